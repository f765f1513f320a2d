"""A training gate is never green on missing evidence or on NaN (issue #34 items 2 and 6).

* Evidence one side recorded and the other did not (initial parameters, the training plan),
  is a finding that says so -- it used to skip the check and pass; evidence in a shape no check
  can use (``initial_params: [1, 2, 3]``) is one message naming the file and the key (exit 2).
* A run whose loss (or any scalar the verdict judges) is NaN on both sides fails: "loss is nan
  on both sides from step 2", as torch.testing.assert_close's ``equal_nan=False``; records
  with the same NaN/Inf at the same places fail their phase. ``equal_nan: true`` on the
  table's rule accepts it, with a warning in the summary. Cases and recordings alike.

Real runs: ``precalign record`` / ``precalign run`` of tiny models, edited or broken the way
a user's would be.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_precalign.cli import main
from tests.helpers.files import copy_trace
from tests.helpers.nets import write_mlp_suite


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-step training case recorded by ``precalign record`` (statistics)."""
    folder = tmp_path_factory.mktemp("training")
    config = write_mlp_suite(folder, mode="stats")
    config.write_text(config.read_text().replace("record: {mode: stats}", "steps: 3, record: {mode: stats}"))
    assert main(["record", str(config), "--out", str(folder / "rec")]) == 0
    return folder / "rec" / "port"


def _compare(a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["compare", str(a), str(b)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out


@pytest.mark.parametrize(
    ("edit", "finding"),
    [
        (
            lambda m: m.pop("initial_params"),
            "initial parameters recorded by the baseline only: the initial weights are not compared",
        ),
        (
            lambda m: m["training"].pop("plan"),
            "training plan recorded by the baseline only: the settings (contract) are not checked before step 0",
        ),
    ],
    ids=["initial-params-one-side", "plan-one-side"],
)
def test_evidence_on_one_side_only_is_a_finding(
    recorded: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: Callable[[dict[str, Any]], Any],
    finding: str,
) -> None:
    a = copy_trace(recorded, tmp_path / "a")
    code, out = _compare(a, copy_trace(recorded, tmp_path / "same"), capsys)
    assert code == 0 and "Runs do not line up" not in out, out  # untouched, the runs pass
    code, out = _compare(a, copy_trace(recorded, tmp_path / "b", edit), capsys)
    assert code == 1, out
    assert f"Runs do not line up: {finding}" in out, out


def test_evidence_of_the_wrong_shape_is_one_message(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``initial_params: [1, 2, 3]``: the typed reader refuses it naming the file and the key
    (exit 2), instead of skipping the initial weights check."""
    a = copy_trace(recorded, tmp_path / "a")
    b = copy_trace(recorded, tmp_path / "b", lambda m: m.__setitem__("initial_params", [1, 2, 3]))
    code = main(["compare", str(a), str(b)])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err, err
    assert "initial_params: expected a mapping, got list [1, 2, 3]" in err, err


NAN_NETS = """import torch


class Breaks(torch.nn.Module):
    \"\"\"A tiny LM whose hidden state turns NaN from its third call on (step 2), alike on
    either side: the same fault in both runs.\"\"\"

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16)
        self.calls = 0

    def forward(self, input_ids):
        self.calls += 1
        hidden = self.emb(input_ids)
        if self.calls > 2:
            hidden = hidden * float("nan")
        return self.head(hidden)


def build():
    return Breaks()
"""

NAN_CONFIG = """version: 1
defaults: {device: cpu, dtype: float32, seed: 0, deterministic: true}
models:
  a: {source: factory, factory: "nan_nets:build"}
  b: {source: factory, factory: "nan_nets:build"}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 4, vocab_size: 16, seed: 1, labels: true}
tolerances:
  t:
    - {match: "*", atol: 1.0e-6, rtol: 1.0e-5RULE}
cases:
  - {name: nan_run, baseline: a, candidate: b, inputs: toks, steps: 4, phases: [forward, backward, step],
     optimizer: {name: adamw, lr: 0.01}, tolerances: t}
"""

LOSS_NAN = "loss is nan on both sides from step 2 (2 of 4 step(s))"


def _nan_suite(folder: Path, monkeypatch: pytest.MonkeyPatch, rule: str = "") -> Path:
    (folder / "nan_nets.py").write_text(NAN_NETS)
    monkeypatch.syspath_prepend(str(folder))
    config = folder / "align.yaml"
    config.write_text(NAN_CONFIG.replace("RULE", rule))
    return config


def test_a_run_nan_on_both_sides_fails_every_phase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _nan_suite(tmp_path, monkeypatch)
    assert main(["run", str(config)]) == 1
    out = capsys.readouterr().out
    summaries = [line for line in out.splitlines() if line.startswith(("PASSED", "FAILED"))]
    assert len(summaries) == 3 and all(line.startswith("FAILED") for line in summaries), summaries
    assert (
        f"Runs do not line up: {LOSS_NAN}: NaN/Inf is not a value, two runs broken alike are not aligned"
        in out
    )
    assert "diverged first" not in out  # both broke alike: no difference between them is claimed
    assert (
        "nonfinite_shared: 128 NaN/Inf element(s) at the same places on both sides: NaN is not a value "
        "(as torch.testing.assert_close, equal_nan=False); set equal_nan: true on the rule to accept it"
    ) in out


def test_equal_nan_true_passes_with_a_stated_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _nan_suite(tmp_path, monkeypatch, ", equal_nan: true")
    assert main(["run", str(config)]) == 0
    summaries = [line for line in capsys.readouterr().out.splitlines() if line.startswith("PASSED")]
    assert len(summaries) == 3, summaries
    for line in summaries:
        assert "record(s) NaN/Inf on both sides, accepted by equal_nan: true" in line, line
        assert f"warning: {LOSS_NAN}: accepted by the table's equal_nan: true" in line, line


def test_recordings_nan_on_both_sides_fail_compare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _nan_suite(tmp_path, monkeypatch)
    for side in ("a", "b"):
        assert main(["record", str(config), "--out", str(tmp_path / side)]) == 0
    capsys.readouterr()
    code, out = _compare(tmp_path / "a" / "nan_run", tmp_path / "b" / "nan_run", capsys)
    assert code == 1
    assert f"Runs do not line up: {LOSS_NAN}" in out, out


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["scalars"]["0"].__setitem__("loss", [1.0, 2.0]), "scalars['0'].loss: expected a number"),
        (
            lambda m: m["scalars"]["0"].__setitem__("grad_norm", "abc"),
            "scalars['0'].grad_norm: expected a number",
        ),
        (lambda m: m["scalars"]["0"].__setitem__("batch_hash", 12345), "batch_hash: expected a string"),
        (lambda m: m["training"]["plan"].__setitem__("lr", ["a"]), "training.plan.lr[0]: expected a list"),
        (lambda m: m["training"]["plan"].__setitem__("groups", 7), "training.plan.groups: expected a list"),
        (
            lambda m: m["training"]["plan"].__setitem__("weight_decay", {"a": 1}),
            "plan.weight_decay: expected a list",
        ),
    ],
    ids=["loss-list", "grad-norm-text", "hash-number", "lr-text", "groups-number", "decay-mapping"],
)
def test_crafted_run_files_are_one_message(
    recorded: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: Callable[[dict[str, Any]], Any],
    message: str,
) -> None:
    """Per-step scalars and plans of the wrong type: one message naming the file and the key,
    exit 2 (they were TypeError / ValueError / KeyError tracebacks)."""
    a = copy_trace(recorded, tmp_path / "a")
    b = copy_trace(recorded, tmp_path / "b", edit)
    code = main(["compare", str(a), str(b)])
    _, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err, err
    assert "manifest.json" in err and message in err, err
