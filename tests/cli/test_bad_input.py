"""Bad input to the ``precalign`` CLI is one ``precalign: error:`` line on stderr and exit code
2, never a traceback. The pytest plugin's side is in tests/integration/test_bad_input.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_precalign.cli import main
from tests.helpers.bad_input import GOOD, SOURCE_ERRORS, TINY_MODELS, variant, with_factory


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


def test_factory_failing_only_on_meta_is_retried_on_cpu(
    cli_suite: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = cli_suite / "cfg.yaml"
    cfg.write_text(with_factory("tiny_models:build_data_dependent"), encoding="utf-8")
    code, out, err = _cli(capsys, "validate", str(cfg))
    assert (code, err) == (0, "")


# -- the precalign CLI --------------------------------------------------------------------------


def test_validate_does_not_build_inputs(cli_suite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A billion tokens (8 GB of ids) are the run's business, not validate's: it checks the
    config and the sources, and returns."""
    (cli_suite / "cfg.yaml").write_text(
        variant("seq_len: 3", "seq_len: 1000000000").replace("batch: 1", "batch: 8"), encoding="utf-8"
    )
    code, out, err = _cli(capsys, "validate", str(cli_suite / "cfg.yaml"))
    assert (code, err) == (0, ""), err
    assert out.endswith(": valid (1 case(s), 2 model(s))\n")


def test_an_input_factory_that_raises_is_one_message_when_the_case_runs(
    cli_suite: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = cli_suite / "cfg.yaml"
    factory = "{kind: factory, factory: 'tiny_models:inputs_raises'}"
    cfg.write_text(variant("{kind: tokens, batch: 1, seq_len: 3, vocab_size: 4}", factory), encoding="utf-8")
    assert _cli(capsys, "validate", str(cfg))[0] == 0  # it imports: validate does not call it
    code, out, err = _cli(capsys, "run", str(cfg))
    assert (code, out) == (2, "")
    _assert_cli_error(
        err, f"precalign: error: {cfg}:6: inputs.toks.factory: tiny_models:inputs_raises raised ValueError"
    )


@pytest.mark.parametrize(
    ("inputs", "where"),
    [
        ("{kind: tokens, batch: 1, seq_len: 1, vocab_size: 4, labels: true}", "inputs"),
        ("{kind: ids, input_ids: [[1], [2]], labels: true}", "inputs"),
    ],
    ids=["tokens", "ids"],
)
def test_one_token_with_the_causal_lm_loss_is_a_config_error(
    cli_suite: Path, capsys: pytest.CaptureFixture[str], inputs: str, where: str
) -> None:
    """The causal-LM loss of one token is NaN on both sides: refused, not compared as aligned."""
    cfg = cli_suite / "cfg.yaml"
    cfg.write_text(variant("{kind: tokens, batch: 1, seq_len: 3, vocab_size: 4}", inputs), encoding="utf-8")
    code, out, err = _cli(capsys, "validate", str(cfg))
    assert (code, out) == (2, "")
    _assert_cli_error(err, f"precalign: error: {cfg}:", "loss 'causal_lm' needs at least 2 tokens per row")


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
        (variant("batch: 1", "batch: one"), (":6: inputs.toks.batch: expected an integer, got str 'one'",)),
        (
            with_factory("tiny_models:build_raises"),
            (":4: models.cand.factory:", "raised RuntimeError: kaboom"),
        ),
        (with_factory("no_such_module:build"), ("cannot import module 'no_such_module'",)),
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
    (cli_suite / "cfg.yaml").write_text(with_factory("tiny_models:build_raises"), encoding="utf-8")
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
