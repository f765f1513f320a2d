"""The object behind the ``align_runner`` fixture: run cases or module pairs from Python tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .compare.tolerances import ToleranceTable, default_table, parse_rule
from .config.specs import AlignConfig, RecordSpec
from .errors import ConfigError
from .reports.text import PhaseReport, failure_message
from .run.outcome import ItemOutcome
from .vocabulary import MODES, PHASES
from .yaml_reader import Reader

if TYPE_CHECKING:
    import torch

    from .mapping.spec import MappingSpec
    from .run.case import CaseRun
    from .vocabulary import Phase

_MARKER_KEYS = ("tolerances", "phases", "record")


@dataclass(frozen=True)
class AlignRunner:
    config: AlignConfig | None
    tolerances: ToleranceTable
    phases: tuple[str, ...]
    record: RecordSpec
    nodeid: str
    fail: Callable[[ItemOutcome], None]  # raises the item's failure (the plugin's)

    @classmethod
    def from_marker(
        cls, config: AlignConfig | None, marker: Any, nodeid: str, fail: Callable[[ItemOutcome], None]
    ) -> AlignRunner:
        """The runner a test's ``@pytest.mark.align(...)`` asks for; ``ConfigError`` naming
        the marker, the argument and its allowed values when one is wrong."""
        kwargs: Mapping[str, Any] = marker.kwargs if marker is not None else {}
        unknown = [k for k in kwargs if k not in _MARKER_KEYS]
        if unknown:
            raise ConfigError(
                f"{nodeid}: @pytest.mark.align got unknown argument {unknown[0]!r} "
                f"(allowed: {', '.join(_MARKER_KEYS)})"
            )
        table = _marker_table(config, kwargs.get("tolerances"), nodeid)
        phases = _marker_phases(kwargs.get("phases"), nodeid)
        record = kwargs.get("record")
        if record is not None and record not in MODES:
            raise ConfigError(
                f"{nodeid}: @pytest.mark.align(record={record!r}): unknown record mode "
                f"(allowed: {', '.join(MODES)})"
            )
        return cls(config, table, phases, RecordSpec(mode=str(record or "tensor")), nodeid, fail)

    def run(self, case: str) -> CaseRun:
        """Run a case of the ``--align-config`` by name."""
        from .run.case import run_case

        if self.config is None:
            raise ConfigError("align_runner.run needs --align-config")
        return run_case(self.config, self.config.case(case))

    def check(
        self,
        baseline: torch.nn.Module,
        candidate: torch.nn.Module,
        inputs: Mapping[str, Any],
        *,
        labels: torch.Tensor | None = None,
        phases: Sequence[str] | None = None,
        mapping: MappingSpec | None = None,
        sync_weights: bool = False,
        steps: int = 1,
    ) -> CaseRun:
        """Record both modules on the same inputs and compare them."""
        from .run.case import check_modules

        return check_modules(
            baseline,
            candidate,
            inputs,
            phases=tuple(phases or self.phases),
            labels=labels,
            table=self.tolerances,
            mapping=mapping,
            sync_weights_first=sync_weights,
            record=self.record,
            steps=steps,
            name=self.nodeid,
        )

    def assert_aligned(self, run: CaseRun, phase: Phase | None = None) -> None:
        """Fail the test (``AlignmentMismatch``, an AssertionError) naming the first divergent layer."""
        __tracebackhide__ = True
        for name in (phase,) if phase else run.phases:
            report = PhaseReport.of_run(
                run,
                name,
                defined_in=self.nodeid,
                baseline="baseline",
                candidate="candidate",
                reproduce=f'pytest "{self.nodeid}"',
            )
            if not report.verdict.passed:
                self.fail(ItemOutcome(report.nodeid_name, passed=False, message=failure_message(report)))


def _marker_table(config: AlignConfig | None, wanted: Any, nodeid: str) -> ToleranceTable:
    if wanted is None:
        return default_table()
    if isinstance(wanted, str):
        if config is None or wanted not in config.tolerances:
            known = ", ".join(config.tolerances) if config else "no --align-config given"
            raise ConfigError(
                f"{nodeid}: @pytest.mark.align(tolerances={wanted!r}): unknown table (known: {known})"
            )
        return config.tolerances[wanted]
    if isinstance(wanted, list):
        rules = tuple(parse_rule(Reader(r, nodeid, f"align.tolerances[{i}]")) for i, r in enumerate(wanted))
        return ToleranceTable(name="marker", rules=rules)
    raise ConfigError(
        f"{nodeid}: @pytest.mark.align(tolerances=...): expected a table name or a list of rules"
    )


def _marker_phases(wanted: Any, nodeid: str) -> tuple[str, ...]:
    if not wanted:
        return ("forward",)
    allowed = ", ".join(PHASES)
    if not isinstance(wanted, (list, tuple)):
        raise ConfigError(
            f"{nodeid}: @pytest.mark.align(phases={wanted!r}): expected a list of phases (allowed: {allowed})"
        )
    for phase in wanted:
        if phase not in PHASES:
            raise ConfigError(
                f"{nodeid}: @pytest.mark.align(phases={list(wanted)!r}): unknown phase {phase!r} "
                f"(allowed: {allowed})"
            )
    return tuple(wanted)
