"""A user's own training run, recorded any way, compared one way (issue #32, items 1-2).

The example scripts a user starts from, in a subprocess, record a hand-written torch loop with
``pytest_precalign.Recorder`` (``example_suites/recorded_runs/torch_loop.py``) and a tiny
``transformers.Trainer`` with ``PrecalignCallback`` (``trainer_finetune.py``), in every mode
(per-step scalars only, layers on step 3 only, layers on every step) and format (native,
msprobe); then ``precalign compare`` and a ``dump:`` case in an inner pytest judge them. Both
give the same run verdict (step, class, origin, evidence), the same in every mode and format
where the mode holds the evidence: another peak LR is the ``schedule`` at step 1 (step 0 has LR
0 under the warmup); faults from step 3 are found at step 3 (another batch order: ``data``; a
layer: ``forward`` at its module where layers were recorded, the ``loss`` where only scalars
were); clean reruns pass; every step is judged and drawn. The runs are shared with
tests/user_runs (``record_shared``: each is recorded once per session)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_precalign.cli import main
from tests.helpers.files import reseal
from tests.helpers.user_runs import record_shared

pytest.importorskip("transformers")

STEPS = list(range(10))  # the example scripts' optimizer steps
# The recordings of the default tests (layers in msprobe format on step 3); the slow test adds
# per-step scalars and layers on every step in msprobe format.
RECORDINGS = ["scalars-native", "step3-native", "step3-msprobe", "every-native"]
MORE_RECORDINGS = ["scalars-msprobe", "every-msprobe"]
MODES = {"scalars": "", "step3": "mode=stats,steps=3", "every": "mode=stats"}
LOOP_VARIANTS = {
    "base": "",
    "rerun": "",
    "lr": "lr=6e-3",
    "shuffle3": "shuffle_from=3",
    "layer3": "layer_bug_from=3",
}
# What each fault of the loop is found as, by whether the recording holds step 3's layers.
LOOP_FAULTS = {
    "rerun": None,
    "lr": (1, "schedule", "lr[0]"),
    "shuffle3": (3, "data", "batch"),
    "layer3": (3, "forward", "model.layers.1.mlp"),
}
LOOP_FAULTS_SCALARS_ONLY = {**LOOP_FAULTS, "layer3": (3, "loss", "loss")}
# Which recordings of each variant the default tests compare: every one where the verdict
# depends on what was recorded (a layer bug) or must be none (a rerun); the scalar faults in
# both formats (their scalars-native runs are tests/user_runs' own).
LOOP_MATRIX = {
    "base": RECORDINGS,
    "rerun": RECORDINGS,
    "layer3": RECORDINGS,
    "lr": ["scalars-native", "step3-msprobe"],
    "shuffle3": ["scalars-native", "step3-msprobe"],
}
# Pairs of recordings in other modes: (baseline, candidate, expected, layers one side only).
MIXED = [
    ("base-every-native", "lr", (1, "schedule", "lr[0]"), {"baseline": STEPS}),
    ("base-step3-native", "rerun-every-native", None, {"candidate": [s for s in STEPS if s != 3]}),
    ("base", "layer3-step3-msprobe", (3, "loss", "loss"), {"candidate": [3]}),
]


def run(variant: str, recording: str) -> str:
    """A run's folder name: the variant alone for the scripts' default recording (scalars,
    native), as tests/user_runs names it."""
    return variant if recording == "scalars-native" else f"{variant}-{recording}"


def _spec(variant: str, settings: str, recording: str) -> str:
    mode, fmt = recording.split("-")
    keys = [k for k in (settings, MODES[mode], "format=msprobe" if fmt == "msprobe" else "") if k]
    name = run(variant, recording)
    return f"{name}:{','.join(keys)}" if keys else name


def _loop(tmp_path_factory: pytest.TempPathFactory, matrix: dict[str, list[str]]) -> Path:
    specs = [_spec(v, LOOP_VARIANTS[v], r) for v, recordings in matrix.items() for r in recordings]
    return record_shared(tmp_path_factory, "torch_loop.py", "torch_loop", *specs)


@pytest.fixture(scope="module")
def loop_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _loop(tmp_path_factory, LOOP_MATRIX)


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    specs = [
        _spec(v, keys, r) for v, keys in (("base", ""), ("linear", "scheduler=linear")) for r in RECORDINGS
    ]
    return record_shared(tmp_path_factory, "trainer_finetune.py", "trainer_finetune", "rerun", *specs)


def _verdict(training: dict[str, Any]) -> tuple[Any, ...]:
    return (
        training["first_divergent_step"],
        training["first_divergent"],
        training["origin"],
        training["evidence"],
    )


def _compare(
    root: Path, base: str, cand: str, out: Path, capsys: pytest.CaptureFixture[str]
) -> dict[str, Any]:
    """``precalign compare`` of two recordings: its report.json's training block."""
    code = main(["compare", str(root / base), str(root / cand), "--report", str(out)])
    text = capsys.readouterr().out
    training: dict[str, Any] = json.loads((out / "report.json").read_text())["training"]
    assert code == (0 if training["passed"] else 1), text
    training["text"] = text
    return training


def _dump_cases(root: Path, pairs: list[tuple[str, str]], work: Path) -> dict[str, dict[str, Any]]:
    """The same pairs as ``dump:`` cases of one config, run by an inner pytest: each case's
    training block of report.json, by case name."""
    cases = "".join(
        f"  - name: {base}__{cand}\n"
        f"    baseline: {{dump: {root / base}}}\n"
        f"    candidate: {{dump: {root / cand}}}\n"
        f"    phases: [forward, backward, step]\n"
        for base, cand in pairs
    )
    work.mkdir()
    (work / "align.yaml").write_text(f"version: 1\ncases:\n{cases}")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--align-config", "align.yaml"]
        + ["--align-report", "report"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((work / "report" / "report.json").read_text())
    out: dict[str, dict[str, Any]] = {}
    for case in report["cases"]:
        if case.get("training") is not None:
            out.setdefault(case["name"], case["training"])
    return out


def _expected(variant: str, recording: str) -> tuple[int, str, str] | None:
    return (LOOP_FAULTS_SCALARS_ONLY if recording.startswith("scalars") else LOOP_FAULTS)[variant]


def _every_recording_one_verdict(
    loop_runs: Path, matrix: dict[str, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``precalign compare`` of each variant's recordings of ``matrix`` with the base's: every
    fault at its step and its class, the same verdict in both formats; every step judged and
    drawn; reruns pass."""
    seen: dict[tuple[str, str], tuple[Any, ...]] = {}
    for variant in LOOP_FAULTS:
        for recording in matrix[variant]:
            training = _compare(
                loop_runs,
                run("base", recording),
                run(variant, recording),
                tmp_path / f"{variant}-{recording}",
                capsys,
            )
            expected = _expected(variant, recording)
            found = _verdict(training)
            assert found[:3] == (expected or (None, None, None)), (variant, recording, training["text"])
            assert training["steps_compared"] == 10 and training["curves"]["steps"] == STEPS
            assert len(training["curves"]["lr"]["candidate"]) == 10 and not training["findings"]
            assert training["not_compared"] == [] and training["one_side_only"] == {}
            mode = recording.split("-")[0]
            other = seen.setdefault((variant, mode), found)
            assert other == found, f"{variant}: native and msprobe {mode} recordings disagree"
    # Another peak LR is the schedule at step 1 whatever was recorded.
    assert {found for (variant, _), found in seen.items() if variant == "lr"} == {seen[("lr", "scalars")]}
    assert "lr at step 1: 2.500e-03 vs 3.000e-03 (group 0)" in seen[("lr", "scalars")][3]


def test_a_recorded_loop_is_one_run_in_every_mode_and_format(
    loop_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _every_recording_one_verdict(loop_runs, LOOP_MATRIX, tmp_path, capsys)


@pytest.mark.slow
def test_every_variant_in_every_mode_and_format_gives_one_verdict(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every variant in every mode and format (slow: 16 more runs; the default test covers
    each mode, the msprobe format on step 3 and the scalar faults in both formats)."""
    matrix = dict.fromkeys(LOOP_VARIANTS, RECORDINGS + MORE_RECORDINGS)
    _every_recording_one_verdict(_loop(tmp_path_factory, matrix), matrix, tmp_path, capsys)


def test_recordings_in_other_modes_are_compared_on_what_both_hold(
    loop_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for base, cand, expected, alone in MIXED:
        training = _compare(loop_runs, base, cand, tmp_path / f"{base}-{cand}", capsys)
        assert _verdict(training)[:3] == (expected or (None, None, None)), training["text"]
        assert training["one_side_only"] == {"layers": alone} and not training["findings"]
        (told,) = training["not_compared"]
        side = next(iter(alone))
        assert f"the {side} recorded them" in told and f"not compared: {told}" in training["text"]


def test_a_dump_case_gives_the_same_run_verdict_as_the_cli(
    loop_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = [
        (run("base", r), run(v, r))
        for v in ("rerun", "lr", "layer3")
        for r in ("scalars-native", "step3-msprobe")
    ]
    pairs += [(base, cand) for base, cand, _, _ in MIXED]
    cases = _dump_cases(loop_runs, pairs, tmp_path / "suite")
    for base, cand in pairs:
        cli = _compare(loop_runs, base, cand, tmp_path / f"{base}-{cand}", capsys)
        case = cases[f"{base}__{cand}"]
        assert _verdict(case) == _verdict(cli), (base, cand)
        assert case["passed"] == cli["passed"] and case["one_side_only"] == cli["one_side_only"]
        assert case["curves"]["steps"] == STEPS


def test_a_step_recorded_twice_with_other_scalars_is_an_error_naming_both_files(
    loop_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(loop_runs / "base", run)
    first, second = (run / f"step{s}" / "rank0" / "manifest.json" for s in (0, 1))
    manifest = json.loads(second.read_text())
    own = json.loads(first.read_text())["scalars"]["0"]
    manifest["scalars"]["0"] = {**own, "loss": own["loss"] + 1.0}
    second.write_text(json.dumps(manifest))
    reseal(second)
    assert main(["compare", str(run), str(loop_runs / "base")]) == 2
    err = capsys.readouterr().err
    assert f"the scalars of step 0 differ between {first} and {second}" in err
    manifest["scalars"]["0"] = own  # the same values twice: one step
    second.write_text(json.dumps(manifest))
    reseal(second)
    assert main(["compare", str(run), str(loop_runs / "base")]) == 0


def test_a_step_or_a_scalar_one_side_did_not_record_fails_closed(
    loop_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(loop_runs / "rerun-step3-native", run)
    shutil.rmtree(run / "step5")
    manifest_file = run / "step2" / "rank0" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["scalars"]["2"]["grad_norm"] = None
    manifest_file.write_text(json.dumps(manifest))
    reseal(manifest_file)
    code = main(
        ["compare", str(loop_runs / "base-step3-native"), str(run), "--report", str(tmp_path / "out")]
    )
    training = json.loads((tmp_path / "out" / "report.json").read_text())["training"]
    assert code == 1 and training["one_side_only"] == {
        "steps": {"baseline": [5]},
        "scalars": {"grad_norm": {"baseline": [2]}},
    }
    out = capsys.readouterr().out
    assert "Runs do not line up: steps 5 recorded by the baseline only" in out
    assert "Runs do not line up: grad_norm recorded by the baseline only (steps 2)" in out


@pytest.mark.parametrize("recording", RECORDINGS)
def test_a_trainer_run_recorded_by_the_callback(trainer_runs: Path, tmp_path: Path, recording: str) -> None:
    """``precalign compare`` (a subprocess, as CI runs it) of the callback's recordings: a
    cosine vs linear decay is found from the two plans the callback wrote (the contract), told
    in the Trainer's own words, at step 3 (the first step where the LRs differ)."""
    out = tmp_path / "report"
    argv = [sys.executable, "-m", "pytest_precalign", "compare"]
    done = subprocess.run(
        argv
        + [
            str(trainer_runs / run("base", recording)),
            str(trainer_runs / run("linear", recording)),
            "--report",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    training = json.loads((out / "report.json").read_text())["training"]
    assert _verdict(training)[:3] == (3, "settings", "lr"), done.stdout
    assert (
        "Step 3 diverged first: settings, origin lr — the sides' settings differ before training: "
        "lr_scheduler_type cosine vs linear: LR differs from step 3"
    ) in done.stdout
    assert training["curves"]["steps"] == STEPS
    html = (out / "report.html").read_text()
    assert html.count('data-curve="lr"') == 1 and "step 9</text>" in html


def test_a_trainer_rerun_passes_and_a_dump_case_agrees(trainer_runs: Path, tmp_path: Path) -> None:
    pairs = [("base", "rerun"), ("base-step3-msprobe", "linear-step3-msprobe")]
    cases = _dump_cases(trainer_runs, pairs, tmp_path / "suite")
    rerun, linear = (cases[f"{b}__{c}"] for b, c in pairs)
    assert rerun["passed"] and rerun["first_divergent"] is None and rerun["steps_compared"] == 10
    assert _verdict(linear)[:3] == (3, "settings", "lr")
    done = subprocess.run(
        [sys.executable, "-m", "pytest_precalign", "compare", *(str(trainer_runs / p) for p in pairs[0])],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "judged by the run's per-step scalars" in done.stdout
