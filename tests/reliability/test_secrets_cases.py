"""What a case run writes and prints holds no planted secret (issue 47 item 1): report.json,
report.html and compare_result.csv of a ``pytest --align-config`` run and of ``precalign``,
the pytest terminal report and the command's stdout/stderr go through the one redaction rule.

The secrets are planted where a user's own values reach the tool: a folder name of the
config's path (the dataset file is in it too), a model factory's ``kwargs``, an error text
the model raises, the environment, a recording's settings. Every output is grepped for a
12-character prefix of each planted token (pytest cuts its short summary to the terminal's
width: a cut token is still a leak). Values that are no secret stay readable: the path around
the marker, module names, the model's own words.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_precalign.cli import main
from pytest_precalign.redaction import REDACTED
from pytest_precalign.reports.document import write_reports
from tests.helpers.paths import REPO, SRC

from .secret_writers import AWS, HF, OPENAI

GITHUB = "ghp_" + "Z" * 36
PLANTED = (HF, GITHUB, OPENAI, AWS)
PREFIXES = tuple(s[:12] for s in PLANTED)

NET = f"""import torch


class Net(torch.nn.Module):
    def __init__(self, token, notes, boom):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 4)
        self.head = torch.nn.Linear(4, 16)
        self.token, self.boom = token, boom

    def forward(self, input_ids):
        if self.boom == "forward":
            raise RuntimeError(f"cannot reach the hub with token {{self.token}} and {OPENAI}")
        return self.head(self.embed(input_ids))


def build(token=None, notes="", boom=None):
    torch.manual_seed(0)
    if boom == "build":
        raise RuntimeError(f"cannot reach the hub with token {{token}} and {OPENAI}")
    return Net(token, notes, boom)
"""

CONFIG = f"""version: 1
defaults: {{device: cpu, dtype: float32, seed: 0, deterministic: true}}
models:
  plain: {{source: factory, factory: "tiny_net:build", kwargs: {{token: {GITHUB}, notes: "{AWS}"}}}}
  cand: {{source: factory, factory: "tiny_net:build", kwargs: {{token: {GITHUB}, boom: BOOM}}}}
inputs:
  rows: {{kind: dataset, path: rows.txt, batch: 2}}
cases:
  - {{name: two_steps, baseline: plain, candidate: cand, inputs: rows, steps: 1,
     phases: [forward, backward, step], loss: mean}}
"""


def _suite(tmp_path: Path, boom: str) -> Path:
    """A project folder whose name holds a token: the model's module, the config, the dataset."""
    folder = tmp_path / f"proj_{HF}"
    folder.mkdir()
    (folder / "tiny_net.py").write_text(NET, encoding="utf-8")
    (folder / "rows.txt").write_text("1 2 3 4\n5 6 7 8\n", encoding="utf-8")
    (folder / "align.yaml").write_text(CONFIG.replace("BOOM", boom), encoding="utf-8")
    return folder


def _env(folder: Path) -> dict[str, str]:
    """The user's environment holds a token too (never recorded: checked here as well)."""
    return {
        "PYTHONPATH": f"{SRC}:{folder}",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONWARNINGS": "ignore",
        "HF_TOKEN": HF,
        "HOME": str(folder.parent),
    }


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``pytest --align-config align.yaml`` run by a user in their project folder (its rootdir)."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--align-config", "align.yaml"]
    cmd += ["--align-report", str(folder.parent / "out"), "-rA", *args]
    return subprocess.run(
        cmd, cwd=folder, env=_env(folder), capture_output=True, text=True, timeout=300, check=False
    )


def _leaks(folders: list[Path], *texts: str) -> list[tuple[str, str]]:
    """(where, prefix) of every planted secret found in the files under ``folders`` or ``texts``."""
    files = [p for folder in folders for p in folder.rglob("*") if p.is_file()]
    found = [(str(p), s) for p in files for s in PREFIXES if s.encode() in p.read_bytes()]
    return found + [(f"output {i}", s) for i, text in enumerate(texts) for s in PREFIXES if s in text]


def test_a_failing_case_writes_and_prints_no_planted_secret(tmp_path: Path) -> None:
    """The model raises with the factory's token and an OpenAI key in its error text, in a
    folder named with a Hugging Face token: exit 1, three report files and the JUnit XML,
    nothing leaks."""
    folder = _suite(tmp_path, "forward")
    done = _pytest(folder, f"--junitxml={tmp_path / 'junit' / 'junit.xml'}")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["compare_result.csv", "report.html", "report.json"]
    assert not _leaks([out, tmp_path / "junit"], done.stdout, done.stderr)
    shown = f"{tmp_path}/proj_{REDACTED}"
    document = json.loads((out / "report.json").read_text())
    assert document["config"] == f"{shown}/align.yaml"
    error = f"the run raised RuntimeError: cannot reach the hub with token {REDACTED} and {REDACTED}"
    assert all(error in case["error"] for case in document["cases"])
    assert f"rootdir: {shown}" in done.stdout  # pytest's own header line, in an alignment run
    assert done.stdout.count(error) == 3 + 3  # each item's failure, then its summary line


@pytest.mark.slow
def test_a_passing_case_and_its_saved_traces_hold_no_planted_secret(tmp_path: Path) -> None:
    """The factory's kwargs hold a GitHub token and an AWS key id: the recordings
    (``--align-save-traces``), the reports and the terminal hold none; module names stay."""
    folder = _suite(tmp_path, "null")
    traces = tmp_path / f"traces_{GITHUB}"
    done = _pytest(folder, "-v", "--align-save-traces", str(traces))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert list(traces.rglob("manifest.json"))  # both sides were written
    assert not _leaks([tmp_path / "out", traces], done.stdout, done.stderr)
    document = json.loads((tmp_path / "out" / "report.json").read_text())
    names = {r["name"] for case in document["cases"] for r in case["records"]}
    assert {"embed", "head"} <= names


@pytest.mark.slow
def test_a_factory_that_raises_at_collection_is_a_usage_error_without_the_secret(tmp_path: Path) -> None:
    folder = _suite(tmp_path, "build")
    done = _pytest(folder)
    assert done.returncode == 4, done.stdout[-3000:] + done.stderr[-2000:]
    assert not _leaks([tmp_path / "out"], done.stdout, done.stderr)
    assert f"tiny_net:build(**{{'token': '{REDACTED}', 'boom': 'build'}}) raised RuntimeError" in done.stderr


@pytest.mark.slow
def test_precalign_run_prints_and_writes_no_planted_secret(tmp_path: Path) -> None:
    folder = _suite(tmp_path, "forward")
    cmd = [sys.executable, "-m", "pytest_precalign", "run", "align.yaml", "--report", str(tmp_path / "out")]
    done = subprocess.run(
        cmd, cwd=folder, env=_env(folder), capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-2000:]
    assert not _leaks([tmp_path / "out"] if (tmp_path / "out").exists() else [], done.stdout, done.stderr)
    assert f"proj_{REDACTED}/align.yaml: case 'two_steps': the run raised RuntimeError" in done.stderr


@pytest.mark.slow
def test_a_calibrated_table_holds_no_planted_secret(tmp_path: Path) -> None:
    """``precalign calibrate`` writes the command as typed into the table and its sidecar: the
    config's and the table's paths name the folder holding a token."""
    folder = _suite(tmp_path, "null")
    table = folder / "calibrated.yaml"
    cmd = [
        sys.executable,
        "-m",
        "pytest_precalign",
        "calibrate",
        str(folder / "align.yaml"),
        "--out",
        str(table),
    ]
    done = subprocess.run(
        cmd, cwd=folder, env=_env(folder), capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    sidecar = folder / "calibrated.calibration.json"
    assert not _leaks([], table.read_text(), sidecar.read_text(), done.stdout, done.stderr)
    assert f"# Command: precalign calibrate {tmp_path}/proj_{REDACTED}/align.yaml" in table.read_text()


def test_a_config_error_quoting_a_token_is_printed_without_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``precalign validate``: the message names the file, the key and the allowed values; the
    refused value (a token pasted into the wrong field) and the folder's token are replaced."""
    folder = _suite(tmp_path, "null")
    config = folder / "align.yaml"
    config.write_text(config.read_text().replace("dtype: float32", f"dtype: {GITHUB}"))
    assert main(["validate", str(config)]) == 2
    out, err = capsys.readouterr()
    assert not _leaks([], out, err)
    assert err == (
        f"precalign: error: {tmp_path}/proj_{REDACTED}/align.yaml:2: defaults.dtype: unknown value "
        f"'{REDACTED}' (allowed: float32, float16, bfloat16, float64, keep)\n"
    )


def test_one_document_written_three_ways_holds_no_planted_secret(tmp_path: Path) -> None:
    """``write_reports`` (what the plugin and the command call): a case entry whose config
    path, error, settings and a secret-named key hold tokens."""
    entry = {
        "config": f"/work/proj_{HF}/align.yaml",
        "name": "c",
        "phase": "forward",
        "nodeid": f"proj_{HF}/align.yaml::c[forward]",
        "passed": False,
        "error": f"raised RuntimeError: bad token {GITHUB}; data s3://me:{OPENAI}@bucket/x",
        "weights": {"api_key": "plain-looking", "path": f"/ckpt/{AWS}"},
        "records": [],
    }
    out = write_reports(tmp_path / "out", [entry], {"config": entry["config"]}).parent
    assert not _leaks([out])
    case = json.loads((out / "report.json").read_text())["cases"][0]
    assert case["weights"] == {"api_key": REDACTED, "path": f"/ckpt/{REDACTED}"}
    assert case["error"] == f"raised RuntimeError: bad token {REDACTED}; data s3://{REDACTED}@bucket/x"


@pytest.mark.slow
def test_precalign_compare_of_recordings_holding_a_token_prints_and_writes_none(tmp_path: Path) -> None:
    """Two recorded roots in a folder named with a token, the candidate's settings holding a
    raw token (a recording from before the rule, or from elsewhere, resealed): the compare's
    stdout, stderr and report hold none of them."""
    script = tmp_path / "record_two.py"
    script.write_text(RECORD_TWO, encoding="utf-8")
    roots = tmp_path / f"runs_{HF}"
    env = {"PYTHONPATH": f"{SRC}:{REPO}", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    made = subprocess.run(
        [sys.executable, str(script), str(roots)], env=env, capture_output=True, text=True, timeout=300
    )
    assert made.returncode == 0, made.stderr[-3000:]
    assert GITHUB in (roots / "b" / "step0" / "rank0" / "manifest.json").read_text()
    cmd = [sys.executable, "-m", "pytest_precalign", "compare", str(roots / "a"), str(roots / "b")]
    done = subprocess.run(
        [*cmd, "--report", str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert not _leaks([tmp_path / "out"], done.stdout, done.stderr)
    assert f"runs_{REDACTED}/a" in done.stdout


RECORD_TWO = f"""import sys
from pathlib import Path

import torch

from pytest_precalign import Recorder
from tests.reliability.crafted_runs import edit_text, manifest


def record(root):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(1))
    rec = Recorder(root, mode="scalars")
    rec.record_settings(model, optimizer, steps=2, arguments={{"hf_token": "{HF}", "lr": 0.1}})
    for step in range(2):
        rec.start(model)
        loss = model(xs[step]).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        rec.record_scalars(loss=loss.item(), lr=[0.1])
        rec.stop()
        rec.step()
    rec.close()


roots = Path(sys.argv[1])
record(roots / "a")
record(roots / "b")
edit_text(manifest(roots / "b"), '"<redacted>"', '"{GITHUB}"')  # the raw token, resealed
"""
