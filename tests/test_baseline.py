"""Stored baselines: --align-baseline's life cycle (with and without xdist), precalign record,
environment and weights differences, and a writer killed with SIGKILL mid-write."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


def _run(pytester: pytest.Pytester, xdist: list[str], *more: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "--align-config", "align.yaml", "--align-baseline", "bl", "-p", "no:cacheprovider", *xdist, *more
    )


def _digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()
    }


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["no-xdist", "xdist-2"])
def test_life_cycle(pytester: pytest.Pytester, xdist: list[str]) -> None:
    _suite(pytester)
    baseline = pytester.path / "bl" / "port"
    obtained = pytester.path / "bl" / "port.obtained"

    # 1. Missing: written, and the test fails saying so.
    result = _run(pytester, xdist)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*Baseline written: bl/port*"] if not xdist else ["*bl/port*"])
    assert (baseline / "manifest.json").is_file() and (baseline / "weights.safetensors").is_file()
    manifest = json.loads((baseline / "manifest.json").read_text())
    assert manifest["side"] == "candidate" and manifest["case"] == "port"
    assert manifest["versions"]["torch"].startswith("2.") and manifest["weights"]["sha256"]
    assert {"device", "dtype", "determinism", "config_digest"} <= set(manifest)
    written = _digest(baseline)

    # 2. Rerun: compared, passes, nothing rewritten.
    _run(pytester, xdist).assert_outcomes(passed=2)
    assert _digest(baseline) == written

    # 3. A perturbed candidate: fails with the table of moved layers; .obtained is written.
    _suite(pytester, bug=0.5)
    result = _run(pytester, xdist)
    result.assert_outcomes(failed=2)
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
    assert _digest(baseline) == written and (obtained / "manifest.json").is_file()

    # 4. --align-update rewrites and still fails.
    result = _run(pytester, xdist, "--align-update")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*Baseline rewritten (--align-update)*"] if not xdist else ["*bl/port*"])
    assert _digest(baseline) != written and not obtained.exists()

    # 5. Rerun: passes against the rewritten baseline.
    _run(pytester, xdist).assert_outcomes(passed=2)

    # 6. --align-update-all rewrites and passes, even for a changed candidate.
    _suite(pytester, bug=-0.25)
    before = _digest(baseline)
    _run(pytester, xdist, "--align-update-all").assert_outcomes(passed=2)
    assert _digest(baseline) != before


def test_environment_and_weights_differences_are_named(pytester: pytest.Pytester) -> None:
    _suite(pytester)
    _run(pytester, []).assert_outcomes(failed=2)
    # Pretend it was recorded elsewhere, without its weights, and change the model's init.
    folder = pytester.path / "bl" / "port"
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["versions"]["transformers"] = "4.49.0"
    manifest["versions"]["torch"] = "2.6.0"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "weights.safetensors").unlink()
    pytester.makefile(
        ".yaml",
        align=CONFIG.format(bug=0.0, extra=", seed: 7").replace(
            "record: {mode: tensor}", "record: {mode: tensor}, weights: {sync: false}"
        ),
    )
    result = _run(pytester, [])
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*Environment changed since it was recorded: torch 2.6.0 → *transformers 4.49.0 → *",
            "*Weights differ from the baseline's (7 of 7 parameters differ: *): differences below may come "
            "from different weights, not from numeric drift*",
        ]
    )


def test_update_needs_a_baseline_dir(pytester: pytest.Pytester) -> None:
    _suite(pytester)
    result = pytester.runpytest_subprocess("--align-config", "align.yaml", "--align-update")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--align-update and --align-update-all need --align-baseline DIR*"])


def test_partial_run_touches_only_its_cases(pytester: pytest.Pytester) -> None:
    _suite(pytester)
    stranger = pytester.path / "bl" / "someone_else"
    stranger.mkdir(parents=True)
    (stranger / "manifest.json").write_text("{}")
    result = _run(pytester, [], "-k", "forward")
    result.assert_outcomes(failed=1, deselected=1)
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
    _run(pytester, []).assert_outcomes(passed=2)
    # A drifted candidate vs the recorded one, offline.
    _suite(pytester, bug=0.5)
    assert _cli(pytester, "record", "align.yaml", "--out", "drift").ret == 0
    drift = _cli(pytester, "compare", "bl/port", "drift/port")
    assert drift.ret == 1
    drift.stdout.fnmatch_lines(["*first divergence mid (activation*origin*"])


# -- SIGKILL during a baseline write ----------------------------------------------------------

WRITER = """
import sys, torch
from pathlib import Path
from pytest_precalign.trace import native_io as trace_io
from pytest_precalign.baseline.store import write_stored
from pytest_precalign.trace.records import Record, Stats, Trace

trace_io.SHARD_BYTES = 4 << 20  # many shard files: a long write to interrupt
n, size, fill = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
records, tensors = [], {}
for i in range(n):
    key = f"t{i:04d}"
    tensors[key] = torch.full((size,), fill + i)
    records.append(Record(seq=i, name=f"layer{i}", module_class="Linear", phase="forward", step=0,
                          call=0, kind="activation", slot="out", dtype="float32", shape=(size,),
                          stats=Stats(0, 0, 0, 0), tensor_key=key))
trace = Trace(manifest={"case": "big", "side": "candidate", "record_mode": "tensor"},
              records=tuple(records), tensors=tensors)
print("writing", flush=True)
write_stored(trace, {"w": torch.ones(3)}, Path(sys.argv[1]) / "big", extra={})
print("done", flush=True)
"""


def _writer(root: Path, n: int, size: int, fill: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), *sys.path])}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), str(n), str(size), str(fill)],
        env=env,
        stdout=subprocess.DEVNULL,
    )


def test_sigkill_mid_write_leaves_the_old_baseline(tmp_path: Path) -> None:
    from pytest_precalign.baseline.store import case_lock, recover
    from pytest_precalign.trace.native_io import read_trace

    old = _writer(tmp_path, 4, 1000, 1.0)
    assert old.wait(timeout=120) == 0
    target = tmp_path / "big"
    before = _digest(target)

    # A new, larger write over it (48 shards of 4 MiB), killed once its temporary dir has shards.
    proc = _writer(tmp_path, 48, 1 << 20, 100.0)
    deadline = time.monotonic() + 120
    killed_mid_write = False
    while time.monotonic() < deadline and proc.poll() is None:
        temps = [p for p in tmp_path.iterdir() if p.name.startswith(".big.pid") and p.name.endswith(".tmp")]
        if temps and len(list(temps[0].glob("tensors-*.safetensors"))) >= 2:
            os.kill(proc.pid, signal.SIGKILL)
            killed_mid_write = True
            break
        time.sleep(0.002)
    proc.wait(timeout=30)
    assert killed_mid_write, "the writer finished before it could be killed"
    assert proc.returncode == -signal.SIGKILL

    # The old baseline is byte-identical and loads; the dead writer's temp dir is still there.
    assert _digest(target) == before
    trace = read_trace(target)
    assert len(trace.records) == 4 and float(trace.tensor(trace.records[3])[0]) == 4.0
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".big.pid")]
    assert leftovers and str(proc.pid) in leftovers[0]

    # The next run for this case removes it (its process is gone) and nothing else.
    (tmp_path / ".other.pid1.abc.tmp").mkdir()  # another case's: not ours to touch
    with case_lock(tmp_path, "big"):
        done = recover(tmp_path, "big")
    assert done == [f"removed {leftovers[0]} (left by killed process {proc.pid})"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".big.lock", ".other.pid1.abc.tmp", "big"]
    assert _digest(target) == before


def test_a_baseline_moved_aside_but_not_replaced_is_restored(tmp_path: Path) -> None:
    from pytest_precalign.baseline.store import recover

    target = tmp_path / "case"
    target.mkdir()
    (target / "manifest.json").write_text('{"x": 1}')
    aside = tmp_path / ".case.q1w2e3.old"  # what publish_dir makes, killed between its renames
    aside.mkdir()
    os.replace(target, aside / "old")
    assert recover(tmp_path, "case") == ["restored case from .case.q1w2e3.old"]
    assert (target / "manifest.json").read_text() == '{"x": 1}' and not aside.exists()


def test_environment_diff_lists_what_changed() -> None:
    from pytest_precalign.baseline.store import environment_diff, weights_diff

    stored = {
        "versions": {"python": "3.11.7", "torch": "2.13.0", "transformers": "4.49.0", "megatron-core": None},
        "device": "cpu",
        "dtype": "float32",
        "seed": 0,
        "determinism": {"requested": True, "deterministic_algorithms": True},
        "config_digest": "a" * 64,
        "weights": {"sha256": "1", "params": {"a": "x", "b": "y", "c": "z"}},
    }
    current = {
        **stored,
        "versions": {**stored["versions"], "transformers": "5.23.0", "megatron-core": "0.16.1"},
        "dtype": "bfloat16",
        "weights": {"sha256": "2", "params": {"a": "x", "b": "Y", "d": "w"}},
    }
    assert environment_diff(stored, current) == [
        "transformers 4.49.0 → 5.23.0",
        "megatron-core absent → 0.16.1",
        "dtype float32 → bfloat16",
    ]
    assert environment_diff(stored, stored) == []
    assert weights_diff(stored, current) == [
        "1 of 3 parameters differ: b",
        "1 baseline parameters absent from the candidate: c",
        "1 candidate parameters absent from the baseline: d",
    ]
    assert weights_diff(stored, stored) == []
