"""Bad input to ``pytest --align-config`` is one ``ERROR:`` line and exit code 4
(``pytest.UsageError``), never a traceback. The CLI's side is in
tests/cli/test_bad_input.py."""

from __future__ import annotations

import pytest

from tests.helpers.bad_input import GOOD, SOURCE_ERRORS, TINY_MODELS, variant, with_factory
from tests.helpers.runs import RunPytest


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(tiny_models=TINY_MODELS)
    return pytester


def _run(pytester: pytest.Pytester, run_pytest: RunPytest, config: str, *args: str) -> pytest.RunResult:
    """A pytest run that gets as far as building models: in a subprocess, as torch cannot be
    re-imported after an in-process run."""
    (pytester.path / "cfg.yaml").write_text(config, encoding="utf-8")
    return run_pytest("--align-config", "cfg.yaml", *args)


@pytest.fixture
def run_config_only(pytester: pytest.Pytester, plugin_args: list[str]) -> RunPytest:
    """A pytest run that stops in ``pytest_configure``, before anything imports torch (and
    before xdist starts workers): in process, which is fast."""

    def run(*args: str) -> pytest.RunResult:
        basetemp = f"--basetemp={pytester.path / 'bt'}"
        return pytester.runpytest_inprocess(*args, "-p", "no:cacheprovider", basetemp, *plugin_args)

    return run


def _assert_usage_error(result: pytest.RunResult, *fragments: str) -> str:
    """One ``ERROR:`` line with every fragment, exit code 4, and no traceback anywhere."""
    output = result.outlines + result.errlines
    text = "\n".join(output)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert "Traceback" not in text, text
    assert "INTERNALERROR" not in text, text
    errors = [line for line in output if line.startswith("ERROR:")]
    assert len(errors) == 1, text
    # The message is the only thing on stderr: one line, not one line and then some.
    assert [line for line in result.errlines if line.strip()] == errors, text
    for fragment in fragments:
        assert fragment in errors[0], f"{fragment!r} not in {errors[0]!r}"
    return errors[0]


def test_good_config_runs(suite: pytest.Pytester, run_pytest: RunPytest) -> None:
    """The harness itself: the valid config these tests edit collects and passes."""
    result = _run(suite, run_pytest, GOOD)
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.OK


# -- config errors, reported at pytest_configure --------------------------------------------

# (id, config text, fragments of the one ERROR line; "{cfg}" is the config's absolute path)
CONFIG_ERRORS: list[tuple[str, str, tuple[str, ...]]] = [
    ("empty-file", "", ("ERROR: --align-config: {cfg}: the config is empty",)),
    ("yaml-syntax", "version: 1\nmodels:\n  base: x\n cand: y\n", ("{cfg}:4: YAML syntax error",)),
    ("version-missing", variant("version: 1\n", ""), ("{cfg}:1: missing required key 'version'",)),
    ("version-2", variant("version: 1", "version: 2"), ("{cfg}:1: version: expected 1", "got 2")),
    (
        "unknown-top-level-key",
        GOOD + "colour: red\n",
        ("{cfg}:12: colour: unknown key 'colour'", "allowed: cases, defaults, inputs"),
    ),
    (
        "unknown-model-key",
        variant('factory: "tiny_models:build"}\n  cand', 'factory: "tiny_models:build", kwarg: {}}\n  cand'),
        ("{cfg}:3: models.base.kwarg: unknown key 'kwarg'", "did you mean 'kwargs'?", "allowed: device"),
    ),
    (
        "unknown-case-key",
        GOOD + "    tolerance: fp32\n",
        ("{cfg}:12: cases[0].tolerance: unknown key 'tolerance'", "did you mean 'tolerances'?"),
    ),
    (
        "unknown-rule-key",
        GOOD + "tolerances:\n  t:\n    - {atol: 0, rtol: 0, matches: '*'}\n",
        (
            "{cfg}:14: tolerances.t[0].matches: unknown key 'matches'",
            "did you mean 'match'?",
            "allowed: atol",
        ),
    ),
    (
        "unknown-source",
        variant("base: {source: factory,", "base: {source: onnx,"),
        ("{cfg}:3: models.base.source: unknown source 'onnx' (allowed: hf, megatron, factory)",),
    ),
    (
        "factory-without-colon",
        with_factory("nocolon"),
        ("{cfg}:4: models.cand.factory: expected 'module:function'", "got 'nocolon'"),
    ),
    (
        "unknown-tolerance-table",
        GOOD + "    tolerances: fp32\n",
        ("{cfg}:12: cases[0].tolerances: unknown tolerance table 'fp32'",),
    ),
    (
        "negative-tolerance",
        GOOD + "tolerances:\n  t:\n    - {atol: -0.1, rtol: 0}\n",
        ("{cfg}:14: tolerances.t[0].atol: must be >= 0, got -0.1",),
    ),
    (
        "atol-without-rtol",
        GOOD + "tolerances:\n  t:\n    - {atol: 0.1}\n",
        ("{cfg}:14: tolerances.t[0]: atol and rtol must be given together (missing 'rtol')",),
    ),
    (
        "case-unknown-model",
        variant("candidate: cand", "candidate: cnad"),
        ("{cfg}:10: cases[0].candidate: unknown model 'cnad' (known: base, cand; or {dump: path})",),
    ),
    (
        "case-unknown-inputs",
        variant("    inputs: toks\n", "    inputs: tok\n"),
        ("{cfg}:11: cases[0].inputs: unknown inputs 'tok' (known: toks)",),
    ),
    (
        "case-unknown-phase",
        GOOD + "    phases: [forward, update]\n",
        ("{cfg}:12: cases[0].phases: unknown phase 'update' (allowed: forward, backward, step)",),
    ),
    (
        "duplicate-case-name",
        GOOD + "  - {name: c1, baseline: cand, candidate: base, inputs: toks}\n",
        ("{cfg}:12: cases[1].name: duplicate case name 'c1'",),
    ),
    (
        "string-for-number",
        variant("seq_len: 3", "seq_len: '3'"),
        ("{cfg}:6: inputs.toks.seq_len: expected an integer, got str '3'",),
    ),
    (
        "hf-missing-class",
        variant(
            'cand: {source: factory, factory: "tiny_models:build"}',
            "cand: {source: hf, config: {vocab_size: 4}}",
        ),
        ("{cfg}:4: models.cand: an hf model needs 'class'",),
    ),
    (
        "mapping-unknown-op",
        GOOD
        + "    mapping: m\nmappings:\n  m:\n    tensors:\n      - {baseline: a, candidate: b, transform: {op: rotate}}\n",
        ("{cfg}:16: mappings.m.tensors[0].transform[0].op: unknown value 'rotate'", "allowed: concat, split"),
    ),
    (
        "mapping-wrong-arity",
        GOOD
        + "mappings:\n  m:\n    tensors:\n      - {baseline: [a, b], candidate: c, transform: {op: split, sizes: [1, 1]}}\n",
        ("{cfg}:15: mappings.m.tensors[0].transform: op 'split' takes 1 tensor(s) but gets 2",),
    ),
    (
        "mapping-placeholders-differ",
        GOOD + "mappings:\n  m:\n    renames:\n      - {baseline: 'layers.{i}', candidate: 'blocks.{n}'}\n",
        ("{cfg}:15: mappings.m.renames[0]: baseline and candidate must use the same {placeholders}",),
    ),
]


@pytest.mark.parametrize(
    ("config", "fragments"), [c[1:] for c in CONFIG_ERRORS], ids=[c[0] for c in CONFIG_ERRORS]
)
def test_bad_config_is_a_usage_error(
    pytester: pytest.Pytester, run_config_only: RunPytest, config: str, fragments: tuple[str, ...]
) -> None:
    (pytester.path / "cfg.yaml").write_text(config, encoding="utf-8")
    result = run_config_only("--align-config", "cfg.yaml")
    cfg = str(pytester.path / "cfg.yaml")
    _assert_usage_error(result, "ERROR: --align-config: ", *(f.replace("{cfg}", cfg) for f in fragments))


def test_missing_config_file(pytester: pytest.Pytester, run_config_only: RunPytest) -> None:
    result = run_config_only("--align-config", "no_such.yaml")
    _assert_usage_error(result, "ERROR: --align-config: no_such.yaml: config file not found")


def test_config_is_a_directory(pytester: pytest.Pytester, run_config_only: RunPytest) -> None:
    pytester.mkdir("suite")
    result = run_config_only("--align-config", "suite")
    _assert_usage_error(result, "suite: is a directory, expected an alignment YAML file")


def test_missing_config_file_from_ini(pytester: pytest.Pytester, run_config_only: RunPytest) -> None:
    pytester.makeini("[pytest]\nalign_config = suites/missing.yaml\n")
    result = run_config_only()
    _assert_usage_error(result, f"{pytester.path / 'suites' / 'missing.yaml'}: config file not found")


def test_option_without_value(pytester: pytest.Pytester, run_config_only: RunPytest) -> None:
    result = run_config_only("--align-config")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "argument --align-config: expected one argument" in "\n".join(result.errlines)
    assert "Traceback" not in "\n".join(result.outlines + result.errlines)


def test_missing_tolerance_file_names_the_config_line(
    pytester: pytest.Pytester, run_config_only: RunPytest
) -> None:
    (pytester.path / "cfg.yaml").write_text(GOOD + "tolerances:\n  t: tables/t.yaml\n", encoding="utf-8")
    result = run_config_only("--align-config", "cfg.yaml")
    _assert_usage_error(
        result, f"{pytester.path / 'cfg.yaml'}:13: tolerances.t: file not found: ", "tables/t.yaml"
    )


def _check_bad_source(suite: pytest.Pytester, result: pytest.RunResult, error_id: str) -> None:
    _, _, fragments = next(e for e in SOURCE_ERRORS if e[0] == error_id)
    cfg = suite.path / "cfg.yaml"
    _assert_usage_error(result, f"ERROR: --align-config: case 'c1': {cfg}:", *fragments)
    # The error stops the session at collection: no test ran.
    assert "passed" not in result.stdout.str()
    assert "failed" not in result.stdout.str()


@pytest.mark.parametrize(
    "error_id", ["module-not-importable", "attribute-missing", "factory-raises", "hf-class-missing"]
)
def test_bad_source_is_a_usage_error(suite: pytest.Pytester, error_id: str) -> None:
    """Serially (in process): each kind of broken source, its message. The -n 2 path, where a
    worker hands the error to the controller, is the next test."""
    config = next(e[1] for e in SOURCE_ERRORS if e[0] == error_id)
    (suite.path / "cfg.yaml").write_text(config, encoding="utf-8")
    basetemp = f"--basetemp={suite.path / 'bt'}"
    result = suite.runpytest_inprocess("--align-config", "cfg.yaml", "-p", "no:cacheprovider", basetemp)
    _check_bad_source(suite, result, error_id)


def test_bad_source_is_a_usage_error_on_xdist_workers(suite: pytest.Pytester) -> None:
    """With -n 2 the sources are checked on the workers: one worker's error is the run's one
    ``ERROR:`` line and exit code 4, as serially (one kind of error: the path is the same)."""
    config = next(e[1] for e in SOURCE_ERRORS if e[0] == "factory-raises")
    (suite.path / "cfg.yaml").write_text(config, encoding="utf-8")
    result = suite.runpytest_subprocess("--align-config", "cfg.yaml", "-p", "no:cacheprovider", "-n", "2")
    _check_bad_source(suite, result, "factory-raises")


def test_bad_source_in_deselected_case_is_not_checked(
    suite: pytest.Pytester, run_pytest: RunPytest, xdist: bool
) -> None:
    config = next(e[1] for e in SOURCE_ERRORS if e[0] == "error-in-second-case")
    result = _run(suite, run_pytest, config, "-k", "c1")
    # xdist's controller does not count what its workers deselected: only the serial run can
    # show the deselection; both show the selected case passing and no usage error.
    result.assert_outcomes(passed=1, deselected=0 if xdist else 1)
