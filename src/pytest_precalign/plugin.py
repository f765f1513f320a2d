"""pytest hooks and fixtures (the ``pytest11`` entry point). Wiring only.

Inert unless asked: without ``--align-config`` (or ini ``align_config``) nothing is loaded,
and at import nothing heavier than pytest itself is imported (no torch, no yaml).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .errors import AlignmentMismatch, PrecalignError
from .redaction import redacted, redacted_text
from .vocabulary import PHASES

if TYPE_CHECKING:
    from .align_runner import AlignRunner
    from .config.specs import AlignConfig, CaseSpec
    from .reports.outcome import ItemOutcome
    from .run.case import CaseRun
    from .run.outcome import PerCase
    from .vocabulary import Phase


# Command-line options of the plugin (prefix ``align-``).
# (flag without prefix, dest, help, extra argparse kwargs)
OPTIONS: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    ("config", "align_config", "alignment config YAML: collect its cases as tests", {"metavar": "PATH"}),
    (
        "report",
        "align_report",
        "write report.json (one entry per case and phase) and report.html into DIR",
        {"metavar": "DIR"},
    ),
    (
        "save-traces",
        "align_save_traces",
        "save each case's baseline and candidate traces under DIR/<config>/<case>/ (never overwrites)",
        {"metavar": "DIR"},
    ),
    (
        "baseline",
        "align_baseline",
        "compare each case's candidate with a stored baseline DIR/<case>/ instead of a live baseline "
        "model (a missing one is written and the test fails)",
        {"metavar": "DIR"},
    ),
    (
        "update",
        "align_update",
        "with --align-baseline: rewrite the baselines that mismatch (the tests still fail)",
        {"action": "store_true"},
    ),
    (
        "update-all",
        "align_update_all",
        "with --align-baseline: rewrite every baseline run and pass",
        {"action": "store_true"},
    ),
    (
        "trust-checkpoint",
        "align_trust_checkpoint",
        "fully unpickle the models' checkpoints (Megatron model_optim_rng.pt, torch_dist .metadata): "
        "only for checkpoints you trust, as unpickling can run code from the file",
        {"action": "store_true"},
    ),
)


def add_options(addoption: Callable[..., Any], prefix: str = "align-") -> None:
    for flag, dest, help_text, extra in OPTIONS:
        addoption(f"--{prefix}{flag}", dest=dest, default=None, help=help_text, **extra)


@dataclass
class _State:
    config: AlignConfig | None
    reports: list[dict[str, Any]] = field(default_factory=list)
    summaries: list[str] = field(default_factory=list)
    # Each case's run (or stored-baseline check), once for all its phase items of this process.
    runs: PerCase[Any] | None = None
    run_id: str = ""  # one per test run, shared by xdist workers
    usage_error: str | None = None  # an xdist worker's usage error, on the controller


STATE_KEY = pytest.StashKey[_State]()
ENTRY_KEY = pytest.StashKey[dict[str, Any]]()  # an item's report entry, until its test report is made


class HookSpecs:
    """The plugin's own hooks, for a conftest (or another plugin) to implement."""

    @pytest.hookspec
    def pytest_precalign_trainers(self) -> Any:
        """Case trainers to register (``steps.trainer_registry.TrainerInfo``, a sequence
        of them), so that a case's ``training:`` can name them: each implementation's are
        registered before the alignment config is read, and removed at unconfigure."""


def _usage_error(text: str) -> pytest.UsageError:
    """A usage error as pytest prints it, through the one redaction rule (docs/security.md):
    every text this plugin puts on the terminal does (failures, summaries, errors, header)."""
    return pytest.UsageError(redacted_text(text))


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(HookSpecs)


def _register_trainers(config: pytest.Config) -> None:
    """What the ``pytest_precalign_trainers`` implementations return, registered (a
    ``pytest.UsageError`` naming a refused one)."""
    from .steps.trainer_registry import TrainerInfo, register_trainer

    added: list[str] = []
    config.add_cleanup(lambda: _unregister(added))
    for result in config.hook.pytest_precalign_trainers():
        for info in [result] if isinstance(result, TrainerInfo) else result:
            try:
                register_trainer(info)
            except PrecalignError as exc:
                raise _usage_error(f"pytest_precalign_trainers: {exc}") from None
            added.append(info.name)


def _unregister(names: list[str]) -> None:
    from .steps.trainer_registry import unregister_trainer

    for name in names:
        unregister_trainer(name)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("precalign", "alignment regression testing (pytest-precalign)")
    add_options(group.addoption, prefix="align-")
    parser.addini("align_config", "default alignment config YAML (like --align-config)", type="paths")
    parser.addini("align_report", "default directory for report.json (like --align-report)")


def _config_path(config: pytest.Config) -> Path | None:
    option = config.getoption("align_config")
    if option:
        return Path(option)
    paths = config.getini("align_config")
    return Path(paths[0]) if paths else None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "align(tolerances=None, phases=None, record=None, mapping=None): defaults for the align_runner fixture",
    )
    updating = config.getoption("align_update") or config.getoption("align_update_all")
    baselines = config.getoption("align_baseline")
    if updating and not baselines:
        raise _usage_error("--align-update and --align-update-all need --align-baseline DIR")
    if baselines:
        from .reports.document import check_report_dir

        try:
            check_report_dir(baselines, "--align-baseline", "each case's baseline <case>/", write=False)
        except PrecalignError as exc:
            raise _usage_error(str(exc)) from None
    _register_trainers(config)
    path = _config_path(config)
    if path is None:
        config.stash[STATE_KEY] = _State(config=None)
        return
    from .config.loader import load_config_file

    try:
        align_config = load_config_file(path)
        if config.getoption("align_trust_checkpoint"):
            from .config.model_weights import trust_checkpoints

            align_config = trust_checkpoints(align_config)
    except PrecalignError as exc:
        raise _usage_error(f"--align-config: {exc}") from None
    report_dir = config.getoption("align_report") or config.getini("align_report")
    if report_dir:
        from .reports.document import check_report_dir

        try:
            check_report_dir(report_dir, "--align-report")
        except PrecalignError as exc:
            raise _usage_error(str(exc)) from None
    from .run.outcome import PerCase

    config.stash[STATE_KEY] = _State(config=align_config, runs=PerCase(), run_id=_run_id(config))
    config.pluginmanager.register(_EntryCollector(config.stash[STATE_KEY]), "precalign-entries")
    # Collect the config's cases even when it lies outside the paths given on the command line.
    resolved = align_config.path
    args = [Path(a.split("::")[0]).resolve() for a in config.args]
    if config.args and not any(resolved == a or a in resolved.parents for a in args):
        config.args.append(str(resolved))


def _run_id(config: pytest.Config) -> str:
    """xdist's test run id on workers (the same for all of them), else a fresh one."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput and workerinput.get("testrunuid"):
        return str(workerinput["testrunuid"])
    import uuid

    return uuid.uuid4().hex


def _state(config: pytest.Config) -> _State:
    return config.stash.get(STATE_KEY, _State(config=None))


@pytest.hookimpl(wrapper=True)
def pytest_report_header(config: pytest.Config) -> Generator[None, list[Any], list[Any]]:
    """The config's line; in an alignment run, every header line through the redaction rule
    (pytest's own too: its ``rootdir:`` names the folder, which may hold a token)."""
    lines = yield
    align_config = _state(config).config
    if align_config is None:
        return lines
    from importlib import metadata

    # torch's version from its metadata: importing torch here would fail before the cases'
    # devices are checked when an installed torch_npu cannot load (no CANN).
    d = align_config.defaults
    ours = (
        f"precalign: config {align_config.path}, {len(align_config.cases)} case(s); "
        f"torch {metadata.version('torch')}, device {d.device}, dtype {d.dtype}, seed {d.seed}, "
        f"deterministic {d.deterministic}"
    )
    return [redacted([ours]), *(redacted(line) for line in lines)]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    align_config = _state(parent.config).config
    if align_config is not None and file_path.resolve() == align_config.path:
        return AlignFile.from_parent(parent, path=file_path)
    return None


class AlignFile(pytest.File):
    """The alignment config: one item per case and phase."""

    def collect(self) -> Iterator[pytest.Item]:
        align_config = _state(self.config).config
        assert align_config is not None
        xdist = self.config.pluginmanager.hasplugin("xdist")
        for case in align_config.cases:
            for phase in case.phases:
                item = AlignItem.from_parent(self, name=f"{case.name}[{phase}]", case=case, phase=phase)
                if xdist:  # keep a case's phases on one worker: it runs the models once
                    item.add_marker(pytest.mark.xdist_group(name=f"precalign-{case.name}"))
                yield item
            if case.search is not None:  # hypothesis-chosen inputs (search.py)
                yield SearchItem.from_parent(self, name=f"{case.name}[search]", case=case)


class _CaseItem(pytest.Item):
    """A test item of a case: an alignment failure or a bad case is shown as its message."""

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, (AlignmentMismatch, PrecalignError)):
            return redacted_text(str(excinfo.value))
        return redacted_text(str(super().repr_failure(excinfo)))


class AlignItem(_CaseItem):
    def __init__(self, *, case: CaseSpec, phase: Phase, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.phase = phase

    def runtest(self) -> None:
        try:
            self._judge()
        except PrecalignError as exc:  # the case could not run: report.json says so too
            entry: dict[str, Any] = {"name": self.case.name, "phase": self.phase, "nodeid": self.nodeid}
            entry |= {"passed": False, "error": str(exc)}
            self.stash[ENTRY_KEY] = {"entry": entry, "summary": f"ERROR {self.name}: {exc}"}
            raise

    def _judge(self) -> None:
        state = _state(self.config)
        assert state.config is not None and state.runs is not None
        if self.config.getoption("align_baseline") and self.case.dumps is None:
            return _settle(self, _baseline_outcome(self, state.config, state.runs, state.run_id))
        from .reports.outcome import phase_outcome
        from .reports.text import PhaseReport

        align_config, case = state.config, self.case
        run: CaseRun = state.runs.take(case.name, len(case.phases), lambda: self._run(align_config))
        report = PhaseReport.of_run(
            run,
            self.phase,
            defined_in=str(align_config.path),
            baseline=case.sides.names[0],
            candidate=case.sides.names[1],
            reproduce=f'pytest --align-config {_relative(self.config, align_config)} "{self.nodeid}"',
            with_environment=True,
        )
        _settle(self, phase_outcome(report, {"nodeid": self.nodeid}))

    def _run(self, align_config: AlignConfig) -> CaseRun:
        from .run.case import run_case

        run = run_case(align_config, self.case)
        _save_traces(self.config, align_config, run)
        return run

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.case.name}[{self.phase}]"


class SearchItem(_CaseItem):
    """A case's divergence search: fails with the minimal diverging inputs, as YAML."""

    def __init__(self, *, case: CaseSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case

    def runtest(self) -> None:
        from .search import run_search, search_outcome

        align_config = _state(self.config).config
        assert align_config is not None
        result = run_search(align_config, self.case)
        reproduce = f'pytest --align-config {align_config.path.name} "{self.nodeid}"'
        _settle(self, search_outcome(result, align_config, reproduce))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.case.name}[search]"


def _baseline_outcome(
    item: AlignItem, align_config: AlignConfig, runs: PerCase[Any], run_id: str
) -> ItemOutcome:
    """``--align-baseline``: the case checked against its stored baseline once, this phase judged."""
    from .baseline.gate import baseline_outcome, update_policy
    from .baseline.store import check_case

    config, case = item.config, item.case
    root = str(config.getoption("align_baseline"))
    policy = update_policy(bool(config.getoption("align_update")), bool(config.getoption("align_update_all")))
    checked = runs.take(
        f"baseline:{case.name}",
        len(case.phases),
        lambda: check_case(align_config, case, Path(root), policy, run_id),
    )
    rel = _relative(config, align_config)
    return baseline_outcome(
        checked, case, item.phase, item.nodeid, config_path=align_config.path, rel=rel, root=root
    )


def _relative(config: pytest.Config, align_config: AlignConfig) -> Path:
    """The config file as the user names it: relative to the rootdir when inside it."""
    try:
        return align_config.path.relative_to(config.rootpath)
    except ValueError:
        return align_config.path


def _settle(item: pytest.Item, outcome: ItemOutcome) -> None:
    """The one place an item's outcome meets pytest: its JUnit properties, its report entry
    (carried to the controller on the test report, see ``_EntryCollector``), its failure."""
    item.user_properties.extend(redacted(outcome.properties))  # the JUnit XML holds them
    if outcome.entry is not None:
        item.stash[ENTRY_KEY] = {"entry": dict(outcome.entry), "summary": outcome.summary}
    _raise_failure(outcome)


def _raise_failure(outcome: ItemOutcome) -> None:
    """Fail the running test with the outcome's message (when it did not pass)."""
    __tracebackhide__ = True
    if not outcome.passed:
        raise AlignmentMismatch(redacted_text(outcome.message))


def _save_traces(config: pytest.Config, align_config: AlignConfig, run: CaseRun) -> None:
    folder = config.getoption("align_save_traces")
    if not folder:
        return
    from .run.stored_runs import save_case_traces

    root = Path(folder) / align_config.path.stem / run.name
    save_case_traces(run.baseline, run.candidate, root, align_config.case(run.name).record.format)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.when == "call" and ENTRY_KEY in item.stash:
        # Extra report attributes survive xdist's report serialization to the controller.
        report.precalign = item.stash[ENTRY_KEY]  # type: ignore[attr-defined]
    return report


class _EntryCollector:
    """Gathers report entries as test reports arrive: in this process, or on the xdist
    controller from every worker. A crashed worker loses only the item it was running, and
    workers write no files."""

    def __init__(self, state: _State) -> None:
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        carried = getattr(report, "precalign", None)
        if isinstance(carried, dict) and "entry" in carried:
            self.state.reports.append(carried["entry"])
            self.state.summaries.append(str(carried.get("summary", "")))


USAGE_ERROR_KEY = "precalign_usage_error"  # an xdist worker's usage error, for the controller


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``-n N`` (xdist's ``load``): a case's phase items run on one worker, in order
    (``case_scheduling.py``). Other distributions are xdist's own; ``loadgroup`` and
    ``loadfile`` keep a case together too."""
    align_config = _state(config).config
    if config.getvalue("dist") != "load" or align_config is None:
        return None
    from pytest_precalign.case_scheduling import CaseScheduling

    return CaseScheduling(config, log, align_config.path.name)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: only selected cases are checked
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Before any test runs: the ``align`` markers' arguments, and the selected cases' sources
    (a bad marker or a broken source is a usage error). On an xdist worker the error cannot be
    raised (xdist would report a crashed worker): the worker collects nothing, stops, and hands
    the message to the controller, which raises it (``pytest_testnodedown``)."""
    try:
        _check_collected(_state(config).config, items)
    except pytest.UsageError as exc:
        workeroutput = getattr(config, "workeroutput", None)
        if workeroutput is None:
            raise
        workeroutput[USAGE_ERROR_KEY] = str(exc)
        session.shouldstop = str(exc)
        items[:] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """On the xdist controller: a worker's usage error is this run's usage error. The worker
    asked xdist to stop (every worker then shuts down cleanly); the error line and exit code 4
    come at the end of the session (``pytest_sessionfinish``)."""
    message = getattr(node, "workeroutput", {}).get(USAGE_ERROR_KEY)
    state = node.config.stash.get(STATE_KEY, None)
    if message and state is not None and state.usage_error is None:
        state.usage_error = str(message)


def _check_collected(align_config: AlignConfig | None, items: list[pytest.Item]) -> None:
    _check_markers(align_config, items)
    if align_config is None:
        return
    from .run.devices import check_devices

    checked: set[str] = set()
    for item in items:
        if isinstance(item, (AlignItem, SearchItem)) and item.case.name not in checked:
            checked.add(item.case.name)
            try:
                check_devices(align_config, item.case)  # before torch is imported (torch_npu, CANN)
                from .run.case import preflight_case

                preflight_case(align_config, item.case)
            except PrecalignError as exc:
                text = str(exc)
                if str(align_config.path) not in text:
                    text = f"{align_config.path}: {text}"
                raise _usage_error(f"--align-config: case {item.case.name!r}: {text}") from None


def _check_markers(align_config: AlignConfig | None, items: list[pytest.Item]) -> None:
    """``@pytest.mark.align(...)`` validated like the YAML: a wrong argument is one line."""
    for item in items:
        marker = item.get_closest_marker("align")
        if marker is None:
            continue
        from .align_runner import AlignRunner

        try:
            AlignRunner.from_marker(align_config, marker, item.nodeid, _raise_failure, item.path.parent)
        except PrecalignError as exc:
            raise _usage_error(str(exc)) from None


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = _state(config)
    if not state.summaries:
        return
    terminalreporter.section("precalign")
    entries = sorted(zip(state.reports, state.summaries, strict=True), key=lambda e: _run_order(state, e[0]))
    for _, line in entries:
        terminalreporter.write_line(redacted_text(line))


def _run_order(state: _State, entry: dict[str, Any]) -> tuple[int, int, str]:
    """The config's order (case, then phase), as a serial run reports it, whichever xdist
    worker finished first; entries of other tests (the ``align`` marker) follow by node id."""
    cases = [c.name for c in state.config.cases] if state.config is not None else []
    name, phase = entry.get("name"), entry.get("phase")
    if name not in cases:
        return (len(cases), 0, str(entry.get("nodeid", "")))
    return (cases.index(name), PHASES.index(phase) if phase in PHASES else len(PHASES), "")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = _state(config)
    if state.usage_error is not None:  # as pytest reports a UsageError: one line, exit 4
        sys.stderr.write(f"ERROR: {redacted_text(state.usage_error)}\n")
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        return
    if state.config is None:
        return
    if hasattr(config, "workerinput"):  # an xdist worker: the controller writes the report
        return
    folder = config.getoption("align_report") or config.getini("align_report")
    if folder:
        from .reports.document import write_reports

        try:
            write_reports(
                folder,
                sorted(state.reports, key=lambda r: r["nodeid"]),
                {
                    "config": str(state.config.path),
                    "exitstatus": int(exitstatus),
                    # Stopped before every item ran (Ctrl-C, a KeyboardInterrupt): never a pass.
                    "interrupted": int(exitstatus) == pytest.ExitCode.INTERRUPTED,
                    "collected": session.testscollected,
                },
                "--align-report",
            )
        except PrecalignError as exc:  # a full disk: one line, and the run does not pass
            sys.stderr.write(f"ERROR: {redacted_text(str(exc))}\n")
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def align_config(request: pytest.FixtureRequest) -> AlignConfig:
    """The loaded ``--align-config`` (skips the test when none was given).

    def test_cases(align_config):
        assert {c.name for c in align_config.cases} >= {"eager_vs_sdpa"}
    """
    loaded = _state(request.config).config
    if loaded is None:
        pytest.skip("no --align-config given")
    return loaded


@pytest.fixture
def align_runner(request: pytest.FixtureRequest) -> AlignRunner:
    """Run a configured case, or compare two modules and fail on a divergence::

    @pytest.mark.align(phases=["forward", "backward"])
    def test_my_port(align_runner):
        align_runner.check(reference, ported, {"input_ids": ids}, labels=ids)

    (``align_runner.compare(...)`` returns the run without asserting.)
    """
    from .align_runner import AlignRunner

    marker = request.node.get_closest_marker("align")
    return AlignRunner.from_marker(
        _state(request.config).config, marker, request.node.nodeid, _raise_failure, request.node.path.parent
    )
