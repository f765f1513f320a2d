"""The object behind the ``align_runner`` fixture: run cases or module pairs from Python tests.

``check`` fails the test on a divergence (it is the assertion, as in pytest-regressions);
``compare`` returns the run and asserts nothing; ``assert_aligned`` asserts a run."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec

from .compare.tolerances import ToleranceTable, load_table
from .config.presets import HEAD_FIELDS, PRESET_MAPPINGS, PRESETS_DIR, resolve_preset
from .config.specs import AlignConfig, RecordSpec
from .errors import ConfigError
from .mapping.spec import MappingSpec, read_mapping_file
from .reports.outcome import ItemOutcome
from .reports.text import PhaseReport, failure_message
from .vocabulary import MODES, PHASES

if TYPE_CHECKING:
    import torch

    from .run.case import CaseRun
    from .vocabulary import Mode, Phase

_MARKER_KEYS = ("tolerances", "phases", "record", "mapping")
# What ``mapping=`` takes: a MappingSpec, a name under the config's ``mappings:``,
# ``preset:NAME`` or the path of a mapping YAML file (relative to the test file's folder).
MappingRef = MappingSpec | str | Path


_P = ParamSpec("_P")


def _asserting(
    compare: Callable[Concatenate[AlignRunner, _P], CaseRun],
) -> Callable[Concatenate[AlignRunner, _P], CaseRun]:
    """``compare`` that fails the test unless the run is aligned (``check``)."""

    def check(self: AlignRunner, /, *args: _P.args, **kwargs: _P.kwargs) -> CaseRun:
        """``compare`` (same arguments), then fail the test (``AlignmentMismatch``, an
        AssertionError naming the first divergent layer) unless every phase is aligned -- as
        pytest-regressions' ``check`` is the assertion; the run when it passes."""
        __tracebackhide__ = True
        run = compare(self, *args, **kwargs)
        self.assert_aligned(run)
        return run

    return check


@dataclass(frozen=True)
class AlignRunner:
    config: AlignConfig | None
    tolerances: ToleranceTable
    phases: tuple[str, ...]
    record: RecordSpec
    nodeid: str
    fail: Callable[[ItemOutcome], None]  # raises the item's failure (the plugin's)
    base_dir: Path = Path()  # the test file's folder: relative file paths start there
    mapping: MappingRef | None = None  # the marker's ``mapping``

    @classmethod
    def from_marker(
        cls,
        config: AlignConfig | None,
        marker: Any,
        nodeid: str,
        fail: Callable[[ItemOutcome], None],
        base_dir: Path | None = None,
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
        folder = base_dir if base_dir is not None else Path()
        table = _marker_table(config, kwargs.get("tolerances"), nodeid, folder)
        mapping = kwargs.get("mapping")
        if mapping is not None:
            _mapping_file(mapping, config, folder, f"{nodeid}: @pytest.mark.align(mapping={mapping!r})")
        phases = _marker_phases(kwargs.get("phases"), nodeid)
        mode = RecordSpec(mode=_marker_mode(kwargs.get("record"), nodeid))
        return cls(config, table, phases, mode, nodeid, fail, folder, mapping)

    def run(self, case: str) -> CaseRun:
        """Run a case of the ``--align-config`` by name."""
        from .run.case import run_case

        if self.config is None:
            raise ConfigError("align_runner.run needs --align-config")
        return run_case(self.config, self.config.case(case))

    def compare(
        self,
        baseline: torch.nn.Module,
        candidate: torch.nn.Module,
        inputs: Mapping[str, Any],
        *,
        labels: torch.Tensor | None = None,
        phases: Sequence[str] | None = None,
        mapping: MappingRef | None = None,
        sync_weights: bool = False,
        steps: int = 1,
        train: bool | None = None,
    ) -> CaseRun:
        """Record both modules on the same inputs and compare them, in ``train`` mode when asked
        (default: the mode the models are in; they are left in the modes they had); the run,
        asserting nothing (``check`` asserts). ``mapping``: a ``MappingSpec``, a name under the
        config's ``mappings:``, ``preset:NAME`` or a mapping YAML file (relative to the test
        file's folder); default: the marker's ``mapping``."""
        from .run.case import check_modules

        wanted = mapping if mapping is not None else self.mapping
        spec = None if wanted is None else self._mapping(wanted, baseline, candidate)
        return check_modules(
            baseline,
            candidate,
            inputs,
            phases=tuple(phases or self.phases),
            labels=labels,
            table=self.tolerances,
            mapping=spec,
            sync_weights_first=sync_weights,
            record=self.record,
            steps=steps,
            name=self.nodeid,
            train=train,
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

    check = _asserting(compare)

    def _mapping(
        self, wanted: MappingRef, baseline: torch.nn.Module, candidate: torch.nn.Module
    ) -> MappingSpec:
        if isinstance(wanted, MappingSpec):
            return wanted
        where = f"{self.nodeid}: align_runner.check(mapping={str(wanted)!r})"
        file = _mapping_file(wanted, self.config, self.base_dir, where)
        if isinstance(file, MappingSpec):
            return file
        if not str(wanted).startswith("preset:"):
            return read_mapping_file(file, str(wanted))
        variables = _module_variables(baseline, candidate)
        megatron_baseline = _is_megatron(baseline) and not _is_megatron(candidate)
        return resolve_preset(str(wanted), variables, where, megatron_baseline=megatron_baseline)


def _mapping_file(wanted: Any, config: AlignConfig | None, base_dir: Path, where: str) -> Path | MappingSpec:
    """The file of a ``mapping`` argument (or the config's named mapping); ConfigError naming
    what is allowed when it is none."""
    if isinstance(wanted, MappingSpec):
        return wanted
    if not isinstance(wanted, (str, Path)):
        raise ConfigError(f"{where}: expected a MappingSpec, a mapping name, preset:NAME or a YAML file path")
    text = str(wanted)
    if config is not None and text in config.mappings:
        return config.mappings[text]
    if text.startswith("preset:"):
        if text.partition(":")[2] not in PRESET_MAPPINGS:
            allowed = ", ".join(f"preset:{p}" for p in PRESET_MAPPINGS)
            raise ConfigError(f"{where}: unknown preset mapping {text!r} (allowed: {allowed})")
        return PRESETS_DIR / f"{text.partition(':')[2]}.yaml"
    file = (base_dir / wanted).resolve()
    if not text.endswith((".yaml", ".yml")) or not file.is_file():
        named = ", ".join(config.mappings) if config is not None and config.mappings else "none"
        raise ConfigError(
            f"{where}: no such mapping file {file} (a mapping is a MappingSpec, a name under the "
            f"config's mappings: (known: {named}), preset:NAME or a .yaml file)"
        )
    return file


def _is_megatron(module: Any) -> bool:
    """A megatron-core model: one of its classes (a user's subclass of ``GPTModel`` too)."""
    return any(cls.__module__.startswith("megatron.") for cls in type(module).__mro__)


def _module_variables(*modules: Any) -> dict[str, Any]:
    """A mapping's ``$variables`` read from the modules' ``.config`` (HF's or Megatron's
    TransformerConfig, whose names differ), Megatron's first."""
    aliases = {"num_key_value_heads": "num_query_groups", "intermediate_size": "ffn_hidden_size"}
    out: dict[str, Any] = {}
    for module in sorted(modules, key=lambda m: not _is_megatron(m)):
        config = getattr(module, "config", None)
        for key in HEAD_FIELDS:
            value = getattr(config, key, None)
            if value is None:
                value = getattr(config, aliases.get(key, key), None)
            if isinstance(value, int) and key not in out:
                out[key] = value
    return out


def _marker_table(config: AlignConfig | None, wanted: Any, nodeid: str, base_dir: Path) -> ToleranceTable:
    where = f"{nodeid}: @pytest.mark.align(tolerances={wanted!r})"
    if isinstance(wanted, list):
        where = f"{nodeid}: @pytest.mark.align(tolerances=...)"
    named = config.tolerances if config is not None else None
    name = config.path.name if config is not None else ""
    return load_table(wanted, where, base_dir, named, name)


def _marker_mode(wanted: Any, nodeid: str) -> Mode:
    """The marker's ``record=``; the default is ``RecordSpec``'s (``stats``), as for a config
    case and the ``Recorder``: one default mode wherever precalign records."""
    if wanted is None:
        return RecordSpec().mode
    for mode in MODES:
        if wanted == mode:
            return mode
    raise ConfigError(
        f"{nodeid}: @pytest.mark.align(record={wanted!r}): unknown record mode (allowed: {', '.join(MODES)})"
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
