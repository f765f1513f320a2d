"""Data-parallel replicas that each ran their share of a step's micro-batches (megatron-core's
data parallelism: the global batch split over the DP ranks) -> the records of one process
that ran them all.

Replica ``d``'s records of modules, outputs and loss are different micro-batches, not copies:
its call ``c`` of a record is call ``c + d x n`` of the step (``n``: that record's calls in
one replica), as one process running the replicas' micro-batches in rank order would number
them. Parameters and their grads are the same on every replica (the grads reduced over the
DP ranks, the parameters after the optimizer's all-gather): they must agree, replica 0's kept.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..errors import TraceError
from ..trace.records import Record

REPLICATED_KINDS = frozenset({"param", "param_grad"})
CheckReplica = Callable[[Sequence[Record], Sequence[Record], int], None]


def _calls(records: Sequence[Record]) -> Counter[tuple[str, str, str, int]]:
    return Counter((r.name, r.kind, r.slot, r.step) for r in records)


def merge_data_split(replicas: Sequence[Sequence[Record]], check: CheckReplica, where: str) -> list[Record]:
    """The replicas' records (each in execution order) as one process's: every replica's
    micro-batch records, calls renumbered, then replica 0's parameter records (``check(first,
    other, replica)`` raises when a replica's parameter records differ)."""
    first = replicas[0]
    params = [r for r in first if r.kind in REPLICATED_KINDS]
    out = [r for r in first if r.kind not in REPLICATED_KINDS]
    calls = _calls(out)
    for index, records in enumerate(replicas[1:], 1):
        check(params, [r for r in records if r.kind in REPLICATED_KINDS], index)
        own = [r for r in records if r.kind not in REPLICATED_KINDS]
        if _calls(own) != calls:
            extra = sorted(set(_calls(own)) ^ set(calls)) or sorted(calls)
            raise TraceError(
                f"{where}: DP replica {index} recorded other modules or call counts than replica 0 "
                f"(e.g. {'|'.join(map(str, extra[0]))}); each replica must run the same number of "
                "micro-batches through the same modules"
            )
        renamed = {
            r.id: replace(r, call=r.call + index * calls[(r.name, r.kind, r.slot, r.step)]).id for r in own
        }
        for r in own:
            shifted = r.call + index * calls[(r.name, r.kind, r.slot, r.step)]
            out.append(replace(r, call=shifted, deps=tuple(renamed.get(d, d) for d in r.deps)))
    return [replace(r, seq=i) for i, r in enumerate(out + params)]
