"""Per-rank traces of one distributed run -> one canonical trace (TP=1, one stage), lazily.

The one merge of rank folders: ``precalign compare``, the launched ranks of a pytest case
(``run/launch.py``) and the rank folders of the user's own loop all come here. For each DP
replica: the TP ranks of each pipeline stage are merged record by record (sharded tensors by
the rules in ``rules.py``, replicated ones checked equal across the TP ranks, the first kept),
each stage's local names become global ones (a virtual-pipeline chunk's ``prefix`` is
stripped, ``layer_offsets`` renumber the layers), and the stages are put in execution order:
forward and optimizer-step records stage by stage, backward records in reverse. With expert
parallelism (``ep`` ranks inside the data-parallel ones, as in megatron-core), expert-parallel
rank r's ``local_experts.i`` is global expert ``r * n + i`` and the other records are EP rank
0's. DP replicas that saw different rows (DDP, FSDP2, ZeRO) are joined into the one-process
run of the global batch (``dp_join.py``; their scalars: ``dp_scalars.py``); replicas that saw
the same data are copies, checked record by record, the first kept, a rank that differs a
finding (``data_split``: a launched side's replicas ran different micro-batches,
``data_split.py``).

Tensors are not read here: the merged trace's store (``store.MergedTensors``) reads and
concatenates one record's shards when the compare asks for it. Statistics-only sides merge
like msprobe's ``parallel_merge``: max of max, min of min, mean weighted by element count,
norm = sqrt(sum of squares). Hashes of shards cannot be merged (a CRC of a concatenation is
not a function of the shards' CRCs): such a side is an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import TraceError
from ..trace.merged_stats import merge_stats
from ..trace.note_blocks import DpJoin, ReplicaMismatch
from ..trace.records import Record, Stats, Trace
from ..vocabulary import PHASE_INDEX
from .data_split import merge_data_split
from .dp_join import Replica, copies_differ, join_replicas, same_record, same_stats, saw_different_data
from .dp_scalars import loss_weights
from .dtensor_rules import TpPlanRules, plan_rules, tp_notes, tp_plan_of
from .layout import ParallelLayout
from .rules import MEGATRON_GPT_RULES, ShardRule, rule_for, rules_for_layout
from .store import MergedTensors, Part, Plan


@dataclass(frozen=True)
class Chunk:
    """A model chunk of a rank (virtual pipeline): records named ``prefix...``; a ModuleList
    path -> the global index of its item 0."""

    index: int = 0
    prefix: str = ""
    layer_offsets: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RankTrace:
    rank: int
    where: str  # the rank folder, for messages
    trace: Trace
    chunks: tuple[Chunk, ...] = (Chunk(),)


@dataclass
class _Merged:
    """Records (with sort keys) and tensor plans being built."""

    records: list[tuple[tuple[Any, ...], Record]] = field(default_factory=list)
    plans: dict[str, Plan] = field(default_factory=dict)
    keys: dict[tuple[Any, ...], str] = field(default_factory=dict)
    replicas_checked: int = 0
    # Replicated records whose TP ranks disagree: rank 0's copy is kept, the verdict fails.
    replica_mismatches: list[ReplicaMismatch] = field(default_factory=list)
    prefix: str = ""
    tp_plan: TpPlanRules | None = None  # a DTensor tensor-parallel side (``dtensor_rules.py``)
    unmerged: dict[str, str] = field(default_factory=dict)  # record id -> why it was not merged


def merge_ranks(
    ranks: Sequence[RankTrace],
    layout: ParallelLayout,
    *,
    where: str,
    rules: Sequence[ShardRule] = MEGATRON_GPT_RULES,
    key_prefix: str = "",
    data_split: bool = False,
    replica_mode: str = "auto",
) -> Trace:
    """The ranks of one run (every rank of ``layout``, in any order) -> one trace; its tensor
    keys start with ``key_prefix``. ``data_split``: the DP replicas ran different micro-batches
    of the step (``data_split.py``), not the same data. ``replica_mode`` (``dp_join``): ``auto``
    joins DP replicas that saw different rows along the batch and checks copies equal,
    ``joined`` always joins, ``same`` refuses replicas that saw different data."""
    if layout.cp > 1 or (layout.ep > 1 and layout.pp > 1):
        raise TraceError(
            f"{where}: merging context-parallel ranks, or expert-parallel ranks over pipeline "
            f"stages, is not supported ({layout.describe()}); compare runs with cp=1, and pp=1 where ep>1"
        )
    by_rank = {r.rank: r for r in ranks}
    all_rules, tp_plan = _rules(by_rank[min(by_rank)], layout, rules)
    replicas = _replicas(by_rank, layout, all_rules, where, key_prefix, tp_plan)
    first, merged = replicas[0]
    leads = [by_rank[r] for r in replica_leads(layout)]
    dp_join: DpJoin | None = None

    def check(a: Sequence[Record], b: Sequence[Record], dp: int) -> None:
        _check_replica(a, b, _group(layout, 0, 0)[0], _group(layout, dp * layout.ep, 0)[0], by_rank, where)

    if data_split:
        first = merge_data_split([records for records, _ in replicas], check, where)
        for _, state in replicas[1:]:
            merged.plans.update(state.plans)
            merged.replica_mismatches += state.replica_mismatches
    elif len(replicas) > 1:
        first, dp_join, found, plans = _dp_replicas(replicas, leads, layout, where, key_prefix, replica_mode)
        merged.replica_mismatches += [m for _, state in replicas[1:] for m in state.replica_mismatches]
        merged.replica_mismatches += found
        merged.plans.update(plans)
    manifest = dict(ranks[0].trace.manifest)  # without its rank's place
    manifest.pop("parallel", None)
    manifest["parallel_merge"] = {
        "layout": layout.describe(),
        "world_size": layout.world_size,
        "ranks": [by_rank[r].where for r in sorted(by_rank)],
        "rules": [r.describe() for r in all_rules],
        "replicas_checked": merged.replicas_checked,
        **({"data_split": layout.dp // layout.ep} if data_split else {}),
    }
    trace = Trace(manifest, tuple(first), MergedTensors(merged.plans), ranks[0].trace.run)  # its run keys
    unmerged = {k: v for _, state in replicas for k, v in state.unmerged.items()}
    return trace.with_notes(
        # every rank's steps whose parameter grads were gone when recorded (``Recorder``)
        grads_missing=tuple(m for r in ranks for m in r.trace.notes.grads_missing),
        replica_mismatches=tuple(merged.replica_mismatches) or ranks[0].trace.notes.replica_mismatches,
        dp_join=({str(manifest.get("step", 0)): dp_join} if dp_join else {}) or ranks[0].trace.notes.dp_join,
        tp_unmerged=unmerged or ranks[0].trace.notes.tp_unmerged,
        **tp_notes(ranks, manifest.get("step", 0)),  # tp_partials, tp_grad_shards
    )


def _rules(
    first: RankTrace, layout: ParallelLayout, rules: Sequence[ShardRule]
) -> tuple[tuple[ShardRule, ...], TpPlanRules | None]:
    """The shard rules of a side: a DTensor side's from its own plan (never Megatron's), else
    ``rules`` as the layout needs them (``rules_for_layout``)."""
    plan = tp_plan_of(first.trace.manifest) if layout.tp > 1 else None
    if plan is not None:
        tp_plan = plan_rules(plan, first.trace.records)
        return tp_plan.rules, tp_plan
    extra = {"sequence_parallel": layout.sequence_parallel, "parallel_output": layout.parallel_output}
    return rules_for_layout(rules, **extra), None


def _replicas(
    by_rank: Mapping[int, RankTrace],
    layout: ParallelLayout,
    rules: Sequence[ShardRule],
    where: str,
    key_prefix: str,
    tp_plan: TpPlanRules | None = None,
) -> list[tuple[list[Record], _Merged]]:
    """Each DP replica's records (its TP ranks, stages and expert ranks merged), in order."""
    replicas: list[tuple[list[Record], _Merged]] = []
    for replica in range(layout.dp // layout.ep):
        merged = _Merged(prefix=f"{key_prefix}d{replica}." if replica else key_prefix, tp_plan=tp_plan)
        for ep_rank in range(layout.ep):
            dp = replica * layout.ep + ep_rank
            for pp in range(layout.pp):
                group = [by_rank[g] for g in _group(layout, dp, pp)]
                _merge_stage(group, pp, layout, rules, merged, ep_rank)
        replicas.append((_ordered(merged, layout, where), merged))
    return replicas


def _dp_replicas(
    replicas: Sequence[tuple[list[Record], _Merged]],
    leads: Sequence[RankTrace],
    layout: ParallelLayout,
    where: str,
    key_prefix: str,
    mode: str,
) -> tuple[list[Record], DpJoin, list[ReplicaMismatch], dict[str, Plan]]:
    """DP replicas (not ``data_split``): joined along the batch when they saw different rows,
    else checked as copies (``dp_join``); the kept records, the ``dp_join`` facts, the
    findings and the joined tensors' plans."""
    records = [r for r, _ in replicas]
    step = leads[0].trace.manifest.get("step")
    scalars = [lead.trace.scalars.get(step) if isinstance(step, int) else None for lead in leads]
    different = saw_different_data(records, [s.batch_hash if s is not None else None for s in scalars])
    if mode == "same" and different:
        raise TraceError(
            f"{where}: the DP replicas saw different data ({leads[1].where} vs {leads[0].where}), and "
            "replicas=same refuses to join them: compare one replica's ranks, or drop replicas=same"
        )
    sides = [
        Replica(lead.where, recs, state.plans) for lead, (recs, state) in zip(leads, replicas, strict=True)
    ]
    if not (different or mode == "joined"):
        return records[0], DpJoin(len(sides), joined=False), copies_differ(sides, where), {}
    if layout.ep > 1:
        raise TraceError(
            f"{where}: DP replicas that saw different data cannot be joined with expert parallelism "
            f"({layout.describe()}): compare one replica's ranks"
        )
    weights = loss_weights(scalars)
    sides = [replace(side, weight=w) for side, w in zip(sides, weights, strict=True)]
    reduced = all(lead.trace.notes.param_grads == "step" for lead in leads)
    source = leads[0].trace.manifest.get("parallel", {}).get("source")  # the model source
    seq_first = source == "megatron"  # megatron-core's [s, b, h] activations
    joined = join_replicas(
        sides, grads_reduced=reduced, where=where, key_prefix=key_prefix, seq_first=seq_first
    )
    block = DpJoin(len(sides), True, tuple(weights), joined.joined, joined.unpaired, joined.parts)
    return joined.records, block, joined.mismatches, joined.plans


def replica_leads(layout: ParallelLayout) -> list[int]:
    """The first rank (tp 0, pp 0) of each DP replica, in replica order."""
    return [_group(layout, d * layout.ep, 0)[0] for d in range(layout.dp // layout.ep)]


def _group(layout: ParallelLayout, dp: int, pp: int) -> list[int]:
    """The global ranks of one TP group (in tp order) of DP replica ``dp``, stage ``pp``."""
    out: dict[int, int] = {}
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        if c["dp"] == dp and c["pp"] == pp and c["cp"] == 0:
            out[c["tp"]] = rank
    return [out[t] for t in sorted(out)]


def _merge_stage(
    group: Sequence[RankTrace],
    pp: int,
    layout: ParallelLayout,
    rules: Sequence[ShardRule],
    merged: _Merged,
    ep_rank: int = 0,
) -> None:
    """One pipeline stage: its TP ranks' records -> merged records with global names (on
    expert-parallel rank ``ep_rank`` > 0, only its experts' records)."""
    lead = group[0]
    by_id = [r.trace.by_id() for r in group]
    for rank, ids in zip(group[1:], by_id[1:], strict=True):
        extra = sorted(set(ids) - set(by_id[0]))
        if extra:
            raise TraceError(
                f"{rank.where}: record {extra[0]!r} is not on tp rank 0 ({lead.where}); "
                "the TP ranks of a stage must record the same modules"
            )
    rename = _renamer(lead, pp, layout, ep_rank)
    for rec in lead.trace.records:
        if ep_rank and not _EXPERT.search(rec.name):
            continue  # EP rank 0 holds the same (data-parallel) copy
        peers = []
        for rank, ids in zip(group, by_id, strict=True):
            other = ids.get(rec.id)
            if other is None:
                raise TraceError(
                    f"{rank.where}: record {rec.id!r} of tp rank 0 ({lead.where}) is missing here"
                )
            peers.append(other)
        name, v = rename(rec.name)
        if merged.tp_plan is not None:
            why = merged.tp_plan.unmerged(rec, rule_for(rec, rules), _ranks_differ(rec, peers))
            if why is not None:
                merged.unmerged[_rename_id(rec.id, rename)] = f"{why} ({', '.join(g.where for g in group)})"
                continue
        out = _merge_record(rec, peers, group, rules, merged)
        deps = tuple(_rename_id(d, rename) for d in rec.deps)
        order = v if rec.phase != "backward" else -v
        key = (rec.step, PHASE_INDEX.get(rec.phase, 3), order, rec.seq)
        merged.records.append((key, replace(out, name=name, deps=deps)))


def _merge_record(
    rec: Record,
    peers: Sequence[Record],
    group: Sequence[RankTrace],
    rules: Sequence[ShardRule],
    merged: _Merged,
) -> Record:
    rule = rule_for(rec, rules) if len(peers) > 1 else None
    shapes = [p.shape for p in peers]
    wheres = [g.where for g in group]
    if any(s != shapes[0] for s in shapes):
        why = "no sharding rule" if rule is None else f"rule {rule.describe()!r}"
        raise TraceError(
            f"{rec.id}: shapes differ across the TP ranks ({', '.join(f'{w}: {list(s)}' for w, s in zip(wheres, shapes, strict=True))}) "
            f"but {why} covers it: add a ShardRule for it"
        )
    if rule is None or rule.layout == "replicated":
        return _replicated(rec, peers, group, merged)
    dim = rule.dim % len(rec.shape) if rec.shape else 0
    pieces = len(peers) * (2 if rule.layout == "gated" else 1)
    if not rec.shape or (rule.layout == "gated" and rec.shape[dim] % 2):
        raise TraceError(
            f"{rec.id}: rule {rule.describe()!r} splits dim {dim} of shape {list(rec.shape)} "
            f"into {pieces // len(peers)} halves per rank ({group[0].where}), which does not divide it"
        )
    if rec.crc32 is not None and rec.stats is None and rec.tensor_key is None:
        raise TraceError(
            f"{group[0].where}: {rec.id} is sharded over TP ({rule.describe()}) but recorded as a hash only: "
            "hash-mode (md5/CRC-32) records cannot be merged across TP ranks (the hash of a concatenation "
            "is not a function of the shards' hashes); record in stats or tensor mode"
        )
    shape = list(rec.shape)
    shape[dim] *= len(peers)
    key = _plan_key(rec, peers, group, rule.layout, dim, tuple(shape), merged)
    stats = _merged_stats([p.stats for p in peers], [p.numel for p in peers])
    return replace(rec, shape=tuple(shape), stats=stats, crc32=None, tensor_key=key)


def _replicated(rec: Record, peers: Sequence[Record], group: Sequence[RankTrace], merged: _Merged) -> Record:
    """Rank 0's record; the others must have the same statistics and hash (their tensors are
    checked when read). Ranks that disagree (a fault on one rank, or a missing sharding rule)
    are noted for the verdict, which fails on them, and rank 0's copy is kept."""
    differ = [
        (rank, peer)
        for peer, rank in zip(peers[1:], group[1:], strict=True)
        if not same_stats(rec.stats, peer.stats) or rec.crc32 != peer.crc32
    ]
    if differ:
        rank, peer = differ[0]
        found = ReplicaMismatch.of(
            rec, group[0].where, [r.where for r, _ in differ], f"{_show(rec)} vs {_show(peer)}"
        )
        merged.replica_mismatches.append(found)
        peers, group = peers[:1], group[:1]
    if len(peers) > 1:
        merged.replicas_checked += 1
    key = _plan_key(rec, peers, group, "replicated", 0, rec.shape, merged)
    return replace(rec, tensor_key=key)


def _plan_key(
    rec: Record,
    peers: Sequence[Record],
    group: Sequence[RankTrace],
    layout: str,
    dim: int,
    shape: tuple[int, ...],
    merged: _Merged,
) -> str | None:
    """The merged store's key for the record's tensor; one tensor under several names (and
    an msprobe data_name) gets one key."""
    if any(
        p.tensor_key is None or p.tensor_key not in g.trace.tensors for p, g in zip(peers, group, strict=True)
    ):
        return None
    parts = tuple(Part(g.trace, str(p.tensor_key), g.where) for p, g in zip(peers, group, strict=True))
    ident = (tuple((id(p.trace), p.key) for p in parts), layout, dim)
    key = merged.keys.get(ident)
    if key is None:
        key = merged.keys[ident] = f"{merged.prefix}m{len(merged.keys):07d}"
        merged.plans[key] = Plan(layout, dim, parts, shape, rec.id)
    return key


def _merged_stats(stats: Sequence[Stats | None], counts: Sequence[int]) -> Stats | None:
    """The shards' statistics merged (``trace/merged_stats``); None when a shard has none."""
    if any(s is None for s in stats):
        return None
    return merge_stats([(s, n) for s, n in zip(stats, counts, strict=True) if s is not None])


def _ranks_differ(rec: Record, peers: Sequence[Record]) -> bool:
    return not all(same_record(rec, p) for p in peers)


def _show(rec: Record) -> str:
    if rec.stats is not None:
        s = rec.stats
        return f"max {s.max:.6g}, min {s.min:.6g}, mean {s.mean:.6g}, norm {s.norm:.6g}"
    return f"hash {rec.crc32}"


# -- names -------------------------------------------------------------------------------------


_EXPERT = re.compile(r"(\.local_experts\.)(\d+)(?=\.|$)")


def globalize(name: str, offsets: Mapping[str, int]) -> str:
    """``decoder.layers.0.mlp`` on a stage whose layers start at 2 -> ``decoder.layers.2.mlp``."""
    for path, offset in offsets.items():
        pattern = rf"^{re.escape(path)}\.(\d+)(?=\.|$)" if path else r"^(\d+)(?=\.|$)"
        match = re.match(pattern, name) if offset else None
        if match:
            head = f"{path}." if path else ""
            return f"{head}{int(match.group(1)) + offset}{name[match.end() :]}"
    return name


def globalize_expert(name: str, ep_rank: int, local: int) -> str:
    """``...experts.local_experts.1`` on expert-parallel rank 1 holding ``local`` = 2 experts ->
    ``...experts.local_experts.3``: rank r's expert i is global expert ``r * local + i``."""
    if not ep_rank:
        return name
    return _EXPERT.sub(lambda m: f"{m.group(1)}{ep_rank * local + int(m.group(2))}", name, count=1)


def _local_experts(trace: Trace) -> int:
    return 1 + max((int(m.group(2)) for r in trace.records if (m := _EXPERT.search(r.name))), default=-1)


def _renamer(
    rank: RankTrace, pp: int, layout: ParallelLayout, ep_rank: int = 0
) -> Callable[[str], tuple[str, int]]:
    """Local name -> (global name, virtual stage) for one rank's chunks."""
    local_experts = _local_experts(rank.trace) if ep_rank else 0
    chunks = sorted(rank.chunks, key=lambda c: -len(c.prefix))
    last = max(rank.chunks, key=lambda c: c.index)
    patterns = {
        c.index: [
            (re.compile(rf"^{re.escape(path)}\.(\d+)(?=\.|$)"), path, off)
            for path, off in c.layer_offsets.items()
        ]
        for c in rank.chunks
    }

    def rename(name: str) -> tuple[str, int]:
        chunk = next((c for c in chunks if c.prefix and name.startswith(c.prefix)), None)
        if chunk is None:
            chunk = next((c for c in chunks if not c.prefix), last)
        local = name[len(chunk.prefix) :] if chunk.prefix and name.startswith(chunk.prefix) else name
        for pattern, path, offset in patterns[chunk.index]:
            m = pattern.match(local)
            if m:
                local = f"{path}.{offset + int(m.group(1))}{local[m.end() :]}"
                break
        return globalize_expert(local, ep_rank, local_experts), chunk.index * layout.pp + pp

    return rename


def _rename_id(record_id: str, rename: Callable[[str], tuple[str, int]]) -> str:
    name, sep, rest = record_id.partition("|")
    return f"{rename(name)[0]}{sep}{rest}"


def _ordered(merged: _Merged, layout: ParallelLayout, where: str) -> list[Record]:
    """Execution order of a one-stage run, each global record once. A module on several
    stages (a container such as ``decoder``: every stage has one) keeps its inputs and the
    grads w.r.t. them from the first stage and its outputs and their grads from the last;
    a parameter on several stages is an error."""
    items = merged.records
    if layout.pp > 1 or (layout.vpp or 1) > 1 or layout.ep > 1:
        items = sorted(items, key=lambda item: item[0])
    chosen: dict[str, tuple[tuple[Any, ...], Record]] = {}
    for key, rec in items:
        held = chosen.get(rec.id)
        if held is None:
            chosen[rec.id] = (key, rec)
            continue
        if rec.kind in ("param", "param_grad"):
            raise TraceError(
                f"{where}: parameter record {rec.id!r} is on several pipeline stages after renumbering "
                "(check each rank's layer_offsets and chunk prefixes; tied weights are not merged)"
            )
        first_wins = rec.kind in ("input", "grad_input")
        stage, held_stage = abs(key[2]), abs(held[0][2])
        if (stage < held_stage) if first_wins else (stage > held_stage):
            chosen[rec.id] = (key, rec)
    kept = sorted(chosen.values(), key=lambda item: item[0]) if len(chosen) < len(items) else items
    merged.records = []
    return [replace(rec, seq=i) for i, (_, rec) in enumerate(kept)]


def _check_replica(
    first: Sequence[Record],
    other: Sequence[Record],
    rank_a: int,
    rank_b: int,
    by_rank: Mapping[int, RankTrace],
    where: str,
) -> None:
    a, b = by_rank[rank_a].where, by_rank[rank_b].where
    ids = {r.id: r for r in other}
    if set(ids) != {r.id for r in first}:
        diff = sorted({r.id for r in first} ^ set(ids))
        raise TraceError(f"{where}: DP replicas hold different records ({b} vs {a}), e.g. {diff[0]!r}")
    for rec in first:
        peer = ids[rec.id]
        if not same_record(rec, peer):
            raise TraceError(
                f"{where}: DP replicas differ at {rec.id} ({b}: {_show(peer)}; {a}: {_show(rec)}); "
                "a DP replica is kept only when all replicas saw the same data: compare one replica's ranks"
            )
