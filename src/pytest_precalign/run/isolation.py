"""Isolation mode (PaDiff's single_step, done per module): call every candidate module again
on the baseline's recorded inputs, brought to the candidate's names and layout, and compare
its output with the baseline's. A module that diverges on identical inputs makes the error
itself; one that only diverges in the normal run inherits it.

The baseline's inputs travel through the case's mapping used the other way round, so the
same rules that map candidate records to the baseline map baseline inputs to the candidate.
Inputs without a baseline counterpart (e.g. masks or rotary tables of another
representation) keep the candidate's own values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch

from ..compare.pairs import Comparison, compare_traces
from ..compare.tolerances import ToleranceTable
from ..mapping.apply import map_trace
from ..mapping.spec import MappingSpec, reverse
from ..recording.calls import ModuleCall
from ..recording.tensor_summary import dtype_name, flatten, tensor_stats
from ..trace.records import Record, Trace, record_id


def _baseline_inputs_for_candidate(
    baseline: Trace, candidate: Trace, mapping: MappingSpec | None
) -> dict[str, Any]:
    """Candidate input-record id -> the baseline's tensor for it, in the candidate's layout."""
    records = tuple(r for r in baseline.records if r.kind == "input" and r.step == 0 and r.tensor_key)
    inputs = Trace({"record_mode": "tensor"}, records, baseline.tensors)
    view = map_trace(inputs, candidate, reverse(mapping) if mapping is not None else None).trace
    return {r.id: view.tensor(r) for r in view.records if r.tensor_key is not None}


def _substitute(value: Any, prefix: str, given: dict[str, Any], used: list[str], name: str, call: int) -> Any:
    if isinstance(value, torch.Tensor):
        rid = record_id(name, "input", prefix, 0, call)
        other = given.get(rid)
        if other is not None and tuple(other.shape) == tuple(value.shape):
            used.append(prefix)
            return other.to(device=value.device, dtype=value.dtype)
        return value
    if isinstance(value, tuple):
        return tuple(_substitute(v, f"{prefix}.{i}", given, used, name, call) for i, v in enumerate(value))
    if isinstance(value, list):
        return [_substitute(v, f"{prefix}.{i}", given, used, name, call) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _substitute(v, f"{prefix}.{k}", given, used, name, call) for k, v in value.items()}
    return value


def _rerun(
    calls: Sequence[ModuleCall], given: dict[str, Any], context: Callable[[], AbstractContextManager[Any]]
) -> Iterator[tuple[ModuleCall, Any]]:
    for c in calls:
        used: list[str] = []
        args = tuple(_substitute(a, f"in.{i}", given, used, c.name, c.call) for i, a in enumerate(c.args))
        kwargs = {k: _substitute(v, f"in.{k}", given, used, c.name, c.call) for k, v in c.kwargs.items()}
        if not used:
            continue  # nothing of the baseline's to feed it
        with torch.no_grad(), context(), _state_kept(c.module):
            output = c.module(*args, **kwargs)
        yield c, output


@contextmanager
def _state_kept(module: torch.nn.Module) -> Iterator[None]:
    """The extra call leaves no trace in the run: it works on copies of the module's buffers
    (BatchNorm's running statistics, a step counter), so the originals keep their values and
    their autograd versions (the backward may have saved them), and the random generators are
    as they were before it."""
    originals = []
    for sub in module.modules():
        for name, buffer in sub._buffers.items():
            if buffer is not None:
                originals.append((sub, name, buffer))
                sub._buffers[name] = buffer.detach().clone()
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        for sub, name, buffer in originals:
            sub._buffers[name] = buffer
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def isolate(
    calls: Sequence[ModuleCall],
    baseline: Trace,
    candidate_raw: Trace,
    mapping: MappingSpec | None,
    table: ToleranceTable,
    context: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> Comparison:
    """Per baseline activation record of step 0: how the candidate module does on the
    baseline's inputs (pairs absent from the result could not be isolated)."""
    given = _baseline_inputs_for_candidate(baseline, candidate_raw, mapping)
    records: list[Record] = []
    tensors: dict[str, Any] = {}
    for c, output in _rerun(calls, given, context):
        for slot, t in flatten(output, "out"):
            key = f"i{len(records):07d}"
            data = t.detach().to("cpu", copy=True)
            tensors[key] = data
            records.append(
                Record(
                    seq=len(records),
                    name=c.name,
                    module_class=type(c.module).__name__,
                    phase="forward",
                    step=0,
                    call=c.call,
                    kind="activation",
                    slot=slot,
                    dtype=dtype_name(t.dtype),
                    shape=tuple(t.shape),
                    stats=tensor_stats(data),
                    tensor_key=key,
                )
            )
    isolated = Trace({"record_mode": "tensor"}, tuple(records), tensors)
    mapped = map_trace(isolated, baseline, mapping).trace
    wanted = {r.id for r in mapped.records}
    base = Trace(
        baseline.manifest,
        tuple(r for r in baseline.records if r.id in wanted),
        baseline.tensors,
        baseline.run,
    )
    return compare_traces(base, mapped, table)
