"""Case inputs: ``InputSpec`` -> tensors, the same for both sides (built once, copied).

A case of ``steps: N`` takes a new batch each step (``CaseInputs.batch(step)``): ``kind:
tokens`` draws batch ``s`` from its seed's generator after batches ``0..s-1`` (batch 0 is
what a one-step case gets); ``kind: dataset`` takes the file's rows ``s*batch ..``; ``kind:
factory`` returning an iterable of batches gives batch ``s`` its ``s``-th item (one mapping:
that batch every step, as ``kind: ids`` does)."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config.dataset_rows import read_rows
from ..config.specs import InputSpec
from ..errors import CaseError, PrecalignError, SourceError
from .imports import import_object, one_line


@dataclass(frozen=True)
class CaseInputs:
    model_inputs: Mapping[str, Any]  # passed to the model as keyword arguments
    labels: torch.Tensor | None
    later: tuple[CaseInputs, ...] = ()  # the batches of steps 1, 2, ... (none: this one every step)

    def to(self, device: torch.device) -> CaseInputs:
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.model_inputs.items()}
        labels = self.labels.to(device) if self.labels is not None else None
        return CaseInputs(moved, labels, tuple(b.to(device) for b in self.later))

    @property
    def rows(self) -> int:
        """The batch size: dim 0 of the first tensor the model is given."""
        return int(next(v for v in self.model_inputs.values() if isinstance(v, torch.Tensor)).shape[0])

    def batch(self, step: int) -> CaseInputs:
        """The batch of optimizer step ``step`` (0-based)."""
        if step == 0 or not self.later:
            return CaseInputs(self.model_inputs, self.labels)
        return self.later[step - 1]


def inputs_digest(inputs: CaseInputs) -> str:
    """sha256 of the inputs' names, dtypes, shapes and values (labels included): two runs fed
    the same tensors have the same digest."""
    whole = hashlib.sha256()
    items = sorted(inputs.model_inputs.items()) + [("labels", inputs.labels)]
    for later in inputs.later:
        items += sorted(later.model_inputs.items()) + [("labels", later.labels)]
    for name, value in items:
        whole.update(name.encode())
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            whole.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
            whole.update(tensor.view(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
        else:
            whole.update(repr(value).encode())
    return whole.hexdigest()


def check_inputs(spec: InputSpec, base_dir: Path) -> None:
    """What can be checked of inputs without making them: an input factory imports and is
    callable (token inputs were checked with the config)."""
    if spec.kind == "factory":
        fn = import_object(str(spec.factory), base_dir, f"{spec.where}: inputs.{spec.name}.factory")
        if not callable(fn):
            raise SourceError(f"{spec.where}: inputs.{spec.name}.factory: {spec.factory!r} is not callable")


def build_inputs(spec: InputSpec, base_dir: Path, steps: int = 1) -> CaseInputs:
    """The inputs of ``steps`` optimizer steps (see the module doc)."""
    if spec.kind == "ids":
        assert spec.input_ids is not None
        mask = None if spec.mask is None else torch.tensor(spec.mask, dtype=torch.long)
        return explicit_inputs(torch.tensor(spec.input_ids, dtype=torch.long), mask, spec.labels)
    if spec.kind == "dataset":
        return _dataset_batches(spec, steps)
    generator = torch.Generator().manual_seed(spec.seed)
    if spec.kind == "tokens":
        batches = [_token_batch(spec, generator) for _ in range(steps)]
        return CaseInputs(batches[0].model_inputs, batches[0].labels, tuple(batches[1:]))
    return _factory_inputs(spec, base_dir, steps)


def _token_batch(spec: InputSpec, generator: torch.Generator) -> CaseInputs:
    ids = torch.randint(0, spec.vocab_size, (spec.batch, spec.seq_len), generator=generator)
    model_inputs: dict[str, Any] = {"input_ids": ids}
    if spec.attention_mask:
        model_inputs["attention_mask"] = torch.ones_like(ids)
    return CaseInputs(model_inputs, ids.clone() if spec.labels else None)


def _dataset_batches(spec: InputSpec, steps: int) -> CaseInputs:
    """``steps`` batches of rows in file order: only the rows they need are read."""
    if spec.path is not None:
        ids = read_rows(
            spec.path, steps * spec.batch, lambda m: CaseError(f"{spec.where}: inputs.{spec.name}: {m}")
        )
    else:
        assert spec.input_ids is not None
        ids = spec.input_ids
    rows = torch.tensor(ids, dtype=torch.long)
    if rows.shape[0] < steps * spec.batch:
        raise CaseError(
            f"{spec.where}: inputs.{spec.name}: {steps} step(s) of batch {spec.batch} need "
            f"{steps * spec.batch} rows, the file has {rows.shape[0]}"
        )
    batches = [
        explicit_inputs(rows[s * spec.batch : (s + 1) * spec.batch], None, spec.labels) for s in range(steps)
    ]
    return CaseInputs(batches[0].model_inputs, batches[0].labels, tuple(batches[1:]))


def _factory_inputs(spec: InputSpec, base_dir: Path, steps: int) -> CaseInputs:
    what = f"{spec.where}: inputs.{spec.name}.factory"
    fn = import_object(str(spec.factory), base_dir, what)
    torch.manual_seed(spec.seed)
    try:
        produced = fn(**dict(spec.kwargs))
    except PrecalignError:
        raise
    except Exception as exc:
        raise SourceError(f"{what}: {spec.factory} raised {type(exc).__name__}: {one_line(exc)}") from None
    if isinstance(produced, Mapping):
        return _factory_batch(spec, produced)
    if not isinstance(produced, Iterable) or isinstance(produced, (str, bytes, torch.Tensor)):
        raise SourceError(
            f"{what}: {spec.factory} returned {type(produced).__name__}, expected a dict of model "
            "kwargs or an iterable of them (one per step)"
        )
    try:
        items = list(itertools.islice(iter(produced), steps))
    except PrecalignError:
        raise
    except Exception as exc:
        raise SourceError(
            f"{what}: {spec.factory}'s batches raised {type(exc).__name__}: {one_line(exc)}"
        ) from None
    batches: list[CaseInputs] = []
    for item in items:
        if not isinstance(item, Mapping):
            raise SourceError(
                f"{what}: batch {len(batches)} of {spec.factory} is {type(item).__name__}, expected a dict of model kwargs"
            )
        batches.append(_factory_batch(spec, item))
    if len(batches) < steps:
        raise CaseError(
            f"{what}: steps {steps} is beyond the data: {spec.factory} gave {len(batches)} batch(es)"
        )
    return CaseInputs(batches[0].model_inputs, batches[0].labels, tuple(batches[1:]))


def _factory_batch(spec: InputSpec, produced: Mapping[str, Any]) -> CaseInputs:
    model_inputs = dict(produced)
    labels: torch.Tensor | None = model_inputs.pop("labels", None)
    if spec.labels and labels is None:
        given_ids = model_inputs.get("input_ids")
        if isinstance(given_ids, torch.Tensor):
            labels = given_ids.clone()
    return CaseInputs(model_inputs, labels)


def explicit_inputs(ids: torch.Tensor, mask: torch.Tensor | None, labels: bool) -> CaseInputs:
    """Given token ids (and 0/1 mask): labels are the ids, with padded positions ignored."""
    model_inputs: dict[str, Any] = {"input_ids": ids}
    if mask is not None:
        model_inputs["attention_mask"] = mask
    if not labels:
        return CaseInputs(model_inputs, None)
    target = ids.clone()
    if mask is not None:
        target[mask == 0] = -100  # cross_entropy's ignore_index
    return CaseInputs(model_inputs, target)


def vocabulary_size(module: torch.nn.Module) -> tuple[str, int] | None:
    """The input embedding's name and row count: the first module with ``num_embeddings``
    (torch's Embedding, Megatron's VocabParallelEmbedding); None when there is none."""
    for name, sub in module.named_modules():
        rows = getattr(sub, "num_embeddings", None)
        if isinstance(rows, int) and not isinstance(rows, bool):
            return name, rows
    return None


def check_token_ids(inputs: CaseInputs, module: torch.nn.Module, model: str, where: str) -> None:
    """Token ids outside the embedding fail inside the model with an IndexError (CPU) or a
    device assert (GPU): name the inputs and the vocabulary instead."""
    ids = inputs.model_inputs.get("input_ids")
    found = vocabulary_size(module)
    if not isinstance(ids, torch.Tensor) or ids.numel() == 0 or ids.is_floating_point() or found is None:
        return
    name, rows = found
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= rows:
        bad = low if low < 0 else high
        raise CaseError(
            f"{where}: token id {bad} is outside model {model!r}'s vocabulary "
            f"({name or 'its embedding'} has {rows} rows: ids 0..{rows - 1})"
        )
