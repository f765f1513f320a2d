from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from pytest_precalign.cli import main
from pytest_precalign.recording import HookRecorder
from pytest_precalign.trace.native_io import write_trace
from tests.helpers.files import reseal
from tests.helpers.paths import MSPROBE_DATA


def _record(tmp_path, name, bump=0.0, mode="tensor"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    if bump:
        with torch.no_grad():
            model[2].bias += bump
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    with HookRecorder(model, mode=mode) as rec:
        model(x).sum().backward()
    return write_trace(rec.trace({"side": name}), tmp_path / name)


def test_compare_identical_runs_exit_0(tmp_path, capsys):
    a, b = _record(tmp_path, "a"), _record(tmp_path, "b")
    assert main(["compare", str(a), str(b), "--report", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "PASSED a_vs_b[forward]" in out and "PASSED a_vs_b[backward]" in out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert {c["phase"] for c in report["cases"]} == {"forward", "backward"}
    assert all(c["first_divergence"] is None for c in report["cases"])


def _keys(value):
    """Every key of a JSON document, at any depth."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_compare_report_names_the_sides_baseline_and_candidate(tmp_path, capsys):
    """One word per side: report.json says baseline/candidate, as the CLI does (never msprobe's
    golden/target); report.html is titled by the baseline."""
    a, b = _record(tmp_path, "a"), _record(tmp_path, "b", bump=0.01)
    assert main(["compare", str(a), str(b), "--report", str(tmp_path / "out")]) == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (report["baseline"], report["candidate"]) == (str(a), str(b))
    assert not {"golden", "target"} & _keys(report)
    assert "<title>precalign report: a</title>" in (tmp_path / "out" / "report.html").read_text()


def test_compare_finds_the_first_divergence_exit_1(tmp_path, capsys):
    a, b = _record(tmp_path, "a"), _record(tmp_path, "b", bump=0.01)
    tol = tmp_path / "tol.yaml"
    tol.write_text('- {match: "*", atol: 1.0e-6, rtol: 0, why: "same code"}\n')
    assert main(["compare", str(a), str(b), "--tolerances", str(tol), "--report", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert "First divergence: 2 (activation, out, step 0), origin: its inputs matched" in out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    forward = next(c for c in report["cases"] if c["phase"] == "forward")
    assert (forward["first_divergence"]["name"], forward["first_divergence"]["origin"]) == ("2", True)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["compare", "{tmp}/missing", "{a}"], "missing: no such file or directory"),
        (["compare", "{tmp}", "{a}"], "neither a pytest-precalign trace (manifest.json) nor an msprobe dump"),
        (
            ["compare", "{a}", "{a}", "--tolerances", "{tmp}/nope.yaml"],
            "--tolerances: file not found: {tmp}/nope.yaml",
        ),
        (
            ["compare", "{a}", "{a}", "--mapping", "preset:nope"],
            "--mapping: unknown preset mapping 'preset:nope'",
        ),
        (["compare", "{a}", "{a}", "--var", "heads"], "--var: expected KEY=INTEGER"),
    ],
)
def test_compare_usage_errors_exit_2(tmp_path, capsys, args, fragment):
    a = _record(tmp_path, "a")
    argv = [x.format(tmp=tmp_path, a=a) for x in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment.format(tmp=tmp_path) in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_compare_with_a_layer_mapping(tmp_path, capsys):
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))

    class Engine(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = inner

        def forward(self, x):
            return self.module(x)

    x = torch.randn(3, 4)
    with HookRecorder(inner, mode="tensor") as rec:
        inner(x)
    a = write_trace(rec.trace(), tmp_path / "a")
    with HookRecorder(Engine(), mode="tensor") as rec:
        rec.model(x)
    b = write_trace(rec.trace(), tmp_path / "b")
    lm = tmp_path / "lm.yaml"
    lm.write_text("TopLayer:\n  module.0: '0'\n  module.1: '1'\n  module.2: '2'\n")
    assert (
        main(["compare", str(a), str(b), "--layer-mapping", str(lm), "--report", str(tmp_path / "out")]) == 0
    )
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    forward = report["cases"][0]
    assert forward["compared"] >= 3 and forward["unmatched"]["baseline"] == []
    assert [u["name"] for u in forward["unmatched"]["candidate"]] == ["module"]
    assert main(["compare", str(a), str(b), "--layer-mapping", "preset:nope"]) == 2
    assert "--layer-mapping: preset:nope: not found" in capsys.readouterr().err


def _dump_set(root, source, ranks, steps=(0,)):
    import shutil

    micro = MSPROBE_DATA / "micro" / source
    rank_dir = next((micro / "step0").iterdir())
    for step in steps:
        for rank in ranks:
            shutil.copytree(rank_dir, root / f"step{step}" / f"rank{rank}")
    return root


def test_compare_pairs_every_step_and_rank(tmp_path, capsys):
    gold = _dump_set(tmp_path / "g", "base_micro_statistics_L0_statistics", ranks=(0, 1), steps=(0, 1))
    targ = _dump_set(tmp_path / "t", "pert_micro_statistics_L0_statistics", ranks=(0, 1), steps=(0, 1))
    tol = tmp_path / "tol.yaml"
    tol.write_text('- {match: "*", atol: 1.0e-6, rtol: 1.0e-5}\n')
    assert (
        main(["compare", str(gold), str(targ), "--tolerances", str(tol), "--report", str(tmp_path / "out")])
        == 1
    )
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    forward = [c for c in report["cases"] if c["phase"] == "forward"]
    assert sorted((c["step"], c["rank"]) for c in forward) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {c["first_divergence"]["name"] for c in forward} == {"model.layers.0.mlp.down_proj"}
    assert "@step1_rank1[forward]" in capsys.readouterr().out


def test_compare_refuses_sides_with_different_ranks(tmp_path, capsys):
    gold = _dump_set(tmp_path / "g", "base_micro_statistics_L0_statistics", ranks=(0, 1))
    targ = _dump_set(tmp_path / "t", "pert_micro_statistics_L0_statistics", ranks=(0, 1, 2))
    assert main(["compare", str(gold), str(targ)]) == 2
    err = capsys.readouterr().err
    assert "the sides hold different steps/ranks" in err and "step0/rank2" in err


def test_compare_refuses_a_dump_root_against_a_step_folder(tmp_path, capsys):
    gold = _dump_set(tmp_path / "g", "base_micro_statistics_L0_statistics", ranks=(0,))
    targ = _dump_set(tmp_path / "t", "pert_micro_statistics_L0_statistics", ranks=(0,))
    assert main(["compare", str(gold), str(targ / "step0")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"baseline {gold} is a dump root, candidate {targ / 'step0'} is a step folder" in err
    assert "give both at the same level" in err
    assert main(["compare", str(gold / "step0" / "rank0"), str(targ / "step0")]) == 2
    assert "is a rank folder, candidate" in capsys.readouterr().err


def test_compare_names_the_dumps_below_a_folder_that_holds_several(tmp_path, capsys):
    _dump_set(tmp_path / "all" / "g", "base_micro_statistics_L0_statistics", ranks=(0,))
    _dump_set(tmp_path / "all" / "t", "pert_micro_statistics_L0_statistics", ranks=(0,))
    assert main(["compare", str(tmp_path / "all"), str(tmp_path / "all" / "t")]) == 2
    err = capsys.readouterr().err
    assert "neither a pytest-precalign trace" in err and "it holds the runs g/, t/: pass one of them" in err


def test_custom_metric_plugin(tmp_path, capsys):
    a, b = _record(tmp_path, "a"), _record(tmp_path, "b", bump=0.01)
    plugin = tmp_path / "my_metrics.py"
    plugin.write_text("def peak(golden, target):\n    return float((golden - target).abs().max())\n")
    argv = ["compare", str(a), str(b), "--metric", f"{plugin}:peak", "--report", str(tmp_path / "out")]
    assert main(argv) == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    forward = next(c for c in report["cases"] if c["phase"] == "forward")
    values = {(m["name"], m["kind"]): m["values"]["peak"] for m in forward["custom_metrics"]}
    assert values[("2", "activation")] == pytest.approx(0.01, rel=1e-4)
    assert values[("0", "activation")] == 0.0
    for bad, fragment in (
        ("nofile.py:peak", "--metric: nofile.py: file not found"),
        (f"{plugin}", "expected file.py:function"),
        (f"{plugin}:nope", "has no function 'nope'"),
    ):
        assert main(["compare", str(a), str(b), "--metric", bad]) == 2
        assert fragment in capsys.readouterr().err


def test_compare_threads_give_the_same_report_and_bad_values_exit_2(tmp_path, capsys, monkeypatch):
    a, b = _record(tmp_path, "a"), _record(tmp_path, "b", bump=0.01)
    reports = []
    for threads in ("1", "3"):
        monkeypatch.setenv("PRECALIGN_COMPARE_THREADS", threads)
        out = tmp_path / f"out{threads}"
        assert main(["compare", str(a), str(b), "--report", str(out)]) == 1
        cases = json.loads((out / "report.json").read_text())["cases"]
        reports.append([{k: v for k, v in c.items() if k != "seconds"} for c in cases])
    assert reports[0] == reports[1]
    capsys.readouterr()
    monkeypatch.setenv("PRECALIGN_COMPARE_THREADS", "two")
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "PRECALIGN_COMPARE_THREADS='two': expected a whole number >= 1" in err


def test_the_cli_compares_in_forked_processes_with_the_same_report(tmp_path):
    """Run as ``precalign compare`` runs (no torch in the process: pairs go to forked workers),
    with 1 and with 2 workers: the same report, and torch was never loaded."""
    a, b = _record(tmp_path, "a"), _record(tmp_path, "b", bump=0.01)
    code = (
        "import sys\n"
        "from pytest_precalign.compare.forked_jobs import fork_usable\n"
        "from pytest_precalign.cli import main\n"
        "usable = fork_usable()\n"
        "rc = main(sys.argv[1:])\n"
        "print('forkable', usable, 'torch', 'torch' in sys.modules)\n"
        "sys.exit(rc)\n"
    )
    reports = []
    for workers in ("1", "2"):
        out = tmp_path / f"out{workers}"
        env = {**os.environ, "PRECALIGN_COMPARE_THREADS": workers}
        argv = [sys.executable, "-c", code, "compare", str(a), str(b), "--report", str(out)]
        done = subprocess.run(argv, capture_output=True, text=True, env=env)
        assert done.returncode == 1, done.stderr
        assert "forkable True torch False" in done.stdout
        cases = json.loads((out / "report.json").read_text())["cases"]
        reports.append([{k: v for k, v in c.items() if k != "seconds"} for c in cases])
    assert reports[0] == reports[1]
    assert any(c["first_divergence"] for c in reports[1])


@pytest.mark.parametrize("value", ["1.5", "-0.1", "half", "nan"])
def test_compare_rejects_a_min_coverage_outside_0_to_1(tmp_path, capsys, value):
    a, b = _record(tmp_path, "a"), _record(tmp_path, "b")
    assert main(["compare", str(a), str(b), "--min-coverage", value]) == 2
    out, err = capsys.readouterr()
    assert err == (
        "precalign: error: --min-coverage: expected a share between 0 and 1 (e.g. 0.5: half the "
        f"baseline side's output records paired), got {value!r}\n"
    )
    assert out == ""


def test_compare_min_coverage_sets_the_floor(tmp_path, capsys):
    """The L0 statistics dump against its mix-level sibling: the modules pair, the API calls
    (most of the mix dump's outputs) do not."""
    golden, target = MSPROBE_DATA / "tiny_statistics_mix", MSPROBE_DATA / "tiny_statistics_L0"
    assert main(["compare", str(golden), str(target), "--report", str(tmp_path / "low")]) == 1
    low = json.loads((tmp_path / "low" / "report.json").read_text())["cases"][0]["coverage"]
    assert (
        0 < low["ratio"] < 0.5 and low["floor"] == 0.5 and "(30%, under the floor of 50%)" in low["problem"]
    )
    out = capsys.readouterr().out
    assert "Too little compared in forward: 32 of 108 baseline forward output records paired" in out
    floor = str(low["ratio"] - 0.01)
    assert (
        main(["compare", str(golden), str(target), "--min-coverage", floor, "--report", str(tmp_path / "ok")])
        == 0
    )
    ok = json.loads((tmp_path / "ok" / "report.json").read_text())["cases"][0]["coverage"]
    assert ok["ratio"] == low["ratio"] and ok["floor"] == float(floor) and ok["passed"]


def _trained(tmp_path, name, lr, trainer=None):
    """A user's run recorded with the Recorder's per-step scalars (5 steps) and layer stats."""
    from pytest_precalign.trace.step_scalars import StepScalars, scalars_manifest
    from pytest_precalign.trace.training_record import read_run_record

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    with HookRecorder(model, mode="stats") as rec:
        model(x).sum().backward()
    steps = {s: StepScalars(step=s, loss=2.0 - 0.1 * s, lr=(lr(s),), grad_norm=1.0) for s in range(5)}
    manifest = {"side": name, "scalars": scalars_manifest(steps)}
    if trainer is not None:  # who recorded it, as a recorder writes it in the manifest
        manifest["training"] = {"trainer": trainer, "framework": {"name": "accelerate", "version": "1.15.0"}}
    return write_trace(rec.trace(manifest, read_run_record(manifest)), tmp_path / name)


def test_compare_names_the_step_a_warmup_one_step_behind_diverges_from_the_scalars(tmp_path, capsys):
    a = _trained(tmp_path, "a", lambda s: 1e-3 * min(s, 2) / 2)
    b = _trained(tmp_path, "b", lambda s: 1e-3 * min(max(s - 1, 0), 2) / 2)
    assert main(["compare", str(a), str(b), "--report", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert "Step 1 diverged first: schedule, origin lr[0] — lr at step 1: 5.000e-04 vs 0.000e+00" in out
    assert "steps 2-4 are downstream of it" in out
    hint = (
        "not replayed: the runs are recordings, not models to train; to go further record step 1 "
        "in tensor mode on both sides from equal state: record: {mode: tensor} in a case, or "
        'Recorder(root, mode="tensor", steps=[1])'
    )
    assert hint in out
    training = json.loads((tmp_path / "out" / "report.json").read_text())["training"]
    assert (training["first_divergent_step"], training["first_divergent"]) == (1, "schedule")
    assert training["replay"]["story"].startswith(hint)
    assert training["lane"] == "approximate" and training["steps_compared"] == 5


def test_the_hint_names_the_recording_api_and_the_overview_the_step(tmp_path, capsys):
    a = _trained(tmp_path, "a", lambda s: 1e-3 * min(s, 2) / 2, trainer="accelerate")
    b = _trained(tmp_path, "b", lambda s: 1e-3 * min(max(s - 1, 0), 2) / 2, trainer="accelerate")
    assert main(["compare", str(a), str(b), "--report", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    # report.html's overview row of the failed item gives its step and class, not "-"
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<td>step 1: schedule (<code>lr[0]</code>)</td>" in html
    assert (
        "to go further record step 1 in tensor mode on both sides from equal state: "
        'AccelerateSteps(root, accelerator, model, optimizer, mode="tensor", steps=[1]) in your run'
    ) in out, out
    assert "PrecalignCallback" not in out and "Recorder(" not in out


def test_compare_fails_closed_on_a_step_one_side_skipped(tmp_path, capsys):
    a = _trained(tmp_path, "a", lambda s: 1e-3)
    b = _trained(tmp_path, "b", lambda s: 1e-3)
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["scalars"]["3"]["skipped"] = True
    (b / "manifest.json").write_text(json.dumps(manifest))
    reseal(b / "manifest.json")
    assert main(["compare", str(a), str(b), "--report", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert "Runs do not line up: skipped recorded by the candidate only" in out
    assert "the candidate skipped the update of step 3" in out
