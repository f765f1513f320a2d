"""msprobe multi-rank dumps merged before the compare (``--parallel target:tp=2``, or
compare.json's ``parallel_merge``): a tiny megatron-core GPTModel dumped by the real msprobe
``PrecisionDebugger`` under torchrun (gloo, CPU) at TP=1 and TP=2, same weights
(``tests/helpers/msprobe_tp_run.py``), in statistics and tensor mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("msprobe")

from pytest_precalign.cli import main  # noqa: E402

SCRIPT = Path(__file__).parents[1] / "helpers" / "msprobe_tp_run.py"
TASKS = ("statistics", "tensor")


def _torchrun(out: Path, nproc: int, fault: str = "none") -> subprocess.Popen[str]:
    out.mkdir(parents=True)
    cmd = [sys.executable, "-W", "ignore", "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    cmd += ["--master_port", str(_free_port()), str(SCRIPT), str(out), ",".join(TASKS), fault]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(proc: subprocess.Popen[str]) -> None:
    try:
        log, _ = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # torchrun and the ranks it started (their own session)
        log, _ = proc.communicate()
        raise RuntimeError(f"torchrun did not finish in 400 s ({proc.args}):\n{log[-3000:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun failed ({proc.args}):\n{log[-6000:]}")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tp1/ (one process, writes the weights), then tp2/ and tp2_fault/ (2 ranks each)."""
    root = tmp_path_factory.mktemp("msprobe_tp")
    _wait(_torchrun(root / "tp1", 1))
    runs = [_torchrun(root / "tp2", 2), _torchrun(root / "tp2_fault", 2, "fc2_rank1")]
    for proc in runs:
        _wait(proc)
    return root


def _cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["compare", *(str(a) for a in args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("task", TASKS)
def test_tp2_dump_merged_is_aligned_with_tp1(
    dumps: Path, capsys: pytest.CaptureFixture[str], task: str
) -> None:
    assert sorted(p.name for p in (dumps / "tp2" / task / "step0").iterdir()) == ["rank0", "rank1"]
    code, out, err = _cli(capsys, dumps / "tp1" / task, dumps / "tp2" / task, "--parallel", "target:tp=2")
    assert code == 0, out + err
    assert "PASSED" in out and "[forward]: 113 compared; aligned" in out, out


@pytest.mark.parametrize("task", TASKS)
def test_fault_on_one_rank_is_the_origin(dumps: Path, capsys: pytest.CaptureFixture[str], task: str) -> None:
    """Rank 1's share of layer 1's fc2 (its partial output before the all-reduce) scaled."""
    code, out, err = _cli(
        capsys, dumps / "tp1" / task, dumps / "tp2_fault" / task, "--parallel", "target:tp=2"
    )
    assert code == 1, out + err
    assert "First divergence: decoder.layers.1.mlp.linear_fc2 (activation, out.0, step 0), origin" in out, out


def test_msprobe_compare_json_parallel_merge(dumps: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 001's compare.json, read as it is: npu_path is the target, bench_path the golden."""
    config: dict[str, Any] = {
        "npu_path": "./tp2_fault/statistics",
        "bench_path": "./tp1/statistics",
        "is_print_compare_log": True,
        "parallel_merge": {
            "npu": {"rank_size": 2, "tp": 2, "pp": 1},
            "bench": {"rank_size": 1, "tp": 1, "pp": 1},
        },
    }
    file = dumps / "compare.json"
    file.write_text(json.dumps(config), encoding="utf-8")
    code, out, err = _cli(capsys, "--msprobe-config", file)
    assert code == 1 and "decoder.layers.1.mlp.linear_fc2 (activation, out.0, step 0), origin" in out, (
        out + err
    )


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("--parallel", "target:tp=4"), ("rank2/ is missing", "world size 4")),
        (("--parallel", "target:tp=2,pp=x"), ("pp='x': expected a whole number",)),
        (("--parallel", "middle:tp=2"), ("expected baseline:KEY=VALUE",)),
        (("--parallel", "target:tp=2,order=tp-pp"), ("order 'tp-pp' must name tp, cp, ep, dp and pp",)),
    ],
)
def test_layout_errors(
    dumps: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    code, out, err = _cli(capsys, dumps / "tp1" / "statistics", dumps / "tp2" / "statistics", *args)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("precalign: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
