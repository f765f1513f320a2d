"""``precalign calibrate``: a measured tolerance table that passes the fault-free eager/sdpa pair
and still names the example suite's deliberate MLP bug as the origin."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from pytest_precalign.cli import main
from pytest_precalign.compare.tolerances import parse_table
from pytest_precalign.config.loader import load_config_file
from pytest_precalign.run.case import run_case
from tests.helpers.paths import EXAMPLES

SUITE = EXAMPLES / "qwen2_hf_attention"
ORIGINAL_TABLE = """tolerances:
  fp32:
    - {match: "*", kind: loss, atol: 1.0e-5, rtol: 0, why: "seed 004 table: loss, float32"}
    - {match: "*", kind: logits, atol: 1.0e-4, rtol: 0, why: "seed 004 table: logits, float32"}
    - {match: "*", atol: 1.0e-4, rtol: 1.0e-3, why: "every tensor, fp32"}
"""


def _suite_copy(root: Path) -> Path:
    folder = root / "suite"
    shutil.copytree(SUITE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def _calibrate(folder: Path, out: Path, *extra: str) -> int:
    argv = ["calibrate", str(folder / "align.yaml"), "--case", "eager_vs_sdpa", "--out", str(out)]
    return main([*argv, *extra])


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The example suite calibrated once with the default perturbations: (suite, table, stdout)."""
    import contextlib
    import io

    folder = _suite_copy(tmp_path_factory.mktemp("calibrated"))
    out = folder / "calibrated.yaml"
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert _calibrate(folder, out) == 0
    return folder, out, buffer.getvalue()


def _use_table(folder: Path, table: Path) -> Path:
    """The suite's config with its hand-written fp32 table replaced by the calibrated file."""
    text = (folder / "align.yaml").read_text()
    assert ORIGINAL_TABLE in text
    config = folder / f"align_{table.stem}.yaml"
    config.write_text(text.replace(ORIGINAL_TABLE, f"tolerances:\n  fp32: {table.name}\n"))
    return config


def _check_table_gates_the_suite(folder: Path, table: Path) -> None:
    config = load_config_file(_use_table(folder, table))
    rules = config.tolerances["fp32"].rules
    assert rules and all(r.why for r in rules)
    fine = run_case(config, config.case("eager_vs_sdpa"))
    for phase in ("forward", "backward", "step"):
        verdict = fine.verdicts[phase]
        assert verdict.passed and verdict.aligned and verdict.compared > 0, phase
        # The pair's differences are real (not bitwise equal) and the table admits them.
        assert any(p.closeness and p.closeness.greatest_abs > 0 for p in fine.comparison.by_phase(phase))
    buggy = run_case(config, config.case("known_mlp_bug"))
    forward = buggy.verdicts["forward"]
    assert forward.passed and not forward.aligned  # the case's expect: matched exactly
    assert forward.first is not None
    assert (forward.first.name, forward.first.kind, forward.first.origin) == (
        "model.layers.1.mlp",
        "activation",
        True,
    )
    assert forward.first.value > 1000 * forward.first.allowed
    assert "Measured max |delta|" in forward.first.rule  # a calibrated rule made the call


def test_default_table_passes_the_pair_and_catches_the_mlp_bug(calibrated: tuple[Path, Path, str]) -> None:
    folder, table, _ = calibrated
    _check_table_gates_the_suite(folder, table)


def test_float64_reference_alone_is_enough(tmp_path: Path) -> None:
    """Without the attention-kernel switch (which *is* the pair) the float64 reference still
    gives bounds the eager/sdpa pair stays within, at the default margin."""
    folder = _suite_copy(tmp_path)
    table = folder / "f64.yaml"
    assert _calibrate(folder, table, "--perturbations", "float64") == 0
    why = yaml.safe_load(table.read_text())["rules"][0]["why"]
    assert "under float64" in why and "attn" not in why
    _check_table_gates_the_suite(folder, table)


def test_every_rule_says_how_it_was_measured(calibrated: tuple[Path, Path, str]) -> None:
    _, table, _ = calibrated
    data = yaml.safe_load(table.read_text())
    for rule in data["rules"]:
        why = rule["why"]
        assert "Measured max |delta|" in why and ("under float64" in why or "under attn" in why)
        assert (
            "margin 4 x" in why and f"precalign calibrate {table.parent}" in why and f"--out {table}" in why
        )
        assert rule["rtol"] == 0 and rule["atol"] > 0 and rule["dtype"] == "float32"
    text = table.read_text()
    assert "seed (run-time seed 1 vs 0, same weights): skipped: no active dropout (train: false)" in text


def test_bounds_cover_every_measured_record_by_the_margin(calibrated: tuple[Path, Path, str]) -> None:
    _, table, _ = calibrated
    rules = parse_table("cal", str(table), "x", "", Path("/"))
    sidecar = json.loads(table.with_name("calibrated.calibration.json").read_text())
    assert sidecar["margin"] == 4
    noise = sidecar["noise"]
    assert {n["perturbation"] for n in noise} == {"float64", "attn"}
    assert any(n["max_abs"] > 0 for n in noise)
    for n in noise:
        tol = rules.lookup(n["name"], n["kind"], n["phase"], n["dtype"], n["step"])
        assert tol.rule is not None, n
        assert tol.atol >= 4 * n["max_abs"], (n, tol)


def test_amplification_is_output_error_over_input_error(calibrated: tuple[Path, Path, str]) -> None:
    _, table, stdout = calibrated
    sidecar = json.loads(table.with_name("calibrated.calibration.json").read_text())
    rows = sidecar["amplification"]
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    assert len(ratios) > 20 and all(math.isfinite(r) and r > 0 for r in ratios)
    # Recompute one row from the per-record noise: the MLP of layer 1 under the float64 reference.
    noise = [
        n for n in sidecar["noise"] if n["perturbation"] == "float64" and n["name"] == "model.layers.1.mlp"
    ]
    out_err = max(n["max_abs"] for n in noise if n["kind"] == "activation")
    in_err = max(n["max_abs"] for n in noise if n["kind"] == "input")
    row = next(
        r
        for r in rows
        if (r["module"], r["direction"], r["perturbation"]) == ("model.layers.1.mlp", "forward", "float64")
    )
    assert row["input_error"] == in_err > 0 and row["output_error"] == out_err > 0
    assert row["ratio"] == pytest.approx(out_err / in_err)
    # Modules fed exactly equal inputs have no ratio, and say so.
    exact = next(r for r in rows if r["module"] == "model.layers.0" and r["direction"] == "forward")
    assert exact["input_error"] == 0 and exact["ratio"] is None
    assert "Error amplification per layer (output error / input error)" in stdout
    line = next(
        x for x in stdout.splitlines() if x.split()[:3] == ["model.layers.1.mlp", "forward", "float64"]
    )
    assert f"{row['ratio']:.3g}" in line
    assert "n/a (input exact)" in stdout


TINY = """version: 1
defaults: {{device: cpu, dtype: float32, seed: 0, deterministic: true}}
models:
  qwen:
    source: hf
    class: transformers.Qwen2ForCausalLM
    config: {{vocab_size: 64, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1,
             num_attention_heads: 2, num_key_value_heads: 1, attention_dropout: {dropout}}}
    attn_implementation: eager
  plain: {{source: factory, factory: "calib_tiny_net:build"}}
inputs:
  tokens: {{kind: tokens, batch: 1, seq_len: 8, vocab_size: 64, seed: 1, labels: true}}
cases:
  - {{name: train, baseline: qwen, candidate: qwen, inputs: tokens, phases: [forward], train: true}}
  - {{name: factory, baseline: plain, candidate: plain, inputs: tokens, phases: [forward], loss: none}}
"""


NET = """import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(64, 8)
        self.out = torch.nn.Linear(8, 64)

    def forward(self, input_ids):
        return self.out(self.emb(input_ids))


def build():
    return Net()
"""


def test_seed_runs_only_with_active_dropout_and_attn_only_on_hf(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "calib_tiny_net.py").write_text(NET)
    (tmp_path / "drop.yaml").write_text(TINY.format(dropout=0.5))
    out = tmp_path / "drop_table.yaml"
    assert (
        main(
            [
                "calibrate",
                "--config",
                str(tmp_path / "drop.yaml"),
                "--case",
                "train",
                "--out",
                str(out),
                "--perturbations",
                "seed,attn",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "train: seed: " in printed and "skipped" not in printed.split("train: seed: ")[1].splitlines()[0]
    sidecar = json.loads(out.with_name("drop_table.calibration.json").read_text())
    seed_noise = [n["max_abs"] for n in sidecar["noise"] if n["perturbation"] == "seed"]
    assert seed_noise and max(seed_noise) > 0  # another dropout mask: a real difference
    assert "config attention_dropout=0.5" in out.read_text()

    (tmp_path / "plain.yaml").write_text(TINY.format(dropout=0.0))
    out2 = tmp_path / "plain_table.yaml"
    code = main(
        [
            "calibrate",
            "--config",
            str(tmp_path / "plain.yaml"),
            "--case",
            "train",
            "--case",
            "factory",
            "--out",
            str(out2),
            "--perturbations",
            "seed,attn,float64",
        ]
    )
    assert code == 0
    text = out2.read_text()
    assert "train: seed (run-time seed 1 vs 0, same weights): skipped: dropout-free model" in text
    assert (
        "factory: attn (another attention kernel): skipped: source 'factory' has no attention-kernel switch"
        in text
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--config", "{tmp}/missing.yaml", "--out", "{tmp}/t.yaml"], "missing.yaml: config file not found"),
        (
            ["--config", "{cfg}", "--case", "nope", "--out", "{tmp}/t.yaml"],
            "no case named 'nope' (known: eager_vs_sdpa, known_mlp_bug)",
        ),
        (
            ["--config", "{cfg}", "--out", "{tmp}/t.yaml", "--margin", "abc"],
            "--margin: expected a number >= 1",
        ),
        (["--config", "{cfg}", "--out", "{tmp}/t.yaml", "--margin", "0.5"], "got '0.5'"),
        (
            ["--config", "{cfg}", "--out", "{tmp}/t.yaml", "--perturbations", "float64,fp8"],
            "unknown perturbation 'fp8' (allowed: a comma-separated list of float64, attn, seed)",
        ),
        (
            ["--config", "{cfg}", "--out", "{tmp}/exists.yaml"],
            "exists.yaml already exists; refusing to overwrite it (pass --force)",
        ),
        (["--config", "{cfg}", "--out", "{tmp}/nodir/t.yaml"], "--out: folder {tmp}/nodir does not exist"),
        (
            ["--out", "{tmp}/t.yaml"],
            "calibrate: give the config once, as `precalign calibrate CONFIG --out FILE`",
        ),
        (["{cfg}", "--config", "{cfg}", "--out", "{tmp}/t.yaml"], "calibrate: give the config once"),
    ],
)
def test_usage_errors_exit_2_with_one_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], fragment: str
) -> None:
    (tmp_path / "exists.yaml").write_text("keep me\n")
    argv = ["calibrate", *(a.format(tmp=tmp_path, cfg=SUITE / "align.yaml") for a in args)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("precalign: error: ") and err.count("\n") == 1, err
    assert fragment.format(tmp=tmp_path) in err
    assert "Traceback" not in err
    assert (tmp_path / "exists.yaml").read_text() == "keep me\n"
    assert not (tmp_path / "t.yaml").exists()


def test_force_replaces_an_existing_table(
    calibrated: tuple[Path, Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _, _ = calibrated
    out = tmp_path / "t.yaml"
    out.write_text("old\n")
    # No --case: every case that runs models, minus those another covers (known_mlp_bug's
    # baseline, inputs and phases are a subset of eager_vs_sdpa's).
    argv = [
        "calibrate",
        "--config",
        str(folder / "align.yaml"),
        "--out",
        str(out),
        "--perturbations",
        "float64",
    ]
    assert main([*argv, "--margin", "8", "--force"]) == 0
    assert capsys.readouterr().out.startswith("eager_vs_sdpa: float64: ")
    data = yaml.safe_load(out.read_text())
    assert data["rules"] and all("margin 8 x" in r["why"] for r in data["rules"])
    assert "known_mlp_bug" not in out.read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left
