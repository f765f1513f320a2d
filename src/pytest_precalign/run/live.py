"""The live-case context: what every run of a case's models does around them, written once.

Determinism flags, each model source's runtime, models built in this process (a
tensor-parallel model as its TP=1 twin, whose ranks run elsewhere), weight sync, the run
environment and manifest, and a side recorded in this process or across ranks. Used by live
cases (``run.case``), the divergence search, stored-baseline recording and calibration::

    with live_case(config, case, base_spec, cand_spec) as live:
        baseline, candidate, sync = live.build_synced(base_spec, cand_spec)
        trace = live.record(baseline, base_spec, live.manifest(base_spec, side="baseline"))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from ..compare.tolerances import default_table
from ..config.specs import AlignConfig, CaseSpec, ModelSpec
from ..mapping.weights import SyncReport, sync_weights
from ..recording import HookRecorder
from ..recording.determinism import deterministic, environment
from ..sources import LoadedModel, build_model, runtime
from ..sources.inputs import CaseInputs, build_inputs, inputs_digest
from ..trace.records import Trace
from ..training.golden import GoldenJudge, golden_judge
from .launch import in_process_twin, is_launched, run_launched
from .side import run_side


def case_where(config: AlignConfig, case: CaseSpec) -> str:
    """The prefix of a case's messages: ``<config>: case '<name>': ``."""
    return f"{config.path}: case {case.name!r}: "


@dataclass
class LiveCase:
    """A case's models inside their contexts (see ``live_case``)."""

    config: AlignConfig
    case: CaseSpec
    flags: dict[str, Any]  # the determinism flags in force, for the manifest
    inputs: CaseInputs | None  # the case's inputs (None: the caller makes its own)
    _stack: ExitStack
    _entered: set[str] = field(default_factory=set)

    @property
    def where(self) -> str:
        return case_where(self.config, self.case)

    def enter(self, spec: ModelSpec) -> None:
        """Enter the source runtime of ``spec`` (once per model) until the context ends."""
        if spec.name not in self._entered:
            self._entered.add(spec.name)
            self._stack.enter_context(runtime(in_process_twin(spec)))

    def build(self, spec: ModelSpec) -> LoadedModel:
        self.enter(spec)
        return build_model(in_process_twin(spec), self.config.base_dir)

    def sync(self, donor: Any, receiver: Any, mapping: Any, *, strict: bool) -> SyncReport:
        """Weights of ``donor`` into ``receiver`` (modules, or a name -> tensor mapping)."""
        where = self.where
        return sync_weights(donor, receiver, mapping, strict=strict, context=lambda: where)

    def build_synced(
        self, base_spec: ModelSpec, cand_spec: ModelSpec
    ) -> tuple[LoadedModel, LoadedModel, SyncReport | None]:
        """Both models, the baseline's weights synced into the candidate when the case asks."""
        baseline, candidate = self.build(base_spec), self.build(cand_spec)
        sync = None
        if self.case.sync_weights:
            sync = self.sync(
                baseline.module, candidate.module, self.case.mapping, strict=self.case.strict_weights
            )
        return baseline, candidate, sync

    def environment(self, spec: ModelSpec) -> dict[str, Any]:
        return environment(spec.device, spec.dtype, spec.seed, self.flags)

    def manifest(self, spec: ModelSpec, **extra: Any) -> dict[str, Any]:
        """The run's environment, the config digest and the case name, then ``extra``."""
        settings = {
            "phases": list(self.case.phases),
            "steps": self.case.steps,
            "loss": self.case.training.loss,
            "train": self.case.training.train,
            "optimizer": {
                k: v if not isinstance(v, tuple) else list(v)
                for k, v in asdict(self.case.training.optimizer).items()
            },
            "record": self.case.record.mode,
        }
        digest = {} if self.inputs is None else {"inputs_digest": inputs_digest(self.inputs)}
        return {
            **self.environment(spec),
            "config_digest": self.config.digest,
            "case": self.case.name,
            "case_settings": settings,
            **digest,
            **extra,
        }

    def record(
        self,
        model: LoadedModel,
        spec: ModelSpec,
        manifest: Mapping[str, Any],
        after_first_forward: Callable[[HookRecorder], None] | None = None,
        *,
        inputs: CaseInputs | None = None,
        case: CaseSpec | None = None,
        seed: int | None = None,
    ) -> Trace:
        """One side through the case's phases: in this process, or across its launched
        ranks (each loading its shard of ``model``'s weights)."""
        if model.cast:  # say in the manifest what building did to the model's dtypes
            manifest = {**manifest, "dtypes": model.cast}
        data = self.inputs if inputs is None else inputs
        assert data is not None, "live_case(..., with_inputs=False): pass inputs="
        case = self.case if case is None else case
        seed = spec.seed if seed is None else seed
        if not is_launched(spec):
            golden = self._golden(case, manifest)
            return run_side(model, data, case, manifest, seed, after_first_forward, golden=golden)
        full = {n: p.detach() for n, p in model.module.named_parameters()}
        return run_launched(spec, self.config.base_dir, case, data, full, manifest, seed)

    def _golden(self, case: CaseSpec, manifest: Mapping[str, Any]) -> GoldenJudge | None:
        """``record: {golden: PATH}``: the case's candidate is compared with the golden run
        while it is recorded, under the case's tolerance table (see ``live_compare``)."""
        if case.record.golden is None or manifest.get("side") != "candidate":
            return None
        table = self.config.tolerances[case.tolerances] if case.tolerances else default_table()
        return golden_judge(case.record.golden, 0, 0, table)


@contextmanager
def live_case(
    config: AlignConfig, case: CaseSpec, *specs: ModelSpec, with_inputs: bool = True
) -> Iterator[LiveCase]:
    """The case's inputs built (unless ``with_inputs`` is False), then determinism on and the
    runtimes of ``specs`` entered (in order), while inside."""
    steps = case.steps if "backward" in case.phases else 1  # a batch per optimizer step
    inputs = build_inputs(config.inputs[case.inputs], config.base_dir, steps) if with_inputs else None
    with ExitStack() as stack:
        flags = stack.enter_context(deterministic(config.defaults.deterministic))
        live = LiveCase(config, case, flags, inputs, stack)
        for spec in specs:
            live.enter(spec)
        yield live
