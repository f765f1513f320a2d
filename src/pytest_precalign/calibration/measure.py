"""Measure a case's noise floor: its baseline run against perturbed copies of itself.

Each perturbation keeps the baseline's weights and inputs and changes one thing that should
not matter: ``float64`` (the same model and inputs in float64, a reference for the rounding
error of the test dtype), ``attn`` (the other attention kernel, HF ``eager`` <-> ``sdpa``) and
``seed`` (a second run-time seed, meaningful only when the run draws random numbers, i.e.
active dropout). The per-record differences are the floor a tolerance table must admit;
``calibrated_table`` turns them into rules.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..config.specs import AlignConfig, CaseSpec, ModelSpec
from ..errors import CaseError, ConfigError, PrecalignError
from ..run.launch import in_process_twin
from ..run.live import live_case
from ..run.side import run_side
from ..sources import LoadedModel, build_model
from ..sources.inputs import CaseInputs
from ..trace.records import Trace

PERTURBATIONS = ("float64", "attn", "seed")
ATTN_KERNELS = ("eager", "sdpa")


@dataclass(frozen=True)
class Noise:
    """How far one record of the perturbed run is from the baseline run."""

    name: str
    kind: str
    slot: str
    phase: str
    step: int
    call: int
    dtype: str  # the baseline's (test) dtype
    max_abs: float  # max |perturbed - baseline|
    scale: float  # max |baseline|
    rel_l2: float  # ||perturbed - baseline|| / ||baseline|| (0 when the baseline is all zeros)


@dataclass(frozen=True)
class Measurement:
    """One perturbation of one case: what ran (or why not) and the per-record noise."""

    case: str
    perturbation: str
    description: str
    skipped: str  # the reason it did not run; "" when it ran
    noise: tuple[Noise, ...] = ()
    unpaired: int = 0  # records only one side produced (e.g. eager's attention weights)


def parse_perturbations(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in names if p not in PERTURBATIONS]
    if not names or unknown:
        got = repr(unknown[0]) if unknown else "nothing"
        raise ConfigError(
            f"--perturbations: unknown perturbation {got} (allowed: a comma-separated list of "
            f"{', '.join(PERTURBATIONS)})"
        )
    return names


def calibration_cases(config: AlignConfig, names: Sequence[str]) -> tuple[CaseSpec, ...]:
    """The cases to calibrate: those named, else every case that runs models, minus those
    another case covers (same baseline, inputs, loss and mode, a subset of its phases)."""
    if names:
        cases = tuple(config.case(n) for n in names)
        for case in cases:
            if case.dumps is not None:
                raise ConfigError(
                    f"{config.path}: case {case.name!r} compares stored dumps; calibrate needs a "
                    "case that runs models (baseline: a model name)"
                )
        return cases
    runnable = [c for c in config.cases if c.dumps is None]
    if not runnable:
        raise ConfigError(f"{config.path}: no case runs models (every case compares stored dumps)")
    kept: list[CaseSpec] = []
    for case in sorted(runnable, key=lambda c: -len(c.phases)):
        if not any(_covers(other, case) for other in kept):
            kept.append(case)
    order = {c.name: i for i, c in enumerate(config.cases)}
    return tuple(sorted(kept, key=lambda c: order[c.name]))


def _covers(a: CaseSpec, b: CaseSpec) -> bool:
    """Case ``a`` runs everything ``b``'s baseline would: calibrating ``b`` too adds nothing."""

    def key(c: CaseSpec) -> tuple[object, ...]:
        step = c.training.optimizer if "step" in b.phases else None
        return (
            c.models.baseline,
            c.inputs,
            c.training.loss,
            c.training.train,
            c.steps,
            c.record.include,
            c.record.exclude,
            step,
        )

    return key(a) == key(b) and set(b.phases) <= set(a.phases)


@dataclass(frozen=True)
class Variant:
    """A perturbed copy of the baseline, ready to run (``model`` None: skipped, ``skipped`` says why)."""

    description: str
    model: LoadedModel | None = None
    skipped: str = ""
    seed: int = 0
    float64_inputs: bool = False


def measure_case(config: AlignConfig, case: CaseSpec, perturbations: Sequence[str]) -> list[Measurement]:
    """Run the case's baseline once as configured and once per perturbation; same weights."""
    spec = in_process_twin(config.models[case.models.baseline])
    # Full tensors are needed to measure element-wise noise, and module inputs to measure
    # amplification, whatever the case records.
    case = replace(case, record=replace(case.record, mode="tensor", inputs=True))
    out: list[Measurement] = []
    with live_case(config, case, spec) as live:
        inputs = live.inputs
        assert inputs is not None
        base = live.build(spec)
        manifest = live.manifest(spec)
        # Perturbed copies are made before the baseline runs: an optimizer step changes its weights.
        variants = [_variant(name, spec, base, case, config) for name in perturbations]
        reference = run_side(base, inputs, case, {**manifest, "side": "baseline"}, spec.seed)
        for name, variant in zip(perturbations, variants, strict=True):
            description = variant.description
            if variant.model is None:
                out.append(Measurement(case.name, name, description, variant.skipped))
                continue
            data = _float64_inputs(inputs) if variant.float64_inputs else inputs
            try:
                trace = run_side(variant.model, data, case, {**manifest, "side": name}, variant.seed)
            except PrecalignError:
                raise
            except Exception as exc:  # the perturbed model cannot run: a usage error, said once
                raise CaseError(
                    f"case {case.name!r}: perturbation {name!r} ({description}) failed: "
                    f"{type(exc).__name__}: {' '.join(str(exc).split())}"
                ) from None
            noise, unpaired = record_noise(reference, trace)
            out.append(Measurement(case.name, name, description, "", noise, unpaired))
            del variant, trace
    return out


def _variant(name: str, spec: ModelSpec, base: LoadedModel, case: CaseSpec, config: AlignConfig) -> Variant:
    if name == "float64":
        description = f"the same weights and inputs in float64 vs the {spec.dtype} run"
        if spec.dtype == "float64":
            return Variant(description, skipped="the test dtype is already float64")
        module = copy.deepcopy(base.module).to(torch.float64)
        model = replace(base, name=f"{base.name}@float64", module=module)
        return Variant(description, model, seed=spec.seed, float64_inputs=True)
    if name == "attn":
        current = _attn_kernel(base.module)
        if spec.source != "hf" or current not in ATTN_KERNELS:
            why = (
                f"source {spec.source!r} has no attention-kernel switch"
                if spec.source != "hf"
                else f"attention kernel {current!r} has no alternative here (eager <-> sdpa)"
            )
            return Variant("another attention kernel", skipped=why)
        other = ATTN_KERNELS[1 - ATTN_KERNELS.index(current)]
        alt = build_model(
            replace(spec, options={**spec.options, "attn_implementation": other}), config.base_dir
        )
        alt.module.load_state_dict(base.module.state_dict())
        description = f"attn_implementation {other} vs {current}, same weights"
        return Variant(description, replace(alt, name=f"{base.name}@{other}"), seed=spec.seed)
    description = f"run-time seed {spec.seed + 1} vs {spec.seed}, same weights"
    dropout = _active_dropout(base.module, case.training.train)
    if not dropout:
        reason = (
            "no active dropout (train: false)"
            if not case.training.train
            else "dropout-free model (every dropout probability is 0)"
        )
        why = f"{reason}: the run draws no random numbers, so a second seed reproduces it bit for bit"
        return Variant(description, skipped=why)
    model = replace(base, module=copy.deepcopy(base.module))
    return Variant(f"{description} ({dropout})", model, seed=spec.seed + 1)


def _attn_kernel(module: torch.nn.Module) -> str | None:
    config = getattr(module, "config", None)
    kernel = getattr(config, "_attn_implementation", None)
    return kernel if isinstance(kernel, str) else None


def _active_dropout(module: torch.nn.Module, train: bool) -> str:
    """What draws random numbers in training mode ("" when nothing does)."""
    if not train:
        return ""
    for name, sub in module.named_modules():
        p = getattr(sub, "p", None)
        if isinstance(sub, torch.nn.modules.dropout._DropoutNd) and isinstance(p, float) and p > 0:
            return f"dropout p={p} at {name}"
    config = getattr(module, "config", None)
    to_dict = getattr(config, "to_dict", None)
    fields: Mapping[str, Any] = to_dict() if callable(to_dict) else {}
    for key, value in fields.items():
        if "dropout" in key and isinstance(value, (int, float)) and value > 0:
            return f"config {key}={value}"
    return ""


def _float64_inputs(inputs: CaseInputs) -> CaseInputs:
    cast = {
        k: v.to(torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in inputs.model_inputs.items()
    }
    return CaseInputs(cast, inputs.labels)


def record_noise(reference: Trace, perturbed: Trace) -> tuple[tuple[Noise, ...], int]:
    """Per floating-point record present on both sides with the same shape: the noise."""
    other = perturbed.by_id()
    out: list[Noise] = []
    unpaired = 0
    for rec in reference.records:
        peer = other.get(rec.id)
        a = reference.tensor(rec)
        b = perturbed.tensor(peer) if peer is not None else None
        if peer is None or a is None or b is None or a.shape != b.shape:
            unpaired += 1
            continue
        if not a.is_floating_point():
            continue
        a64, b64 = a.detach().to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
        if a64.numel() == 0:
            continue
        # Elements beyond the test dtype's range (float64 masks use -1.8e308 where float32
        # ones use -3.4e38 as "minus infinity") carry no rounding noise: left out.
        top = torch.finfo(a.dtype).max
        kept = torch.isfinite(a64) & torch.isfinite(b64) & (b64.abs() <= top)
        diff = torch.where(kept, (b64 - a64).abs(), 0.0)
        base = torch.where(kept, a64, 0.0)
        max_abs = float(diff.max())
        scale = float(base.abs().max())
        norm = float(torch.linalg.vector_norm(base))
        rel = float(torch.linalg.vector_norm(diff)) / norm if norm > 0 else 0.0
        out.append(
            Noise(rec.name, rec.kind, rec.slot, rec.phase, rec.step, rec.call, rec.dtype, max_abs, scale, rel)
        )
    known = reference.by_id()
    unpaired += sum(1 for r in perturbed.records if r.id not in known)
    return tuple(out), unpaired
