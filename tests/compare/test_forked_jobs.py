"""compare/forked_jobs.py: jobs shared with forked processes give the serial results, and
whatever goes wrong in a child (an error, a death, a result that does not pickle) ends with
the job run again here, raising its own error if it has one. No child is left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_precalign.compare.forked_jobs import fork_usable, run_forked

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

PARENT = os.getpid()


def _slow_square(i: int) -> tuple[int, int]:
    time.sleep(0.005)  # long enough that the parent cannot take every job before a child starts
    return i * i, os.getpid()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_results_are_the_serial_ones_and_the_children_did_some():
    order = list(range(40))[::-1]
    seen: list[int] = []
    found = run_forked(order, _slow_square, workers=3, done=seen.append)
    assert {i: v for i, (v, _) in found.items()} == {i: i * i for i in range(40)}
    assert sorted(seen) == list(range(40))  # done once per job, in this process
    pids = {pid for _, pid in found.values()}
    assert PARENT in pids and len(pids) == 3
    assert all(_gone(pid) for pid in pids - {PARENT})  # reaped


def test_a_job_that_fails_in_a_child_is_run_again_here():
    def job(i: int) -> tuple[int, int]:
        if i % 5 == 0 and os.getpid() != PARENT:
            raise ValueError("only in a child")
        return _slow_square(i)

    found = run_forked(list(range(30)), job, workers=2)
    assert {i: v for i, (v, _) in found.items()} == {i: i * i for i in range(30)}
    assert all(found[i][1] == PARENT for i in range(0, 30, 5) if i in found)


def test_a_job_error_is_raised_with_its_own_message_and_no_child_is_left(tmp_path: Path):
    def job(i: int) -> int:
        (tmp_path / f"pid{os.getpid()}").touch()
        time.sleep(0.002)
        if i == 7:
            raise ValueError("tensor 7: not a readable torch tensor file")
        return i

    with pytest.raises(ValueError, match="tensor 7: not a readable torch tensor file"):
        run_forked(list(range(20)), job, workers=2)
    pids = {int(p.name[3:]) for p in tmp_path.iterdir()} - {PARENT}
    assert all(_gone(pid) for pid in pids)


def test_a_child_that_dies_or_sends_what_does_not_pickle_changes_nothing():
    def dies(i: int) -> int:
        if os.getpid() != PARENT:
            os._exit(3)
        return i + 1

    assert run_forked(list(range(10)), dies, workers=2) == {i: i + 1 for i in range(10)}

    def unpicklable(i: int) -> object:
        time.sleep(0.002)
        return (lambda: i) if os.getpid() != PARENT else i

    found = run_forked(list(range(12)), unpicklable, workers=2)
    assert found == {i: i for i in range(12)}  # every job the child did was run again here


def test_more_jobs_than_a_pipe_holds():
    order = list(range(40_000))  # 160 KB of indices: more than a pipe's 64 KB
    found = run_forked(order, lambda i: i * 2, workers=2)
    assert found == {i: i * 2 for i in order}


def test_forking_is_used_only_without_threads_and_without_torch():
    code = (
        "import threading, time\n"
        "from pytest_precalign.compare.forked_jobs import fork_usable\n"
        "print(fork_usable())\n"
        "t = threading.Thread(target=time.sleep, args=(0.2,)); t.start(); print(fork_usable()); t.join()\n"
        "import torch\n"
        "print(fork_usable())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False", "False"]
    if "torch" in sys.modules or threading.active_count() > 1:  # this test process
        assert not fork_usable()
