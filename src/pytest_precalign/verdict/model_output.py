"""The grad arriving at the model's output, when nothing inside the model made it: the loss.

A loop that computes its loss outside the model (TRL 0.7's ``DPOTrainer`` calls the model
without labels and makes the loss from the logits) leaves no loss record; where its value
coincides on both sides (DPO/IPO at step 0: the policy equals its reference), the logged loss
matches and every forward record matches, and the first backward record that differs is the
grad w.r.t. the output of the module whose output is the model's output (``lm_head``). No
module's code made that grad: the code after the model did, from matching outputs, so the loss
differs in its gradient. Named only with evidence: every forward record of the step paired and
matched, the module is the last of its forward pass that no recorded module encloses (the root
is not recorded: its output is that module's), and the logged loss matched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ..compare.pairs import PairResult
from ..trace.records import Record
from ..vocabulary import FAILED, GATE_KINDS
from .divergence_start import same_tensor
from .phase import Divergence
from .run_patterns import LossFunctionDiffers, LossGradScaled

# Output slots that are a KV cache (``out.past_key_values.0.1``): returned by one release and not
# the other (``use_cache``), of another form, not data the loss is made from.
CACHE_WORDS = ("past_key_value", "present_key_value", "cache")


@dataclass(frozen=True)
class CacheAside:
    """A cache output one side alone returned (``side``), set aside: the record and its slot."""

    name: str
    slot: str
    side: Literal["baseline", "candidate"]


@dataclass(frozen=True)
class OutputGrad:
    first: Divergence  # the grad w.r.t. the model's output, the step's first divergent backward record
    module: str  # the top-level module whose output is the model's output
    compared: int  # forward output records paired, all within tolerance
    aside: tuple[CacheAside, ...] = ()  # one-sided cache outputs set aside


def output_grad(
    first: Divergence | None, pairs: Sequence[PairResult], parents: Mapping[str, str]
) -> OutputGrad | None:
    """``first`` (the step's first divergent backward record, ``pairs`` the step's, ``parents``
    the trace's module tree) when it is the grad w.r.t. the model's output, every forward
    output record of the step was paired and matched (a KV cache one side alone returned set
    aside) and the output module's own grad w.r.t. its output differs too; None otherwise."""
    if first is None or first.kind != "grad_output" or first.pair.record.module_class == "api":
        return None
    rec = first.pair.record
    forward = [p for p in pairs if p.record.phase == "forward" and p.record.kind in GATE_KINDS["forward"]]
    aside = [p for p in forward if p.status in ("only_baseline", "only_candidate") and _cache(p.record)]
    rest = [p for p in forward if p not in aside]
    if not rest or any(p.status != "ok" for p in rest):
        return None  # a forward record missing, one-sided or not compared: it cannot be told
    out = _output_of_the_pass(rec.call, rest, parents)
    if out is None or not _at_the_output(rec, out, rest, pairs):
        return None
    shown = (CacheAside(p.record.name, p.record.slot, _side(p)) for p in aside)
    return OutputGrad(first, out.name, len(rest), tuple(dict.fromkeys(shown)))


def _side(pair: PairResult) -> Literal["baseline", "candidate"]:
    return "baseline" if pair.status == "only_baseline" else "candidate"


def _cache(rec: Record) -> bool:
    return rec.kind == "activation" and any(word in rec.slot.lower() for word in CACHE_WORDS)


def _top_level(rec: Record, parents: Mapping[str, str]) -> bool:
    """No module encloses ``rec``'s: by the trace's own tree, else by the dotted path."""
    key = f"{rec.name}#{rec.call}"
    return not parents.get(key, "") if key in parents else "." not in rec.name


def _output_of_the_pass(
    call: int, forward: Sequence[PairResult], parents: Mapping[str, str]
) -> Record | None:
    """The last output of a top-level module (no recorded module encloses it) in forward pass
    ``call`` (the records of call ``call``): the model's output, the root being unrecorded."""
    tops = [
        p.record
        for p in forward
        if p.record.kind == "activation"
        and p.record.module_class != "api"
        and p.record.call == call
        and _top_level(p.record, parents)
    ]
    return max(tops, key=lambda r: r.seq, default=None)


def _at_the_output(
    rec: Record, out: Record, forward: Sequence[PairResult], pairs: Sequence[PairResult]
) -> bool:
    """``rec`` (a grad w.r.t. a module's output) is the grad w.r.t. the model's output ``out``:
    of ``out``'s module, or of a module inside it returning that very tensor (a Linear its
    module returns as is); and the grad w.r.t. ``out`` itself differs (had it matched, the grad
    changed inside the model)."""
    own = next(
        (p for p in pairs if p.record.kind == "grad_output" and _key(p.record) == _key(out)),
        None,
    )
    if own is None or own.status not in FAILED:
        return False
    if rec.name == out.name:
        return True
    mine = next(
        (p.record for p in forward if p.record.kind == "activation" and _key(p.record) == _key(rec)),
        None,
    )
    return mine is not None and rec.name.startswith(out.name + ".") and same_tensor(mine, out)


def _key(rec: Record) -> tuple[str, int, str]:
    return rec.name, rec.call, rec.slot


def output_grad_pattern(factor: float | None) -> LossFunctionDiffers | LossGradScaled:
    """What the difference looks like; ``factor``: every parameter grad of the step scaled by it."""
    return LossFunctionDiffers() if factor is None else LossGradScaled(factor)
