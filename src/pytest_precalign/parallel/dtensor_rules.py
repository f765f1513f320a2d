"""Sharding rules of a DTensor tensor-parallel run, derived from the plan its recording wrote
(the manifest's ``parallel.dtensors.tp_plan``, ``steps/tp_plan.py``) and the records of its
first rank; the merge (``merge.py``) applies them as it applies Megatron's (``rules.py``).
No torch import.

What a recorder sees on a rank of ``parallelize_module``'s styles (its hooks run after torch's):

- a module's input after the style's input hook is a ``DTensor`` (``Replicate`` for
  ``ColwiseParallel``, ``Shard(-1)`` for ``RowwiseParallel``): recorded as the full tensor, the
  same on every rank -- replicated;
- its output with ``use_local_output=True`` (the default) and ``output_layouts`` ``Shard(d)``
  (``ColwiseParallel``'s): the rank's local shard -> concatenated on dim ``d`` (its grads too);
  ``Replicate`` (``RowwiseParallel``'s, all-reduced): replicated, checked equal;
- a module the plan does not name that runs on those local shards between them and the next
  module whose input the plan makes a DTensor again (``act_fn`` between ``gate_proj`` and
  ``down_proj``), inside the same parent, with the shard's width on dim ``d``: a local shard,
  concatenated on ``d``;
- the grad of a ``ColwiseParallel`` module's input is the grad of the DTensor its input hook
  made for this module alone: this module's share of the input's grad, where the unsharded run
  records the grad of the input tensor its consumers share (``q/k/v_proj``, ``gate/up_proj``).
  Not merged: listed with the reason (``own_share``); so is the grad of a ``SequenceParallel``
  module's input (a norm's: the DTensor made from the rank's part of the residual stream, whose
  grad in the unsharded run also holds the residual's);
- ``PrepareModuleInput`` / ``PrepareModuleOutput`` / ``PrepareModuleInputOutput`` (torchtitan's
  attention and feed-forward inputs): an input or output they hand on as a local tensor
  (``use_local_output``) of a ``Shard(d)`` layout is the rank's shard -> concatenated on ``d``
  (slot ``in.<i>`` / ``in.<kwarg>``, ``out`` / ``out.<i>``); one they hand on as a DTensor or a
  replicated local tensor is the full one, replicated; the grad of an input they made is this
  module's share (``own_share``), listed;
- a local shard recorded as a hash (hash mode) cannot be merged: listed;
- a module of a style whose hooks cannot be read (``"unread"``: a custom ``ParallelStyle``):
  its input grads and its records the ranks recorded differently are listed (``UNREAD``), and
  so are the others of its parent (``regions``) that differ;
- any other record inside such a parent (an attention module's weights, local heads) that the
  ranks recorded differently is not merged either: listed (``regions``), never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..trace.note_blocks import PartialSums, TpPartials
from ..trace.records import Record
from .rules import Role, ShardRule

OWN_SHARE = (
    "the grad of a ColwiseParallel, SequenceParallel or PrepareModuleInput module's input is the grad "
    "of the tensor its input hook made for this module alone (this module's share), not the grad of "
    "the input its consumers share in the unsharded run (q/k/v, gate/up projections; a norm and the "
    "residual): not merged"
)
HASHED = (
    "a local shard recorded as a hash only (hash mode): the hash of the concatenation is not a "
    "function of the shards' hashes: not merged; record in stats or tensor mode to compare it"
)
UNREAD = (
    "a module of a tensor-parallel style whose hooks cannot be read (a custom ParallelStyle): how "
    "its output is split over the TP ranks, and whose share its input's grad is, are not known: "
    "not merged"
)
UNSPLIT = (
    "recorded differently by the TP ranks of a DTensor tensor-parallel module's parent, and its "
    "plan does not say how it is split (e.g. attention weights over the local heads): not merged"
)


@dataclass(frozen=True)
class TpPlanRules:
    """The merge's view of a DTensor TP plan: shard ``rules``, the modules whose input grads are
    their own share (``own_share``), and the parents of local-output modules (``regions``)."""

    rules: tuple[ShardRule, ...]
    own_share: frozenset[str]
    regions: tuple[str, ...]
    unread: frozenset[str] = frozenset()  # modules of a style whose hooks cannot be read

    def unmerged(self, rec: Record, rule: ShardRule | None, ranks_differ: bool) -> str | None:
        """Why ``rec`` (of the first rank; ``rule`` its shard rule) is not merged, or None."""
        if rec.kind == "grad_input" and rec.name in self.own_share:
            return OWN_SHARE
        if rec.name in self.unread and (ranks_differ or rec.kind == "grad_input"):
            return UNREAD
        if rule is not None and rec.stats is None and rec.tensor_key is None and rec.crc32 is not None:
            return HASHED
        inside = any(rec.name == p or rec.name.startswith(f"{p}.") for p in self.regions)
        if inside and rule is None and ranks_differ:
            return UNSPLIT
        return None


def _local_dim(entry: Mapping[str, Any]) -> int | None:
    """The dim a module's output is a local shard of, or None (a DTensor, or replicated)."""
    output = entry.get("output")
    if not entry.get("use_local_output") or not isinstance(output, list) or len(output) != 1:
        return None
    shard = output[0]
    return int(shard["shard"]) if isinstance(shard, dict) and "shard" in shard else None


def _prepared_inputs(entry: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(slot, layout) of each input a ``PrepareModule*`` entry converts (module doc)."""
    if not str(entry.get("style", "")).startswith("PrepareModule"):
        return []
    given = entry.get("input")
    kwargs = entry.get("input_kwargs")
    found = [(f"in.{i}", p) for i, p in enumerate(given if isinstance(given, list) else ())]
    found += [(f"in.{k}", p) for k, p in (kwargs.items() if isinstance(kwargs, Mapping) else ())]
    return [(slot, p) for slot, p in found if p is not None]


def _prepared_rules(name: str, entry: Mapping[str, Any]) -> list[ShardRule]:
    """The shard rules of the local tensors a ``PrepareModule*`` entry hands on (module doc)."""
    style = str(entry.get("style"))
    if not style.startswith("PrepareModule"):
        return []
    slots: list[tuple[Role, str, Any]] = []
    if entry.get("use_local_input"):
        slots += [("in", slot, p) for slot, p in _prepared_inputs(entry)]
    output = entry.get("output")
    if entry.get("use_local_output") and isinstance(output, list) and len(output) > 1:
        slots += [("out", f"out.{i}", p) for i, p in enumerate(output)]
    return [
        ShardRule(
            name,
            role,
            "chunk",
            int(p["shard"]),
            slot,
            f"{style}: the rank's local {slot}, Shard({p['shard']})",
        )
        for role, slot, p in slots
        if isinstance(p, dict) and "shard" in p
    ]


def _makes_dtensor_input(entry: Mapping[str, Any]) -> bool:
    if str(entry.get("style", "")).startswith("PrepareModule"):
        return not entry.get("use_local_input") and bool(_prepared_inputs(entry))
    inputs = entry.get("input")
    return isinstance(inputs, list) and any(isinstance(p, dict) and "shard" in p for p in inputs)


def plan_rules(plan: Mapping[str, Any], records: Sequence[Record]) -> TpPlanRules:
    """The rules of ``plan`` (module name -> entry) for the records of one rank (one step)."""
    rules: list[ShardRule] = []
    local = {name: d for name, e in plan.items() if isinstance(e, dict) and (d := _local_dim(e)) is not None}
    for name, dim in local.items():
        why = f"{plan[name].get('style')}: the rank's local output (use_local_output), Shard({dim})"
        rules.append(ShardRule(name, "out", "chunk", dim, why=why))
    for name, entry in plan.items():
        rules += _prepared_rules(name, entry) if isinstance(entry, dict) else []
    own = frozenset(
        n
        for n, e in plan.items()
        if isinstance(e, dict)
        and (
            (e.get("style") == "ColwiseParallel" and e.get("input") == ["replicate"])
            or e.get("style") == "SequenceParallel"
            or bool(_prepared_inputs(e))
        )
    )
    unread = frozenset(n for n, e in plan.items() if isinstance(e, dict) and e.get("unread"))
    regions = tuple(sorted({name.rpartition(".")[0] for name in local}))
    rules += _between(plan, local, regions, records)
    regions = tuple(sorted({*regions, *(name.rpartition(".")[0] for name in unread)}))
    return TpPlanRules(tuple(rules), own, regions, unread)


def _between(
    plan: Mapping[str, Any], local: Mapping[str, int], regions: Sequence[str], records: Sequence[Record]
) -> list[ShardRule]:
    """Rules for the modules the plan does not name that run on local shards inside a region
    (see the module doc), found in the first rank's forward records in execution order."""
    out: dict[tuple[str, str], ShardRule] = {}
    forward = sorted((r for r in records if r.kind in ("input", "activation")), key=lambda r: (r.step, r.seq))
    for parent in regions:
        head = f"{parent}."
        width: tuple[int, int] | None = None  # (dim, local size) while inside a shard region
        for rec in forward:
            if rec.name == parent and rec.kind == "activation":
                width = None
            elif rec.name in local and rec.kind == "activation" and rec.name.startswith(head):
                dim = local[rec.name]
                width = (dim, rec.shape[dim]) if rec.shape else None
            elif rec.name in plan and rec.kind == "input" and _makes_dtensor_input(plan[rec.name]):
                width = None
            elif width is not None and rec.name.startswith(head) and rec.name not in plan and rec.shape:
                dim, size = width
                if -len(rec.shape) <= dim < len(rec.shape) and rec.shape[dim] == size:
                    role: Role = "out" if rec.kind == "activation" else "in"
                    why = "runs on the local shards between tensor-parallel modules (no plan entry)"
                    out.setdefault(
                        (rec.name, rec.slot), ShardRule(rec.name, role, "chunk", dim, rec.slot, why)
                    )
    return list(out.values())


def partials_note(ranks: Sequence[Any], step: Any, key: str = "tp_partials") -> dict[str, TpPartials]:
    """The ``tp_partials`` note of one merged step (``{step: {module: {rank: calls}}}``) from
    the ranks' manifests (``parallel.dtensors.tp_partials``, ``steps/tp_partials.py``);
    empty where no rank kept partial sums. ``key="tp_grad_shards"``: the ``tp_grad_shards``
    note (``{step: {param: {rank: calls}}}``), each rank's local shards of the sharded weights'
    grads."""
    by_module: dict[str, dict[str, tuple[PartialSums, ...]]] = {}
    for rank in ranks:  # RankTrace
        parallel = rank.trace.manifest.get("parallel")
        dtensors = parallel.get("dtensors") if isinstance(parallel, Mapping) else None
        kept = dtensors.get(key) if isinstance(dtensors, Mapping) else None
        if not isinstance(kept, Mapping):
            continue
        own = {str(module): {str(rank.rank): calls} for module, calls in kept.items()}
        for module, calls in TpPartials.from_json(
            own, rank.where, f"parallel.dtensors.{key}"
        ).modules.items():
            by_module.setdefault(module, {}).update(calls)
    return {str(step): TpPartials(by_module)} if by_module else {}


def tp_notes(ranks: Sequence[Any], step: Any) -> dict[str, Any]:
    """The merged step's ``tp_partials`` and ``tp_grad_shards`` notes (``partials_note``), each
    the first rank's own where the ranks' manifests hold none."""
    notes = ranks[0].trace.notes
    return {
        "tp_partials": partials_note(ranks, step) or notes.tp_partials,
        "tp_grad_shards": partials_note(ranks, step, "tp_grad_shards") or notes.tp_grad_shards,
    }


def tp_plan_of(manifest: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``tp_plan`` a rank's manifest holds, or None."""
    parallel = manifest.get("parallel")
    dtensors = parallel.get("dtensors") if isinstance(parallel, Mapping) else None
    plan = dtensors.get("tp_plan") if isinstance(dtensors, Mapping) else None
    return plan if isinstance(plan, Mapping) and plan else None
