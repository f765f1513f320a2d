"""Record one side of a case, alone: build its model, give it known weights, run it through the
case's phases and return the trace together with the weights it started from.

This is what a stored baseline is made of (``--align-baseline``, ``precalign record``), and
what a candidate is compared with it by. Names are "stored names": the model's own names
mapped through the case's ``stored_layer_mapping`` (if any), so a baseline recorded before a
framework upgrade and a candidate run after it meet name for name.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..config.specs import AlignConfig, CaseSpec
from ..errors import CaseError
from ..mapping.spec import MappingSpec, to_baseline_name
from ..trace.json_fields import field_dict
from ..trace.records import Trace

if TYPE_CHECKING:
    import torch

    from ..mapping.weights import SyncReport
    from ..run.live import LiveCase
    from ..sources import LoadedModel

SIDES = ("candidate", "baseline")


@dataclass(frozen=True)
class WeightsDigest:
    """A checksum of a model's initial parameters, by stored name: the whole (sha256) and each
    parameter (CRC-32), so a changed baseline can say which weights moved."""

    sha256: str
    params: Mapping[str, str]

    def as_dict(self) -> dict[str, Any]:
        return field_dict(self)


@dataclass(frozen=True)
class SideRecording:
    side: str
    trace: Trace  # in stored names
    raw: Trace  # in the model's own names
    weights: Mapping[str, Any]  # stored name -> initial parameter (CPU tensor)
    digest: WeightsDigest
    sync: SyncReport | None
    weights_source: str  # "stored", "synced from <model>", "as built"
    environment: Mapping[str, Any]


def weights_digest(weights: Mapping[str, torch.Tensor]) -> WeightsDigest:
    whole = hashlib.sha256()
    params = {}
    for name in sorted(weights):
        tensor = weights[name].detach().to("cpu").contiguous()
        data = tensor.view(-1).view(dtype=_byte_dtype()).numpy().tobytes() if tensor.numel() else b""
        head = f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode()
        whole.update(head)
        whole.update(data)
        params[name] = f"{zlib.crc32(head + data):08x}"
    return WeightsDigest(whole.hexdigest(), params)


def _byte_dtype() -> torch.dtype:
    import torch

    return torch.uint8


def stored_names(module: torch.nn.Module, rename: MappingSpec | None) -> dict[str, torch.Tensor]:
    """The module's parameters under their stored names (detached CPU copies)."""
    classes = {n: type(m).__name__ for n, m in module.named_modules()}
    out = {}
    for name, param in module.named_parameters():
        out[to_baseline_name(rename, name, classes.get)] = param.detach().to("cpu").clone()
    return out


def record_side(
    config: AlignConfig,
    case: CaseSpec,
    side: str = "candidate",
    *,
    stored_weights: Mapping[str, torch.Tensor] | None = None,
    stored_side: str | None = None,
) -> SideRecording:
    """Run one model of ``case``. Its weights: ``stored_weights`` when given (a baseline's
    weights file, mapped by name: ``stored_layer_mapping`` for a stored candidate, the case's
    ``mapping`` for a stored baseline side), else for the candidate of a case with
    ``weights: {sync: true}`` the baseline model's, synced as in a live run, else as built
    (from the model's seed)."""
    from ..mapping.apply import map_trace
    from ..run.live import live_case

    if side not in SIDES:
        raise CaseError(f"unknown side {side!r} (allowed: {', '.join(SIDES)})")
    if case.dumps is not None:
        raise CaseError(f"case {case.name!r} gates stored dumps; it has no model to record")
    base_spec = config.models[case.models.baseline]
    spec = config.models[case.models.candidate if side == "candidate" else case.models.baseline]
    rename = case.baseline_rename if side == "candidate" else None
    with live_case(config, case, spec) as live:
        model = live.build(spec)
        sync, source = _initial_weights(live, model, side, stored_weights, stored_side)
        weights = stored_names(model.module, rename)
        digest = weights_digest(weights)
        env = live.environment(spec)
        weights_info = {**digest.as_dict(), "source": source}
        manifest = live.manifest(spec, side=side, model=spec.name, weights=weights_info)
        # The live run's seed (the baseline model's), so dropout draws the same numbers.
        trace = live.record(model, spec, manifest, case=replace(case, isolate=False), seed=base_spec.seed)
    del model
    raw = trace
    if rename is not None:
        trace = map_trace(trace, Trace(manifest={}, records=()), rename).trace
    return SideRecording(side, trace, raw, weights, digest, sync, source, env)


def _initial_weights(
    live: LiveCase,
    model: LoadedModel,
    side: str,
    stored_weights: Mapping[str, torch.Tensor] | None,
    stored_side: str | None,
) -> tuple[SyncReport | None, str]:
    """Give the recorded model its starting weights (see ``record_side``); returns the sync
    report and where the weights came from."""
    case = live.case
    rename = case.baseline_rename if side == "candidate" else None
    if stored_weights is not None:
        by = case.mapping if stored_side == "baseline" and side == "candidate" else rename
        sync = live.sync(stored_weights, model.module, by, strict=False)
        return sync, "loaded from the baseline's weights.safetensors"
    if side == "candidate" and case.sync_weights:
        base_spec = live.config.models[case.models.baseline]
        donor = live.build(base_spec)
        sync = live.sync(donor.module, model.module, case.mapping, strict=case.strict_weights)
        return sync, f"synced from {base_spec.name}"
    return None, "as built (seed)"
