"""Every optimizer step of a framework's own training loop (PyTorch Lightning, an Accelerate
loop), measured around the torch optimizer's own step and written by a ``Recorder``: the
shared part of ``PrecalignLightningCallback`` (``lightning_callback``) and ``AccelerateSteps``
(``accelerate_steps``). The framework tells ``OptimizerSteps`` what only it knows:

>>> steps = OptimizerSteps(recorder, model, optimizer, settings)
>>> steps.micro_batch(batch, step)     # each micro-batch the step trains on, before its forward
>>> steps.loss(loss)                   # the loss its backward runs on (already divided by k)
>>> steps.before_clip(norm=None)       # grads accumulated, before the framework clips
>>> ...the framework clips, optimizer.step()...
>>> steps.close()                      # the step is over: its scalars and folder are written

The rest is read from the torch optimizer's step hooks, which every framework goes through:
a step pre-hook runs just before the update -- after the framework's clipping, or, when the
framework passes a closure that does the last backward and the clipping (Lightning), the
closure is wrapped and the grads are read when it returns -- for the grads after clipping
(the clip coefficient) and each group's LR and weight decay as the update uses them; the
update and parameter norms at ``close()``, after the update. The grad norm and zero grads are
those before clipping (``StepEvidence``). Only reads: the closure's result is
returned as is, no grad, parameter or optimizer state is written (recording is bitwise
neutral).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from ..errors import ConfigError
from ..recording import sharded
from ..trace.step_scalars import StepScalars
from ..trace.training_record import TrainingSettings
from .run_settings import json_safe
from .step_evidence import (
    RowsDigest,
    StepEvidence,
    batch_hashes,
    group_settings,
    initial_params,
    token_count,
)
from .step_sink import StepSink

TOKEN_KEYS = ("input_ids", "labels", "attention_mask")


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    """The parameters the optimizer updates (what a framework clips), in group order."""
    return [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]


def parameter_names(optimizer: torch.optim.Optimizer, *modules: torch.nn.Module) -> dict[int, str]:
    """Each optimizer parameter's name in the first of ``modules`` that holds it (the recorded
    model first, so names match its records); ``param<k>`` for one none holds."""
    names: dict[int, str] = {}
    for module in reversed(modules):
        names.update({id(p): n for n, p in module.named_parameters()})
    out = {}
    for k, p in enumerate(p for g in optimizer.param_groups for p in g["params"]):
        out[id(p)] = names.get(id(p), f"param{k}")
    return out


def optimizer_arguments(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer as the user built it, JSON-safe (its class and defaults, its groups' sizes
    and weight decay)."""
    cls = type(optimizer)
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "defaults": {k: json_safe(v) for k, v in optimizer.defaults.items()},
        "param_groups": [
            {"params": len(g["params"]), "weight_decay": json_safe(g.get("weight_decay"))}
            for g in optimizer.param_groups
        ],
    }


# -- what a step's batches were -----------------------------------------------------------------


def batch_view(batch: Any) -> Mapping[str, Any] | None:
    """A token batch's ``input_ids``/``labels``/``attention_mask`` (a mapping holding
    ``input_ids``), for ``step_evidence.batch_hash``; None for any other batch."""
    if isinstance(batch, Mapping) and isinstance(batch.get("input_ids"), torch.Tensor):
        return {k: batch[k] for k in TOKEN_KEYS if isinstance(batch.get(k), torch.Tensor)}
    return None


def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, Mapping):
        for key in value:
            yield from _leaves(value[key], f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{path}[{i}]")


def tensors_hash(batches: Sequence[Any]) -> str:
    """sha256 of every tensor of the step's micro-batches (any structure: a tuple ``(x, y)``,
    a dict...), row by row over the micro-batches in order (a tensor's first dimension is its
    rows), so the same rows give the same hash however they were split into micro-batches."""
    return tensors_hashes(batches)[0]


def tensors_hashes(batches: Sequence[Any]) -> tuple[str, str]:
    """(``tensors_hash``, the rows as a multiset: ``StepScalars.rows_hash``) of the batches."""
    whole = RowsDigest()
    for batch in batches:
        leaves = [(path, sharded.whole(t.detach(), path).to("cpu")) for path, t in _leaves(batch)]
        leaves = [(path, t.reshape(1) if t.ndim == 0 else t) for path, t in leaves]
        for r in range(max((len(t) for _, t in leaves), default=0)):
            parts = []
            for path, t in leaves:
                if r < len(t):
                    row = t[r].contiguous()
                    parts += [
                        f"{path}{tuple(row.shape)}{row.dtype}".encode(),
                        row.reshape(-1).view(torch.uint8).numpy().tobytes(),
                    ]
            whole.row(parts)
    return whole.hexdigests()


def step_batch(batches: Sequence[Any]) -> tuple[str | None, int | None, str | None]:
    """(batch hash, tokens, rows hash) of a step's micro-batches: ``step_evidence``'s for
    token batches, ``tensors_hashes`` and no token count for any other."""
    if not batches:
        return None, None, None
    views = [batch_view(b) for b in batches]
    if all(v is not None for v in views):
        tokens = [v for v in views if v is not None]
        digest, rows = batch_hashes(tokens)
        return digest, token_count(tokens), rows
    digest, rows = tensors_hashes(batches)
    return digest, None, rows


# -- one step at a time -------------------------------------------------------------------------


class OptimizerSteps:
    """Measures and records each optimizer step of ``optimizer`` training ``model`` (see the
    module doc); ``settings`` are written with the first folder."""

    def __init__(
        self,
        recorder: StepSink,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        settings: TrainingSettings | None,
        *,
        owner: str,
        scaler: Any = None,
    ) -> None:
        self.recorder = recorder
        self.model = model
        self.optimizer = optimizer
        self.owner = owner
        self.scaler = scaler  # a mixed-precision GradScaler, if the run has one
        self._scale: float | None = None  # the loss scale of the open step's backwards
        self.evidence = StepEvidence(optimizer_params(optimizer))
        self.scalars: dict[int, StepScalars] = {}
        self._first = True
        self._initial = initial_params(model.named_parameters())
        self.settings = settings  # written with the first folder (settable until then)
        self._step: int | None = None  # the open step
        self._batch: Any = None  # the current micro-batch, until its loss is seen
        self._batches: list[Any] = []  # the micro-batches whose backward ran
        self._losses: list[torch.Tensor] = []
        self._pending: dict[str, Any] = {}
        self._handles = [optimizer.register_step_pre_hook(self._pre_step)]
        if recorder.mode != "scalars":
            self._handles.append(model.register_forward_hook(self._see_output))

    @property
    def open_step(self) -> int | None:
        return self._step

    @property
    def micro_batches(self) -> int:
        """The open step's micro-batches whose loss was seen so far."""
        return len(self._losses)

    @property
    def stepped(self) -> bool:
        """Whether the open step reached its optimizer step (the grads were read)."""
        return self._step is not None and "grad_norm" in self._pending

    def micro_batch(self, batch: Any, step: int) -> None:
        """A micro-batch of optimizer step ``step`` is about to run (the first one opens it)."""
        if self._step is None:
            self._open(step)
        elif step != self._step:
            raise ConfigError(
                f"{self.owner}: a micro-batch of step {step} while step {self._step} is still open"
            )
        self._batch = batch

    def loss(self, loss: torch.Tensor) -> None:
        """The loss of the current micro-batch, as its backward runs on it."""
        if self._step is not None and isinstance(loss, torch.Tensor):
            self._losses.append(loss.detach())
            self._batches.append(self._batch)
            self._batch = None

    def before_clip(self, norm: float | None = None) -> None:
        """The grads are accumulated and not clipped yet (``norm``: the pre-clip norm the
        framework reported, used as is)."""
        if self._step is not None:
            # the clipped grads' norm is measured at the update (_after_clip), the zeros with it
            self._pending["grad_norm"] = self.evidence.grads_before_clip(norm=norm, zeros_after_clip=True)

    def close(self) -> StepScalars | None:
        """The open step is over (its update done or skipped): write its scalars and folder.
        Call it after the update: the update and parameter norms are taken here."""
        step, self._step = self._step, None
        if step is None:
            return None
        pending, self._pending = self._pending, {}
        loss = None
        if self._losses:
            loss = float(sum(float(v.to(torch.float64)) for v in self._losses))
        digest, tokens, rows = step_batch(self._batches)
        scalars = self.evidence.finish(  # the grad norms, update and parameter norms
            step,
            loss=loss,
            lr=pending.get("lr"),
            weight_decay=pending.get("weight_decay"),
            skipped="lr" not in pending,  # the optimizer's step never ran (an overflow)
            tokens=tokens,
            batch_hash=digest,
            rows_hash=rows,
            micro_batches=len(self._losses),
            loss_scale=self._scale,
        )
        self._batch, self._batches, self._losses = None, [], []
        if self._first:
            self._first = False
            if self.settings is not None:
                self.recorder.write_settings(self.settings)
            if step == 0:
                self.recorder.record_initial_params(self._initial)
        self.recorder.record_scalars(scalars)
        self.recorder.updated()
        self.recorder.stop()
        self.recorder.step()
        self.scalars[step] = scalars
        return scalars

    def remove(self, failed: bool = False) -> None:
        """Remove the hooks (the run is over, or ``failed``: a step left open is dropped, its
        marker left: the run stopped inside it)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._step = None
        self.recorder.close(failed=failed)

    # -- the pieces -------------------------------------------------------------------------
    def _open(self, step: int) -> None:
        self._step, self._pending = step, {}
        self._batch, self._batches, self._losses = None, [], []
        self.recorder.seek(step)
        self.recorder.start(self.model)
        self.evidence.begin()
        enabled = self.scaler is not None and self.scaler.is_enabled()
        self._scale = float(self.scaler.get_scale()) if enabled else None

    def _pre_step(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._step is None:
            return None
        # args[0] is the optimizer itself; the closure is step's first argument or keyword
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is None:
            self._after_clip()
            return None

        def measured_closure() -> Any:
            result = closure()
            if "lr" not in self._pending:  # an optimizer calling it again (LBFGS): the first
                self._after_clip()
            return result

        if "closure" in kwargs:
            return args, {**kwargs, "closure": measured_closure}
        return (args[0], measured_closure, *args[2:]), kwargs

    def _after_clip(self) -> None:
        """Just before the update: the grads after clipping, the LR and weight decay it uses."""
        pending, evidence = self._pending, self.evidence
        if "grad_norm" not in pending:  # the framework said nothing: nothing was clipped
            pending["grad_norm"] = evidence.grads_before_clip()
        evidence.grads_after_clip()
        pending["lr"], pending["weight_decay"] = group_settings(self.optimizer)

    def _see_output(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self._step is None or not torch.is_grad_enabled():
            return
        for kind in ("logits", "loss"):
            value = getattr(output, kind, None)
            if isinstance(value, torch.Tensor):
                self.recorder.record_output(kind, value)
