"""benchmarks/mutations.py on a small subset (3 seeded faults, 1 fault-free pair), so the
benchmark cannot rot: it must detect and localise them, raise no false alarm and end with
its JSON line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers.paths import REPO, SRC

SUBSET = "hf_act_gelu,hf_bwd_down_grad_in,hf_map_gate_up,clean_eager_vs_sdpa"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(SRC), os.environ.get("PYTHONPATH")))),
    }
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "mutations.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


def test_subset_is_detected_and_localised() -> None:
    proc = _run("--only", SUBSET, "--no-distributed")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    figures = json.loads(lines[-1])
    assert figures["mutations"] == 3
    assert figures["clean_pairs"] == 1
    assert figures["not_run"] == []
    assert figures["detected"] == 3
    assert figures["localised"] == 3
    assert figures["false_alarms"] == 0
    table = "\n".join(lines)
    assert (
        "| hf_map_gate_up | hf | mapping | forward | `model.layers.0.mlp.gate_proj` | `model.layers.0.mlp.gate_proj` | yes | yes |"
        in table
    )
    assert "| hf_bwd_down_grad_in | hf | backward | backward |" in table
    assert "| clean_eager_vs_sdpa | hf | clean | - | `-` | `-` | clean | - |" in table


def test_unknown_case_is_one_clear_error() -> None:
    proc = _run("--only", "no_such_mutation")
    assert proc.returncode != 0
    assert "--only: unknown case(s) no_such_mutation (allowed:" in proc.stderr
    assert "Traceback" not in proc.stderr


TRAINING_SUBSET = (
    "warmup_one_step_behind,adam_eps_planted,mlp_bug_from_step_5,adam_bias_correction_off,clean_rerun"
)


def test_training_subset_is_found_at_its_step_and_class() -> None:
    proc = _run("--training", "--only", TRAINING_SUBSET)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (figures["mutations"], figures["clean_pairs"]) == (4, 1)
    assert figures["detected"] == figures["right_step"] == figures["right_class"] == 4
    assert figures["false_alarms"] == 0 and figures["missed"] == []
    assert figures["right_origin"] == figures["with_origin"] == 2
