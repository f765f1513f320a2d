"""The object behind the ``align_runner`` fixture: run cases or module pairs from Python tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .compare.tolerances import ToleranceTable, default_table, parse_rule
from .config.specs import AlignConfig, RecordSpec
from .errors import AlignmentMismatch, ConfigError
from .reports.text import PhaseReport, failure_message
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

    @classmethod
    def from_marker(cls, config: AlignConfig | None, marker: Any, nodeid: str) -> AlignRunner:
        kwargs: Mapping[str, Any] = marker.kwargs if marker is not None else {}
        unknown = [k for k in kwargs if k not in _MARKER_KEYS]
        if unknown:
            raise ConfigError(
                f"{nodeid}: @pytest.mark.align got unknown argument {unknown[0]!r} "
                f"(allowed: {', '.join(_MARKER_KEYS)})"
            )
        table = default_table()
        wanted = kwargs.get("tolerances")
        if isinstance(wanted, str):
            if config is None or wanted not in config.tolerances:
                known = ", ".join(config.tolerances) if config else "no --align-config given"
                raise ConfigError(
                    f"{nodeid}: @pytest.mark.align(tolerances={wanted!r}): unknown table (known: {known})"
                )
            table = config.tolerances[wanted]
        elif isinstance(wanted, list):
            table = ToleranceTable(
                name="marker",
                rules=tuple(
                    parse_rule(Reader(r, nodeid, f"align.tolerances[{i}]")) for i, r in enumerate(wanted)
                ),
            )
        elif wanted is not None:
            raise ConfigError(
                f"{nodeid}: @pytest.mark.align(tolerances=...): expected a table name or a list of rules"
            )
        phases = tuple(kwargs.get("phases") or ("forward",))
        record = RecordSpec(mode=str(kwargs.get("record") or "tensor"))
        return cls(config=config, tolerances=table, phases=phases, record=record, nodeid=nodeid)

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
        """Raise ``AlignmentMismatch`` (an AssertionError) naming the first divergent layer."""
        __tracebackhide__ = True
        for name in (phase,) if phase else run.phases:
            verdict = run.verdicts[name]
            if not verdict.passed:
                report = PhaseReport(
                    config=self.nodeid,
                    case=run.name,
                    phase=name,
                    verdict=verdict,
                    baseline="baseline",
                    candidate="candidate",
                    table=run.table,
                    reproduce=f'pytest "{self.nodeid}"',
                    seconds=run.seconds,
                )
                raise AlignmentMismatch(failure_message(report))
