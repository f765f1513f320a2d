"""--align-baseline end to end: a stored baseline's life cycle, the environment and weights
differences it names, partial runs and ``precalign record``; the inner pytest runs serially, and with -n 2 where xdist matters (``xdist_twin``).
Every item is in report.json and the terminal summary in each state (workers once kept
baseline entries to themselves: report.json had "cases": [])."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.files import digest, reseal
from tests.helpers.runs import RunPytest

NETS = """
import torch


class Mid(torch.nn.Linear):
    def __init__(self, width, bug):
        super().__init__(width, width)
        self.bug = bug

    def forward(self, x):
        return super().forward(x) + self.bug   # the candidate's drift, when bug != 0


class Net(torch.nn.Module):
    def __init__(self, vocab=40, width=12, bug=0.0):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.body = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())
        self.mid = Mid(width, bug)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, input_ids):
        return self.head(self.mid(self.body(self.embed(input_ids))))


def build(**kwargs):
    return Net(**kwargs)
"""

CONFIG = """
version: 1
models:
  ref: {{source: factory, factory: "nets:build"}}
  cand: {{source: factory, factory: "nets:build", kwargs: {{bug: {bug}}}{extra}}}
inputs:
  toks: {{kind: tokens, batch: 2, seq_len: 5, vocab_size: 40, seed: 3, labels: true}}
tolerances:
  tight:
    - {{match: "*", atol: 1.0e-6, rtol: 1.0e-5, why: "fp32 same code"}}
cases:
  - {{name: port, baseline: ref, candidate: cand, inputs: toks, phases: [forward, backward],
     record: {{mode: tensor}}, tolerances: tight}}
"""


def _suite(pytester: pytest.Pytester, bug: float = 0.0, extra: str = "") -> None:
    pytester.makepyfile(nets=NETS)
    pytester.makefile(".yaml", align=CONFIG.format(bug=bug, extra=extra))


def _report(pytester: pytest.Pytester) -> dict[tuple[str, str], dict[str, Any]]:
    """report.json's entries by (case, phase)."""
    cases = json.loads((pytester.path / "out" / "report.json").read_text())["cases"]
    return {(c["name"], c["phase"]): c for c in cases}


def _assert_summary(result: pytest.RunResult) -> None:
    """Both items are named in the terminal summary's precalign section (under -n 2 too: the
    workers' baseline entries reach the controller)."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "precalign" in line and line.startswith("="))
    named: set[str] = set()
    for line in lines[start + 1 :]:
        if line.startswith("="):
            break
        named |= {item for item in ("port[forward]", "port[backward]") if f" {item}:" in line}
    assert named == {"port[forward]", "port[backward]"}, "\n".join(lines)


def _assert_report(pytester: pytest.Pytester, actions: set[str], passed: bool) -> dict[str, Any]:
    """Both items of case port are in report.json with their baseline's action; returns the
    forward entry."""
    entries = _report(pytester)
    assert set(entries) == {("port", "forward"), ("port", "backward")}
    for entry in entries.values():
        assert entry["passed"] is passed
        assert entry["baseline"]["path"].endswith("bl/port")
        assert entry["baseline"]["action"] in actions, entry["baseline"]
    return entries["port", "forward"]


@pytest.mark.xdist_twin("workers' baseline entries reach the controller")
def test_life_cycle(
    pytester: pytest.Pytester, run_pytest: RunPytest, xdist: bool, request: pytest.FixtureRequest
) -> None:
    _suite(pytester)
    baseline = pytester.path / "bl" / "port"
    obtained = pytester.path / "bl" / "port.obtained"

    def run(*more: str) -> pytest.RunResult:
        return run_pytest(
            "--align-config", "align.yaml", "--align-baseline", "bl", "--align-report", "out", *more
        )

    # 1. Missing: written, and the test fails saying so.
    result = run()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*Baseline written: bl/port*"] if not xdist else ["*bl/port*"])
    # -n 2: the other phase's worker finds it written earlier in this very run
    _assert_report(pytester, {"written", "written-earlier"}, passed=False)
    _assert_summary(result)
    assert (baseline / "manifest.json").is_file() and (baseline / "weights.safetensors").is_file()
    manifest = json.loads((baseline / "manifest.json").read_text())
    assert manifest["side"] == "candidate" and manifest["case"] == "port"
    assert manifest["versions"]["torch"].startswith("2.") and manifest["weights"]["sha256"]
    assert {"device", "dtype", "determinism", "config_digest"} <= set(manifest)
    written = digest(baseline)
    if xdist:
        # Under -n 2 what differs is where the entries are made (on the workers): steps 1 and 4
        # show it ("written-earlier"); steps 2, 3, 5 and 6 are the serial run's, the same code.
        _suite(pytester, bug=0.5)
        result = run("--align-update")
        result.assert_outcomes(failed=2)
        _assert_report(pytester, {"updated", "written-earlier"}, passed=False)
        result.stdout.fnmatch_lines(["*bl/port*"])
        assert digest(baseline) != written and not obtained.exists()
        return

    # 2. Rerun: compared, passes, nothing rewritten.
    result = run()
    result.assert_outcomes(passed=2)
    _assert_summary(result)
    assert _report(pytester)["port", "forward"]["first_divergence"] is None
    _assert_report(pytester, {"compared"}, passed=True)
    assert digest(baseline) == written

    # 3. A perturbed candidate: fails with the table of moved layers; .obtained is written.
    _suite(pytester, bug=0.5)
    result = run()
    result.assert_outcomes(failed=2)
    forward = _assert_report(pytester, {"compared"}, passed=False)
    _assert_summary(result)
    assert (forward["first_divergence"]["name"], forward["first_divergence"]["origin"]) == ("mid", True)
    assert forward["baseline"]["obtained"].endswith("bl/port.obtained")
    result.stdout.fnmatch_lines(
        [
            "*First divergence: mid (activation, out, step 0), origin*",
            "*record (baseline name)*kind*metric*value*allowed*",
            "*mid *activation*allclose*",
            "*head *activation*allclose*",
            "*Obtained trace written to bl/port.obtained*",
            "*To accept the new values: pytest --align-config align.yaml --align-baseline bl --align-update*",
        ]
    )
    assert digest(baseline) == written and (obtained / "manifest.json").is_file()

    # 4. --align-update rewrites and still fails.
    result = run("--align-update")
    result.assert_outcomes(failed=2)
    _assert_report(pytester, {"updated", "written-earlier"} if xdist else {"updated"}, passed=False)
    result.stdout.fnmatch_lines(["*Baseline rewritten (--align-update)*"] if not xdist else ["*bl/port*"])
    assert digest(baseline) != written and not obtained.exists()

    # 5. Rerun: passes against the rewritten baseline.
    run().assert_outcomes(passed=2)
    _assert_report(pytester, {"compared"}, passed=True)

    # 6. --align-update-all rewrites and passes, even for a changed candidate.
    _suite(pytester, bug=-0.25)
    before = digest(baseline)
    run("--align-update-all").assert_outcomes(passed=2)
    _assert_report(pytester, {"rewritten"}, passed=True)
    assert digest(baseline) != before


def _gate(run_pytest: RunPytest, *more: str) -> pytest.RunResult:
    return run_pytest("--align-config", "align.yaml", "--align-baseline", "bl", *more)


def test_environment_and_weights_differences_are_named(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    _suite(pytester)
    _gate(run_pytest).assert_outcomes(failed=2)
    # Pretend it was recorded elsewhere, without its weights, and change the model's init.
    folder = pytester.path / "bl" / "port"
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["versions"]["transformers"] = "4.49.0"
    manifest["versions"]["torch"] = "2.6.0"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "weights.safetensors").unlink()
    reseal(folder / "manifest.json")
    pytester.makefile(
        ".yaml",
        align=CONFIG.format(bug=0.0, extra=", seed: 7").replace(
            "record: {mode: tensor}", "record: {mode: tensor}, weights: {sync: false}"
        ),
    )
    result = _gate(run_pytest)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*Environment changed since it was recorded: torch 2.6.0 → *transformers 4.49.0 → *",
            "*Weights differ from the baseline's (7 of 7 parameters differ: *): differences below may come "
            "from different weights, not from numeric drift*",
        ]
    )


def test_update_needs_a_baseline_dir(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    _suite(pytester)
    result = run_pytest("--align-config", "align.yaml", "--align-update")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--align-update and --align-update-all need --align-baseline DIR*"])


@pytest.mark.xdist_twin("deselection on the workers")
def test_partial_run_touches_only_its_cases(
    pytester: pytest.Pytester, run_pytest: RunPytest, xdist: bool
) -> None:
    _suite(pytester)
    stranger = pytester.path / "bl" / "someone_else"
    stranger.mkdir(parents=True)
    (stranger / "manifest.json").write_text("{}")
    result = _gate(run_pytest, "-k", "forward")
    result.assert_outcomes(failed=1, deselected=0 if xdist else 1)  # xdist does not count deselection
    assert (stranger / "manifest.json").read_text() == "{}"
    assert sorted(p.name for p in (pytester.path / "bl").iterdir()) == [".port.lock", "port", "someone_else"]


def _safetensors_names(path: Path) -> list[str]:
    """Tensor names from a safetensors header (no torch import: pytester's module snapshot
    would drop it and a second import of torch in this process corrupts it)."""
    data = path.read_bytes()
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    return [k for k in header if k != "__metadata__"]


def _cli(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.run(sys.executable, "-m", "pytest_precalign", *args)


def test_record_cli_writes_a_baseline_usable_by_pytest_and_compare(pytester: pytest.Pytester) -> None:
    """The CLI in subprocesses; its baseline gated by pytest once, serially in process (the gate
    under -n 2 is ``test_life_cycle[xdist]``)."""
    _suite(pytester)
    result = _cli(pytester, "record", "align.yaml", "--out", "bl")
    assert result.ret == 0, result.stderr.str()
    result.stdout.fnmatch_lines(
        ["recorded port (candidate 'cand'): * records, 7 weights (sha256 *) -> bl/port"]
    )
    weights = _safetensors_names(pytester.path / "bl" / "port" / "weights.safetensors")
    names = [f"{m}.{p}" for m in ("body.0", "mid", "head") for p in ("weight", "bias")]
    assert sorted(weights) == sorted([*names, "embed.weight"])
    # Refuses to overwrite (exit 2, one message), --overwrite replaces.
    again = _cli(pytester, "record", "align.yaml", "--out", "bl")
    assert again.ret == 2 and "refusing to overwrite it (pass --overwrite)" in again.stderr.str()
    assert "Traceback" not in again.stderr.str()
    assert _cli(pytester, "record", "align.yaml", "--out", "bl", "--overwrite").ret == 0
    bad = _cli(pytester, "record", "align.yaml", "--out", "bl", "--side", "both")
    assert bad.ret == 2 and "invalid choice: 'both'" in bad.stderr.str()
    # The baseline side of the case, as a `precalign compare` side against the candidate.
    assert _cli(pytester, "record", "align.yaml", "--out", "golden", "--side", "baseline").ret == 0
    compare = _cli(pytester, "compare", "golden/port", "bl/port")
    assert compare.ret == 0, compare.stdout.str()
    # As a baseline for pytest: compared, and passes.
    gate = pytester.runpytest_inprocess(
        "--align-config",
        "align.yaml",
        "--align-baseline",
        "bl",
        "-p",
        "no:cacheprovider",
        f"--basetemp={pytester.path / 'bt'}",
    )
    gate.assert_outcomes(passed=2)
    # A drifted candidate vs the recorded one, offline.
    _suite(pytester, bug=0.5)
    assert _cli(pytester, "record", "align.yaml", "--out", "drift").ret == 0
    drift = _cli(pytester, "compare", "bl/port", "drift/port")
    assert drift.ret == 1
    drift.stdout.fnmatch_lines(["*first divergence mid (activation*origin*"])
