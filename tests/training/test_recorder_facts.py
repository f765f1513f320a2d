"""What a ``Recorder`` run carries besides its records (issue #25, items 3, 8, 9): the
environment a case records (so ``precalign env-diff`` takes Recorder runs), the model's
config (so ``--mapping preset:...`` needs no ``--var``), and a note when the parameter grads
were gone at ``stop()`` (so the backward fails instead of passing on nothing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_precalign.cli import main

from .test_recorder import EXAMPLE, Tiny, _shared_run, compare, hf_run, torchrun

torch = pytest.importorskip("torch")

__all__ = ["hf_run"]  # the shared HF example run, a module fixture of test_recorder


def _run(root: Path, *, zero_before_stop: bool = False, steps: int = 1, bump: float = 0.0) -> Path:
    from pytest_precalign import Recorder

    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(root, mode="stats", param_grads="step")
    for _ in range(steps):
        rec.start(model)
        loss = model(torch.ones(3, 4) + bump).sum()
        loss.backward()
        optimizer.step()
        if zero_before_stop:
            optimizer.zero_grad()  # the loop zeroes the grads before stop(): grads_ready() was needed
        rec.stop()
        rec.step()
        optimizer.zero_grad()
    return root


def _manifest(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / "step0" / "rank0" / "manifest.json").read_text())
    return data


# -- 9: the environment ----------------------------------------------------------------------------


def test_recorder_runs_carry_the_environment_env_diff_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    manifest = _manifest(a)
    assert manifest["versions"]["torch"] == torch.__version__
    assert (manifest["device"], manifest["dtype"]) == ("cpu", "float32")
    assert {"platform", "determinism", "numerics", "torch_threads", "seed"} <= set(manifest)
    assert main(["env-diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"environment: the same in {a} and {b} (python ")
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "msprobe" not in out and out.startswith("environment: the same")


# -- 3: grads gone before stop() -------------------------------------------------------------------


def test_param_grads_zeroed_before_stop_fail_the_backward_naming_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _run(tmp_path / "a", zero_before_stop=True)
    b = _run(tmp_path / "b", zero_before_stop=True, bump=1.0)  # another input: its grads differ
    assert _manifest(a)["grads_missing"][0]["count"] == 4
    assert main(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    backward = next(line for line in out.splitlines() if "[backward]" in line)
    assert backward.startswith("FAILED") and "param grads missing" in backward
    assert "grads_ready() was not called" in out and "layers.0.weight" in out
    # Recorded right (grads_ready() not needed: the grads are still there at stop()), it passes.
    c, d = _run(tmp_path / "c"), _run(tmp_path / "d")
    assert "grads_missing" not in _manifest(c)
    assert main(["compare", str(c), str(d)]) == 0


def test_a_step_one_side_did_not_record_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _run(tmp_path / "a", steps=2), _run(tmp_path / "b", steps=1)
    assert main(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "step 1 was recorded by the baseline only" in out


# -- 8: the model's config -------------------------------------------------------------------------


def test_hf_and_megatron_recorder_runs_compare_under_a_preset_without_var(
    hf_run: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    pytest.importorskip("megatron.core")
    megatron = _shared_run(
        tmp_path_factory,
        "tp1pp1",
        lambda out: torchrun(1, "--tp", "1", "--pp", "1", "--steps", "2", "--out", str(out)),
    )
    hf_config = _manifest(hf_run)["model_config"]
    mcore_config = _manifest(megatron)["model_config"]
    assert (hf_config["source"], hf_config["class"]) == ("transformers", "Qwen2Config")
    assert (mcore_config["source"], mcore_config["class"]) == ("megatron-core", "TransformerConfig")
    assert (mcore_config["fields"]["num_attention_heads"], mcore_config["fields"]["num_query_groups"]) == (
        4,
        2,
    )
    tolerances = ("--tolerances", str(EXAMPLE / "tolerances.yaml"))
    done = compare(hf_run, megatron, "--mapping", "preset:megatron-qwen2.5", *tolerances)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert done.stdout.count("PASSED") == 3, done.stdout[-3000:]
    # --var still wins: a wrong head count breaks the fused-QKV transform.
    wrong = compare(
        hf_run,
        megatron,
        "--mapping",
        "preset:megatron-qwen2.5",
        "--var",
        "num_key_value_heads=4",
        *tolerances,
    )
    assert wrong.returncode != 0, wrong.stdout[-2000:]
