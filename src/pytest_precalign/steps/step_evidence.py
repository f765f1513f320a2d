"""What one optimizer step did, measured on the live model and optimizer: the pieces of a
``StepScalars`` (``trace/step_scalars.py``). Shared by every trainer (the tool's loop, the
``transformers.Trainer`` callback, megatron-core's stack) and the ``Recorder``, so the same
quantity is computed the same way on both sides of a case.

>>> evidence = StepEvidence(model.parameters())
>>> evidence.begin()                     # before the step's first forward (params snapshot)
>>> ...forward/backward of every micro-batch...
>>> evidence.grads_before_clip()         # global grad norm (+ zero grads), before clipping
>>> clip_grad_norm_(...)                 # the framework's own clipping
>>> evidence.grads_after_clip()          # the clip coefficient as measured (+ zero grads)
>>> lr, wd = group_settings(optimizer)   # the LR the update is about to use
>>> optimizer.step()
>>> scalars = evidence.finish(step, loss=..., lr=lr, weight_decay=wd, ...)

Only reads: no grad, parameter or optimizer state is written (recording is bitwise neutral).
The grad norm is ``torch.nn.utils.get_total_norm``, the number ``clip_grad_norm_`` returns,
so a framework that reports its own pre-clip norm and one measured here agree bitwise. Grads
are ``.grad`` unless ``grads=`` names others (megatron-core's ``main_grad``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from ..errors import RecorderError
from ..recording import native_kernels
from ..recording.host_sync import to_host
from ..recording.sharded import whole
from ..recording.tensor_summary import as_dense
from ..trace.step_scalars import ROWS_MODULUS, StepScalars
from . import sharded_norms
from .step_norms import grad_norm_and_zeros, norms_keeping_snapshot, param_and_update_norms
from .torch_norms import total_norm

IGNORE_INDEX = -100  # cross_entropy's ignore_index: such label positions are not tokens


def grad_norm(grads: Sequence[torch.Tensor]) -> float:
    """Global L2 norm of ``grads`` (as ``clip_grad_norm_`` computes it); 0.0 for none. Sharded
    grads (DTensors): the norm of the full grads (``sharded_norms.py``)."""
    if not grads:
        return 0.0
    if sharded_norms.one_mesh(grads):  # torch's norm: no local read of the grads besides it
        return sharded_norms.torch_norm(grads)
    parts = sharded_norms.split(grads)
    if parts is not None:
        return sharded_norms.grad_norm_and_zeros(grads, parts)[0]
    return float(to_host(total_norm([g.detach() for g in grads], 2.0)))


def zero_count(grads: Sequence[torch.Tensor]) -> int:
    """Grad elements exactly 0 (Megatron-LM's ``num-zeros``), read in one host sync."""
    if not grads:
        return 0
    parts = sharded_norms.split(grads)
    if parts is not None:
        return sharded_norms.grad_norm_and_zeros(grads, parts)[1]
    counted = native_kernels.zeros_of(grads)  # one pass of each grad's bits, no host sync
    if counted is not None:
        return counted
    device = grads[0].device
    nonzero = torch.stack([torch.count_nonzero(g.detach()).to(device) for g in grads]).sum()
    return sum(g.numel() for g in grads) - int(to_host(nonzero))


def group_settings(optimizer: Any) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The LR and weight decay of each parameter group, in the optimizer's group order (read
    before ``optimizer.step()``: the LR the update uses)."""
    groups = optimizer.param_groups
    lrs = tuple(float(g["lr"].item() if isinstance(g["lr"], torch.Tensor) else g["lr"]) for g in groups)
    wds = tuple(float(g.get("weight_decay", 0.0)) for g in groups)
    return lrs, wds


def batch_hash(batches: Iterable[Mapping[str, Any]]) -> str:
    """sha256 of the tokens the step's loss sees, row by row in order over its micro-batches:
    each row's ``input_ids`` and ``labels`` at its attended positions (``attention_mask`` 1,
    when the batch has a mask of their shape; every position when it has none). Labels -100
    at attended positions are kept as values (which tokens the loss ignores is part of the
    data); padding (mask 0) is not hashed. So the same rows hash the same however they are
    padded (right or left, to any length) and split into micro-batches, and a row with other
    ids or labels, or the rows in another order, hash differently. Other keys of a batch
    (position ids, pixel values, ...) are not hashed."""
    return batch_hashes(batches)[0]


def batch_hashes(batches: Iterable[Mapping[str, Any]]) -> tuple[str, str]:
    """(``batch_hash``, ``rows_hash``) of the step's batches: the rows as a sequence, and as
    a multiset (each row's sha256 of the same bytes, summed: ``StepScalars.rows_hash``)."""
    whole = RowsDigest()
    for batch in batches:
        mask = _rows(batch.get("attention_mask"))
        present = [
            (key, rows) for key in ("input_ids", "labels") if (rows := _rows(batch.get(key))) is not None
        ]
        for r in range(max((len(rows) for _, rows in present), default=0)):
            parts = []
            for key, rows in present:
                if r < len(rows):
                    row = _attended(rows, mask, r)
                    parts += [f"{key}({row.numel()})".encode(), row.numpy().tobytes()]
            whole.row(parts)
    return whole.hexdigests()


class RowsDigest:
    """A step's batch hashed row by row: the sequence (one sha256 over every row's bytes in
    order) and the multiset (each row's own sha256, summed modulo 2**256)."""

    def __init__(self) -> None:
        self._sequence = hashlib.sha256()
        self._rows = 0

    def row(self, parts: Sequence[bytes]) -> None:
        own = hashlib.sha256()
        for part in parts:
            self._sequence.update(part)
            own.update(part)
        self._rows = (self._rows + int(own.hexdigest(), 16)) % ROWS_MODULUS

    def hexdigests(self) -> tuple[str, str]:
        return self._sequence.hexdigest(), f"{self._rows:064x}"


def _rows(value: Any) -> torch.Tensor | None:
    if not isinstance(value, torch.Tensor):
        return None
    tensor = value.detach().to("cpu", torch.int64).contiguous()
    return tensor.reshape(1, -1) if tensor.ndim < 2 else tensor


def _attended(rows: torch.Tensor, mask: torch.Tensor | None, r: int) -> torch.Tensor:
    """Row ``r`` of ``rows`` at the positions ``mask`` attends (all of it without a mask of
    the rows' shape, e.g. none or a 4-d one)."""
    row = rows[r].reshape(-1)
    if mask is None or mask.shape != rows.shape:
        return row
    return row[mask[r].reshape(-1) != 0]


def token_count(batches: Iterable[Mapping[str, Any]]) -> int:
    """Label positions that are not ignored (-100), over the step's micro-batches (what the
    loss counts, padding labelled -100); without labels, the input ids at attended positions
    (``attention_mask`` 1; all of them without a mask)."""
    total = 0
    for batch in batches:
        labels = batch.get("labels")
        ids = _rows(batch.get("input_ids"))
        if isinstance(labels, torch.Tensor):
            total += int((labels != IGNORE_INDEX).sum())
        elif ids is not None:
            mask = _rows(batch.get("attention_mask"))
            total += sum(int(_attended(ids, mask, r).numel()) for r in range(len(ids)))
    return total


def tensor_summary(tensor: torch.Tensor) -> dict[str, float]:
    """max, min, mean and L2 norm of a parameter, in float64 (the manifest's initial params);
    a DTensor's full tensor (gathered: once, before training)."""
    values = whole(tensor.detach(), "a parameter").to(torch.float64)
    if values.numel() == 0:
        return {"max": 0.0, "min": 0.0, "mean": 0.0, "norm": 0.0}
    return {
        "max": float(values.max()),
        "min": float(values.min()),
        "mean": float(values.mean()),
        "norm": float(torch.linalg.vector_norm(values)),
    }


def initial_params(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, dict[str, float]]:
    """The manifest's ``initial_params``: a summary of each parameter before any update."""
    return {name: tensor_summary(param) for name, param in named}


def _versions(params: Sequence[torch.Tensor]) -> tuple[int, ...] | None:
    """The parameters' version counters (each in-place write moves its tensor's); None when
    one has none (an inference tensor)."""
    try:
        return tuple(p._version for p in params)
    except RuntimeError:
        return None


def _fits(buffers: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> bool:
    """Whether ``buffers`` can hold a copy of ``params`` (same count, shapes, strides, dtypes,
    devices): a parameter replaced between steps gets new buffers."""
    return len(buffers) == len(params) and all(
        b.shape == p.shape and b.stride() == p.stride() and b.dtype == p.dtype and b.device == p.device
        for b, p in zip(buffers, params, strict=True)
    )


class StepEvidence:
    """Measures one optimizer step of ``params`` (see the module doc for the call order)."""

    def __init__(self, params: Iterable[torch.Tensor], *, update_norm: bool = True) -> None:
        self.params = [p for p in params if isinstance(p, torch.Tensor)]
        # DTensor parameters (FSDP2, tensor parallelism): their local shards are snapshot and
        # read, and the norms summed over the ranks that shard them (``sharded_norms.py``).
        self._sharded = sharded_norms.split(self.params) is not None
        self.update_norm = update_norm
        # The parameters as they were at begin(), until the step's norms are taken: the same
        # buffers every step (allocated once, like the parameters), so a step allocates nothing.
        self._before: list[torch.Tensor] | None = None
        self._buffers: list[torch.Tensor] = []
        # The parameters' version counters when the last step's norms left its parameters in
        # the buffers (``norms_keeping_snapshot``); None when they did not.
        self._kept: tuple[int, ...] | None = None
        self._grad_norm: float | None = None
        self._zero_grads: int | None = None
        self._clip_coef: float | None = None
        self._uncounted: list[torch.Tensor] | None = None  # grads whose zeros are counted later

    def _grads(self, grads: Sequence[torch.Tensor] | None) -> list[torch.Tensor]:
        """The step's grads, a sparse one as the dense grad it stands for (``as_dense``)."""
        found = list(grads) if grads is not None else [p.grad for p in self.params if p.grad is not None]
        return [as_dense(g) for g in found]

    def _targets(self) -> list[torch.Tensor]:
        """The tensors whose copy ``begin`` keeps: the parameters, or their local shards (in the
        order of ``sharded_norms.split``'s parts)."""
        parts = sharded_norms.split(self.params) if self._sharded else None
        if parts is None:
            return self.params
        return [local for _, _, locals_ in parts for local in locals_]

    def begin(self) -> None:
        """Before the step: keep a copy of the parameters (for the update norm), copied into
        buffers kept from the step before when the parameters still fit them. Where the last
        step's norms were read by the C kernels, they left the parameters in the buffers as
        they read them (``norms_keeping_snapshot``): no copy then, unless a parameter was
        modified in place since (its version counter moved: a ``load_state_dict``, a second
        ``optimizer.step()``) or replaced. A write through ``.data``, which moves no counter,
        counts in this step's update norm: the norm of how far the parameters moved since
        the last step's end."""
        self._grad_norm = self._zero_grads = self._clip_coef = None
        self._before = self._uncounted = None
        kept, self._kept = self._kept, None
        if self.update_norm and self.params:
            targets = self._targets()
            fits = _fits(self._buffers, targets)
            if not (fits and kept is not None and kept == _versions(targets)):
                with torch.no_grad():
                    if not fits:
                        self._buffers = []  # free the old ones before allocating
                        self._buffers = [
                            torch.empty_like(p, memory_format=torch.preserve_format) for p in targets
                        ]
                    torch._foreach_copy_(self._buffers, [p.detach() for p in targets])
            self._before = self._buffers

    def grads_before_clip(
        self,
        grads: Sequence[torch.Tensor] | None = None,
        *,
        norm: float | None = None,
        zeros_after_clip: bool = False,
    ) -> float:
        """The step's grads after accumulation, before clipping: their global norm (``norm``:
        the one the framework reported, used as is) and the count of exact zeros.
        ``zeros_after_clip``: the caller clips and then calls ``grads_after_clip``, which
        counts the zeros in the same read of each grad as the norm after clipping (one read
        of the grads fewer; clipping multiplies by a coefficient in (0, 1], so the zeros are
        the same ones unless a product underflows to zero; Megatron-LM and the Trainer
        callback count them after clipping too)."""
        found = self._grads(grads)
        parts = sharded_norms.split(found)
        if parts is not None:  # DTensor grads: the full grads' (sharded_norms.py)
            given = None if norm is None else float(norm)  # not computed again
            self._grad_norm, self._zero_grads = sharded_norms.grad_norm_and_zeros(found, parts, given)
        elif norm is None:  # both from one read of each grad, one host sync (step_norms.py)
            self._grad_norm, self._zero_grads = grad_norm_and_zeros(found)
        else:
            self._grad_norm = float(norm)
            self._zero_grads = None if zeros_after_clip else zero_count(found)
        self._uncounted = found if self._zero_grads is None else None
        return self._grad_norm

    def grads_after_clip(self, grads: Sequence[torch.Tensor] | None = None) -> float:
        """After the framework clipped: the coefficient the grads were multiplied by, measured
        as (norm after) / (norm before); 1.0 when the norm before was 0."""
        if self._grad_norm is None:
            raise RecorderError(
                "StepEvidence.grads_after_clip: no grad norm before clipping for this step "
                "(call grads_before_clip before the framework clips)"
            )
        if self._uncounted is not None:  # counted here: grads_before_clip(zeros_after_clip=True)
            found = self._grads(grads)
            parts = sharded_norms.split(found)
            if parts is not None:
                after, self._zero_grads = sharded_norms.grad_norm_and_zeros(found, parts)
            else:
                after, self._zero_grads = grad_norm_and_zeros(found)
            self._uncounted = None
        else:
            after = grad_norm(self._grads(grads))
        self._clip_coef = after / self._grad_norm if self._grad_norm > 0 else 1.0
        return self._clip_coef

    def norms_after_update(self) -> tuple[float | None, float | None]:
        """(update norm, parameter norm) after the optimizer step, read in one host sync.
        On the CPU by the C kernels, each parameter and its snapshot read once, the parameter
        copied over its snapshot in the same read (the next step's, see ``begin``); elsewhere
        the update subtracted in place, in the snapshot's buffers (before - after: the update
        negated, whose norm is the update's, bit for bit): no step-sized temporary
        (``step_norms.py``)."""
        if not self.params:
            return None, None
        before, self._before = self._before, None
        if self._sharded:
            return self._sharded_norms(before)
        params = [p.detach() for p in self.params]
        with torch.no_grad():
            kept = None if before is None else norms_keeping_snapshot(params, before)
            if kept is not None:  # the buffers hold the parameters now: the next snapshot
                self._kept = _versions(self.params)
            param, update = kept if kept is not None else param_and_update_norms(params, before)
            norms = [param] if update is None else [param, update]
            values = to_host(torch.stack([n.to(torch.float64) for n in norms]))
        return (values[1] if before is not None else None), values[0]

    def _sharded_norms(self, before: list[torch.Tensor] | None) -> tuple[float | None, float | None]:
        """``norms_after_update`` of DTensor parameters: each part's local norms (as above),
        their squares summed over the ranks that shard them (``sharded_norms.global_norms``)."""
        parts = sharded_norms.split(self.params) or []
        squares: list[tuple[tuple[Any, ...], float, float]] = []
        at, all_kept = 0, before is not None
        with torch.no_grad():
            for groups, _, local in parts:
                mine = None if before is None else before[at : at + len(local)]
                at += len(local)
                kept = None if mine is None else norms_keeping_snapshot(local, mine)
                all_kept = all_kept and kept is not None
                param, update = kept if kept is not None else param_and_update_norms(local, mine)
                p, u = float(to_host(param.to(torch.float64))), 0.0
                if update is not None:
                    u = float(to_host(update.to(torch.float64)))
                squares.append((groups, p * p, u * u))
        if all_kept:  # the buffers hold the local parameters now: the next snapshot
            self._kept = _versions(self._targets())
        param_norm, update_norm = sharded_norms.global_norms(squares, self.params[0].device)
        return (update_norm if before is not None else None), param_norm

    def finish(self, step: int, **fields: Any) -> StepScalars:
        """The step's scalars: what was measured, plus ``fields`` (loss, lr, weight_decay,
        tokens, batch_hash, micro_batches, loss_scale, skipped, or overrides)."""
        if self._uncounted is not None:  # zeros left for a clipping that never came (a skipped step)
            self._zero_grads, self._uncounted = zero_count(self._uncounted), None
        update, param = self.norms_after_update()
        measured: dict[str, Any] = {
            "grad_norm": self._grad_norm,
            "zero_grads": self._zero_grads,
            "clip_coef": self._clip_coef
            if self._clip_coef is not None
            else (1.0 if self._grad_norm is not None else None),
            "update_norm": update,
            "param_norm": param,
        }
        measured.update(fields)
        for key in ("lr", "weight_decay"):
            if measured.get(key) is not None:
                measured[key] = tuple(float(v) for v in measured[key])
        return StepScalars(step=step, **measured)
