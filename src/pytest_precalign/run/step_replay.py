"""Drill-down by replay: a failing training run's first divergent step ``k`` replayed on both
sides from the same state, with every layer recorded, to name its origin.

Each side is built afresh exactly as the case builds it (``live.build_synced``) and trained by
its own machinery through steps ``0..k-1`` without recording, so its scheduler position, data
order, counters and any patch state are where the run had them at step ``k``. At the boundary
(``step_boundary``) the baseline's state after step ``k - 1`` is captured (parameters, the
optimizer's per-parameter state, the RNG) and loaded into both sides: into the candidate
through the case's mapping, each per-parameter state tensor transformed as ``sync_weights``
transforms the parameters. Step ``k`` then runs on both sides in tensor mode and ``finish``
judges it: a layer (forward or backward), the grad reduction, clipping, the schedule (the
candidate's own scheduler gives another LR on equal state) or the optimizer update. The case
is then judged again with what the replay found (``outcome.judged_again``; the story is the
verdict's, ``verdict.replay_finding``).

Replayed: sides trained in this process by the tool's loop, a ``transformers.Trainer`` (a
callback loads the state where step ``k`` begins) or megatron-core's stack (the torch optimizer
inside its ``FP32Optimizer``). Not replayed (one line saying why and what to record instead):
stored runs, launched sides, an optimizer stepping on copies of the parameters, a divergence
of the initial weights; ``replay: false`` turns the replay off.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..compare.tolerances import ToleranceTable, default_table
from ..config.specs import AlignConfig, CaseSpec
from ..errors import CaseError
from ..mapping.weights import sync_weights
from ..reports.training_evidence_text import finding_text
from ..trace.records import Trace
from ..verdict.replay_finding import NotReplayed, Replay, ReplayFinding, StepMatched
from ..verdict.training_run import TrainingVerdict
from .launch import is_launched
from .live import live_case
from .outcome import CaseRun, FinishInputs, finish, judged_again
from .side import run_side
from .step_boundary import Boundary


class ReplayUnavailable(Exception):
    """The replay cannot load one side's state into the other (the reason is the message)."""


def with_replay(config: AlignConfig, case: CaseSpec, run: CaseRun) -> CaseRun:
    """``run`` judged again with the replay of its first divergent step told (unchanged when
    nothing to replay)."""
    step = run.to_replay
    if not case.training.replay or step is None or run.training is None:
        return run
    return judged_again(run, _replayed(config, case, run.training, step))


def _replayed(config: AlignConfig, case: CaseSpec, verdict: TrainingVerdict, step: int) -> Replay:
    """What replaying ``step`` found, or why it was not replayed."""
    why = not_replayable(config, case, verdict)
    if why is not None:
        return NotReplayed(why)
    try:
        with torch.random.fork_rng(devices=[]):  # the process's RNG as the run left it
            return replay_step(config, case, step)
    except (ReplayUnavailable, CaseError) as exc:
        return NotReplayed(str(exc))
    except Exception as exc:  # noqa: BLE001 - the run's verdict stands; the replay says why it stopped
        return NotReplayed(f"the replay raised {type(exc).__name__}: {exc}")


def not_replayable(config: AlignConfig, case: CaseSpec, verdict: TrainingVerdict) -> str | None:
    """Why the case's sides cannot be replayed here (None: they can)."""
    if case.dumps is not None:
        return "the sides are stored runs, not models this process can train"
    assert verdict.first is not None
    if verdict.first.what == "weights":
        return "the initial weights differ, and a replay from equal state would hide that"
    for side, name in (("baseline", case.models.baseline), ("candidate", case.models.candidate)):
        spec = config.models[name]
        if is_launched(spec):
            return f"the {side} ({name}) runs launched under torchrun, not in this process"
    return None


def replay_step(
    config: AlignConfig, case: CaseSpec, step: int, carrier: StateCarrier | None = None
) -> ReplayFinding:
    """Replay ``step`` of ``case`` from the baseline's state after ``step - 1`` (module doc);
    ``carrier``: the state's carrier (default: a new one)."""
    base_spec, cand_spec = config.models[case.models.baseline], config.models[case.models.candidate]
    rcase = replace(case, record=replace(case.record, mode="tensor", golden=None), expect=None, isolate=False)
    if carrier is None:
        carrier = StateCarrier(rcase, lambda: f"{config.path}: case {case.name!r}: replay of step {step}: ")
    with live_case(config, rcase, base_spec, cand_spec) as live:
        baseline, candidate, sync = live.build_synced(base_spec, cand_spec)
        assert live.inputs is not None
        env = live.environment(base_spec)
        traces = []
        for side, loaded, spec, boundary in (
            ("baseline", baseline, base_spec, Boundary(step, carrier.capture)),
            ("candidate", candidate, cand_spec, Boundary(step, carrier.load)),
        ):
            manifest = live.manifest(spec, side=side, model=spec.name, replay={"step": step})
            trace = run_side(loaded, live.inputs, rcase, manifest, base_spec.seed, boundary=boundary)
            traces.append(_only_step(trace, step))
    del baseline, candidate
    run = finish(
        replace(
            FinishInputs.of_case(rcase, (traces[0], traces[1]), _table(config, case), 0.0),
            sync=sync,
            environment=env,
            check_mapping=False,
        )
    )
    return _finding(run, step, carrier.starts)


def _table(config: AlignConfig, case: CaseSpec) -> ToleranceTable:
    """The case's table (``run.case.case_table``'s rule)."""
    return config.tolerances[case.tolerances] if case.tolerances else default_table()


def _only_step(trace: Trace, step: int) -> Trace:
    """The trace with the scalars of ``step`` only, and no initial parameters (the replay's
    sides start from the loaded state, not from step 0's)."""
    run = trace.run
    only = {s: v for s, v in run.scalars.items() if s == step}
    return trace.with_run(replace(run, scalars=only, initial_params=None))


def _finding(run: CaseRun, step: int, starts: Mapping[str, Mapping[str, str]]) -> ReplayFinding:
    training = run.training
    first = training.first if training is not None else None
    if first is not None:
        return ReplayFinding(step, first.origin, first.what, first.evidence, starts)
    if training is not None and training.findings:
        raise ReplayUnavailable(f"the replay's runs do not line up: {finding_text(training.findings[0])}")
    compared = sum(v.compared for v in run.verdicts.values())
    if not compared:
        raise ReplayUnavailable(f"the replay of step {step} compared nothing")
    return ReplayFinding(step, "", "none", StepMatched(step, compared), starts)


@dataclass
class StateCarrier:
    """The baseline's state at the boundary, captured on the baseline and loaded into the
    candidate through the case's mapping; ``starts``: each side's parameters' digests there."""

    case: CaseSpec
    where: Any  # () -> the message prefix
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    state: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # key -> name -> tensor
    steps: set[float] = field(default_factory=set)
    rng: torch.Tensor | None = None
    starts: dict[str, dict[str, str]] = field(default_factory=dict)
    keep: bool = False  # keep the candidate's loaded parameters and state in ``kept`` (tests)
    kept: dict[str, torch.Tensor] = field(default_factory=dict)  # "<key>:<name>" -> tensor

    def capture(self, module: torch.nn.Module, optimizer: Any) -> None:
        named = dict(module.named_parameters())
        self.params = {n: p.detach().clone() for n, p in named.items()}
        for name, param in named.items():
            held = optimizer.state.get(param, {}) if optimizer is not None else {}
            for key, value in held.items():
                if key == "step":
                    self.steps.add(float(value))
                elif isinstance(value, torch.Tensor) and value.shape == param.shape:
                    self.state.setdefault(key, {})[name] = value.detach().clone()
                else:
                    raise ReplayUnavailable(
                        f"the baseline's optimizer state {key!r} of {name} is not per element"
                    )
        if len(self.steps) > 1:
            raise ReplayUnavailable(
                f"the baseline's parameters are at different optimizer steps {sorted(self.steps)}"
            )
        self.rng = torch.get_rng_state()
        self.starts["baseline"] = digests(module)

    def load(self, module: torch.nn.Module, optimizer: Any) -> None:
        strict = self.case.strict_weights
        report = sync_weights(self.params, module, self.case.mapping, strict=strict, context=self.where)
        if report.unsynced:  # weights: {strict: false}: the sides would not start equal
            raise ReplayUnavailable(
                f"{len(report.unsynced)} candidate parameter(s) have no baseline source "
                f"({', '.join(report.unsynced[:3])}): the sides would not start from equal state"
            )
        if optimizer is not None:
            self._load_state(module, optimizer)
        if self.rng is not None:
            torch.set_rng_state(self.rng)
        self.starts["candidate"] = digests(module)
        if self.keep:
            for name, param in module.named_parameters():
                self.kept[f"param:{name}"] = param.detach().clone()
                held = optimizer.state.get(param, {}) if optimizer is not None else {}
                self.kept.update({f"{k}:{name}": v.detach().clone() for k, v in held.items()})

    def _load_state(self, module: torch.nn.Module, optimizer: Any) -> None:
        named = dict(module.named_parameters())
        held = {n: optimizer.state.get(p, {}) for n, p in named.items()}
        keys = {k for s in held.values() for k in s if k != "step"}
        if keys != set(self.state):
            raise ReplayUnavailable(
                f"the optimizers keep different state (baseline {sorted(self.state)}, candidate {sorted(keys)})"
            )
        for key, by_name in self.state.items():
            source = {n: by_name.get(n, torch.zeros_like(p)) for n, p in self.params.items()}
            _sync_state(source, module, {n: s.get(key) for n, s in held.items()}, self.case, self.where)
        for state in held.values():
            if "step" in state and self.steps:
                value = next(iter(self.steps))
                if isinstance(state["step"], torch.Tensor):
                    state["step"].fill_(value)
                else:
                    state["step"] = type(state["step"])(value)


def _sync_state(
    source: Mapping[str, torch.Tensor],
    module: torch.nn.Module,
    targets: Mapping[str, torch.Tensor | None],
    case: CaseSpec,
    where: Any,
) -> None:
    """``source`` (per-parameter state in the baseline's names) into ``targets`` (the
    candidate's, by its parameter names) by ``sync_weights`` itself: each parameter's data is
    swapped for its state tensor while the mapping copies into it, then put back."""
    named = dict(module.named_parameters())
    saved = {n: p.data for n, p in named.items()}
    try:
        for name, param in named.items():
            target = targets.get(name)
            param.data = target if target is not None else torch.empty_like(saved[name])
        sync_weights(source, module, case.mapping, strict=case.strict_weights, context=where)
    except CaseError as exc:
        raise ReplayUnavailable(f"the optimizer state does not map: {exc}") from None
    finally:
        for name, param in named.items():
            param.data = saved[name]


def digests(module: torch.nn.Module) -> dict[str, str]:
    """Each parameter's bytes' SHA-1, by name (equal digests: bitwise equal tensors)."""
    out = {}
    for name, param in module.named_parameters():
        data = param.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        out[name] = hashlib.sha1(data, usedforsecurity=False).hexdigest()
    return out
