"""Divergence search: hypothesis chooses inputs within a case's ``search:`` bounds (batch,
sequence length, token ids, right padding), runs the forward alignment for each, and
shrinks the first divergence it finds to a minimal example, written as an ``inputs:`` block.

Both models are built and synced once; every example reuses them (forward only, so no
weights or grads carry over from one example to the next).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from .compare.pairs import SHARED_NONFINITE
from .config.search import SearchSpec, ids_block
from .config.specs import AlignConfig, CaseSpec
from .errors import CaseError
from .reports.outcome import ItemOutcome
from .reports.text import PhaseReport, failure_message
from .run.case import case_table
from .run.live import live_case
from .run.outcome import CaseRun, FinishInputs, finish
from .run.side import run_side
from .sources import LoadedModel
from .sources.inputs import CaseInputs, explicit_inputs, vocabulary_size


@dataclass(frozen=True)
class Example:
    """One generated input: token ids per row and the number of right-padded positions."""

    ids: tuple[tuple[int, ...], ...]
    pads: tuple[int, ...]

    @property
    def batch(self) -> int:
        return len(self.ids)

    @property
    def seq_len(self) -> int:
        return len(self.ids[0])

    def mask(self) -> list[list[int]]:
        return [[1] * (self.seq_len - p) + [0] * p for p in self.pads]


@dataclass(frozen=True)
class SearchResult:
    case: str
    tried: int  # examples run, shrinking included
    seconds: float
    minimal: Example | None  # None: no divergence found
    run: CaseRun | None  # the minimal example's run
    inputs_block: str  # ready-to-paste ``inputs:`` YAML ("" when nothing was found)
    inputs_name: str

    @property
    def passed(self) -> bool:
        return self.minimal is None


def examples(spec: SearchSpec) -> Any:
    """The hypothesis strategy of inputs within ``spec``; shrinks toward batch and seq_len
    minimums, token id 0 and no padding."""
    from hypothesis import strategies as st

    @st.composite
    def draw(draw: Any) -> Example:
        batch = draw(st.integers(*spec.batch))
        seq = draw(st.integers(*spec.seq_len))
        row = st.lists(st.integers(0, spec.vocab_size - 1), min_size=seq, max_size=seq)
        ids = draw(st.lists(row, min_size=batch, max_size=batch))
        pads = [0] * batch
        if spec.padding and seq > 1:
            pads = draw(st.lists(st.integers(0, seq - 1), min_size=batch, max_size=batch))
        return Example(tuple(tuple(r) for r in ids), tuple(pads))

    return draw()


def _inputs(example: Example, spec: SearchSpec) -> CaseInputs:
    mask = torch.tensor(example.mask(), dtype=torch.long) if spec.padding or spec.attention_mask else None
    return explicit_inputs(torch.tensor(example.ids, dtype=torch.long), mask, spec.labels)


def run_search(config: AlignConfig, case: CaseSpec) -> SearchResult:
    """Search the case's input space for a forward divergence; shrink the first one found."""
    try:
        from hypothesis import find
        from hypothesis.errors import NoSuchExample
    except ImportError:
        raise CaseError(
            f"{case.where}: search: needs hypothesis (pip install 'pytest-precalign[search]')"
        ) from None
    spec = case.search
    assert spec is not None
    started = time.perf_counter()
    base_spec, cand_spec = config.models[case.models.baseline], config.models[case.models.candidate]
    table = case_table(config, case)
    forward = replace(case, phases=("forward",), expect=None, isolate=False)
    tried = 0
    with live_case(config, case, base_spec, cand_spec, with_inputs=False) as live:
        baseline, candidate, sync = live.build_synced(base_spec, cand_spec)
        for loaded in (baseline, candidate):
            _check_vocabulary(loaded, spec, live.where)
        env = live.environment(base_spec)
        manifest = live.manifest(base_spec, search=True)

        def align(example: Example) -> CaseRun:
            data = _inputs(example, spec)
            seed = base_spec.seed
            base = run_side(baseline, data, forward, {**manifest, "side": "baseline"}, seed)
            cand = run_side(candidate, data, forward, {**manifest, "side": "candidate"}, seed)
            return finish(
                replace(
                    FinishInputs.of_case(forward, (base, cand), table, started), sync=sync, environment=env
                )
            )

        def diverges(example: Example) -> bool:
            nonlocal tried
            tried += 1
            return _sides_differ(align(example))

        try:
            minimal: Example | None = find(examples(spec), diverges, settings=_settings(spec))
        except NoSuchExample:
            minimal = None
        run = align(minimal) if minimal is not None else None
    name = f"{case.name}_minimal"
    block = ""
    if minimal is not None:
        mask = minimal.mask() if spec.padding or spec.attention_mask else None
        block = ids_block(name, [list(r) for r in minimal.ids], mask, spec.labels)
    return SearchResult(case.name, tried, time.perf_counter() - started, minimal, run, block, name)


def _sides_differ(run: CaseRun) -> bool:
    """The forward failed because the two sides differ: an input that makes both sides NaN at
    the same places (a degenerate example, e.g. no label left to average) fails the case's own
    check, but is no difference between the sides for the search to shrink towards."""
    verdict = run.verdicts["forward"]
    if verdict.passed:
        return False
    failing = [c for p in verdict.records for c in p.checks if not c.passed]
    return not failing or any(c.metric != SHARED_NONFINITE for c in failing)


def _check_vocabulary(loaded: LoadedModel, spec: SearchSpec, where: str) -> None:
    found = vocabulary_size(loaded.module)
    if found is not None and spec.vocab_size > found[1]:
        raise CaseError(
            f"{where}search.vocab_size: {spec.vocab_size} exceeds model {loaded.name!r}'s "
            f"vocabulary ({found[0] or 'its embedding'} has {found[1]} rows)"
        )


def _settings(spec: SearchSpec) -> Any:
    from hypothesis import HealthCheck, Verbosity, settings

    return settings(
        max_examples=spec.max_examples,
        deadline=None,
        database=None,  # nothing written next to the user's suite
        derandomize=True,  # the same examples on every run: CI gates are reproducible
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
    )


def search_outcome(result: SearchResult, config: AlignConfig, reproduce: str) -> ItemOutcome:
    """The search item's outcome: passes when no divergence was found."""
    message = "" if result.passed else search_message(result, config, reproduce)
    return ItemOutcome(
        name=f"{result.case}[search]",
        passed=result.passed,
        message=message,
        properties=(("precalign_search_examples", result.tried),),
    )


def search_message(result: SearchResult, config: AlignConfig, reproduce: str) -> str:
    """The failure message: the minimal example, its first divergence, the paste-able block."""
    assert result.minimal is not None and result.run is not None
    case = config.case(result.case)
    verdict = result.run.verdicts["forward"]
    first = verdict.first
    where = f"{first.name} ({first.kind}, {first.slot})" if first is not None else "no single record"
    origin = (
        ""
        if first is None
        else (", origin" if first.origin else f", propagated (origin module: {first.origin_module})")
    )
    example = result.minimal
    head = (
        f"Divergence search: case {case.name!r} diverges in forward; minimal example after "
        f"{result.tried} runs: batch {example.batch}, seq_len {example.seq_len}"
        + (f", right padding {list(example.pads)}" if any(example.pads) else "")
        + f"\nFirst divergent layer of the minimal example: {where}{origin}"
    )
    report = PhaseReport.of_run(
        result.run,
        "forward",
        defined_in=str(config.path),
        baseline=case.models.baseline,
        candidate=case.models.candidate,
        reproduce=reproduce,
        seconds=result.seconds,
    )
    paste = (
        f"To reproduce, paste this into {config.path.name} and set 'inputs: {result.inputs_name}' "
        f"in case {case.name!r}:\n{result.inputs_block}"
    )
    return f"{head}\n{paste}\n\n{failure_message(report)}"
