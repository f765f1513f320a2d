"""A report folder is published whole (reports/folder.py): report.json, report.html and
compare_result.csv of one run, never files of two runs side by side -- whether the writer is
killed (SIGKILL, SIGTERM, SIGINT) mid-write, a second writer publishes into the same folder at
the same time, a reader looks while it is replaced, or the disk is full (one message, exit 2
in the CLI; the previous report is kept). Writers are real processes; the full disk is a real
tmpfs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_precalign.cli import main
from pytest_precalign.errors import ConfigError, ReportError
from pytest_precalign.reports.document import write_reports
from tests.helpers.paths import MSPROBE_DATA

FILES = ("report.json", "report.html", "compare_result.csv")
_RUN = re.compile(r"\brun(\d+)\.l\d")

# A writer process: report after report into argv[1], run ids argv[2], argv[2]+1, ... (argv[3] of
# them, or forever), each of argv[4] records named run<k>.l<i>. Ctrl-C interrupts it as it does a
# user's Python (a process started in the background by a shell without job control inherits
# SIGINT ignored, and Python then keeps it ignored: such a writer would never stop).
WRITER = """
import signal
import sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from pytest_precalign.reports.document import write_reports
out, first, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
k = first
while count < 0 or k < first + count:
    check = {"metric": "allclose", "value": 0.1, "allowed": 1.0, "passed": True, "upper": True}
    records = [{"name": f"run{k}.l{i}", "kind": "activation", "slot": "out", "step": 0, "status": "ok",
                "checks": [check]} for i in range(size)]
    entry = {"case": f"run{k}", "nodeid": f"run{k}[forward]", "phase": "forward", "passed": True,
             "records": records, "unmatched": {"baseline": [], "candidate": []}, "nonfinite": []}
    write_reports(out, [entry], {"baseline": f"run{k}", "candidate": f"run{k}"})
    k += 1
"""


def _argv(out: Path, first: int, count: int = -1, size: int = 400) -> list[str]:
    return [sys.executable, "-c", WRITER, str(out), str(first), str(count), str(size)]


def _writer(out: Path, first: int, count: int = -1, size: int = 400) -> subprocess.Popen[str]:
    argv = _argv(out, first, count, size)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _write(out: Path, first: int, size: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_argv(out, first, 1, size), capture_output=True, text=True)


def _runs(texts: dict[str, str]) -> set[int]:
    """The run ids the files hold (one id: one run's set)."""
    found = {int(m) for text in texts.values() for m in _RUN.findall(text)}
    meta = json.loads(texts["report.json"])["baseline"]
    return found | {int(meta.removeprefix("run"))}


def _read(folder: Path) -> dict[str, str] | None:
    """The three files as one reader sees them through one open of the folder (None: the
    folder or a file is not there)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    try:
        texts = {}
        for name in FILES:
            try:
                handle = os.open(name, os.O_RDONLY, dir_fd=fd)
            except FileNotFoundError:
                return None
            with os.fdopen(handle, encoding="utf-8") as f:
                texts[name] = f.read()
        return texts
    finally:
        os.close(fd)


def _assert_one_run(folder: Path) -> int:
    assert sorted(p.name for p in folder.iterdir()) == sorted(FILES)
    texts = _read(folder)
    assert texts is not None
    runs = _runs(texts)
    assert len(runs) == 1, f"{folder} holds files of runs {sorted(runs)}"
    return runs.pop()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


def _wait_for(path: Path, seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("sig", "delay"),
    [(signal.SIGKILL, 0.05), (signal.SIGKILL, 0.23), (signal.SIGTERM, 0.11),
     (signal.SIGTERM, 0.31), (signal.SIGINT, 0.17), (signal.SIGINT, 0.37)],
)  # fmt: skip
def test_a_writer_killed_mid_write_leaves_one_runs_report(tmp_path: Path, sig: int, delay: float) -> None:
    out = tmp_path / "out"
    writer = _writer(out, 1)
    try:
        _wait_for(out / "report.json")
        time.sleep(delay)  # several reports are being written over each other
    finally:
        writer.send_signal(sig)
        try:
            writer.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            writer.kill()
            writer.communicate()
            raise AssertionError(f"the writer did not stop on signal {sig}") from None
    _assert_one_run(out)
    write_reports(out, [], {"baseline": "run0", "candidate": "run0"})  # the next writer clears up
    assert _leftovers(out) == [] and _assert_one_run(out) == 0


def test_two_concurrent_writers_publish_whole_sets_one_at_a_time(tmp_path: Path) -> None:
    out = tmp_path / "out"
    writers = [_writer(out, 100, 6, size=300), _writer(out, 200, 6, size=300)]
    seen: set[int] = set()
    while any(w.poll() is None for w in writers):  # a reader looks while they write
        texts = _read(out)
        if texts is not None:
            runs = _runs(texts)
            assert len(runs) == 1, f"a reader saw files of runs {sorted(runs)}"
            seen |= runs
    for w in writers:
        _, err = w.communicate()
        assert w.returncode == 0, err
    assert _assert_one_run(out) in (105, 205) and _leftovers(out) == []
    assert len(seen) > 1  # the reader saw reports of both writers come and go


def test_a_folder_holding_other_files_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = MSPROBE_DATA / "tiny_statistics_mix"
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["compare", str(dump), str(dump), "--report", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert f"--report: {tmp_path}: holds notes.txt, not a report: a report folder is replaced whole" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_the_working_directory_is_not_a_report_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="is the working directory"):
        write_reports(".", [], {})
    assert list(tmp_path.iterdir()) == []


def test_an_earlier_report_is_replaced_whole(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for k in (1, 2):
        assert _write(out, k, size=5).returncode == 0
        assert _assert_one_run(out) == k


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 320 KiB tmpfs: a small report fits, a large one does not."""
    if not sys.platform.startswith("linux"):
        pytest.skip("a tmpfs mount: Linux only")
    folder = tmp_path / "disk"
    folder.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=320k", "tmpfs", str(folder)], check=True, capture_output=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a small tmpfs here (needs root and mount): {exc}")
    yield folder
    subprocess.run(["umount", str(folder)], check=False, capture_output=True)


def test_a_full_disk_keeps_the_previous_report(small_disk: Path) -> None:
    out = small_disk / "out"
    assert _write(out, 1, size=5).returncode == 0
    check = {"metric": "allclose", "value": 0.1, "allowed": 1.0, "passed": True, "upper": True}
    records = [
        {"name": f"run2.l{i}", "kind": "activation", "slot": "out", "checks": [check]} for i in range(2000)
    ]
    with pytest.raises(ReportError) as excinfo:
        write_reports(out, [{"case": "run2", "phase": "forward", "records": records}], {"baseline": "run2"})
    message = str(excinfo.value)
    assert message.startswith(f"--report: {out}: cannot write the report: No space left on device")
    assert message.endswith("; the previous report is kept") and "\n" not in message
    assert _assert_one_run(out) == 1 and _leftovers(out) == []


def test_a_full_disk_is_one_cli_message_and_exit_2(
    small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = MSPROBE_DATA / "tiny_statistics_mix"  # its report is ~1 MB
    out = small_disk / "out"
    assert main(["compare", str(dump), str(dump), "--report", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"precalign: error: --report: {out}: cannot write the report: No space left on device; nothing was written"
    ]
    assert list(small_disk.iterdir()) == []


def test_a_full_disk_under_pytest_is_one_line_and_fails_the_run(
    pytester: pytest.Pytester, small_disk: Path, request: Any
) -> None:
    from tests.helpers.nets import write_mlp_suite

    config = write_mlp_suite(pytester.path, mode="stats")
    request.addfinalizer(lambda: sys.modules.pop("nets", None))
    (small_disk / "filler").write_bytes(b"\0" * (300 << 10))  # the stats report does not fit
    result = pytester.runpytest_inprocess(
        "--align-config", str(config), "--align-report", str(small_disk / "out"), "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text
    lines = [line for line in result.stderr.lines if line.startswith("ERROR: ")]
    assert lines == [
        f"ERROR: --align-report: {small_disk / 'out'}: cannot write the report: No space left on device; "
        "nothing was written"
    ]
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]
