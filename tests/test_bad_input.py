"""End to end: bad input to ``pytest --align-config`` is one ``ERROR:`` line and exit code 4
(``pytest.UsageError``), and to the ``precalign`` CLI one ``precalign: error:`` line on stderr
and exit code 2 -- never a traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_precalign.cli import main

TINY_MODELS = """
import torch


class Tiny(torch.nn.Module):
    def __init__(self, vocab=4, width=4):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.proj = torch.nn.Sequential(torch.nn.Linear(width, vocab))

    def forward(self, input_ids):
        return self.proj(self.emb(input_ids))


def build(**kwargs):
    return Tiny(**kwargs)


def build_raises():
    raise RuntimeError("kaboom: no weights for layer 3")


def build_not_module():
    return {"not": "a module"}


def build_data_dependent():
    # Works on the CPU, but not on the meta device the preflight tries first.
    model = Tiny()
    if float(model.emb.weight.detach().abs().sum()) <= 0:
        raise AssertionError("unreachable")
    return model


def inputs_raises():
    raise ValueError("no tokenizer here")


NOT_CALLABLE = 3
"""

GOOD = """\
version: 1
models:
  base: {source: factory, factory: "tiny_models:build"}
  cand: {source: factory, factory: "tiny_models:build"}
inputs:
  toks: {kind: tokens, batch: 1, seq_len: 3, vocab_size: 4}
cases:
  - name: c1
    baseline: base
    candidate: cand
    inputs: toks
"""


def _variant(old: str, new: str, text: str = GOOD) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _with_factory(path: str) -> str:
    return _variant(
        'cand: {source: factory, factory: "tiny_models:build"}',
        f'cand: {{source: factory, factory: "{path}"}}',
    )


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(tiny_models=TINY_MODELS)
    return pytester


def _run(pytester: pytest.Pytester, config: str, *args: str) -> pytest.RunResult:
    """A pytest run that gets as far as building models: in a subprocess (pyproject's
    ``--runpytest=subprocess``), as torch cannot be re-imported after an in-process run."""
    (pytester.path / "cfg.yaml").write_text(config, encoding="utf-8")
    return pytester.runpytest("--align-config", "cfg.yaml", "-p", "no:cacheprovider", *args)


def _run_config_only(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """A pytest run that stops in ``pytest_configure``, before anything imports torch: in
    process, which is fast."""
    return pytester.runpytest_inprocess(*args, "-p", "no:cacheprovider", f"--basetemp={pytester.path / 'bt'}")


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


def test_good_config_runs(suite: pytest.Pytester) -> None:
    """The harness itself: the valid config these tests edit collects and passes."""
    result = _run(suite, GOOD)
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.OK


# -- config errors, reported at pytest_configure --------------------------------------------

# (id, config text, fragments of the one ERROR line; "{cfg}" is the config's absolute path)
CONFIG_ERRORS: list[tuple[str, str, tuple[str, ...]]] = [
    ("empty-file", "", ("ERROR: --align-config: {cfg}: the config is empty",)),
    ("yaml-syntax", "version: 1\nmodels:\n  base: x\n cand: y\n", ("{cfg}:4: YAML syntax error",)),
    ("version-missing", _variant("version: 1\n", ""), ("{cfg}:1: missing required key 'version'",)),
    ("version-2", _variant("version: 1", "version: 2"), ("{cfg}:1: version: expected 1", "got 2")),
    (
        "unknown-top-level-key",
        GOOD + "colour: red\n",
        ("{cfg}:12: colour: unknown key 'colour'", "allowed: cases, defaults, inputs"),
    ),
    (
        "unknown-model-key",
        _variant('factory: "tiny_models:build"}\n  cand', 'factory: "tiny_models:build", kwarg: {}}\n  cand'),
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
        _variant("base: {source: factory,", "base: {source: onnx,"),
        ("{cfg}:3: models.base.source: unknown source 'onnx' (allowed: hf, megatron, factory)",),
    ),
    (
        "factory-without-colon",
        _with_factory("nocolon"),
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
        _variant("candidate: cand", "candidate: cnad"),
        ("{cfg}:10: cases[0].candidate: unknown model 'cnad' (known: base, cand; or {dump: path})",),
    ),
    (
        "case-unknown-inputs",
        _variant("    inputs: toks\n", "    inputs: tok\n"),
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
        _variant("seq_len: 3", "seq_len: '3'"),
        ("{cfg}:6: inputs.toks.seq_len: expected an integer, got str '3'",),
    ),
    (
        "hf-missing-class",
        _variant(
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
    pytester: pytest.Pytester, config: str, fragments: tuple[str, ...]
) -> None:
    (pytester.path / "cfg.yaml").write_text(config, encoding="utf-8")
    result = _run_config_only(pytester, "--align-config", "cfg.yaml")
    cfg = str(pytester.path / "cfg.yaml")
    _assert_usage_error(result, "ERROR: --align-config: ", *(f.replace("{cfg}", cfg) for f in fragments))


def test_missing_config_file(pytester: pytest.Pytester) -> None:
    result = _run_config_only(pytester, "--align-config", "no_such.yaml")
    _assert_usage_error(result, "ERROR: --align-config: no_such.yaml: config file not found")


def test_config_is_a_directory(pytester: pytest.Pytester) -> None:
    pytester.mkdir("suite")
    result = _run_config_only(pytester, "--align-config", "suite")
    _assert_usage_error(result, "suite: is a directory, expected an alignment YAML file")


def test_missing_config_file_from_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nalign_config = suites/missing.yaml\n")
    result = _run_config_only(pytester)
    _assert_usage_error(result, f"{pytester.path / 'suites' / 'missing.yaml'}: config file not found")


def test_option_without_value(pytester: pytest.Pytester) -> None:
    result = _run_config_only(pytester, "--align-config")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "argument --align-config: expected one argument" in "\n".join(result.errlines)
    assert "Traceback" not in "\n".join(result.outlines + result.errlines)


def test_missing_tolerance_file_names_the_config_line(pytester: pytest.Pytester) -> None:
    (pytester.path / "cfg.yaml").write_text(GOOD + "tolerances:\n  t: tables/t.yaml\n", encoding="utf-8")
    result = _run_config_only(pytester, "--align-config", "cfg.yaml")
    _assert_usage_error(
        result, f"{pytester.path / 'cfg.yaml'}:13: tolerances.t: file not found: ", "tables/t.yaml"
    )


# -- source errors: found by the preflight (meta device, then CPU) before any test runs -----------
#
# Every source error goes through the CLI's ``validate`` in process (fast); the pytest plugin,
# whose runs must import torch in a subprocess, gets a representative few of them.

HF_MODEL = "cand: {source: hf, class: %s, config: {vocab_size: 4}}"

# (id, config text, fragments after "<cfg>:<line>: ")
SOURCE_ERRORS: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "module-not-importable",
        _with_factory("no_such_module:build"),
        (":4: models.cand.factory: cannot import module 'no_such_module' from 'no_such_module:build'",),
    ),
    (
        "attribute-missing",
        _with_factory("tiny_models:missing_attr"),
        (":4: models.cand.factory: module 'tiny_models' has no attribute 'missing_attr'",),
    ),
    (
        "not-callable",
        _with_factory("tiny_models:NOT_CALLABLE"),
        (":4: models.cand.factory: 'tiny_models:NOT_CALLABLE' is not callable",),
    ),
    (
        "factory-raises",
        _with_factory("tiny_models:build_raises"),
        (
            ":4: models.cand.factory: tiny_models:build_raises(**{}) raised RuntimeError: kaboom: no weights for layer 3",
        ),
    ),
    (
        "factory-bad-kwargs",
        _variant(
            'cand: {source: factory, factory: "tiny_models:build"}',
            'cand: {source: factory, factory: "tiny_models:build", kwargs: {depth: 2}}',
        ),
        (":4: models.cand.factory: tiny_models:build(**{'depth': 2}) raised TypeError", "depth"),
    ),
    (
        "factory-returns-no-module",
        _with_factory("tiny_models:build_not_module"),
        (":4: models.cand.factory: tiny_models:build_not_module returned dict, expected a torch.nn.Module",),
    ),
    (
        "module-import-raises",
        _with_factory("broken_models:build"),
        (":4: models.cand.factory: importing 'broken_models' raised ZeroDivisionError",),
    ),
    (
        "inputs-factory-raises",
        _variant(
            "{kind: tokens, batch: 1, seq_len: 3, vocab_size: 4}",
            "{kind: factory, factory: 'tiny_models:inputs_raises'}",
        ),
        (":6: inputs.toks.factory: tiny_models:inputs_raises raised ValueError: no tokenizer here",),
    ),
    (
        "error-in-second-case",
        _variant(
            "inputs:\n",
            '  bad: {source: factory, factory: "tiny_models:build_raises"}\ninputs:\n',
            GOOD + "  - {name: broken, baseline: base, candidate: bad, inputs: toks}\n",
        ),
        (":5: models.bad.factory: tiny_models:build_raises(**{}) raised RuntimeError: kaboom",),
    ),
    (
        "hf-class-missing",
        _variant(
            'cand: {source: factory, factory: "tiny_models:build"}',
            HF_MODEL % "transformers.NoSuchModelForCausalLM",
        ),
        (":4: models.cand.class: module 'transformers' has no attribute 'NoSuchModelForCausalLM'",),
    ),
    (
        "hf-class-not-a-model",
        _variant('cand: {source: factory, factory: "tiny_models:build"}', HF_MODEL % "tiny_models.Tiny"),
        (":4: models.cand.class: tiny_models.Tiny has no config_class; is it a transformers model?",),
    ),
    (
        "hf-pretrained-dir-missing",
        _variant(
            'cand: {source: factory, factory: "tiny_models:build"}',
            "cand: {source: hf, class: transformers.Qwen2ForCausalLM, pretrained: weights/qwen}",
        ),
        (":4: models.cand.pretrained: ", "weights/qwen is not a directory (only local models are loaded)"),
    ),
]


@pytest.fixture
def cli_suite(tmp_path: Path) -> Iterator[Path]:
    """A config folder with tiny_models.py; the CLI imports it into this process, so unload it."""
    (tmp_path / "tiny_models.py").write_text(textwrap.dedent(TINY_MODELS), encoding="utf-8")
    (tmp_path / "broken_models.py").write_text("SCALE = 1 / 0\n", encoding="utf-8")
    yield tmp_path
    sys.modules.pop("tiny_models", None)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _assert_cli_error(err: str, *fragments: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("precalign: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"


@pytest.mark.parametrize(
    ("config", "fragments"), [c[1:] for c in SOURCE_ERRORS], ids=[c[0] for c in SOURCE_ERRORS]
)
def test_bad_source_cli(
    cli_suite: Path, capsys: pytest.CaptureFixture[str], config: str, fragments: tuple[str, ...]
) -> None:
    cfg = cli_suite / "cfg.yaml"
    cfg.write_text(config, encoding="utf-8")
    code, out, err = _cli(capsys, "validate", str(cfg))
    assert (code, out) == (2, "")
    _assert_cli_error(err, f"precalign: error: {cfg}:", *fragments)


@pytest.mark.parametrize(
    "error_id", ["module-not-importable", "attribute-missing", "factory-raises", "hf-class-missing"]
)
def test_bad_source_is_a_usage_error(suite: pytest.Pytester, error_id: str) -> None:
    _, config, fragments = next(e for e in SOURCE_ERRORS if e[0] == error_id)
    result = _run(suite, config)
    cfg = suite.path / "cfg.yaml"
    _assert_usage_error(result, f"ERROR: --align-config: case 'c1': {cfg}:", *fragments)
    # The error stops the session at collection: no test ran.
    assert "passed" not in result.stdout.str()
    assert "failed" not in result.stdout.str()


def test_bad_source_in_deselected_case_is_not_checked(suite: pytest.Pytester) -> None:
    config = next(e[1] for e in SOURCE_ERRORS if e[0] == "error-in-second-case")
    result = _run(suite, config, "-k", "c1")
    result.assert_outcomes(passed=1, deselected=1)


def test_factory_failing_only_on_meta_is_retried_on_cpu(
    cli_suite: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = cli_suite / "cfg.yaml"
    cfg.write_text(_with_factory("tiny_models:build_data_dependent"), encoding="utf-8")
    code, out, err = _cli(capsys, "validate", str(cfg))
    assert (code, err) == (0, "")


# -- the precalign CLI --------------------------------------------------------------------------


def test_cli_validate_good_config(cli_suite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (cli_suite / "cfg.yaml").write_text(GOOD, encoding="utf-8")
    code, out, err = _cli(capsys, "validate", str(cli_suite / "cfg.yaml"))
    assert (code, err) == (0, "")
    assert out == f"{cli_suite / 'cfg.yaml'}: valid (1 case(s), 2 model(s))\n"


@pytest.mark.parametrize("command", ["validate", "run"])
def test_cli_missing_config(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, out, err = _cli(capsys, command, str(tmp_path / "nope.yaml"))
    assert (code, out) == (2, "")
    _assert_cli_error(err, f"{tmp_path / 'nope.yaml'}: config file not found")


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        (GOOD + "extra: 1\n", (":12: extra: unknown key 'extra'", "allowed: cases")),
        ("version: 1\nmodels: {a: [\n", (":3: YAML syntax error",)),
        (_variant("batch: 1", "batch: one"), (":6: inputs.toks.batch: expected an integer, got str 'one'",)),
        (
            _with_factory("tiny_models:build_raises"),
            (":4: models.cand.factory:", "raised RuntimeError: kaboom"),
        ),
        (_with_factory("no_such_module:build"), ("cannot import module 'no_such_module'",)),
    ],
    ids=["unknown-key", "yaml-syntax", "wrong-type", "factory-raises", "no-module"],
)
def test_cli_bad_config(
    cli_suite: Path, capsys: pytest.CaptureFixture[str], command: str, config: str, fragments: tuple[str, ...]
) -> None:
    (cli_suite / "cfg.yaml").write_text(config, encoding="utf-8")
    code, out, err = _cli(capsys, command, str(cli_suite / "cfg.yaml"))
    assert (code, out) == (2, "")
    _assert_cli_error(err, str(cli_suite / "cfg.yaml"), *fragments)


def test_cli_run_unknown_case(cli_suite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (cli_suite / "cfg.yaml").write_text(GOOD, encoding="utf-8")
    code, out, err = _cli(capsys, "run", str(cli_suite / "cfg.yaml"), "--case", "c2")
    assert (code, out) == (2, "")
    _assert_cli_error(err, "no case named 'c2' (known: c1)")


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ([], "the following arguments are required: command"),
        (["run"], "the following arguments are required: config"),
        (["check", "cfg.yaml"], "invalid choice: 'check'"),
        (["run", "cfg.yaml", "--cases", "c1"], "unrecognized arguments: --cases c1"),
    ],
    ids=["no-command", "no-config", "unknown-command", "unknown-option"],
)
def test_cli_bad_arguments(capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str) -> None:
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert fragment in err
    assert "Traceback" not in err


def test_cli_subprocess_no_traceback(cli_suite: Path) -> None:
    """The installed entry point, in a fresh interpreter: exit code 2 and one stderr line."""
    (cli_suite / "cfg.yaml").write_text(_with_factory("tiny_models:build_raises"), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_precalign", "validate", "cfg.yaml"],
        cwd=cli_suite,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    _assert_cli_error(proc.stderr, f"{cli_suite / 'cfg.yaml'}:4: models.cand.factory:", "kaboom")
