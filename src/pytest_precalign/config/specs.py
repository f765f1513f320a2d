"""The alignment config's frozen dataclasses: what ``config/loader.py`` builds from YAML. No torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..compare.moe_tokens import MoeSpec
from ..compare.tolerances import ToleranceTable
from ..errors import ConfigError
from ..mapping.spec import MappingSpec
from ..specs.coverage import DEFAULT_MIN_COVERAGE
from ..specs.envelope import EnvelopeSpec
from ..specs.expectation import Expectation
from ..steps.spec import OptimizerSpec as OptimizerSpec
from ..steps.spec import SidesTraining
from ..vocabulary import Level, Loss, Mode, Phase, RecordFormat
from .model_sources import MEGATRON_RUNTIME
from .search import SearchSpec


@dataclass(frozen=True)
class Defaults:
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    deterministic: bool = True
    dtype_given: bool = False  # ``defaults: {dtype: ...}`` was written (else a source's own default)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str
    options: Mapping[str, Any]
    device: str
    dtype: str
    seed: int
    output: str | None
    where: str
    patch: str | None = None  # "module:function" applied to the built module (fault injection)

    @property
    def megatron_core(self) -> bool:
        """A megatron-core model: a preset's (``source: megatron``) or the user's own
        (``source: factory`` with ``runtime: megatron``)."""
        return self.source == "megatron" or self.options.get("runtime") == MEGATRON_RUNTIME


@dataclass(frozen=True)
class InputSpec:
    name: str
    kind: str
    batch: int = 1
    seq_len: int = 8
    vocab_size: int = 0
    seed: int = 0
    labels: bool = False
    attention_mask: bool = False
    factory: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    where: str = ""
    # kind: ids -- explicit token ids (rows) and an optional 0/1 attention mask
    input_ids: tuple[tuple[int, ...], ...] | None = None
    mask: tuple[tuple[int, ...], ...] | None = None
    # kind: dataset -- the file its rows are read from, as many as a case needs (or input_ids)
    path: Path | None = None


@dataclass(frozen=True)
class RecordSpec:
    # The one default record mode. Every recorder defaults to ``stats``; ``PrecalignCallback``
    # alone defaults to ``scalars`` (per-step scalars only, no hooks: cheap enough to leave on
    # for a whole run).
    mode: Mode = "stats"
    inputs: bool = True
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    format: RecordFormat = "native"  # how saved traces are written: ours, or msprobe's dump layout
    level: Level = "module"  # module hooks, op calls inside modules ("op"), or both ("mix")
    moe: MoeSpec | None = None  # MoE blocks whose expert records are keyed by token
    golden: Path | None = None  # a golden run the candidate is compared with while recorded


@dataclass(frozen=True)
class Models:
    """The two models a case builds and compares (names under ``models:``)."""

    baseline: str
    candidate: str

    @property
    def names(self) -> tuple[str, str]:
        """The sides' names in reports: the models' names."""
        return self.baseline, self.candidate


@dataclass(frozen=True)
class Dumps:
    """The stored runs a case gates on both sides (``{dump: path}``), instead of models."""

    baseline: Path
    candidate: Path
    names: tuple[str, str] = ("", "")  # the sides' names in reports: ``dump:<the path as given>``


@dataclass(frozen=True)
class TrainingSpec:
    """How a case's sides compute their loss, backward and optimizer steps."""

    optimizer: OptimizerSpec
    loss: Loss
    train: bool  # the models in train mode (dropout on) instead of eval
    # Which framework's machinery trains each side (steps/spec.py); None: each model's default.
    trainers: SidesTraining = SidesTraining()
    # The run verdict's noise-envelope lane (``envelope:``); None: the table's lanes.
    envelope: EnvelopeSpec | None = None
    # A failing training run's first divergent step replayed from the baseline's state
    # (run/step_replay.py); ``replay: false`` turns it off.
    replay: bool = True


@dataclass(frozen=True)
class CaseSpec:
    """One case of the config: its two sides (models, or stored runs), inputs, phases and how
    it trains and is judged."""

    name: str
    sides: Models | Dumps
    inputs: str
    phases: tuple[Phase, ...]
    steps: int
    sync_weights: bool
    strict_weights: bool
    mapping: MappingSpec | None
    training: TrainingSpec
    record: RecordSpec
    tolerances: str | None
    expect: Expectation | None
    where: str
    isolate: bool = False
    search: SearchSpec | None = None  # divergence search over generated inputs (search.py)
    # --align-baseline: renames from the candidate's names to a stored baseline's (e.g. modules
    # that moved between framework versions); stored traces and weights use the mapped names.
    baseline_rename: MappingSpec | None = None
    # The share of the baseline's output records of each phase that must find a partner.
    min_coverage: float = DEFAULT_MIN_COVERAGE

    @property
    def models(self) -> Models:
        """The case's two models; a case that gates stored runs has none (a ``ConfigError``)."""
        if isinstance(self.sides, Dumps):
            raise ConfigError(
                f"{self.where}: case {self.name!r} gates stored runs ({{dump: path}}), not models"
            )
        return self.sides

    @property
    def dumps(self) -> Dumps | None:
        """The stored runs the case gates (None: it builds models)."""
        return self.sides if isinstance(self.sides, Dumps) else None


@dataclass(frozen=True)
class AlignConfig:
    path: Path
    version: int
    defaults: Defaults
    models: Mapping[str, ModelSpec]
    inputs: Mapping[str, InputSpec]
    tolerances: Mapping[str, ToleranceTable]
    mappings: Mapping[str, MappingSpec]
    cases: tuple[CaseSpec, ...]
    digest: str

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def case(self, name: str) -> CaseSpec:
        for case in self.cases:
            if case.name == name:
                return case
        known = ", ".join(c.name for c in self.cases)
        raise ConfigError(f"{self.path}: no case named {name!r} (known: {known})")
