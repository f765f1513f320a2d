"""Two checkpoints compared tensor by tensor through a mapping (like msprobe's checkpoint
compare): names missing on either side, shape mismatches and values not close."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.model_weights import WEIGHT_FORMATS
from ..errors import SourceError
from ..mapping.spec import MappingSpec, to_baseline_name
from ..mapping.transforms import apply_forward, apply_inverse
from ..mapping.weights import expand_rule

if TYPE_CHECKING:
    import torch

FORMATS = WEIGHT_FORMATS


@dataclass
class CheckpointDiff:
    compared: int = 0
    only_first: list[str] = field(default_factory=list)
    only_second: list[str] = field(default_factory=list)
    mismatches: list[tuple[str, str]] = field(default_factory=list)  # (second's name, message)

    @property
    def aligned(self) -> bool:
        return self.compared > 0 and not (self.only_first or self.only_second or self.mismatches)

    def lines(self) -> list[str]:
        out = [f"check-weights: {self.compared} tensor(s) compared"]
        out += [f"MISMATCH {name}: {message}" for name, message in self.mismatches]
        out += [f"MISSING in second: {name}" for name in self.only_first]
        out += [f"MISSING in first: {name}" for name in self.only_second]
        if self.compared == 0:
            out.append("NOTHING COMPARED: no tensor found a partner (fail closed)")
        out.append("ALIGNED" if self.aligned else "DIFFERS")
        return out


def detect_format(path: Path) -> str:
    if (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file():
        return "hf"
    if any(path.glob("iter_*")) or any(path.glob("mp_rank_*")) or (path / "release").is_dir():
        return "megatron"
    if (path / "metadata.json").is_file():
        return "megatron-dist"
    raise SourceError(
        f"{path}: not a checkpoint folder; allowed formats: hf (model.safetensors[.index.json]), "
        "megatron (iter_*/mp_rank_XX[_YYY]/model_optim_rng.pt), megatron-dist (metadata.json, *.distcp)"
    )


def load_checkpoint(path: Path, fmt: str | None = None, *, trust: bool = False) -> dict[str, torch.Tensor]:
    """Read-only: the tensors of a checkpoint folder by name. Pickled files in it are fully
    unpickled only when the user said to ``trust`` the checkpoint (``trust.py``)."""
    if not path.is_dir():
        raise SourceError(f"{path}: no such checkpoint folder")
    fmt = fmt or detect_format(path)
    if fmt == "hf":
        from .hf import load_hf

        return load_hf(path)
    if fmt == "megatron":
        from .megatron_legacy import load_megatron_legacy

        return load_megatron_legacy(path, trust)
    if fmt == "megatron-dist":
        from .megatron_dist import load_megatron_dist

        return load_megatron_dist(path, trust)
    raise SourceError(f"{path}: format {fmt!r} not supported (allowed: {', '.join(FORMATS)})")


def _close(expected: torch.Tensor, actual: torch.Tensor) -> str | None:
    import torch

    if tuple(expected.shape) != tuple(actual.shape):
        return f"shape mismatch: {tuple(actual.shape)} vs expected {tuple(expected.shape)}"
    try:
        torch.testing.assert_close(actual, expected.to(actual.dtype), check_device=False)
    except AssertionError as exc:
        return " ".join(str(exc).split())
    return None


def compare_checkpoints(
    first: Mapping[str, torch.Tensor],
    second: Mapping[str, torch.Tensor],
    mapping: MappingSpec | None = None,
) -> CheckpointDiff:
    """``first`` is the baseline side of the mapping (e.g. HF), ``second`` the candidate side."""
    diff = CheckpointDiff()
    used: set[str] = set()
    done: set[str] = set()
    for rule in mapping.tensors if mapping else ():
        for base_names, cand_names in expand_rule(rule, first):
            if not all(n in first for n in base_names) or not all(n in second for n in cand_names):
                continue
            shapes = [tuple(second[n].shape) for n in cand_names]
            inputs = [first[n] for n in base_names]
            try:
                outs = (
                    apply_inverse(rule.ops, inputs, shapes)
                    if rule.reversed
                    else apply_forward(rule.ops, inputs)
                )
            except (RuntimeError, ValueError, IndexError) as exc:
                diff.mismatches.append((cand_names[0], f"transform does not fit ({exc})"))
                outs = []
            for name, value in zip(cand_names, outs, strict=False):
                message = _close(value, second[name])
                if message:
                    diff.mismatches.append((name, f"{message} (from {'+'.join(base_names)})"))
                diff.compared += 1
            used.update(base_names)
            done.update(cand_names)
    for name, tensor in second.items():
        if name in done:
            continue
        base = to_baseline_name(mapping, name)
        if base not in first:
            diff.only_second.append(name)
            continue
        used.add(base)
        message = _close(first[base], tensor)
        if message:
            diff.mismatches.append((name, message))
        diff.compared += 1
    diff.only_first = [n for n in first if n not in used]
    return diff
