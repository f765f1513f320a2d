"""Recordings from elsewhere (issue #34 item 1): every JSON file the tool reads from a
recording goes through the one untrusted reader: huge integers, duplicate keys, environment
blocks of the wrong type and a world size no folder backs are one message naming the file
and the key, exit 2; never a traceback, and no allocation sized by a number from a file.
On a real run recorded by ``precalign record``, edited the way a damaged or crafted file is.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pytest_precalign
from pytest_precalign.baseline.variants import choose
from pytest_precalign.cli import main
from pytest_precalign.errors import TraceError
from tests.helpers.files import copy_trace, reseal
from tests.helpers.nets import write_mlp_suite

SRC = Path(pytest_precalign.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace folder recorded by ``precalign record`` (statistics, a 3-block MLP)."""
    folder = tmp_path_factory.mktemp("recorded")
    config = write_mlp_suite(folder, mode="stats")
    assert main(["record", str(config), "--out", str(folder / "rec")]) == 0
    return folder / "rec" / "port"


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_an_integer_of_5000_digits_is_one_message(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = copy_trace(recorded, tmp_path / "a")
    b = copy_trace(recorded, tmp_path / "b")
    text = (b / "manifest.json").read_text()
    (b / "manifest.json").write_text(text.replace('"seed": ', '"seed": ' + "9" * 5000 + ', "x": ', 1))
    reseal(b / "manifest.json")
    for command in (["compare", str(a), str(b)], ["env-diff", str(a), str(b)]):
        assert main(command) == 2
        line = _one_error(capsys)
        assert f"{b / 'manifest.json'}: " in line and "more than 4300 digits" in line, line


def test_a_key_twice_in_a_manifest_is_refused(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = copy_trace(recorded, tmp_path / "a")
    b = copy_trace(recorded, tmp_path / "b")
    text = (b / "manifest.json").read_text()
    (b / "manifest.json").write_text(text.replace('"scalars": ', '"scalars": {}, "scalars": ', 1))
    reseal(b / "manifest.json")
    assert main(["compare", str(a), str(b)]) == 2
    line = _one_error(capsys)
    assert line.endswith(f"{b / 'manifest.json'}: key 'scalars' appears twice in one object (each key once)")


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("versions", [1, 2], "'versions' must be an object, got [1, 2]"),
        ("versions", {"torch": 2}, "versions.'torch' must be a version string or null, got 2"),
        ("determinism", "on", "'determinism' must be an object, got 'on'"),
        ("weights", {"sha256": 1, "params": {}}, "'weights' must be {sha256: string, params:"),
    ],
)
@pytest.mark.parametrize("command", ["compare", "env-diff"])
def test_an_environment_block_of_the_wrong_type_is_one_message(
    recorded: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    key: str,
    value: Any,
    says: str,
    command: str,
) -> None:
    a = copy_trace(recorded, tmp_path / "a")
    b = copy_trace(recorded, tmp_path / "b", lambda m: m.__setitem__(key, value))
    assert main([command, str(a), str(b)]) == 2
    line = _one_error(capsys)
    assert f"{b / 'manifest.json'}: {says}" in line, line


def test_a_crafted_variant_manifest_is_one_message(recorded: Path, tmp_path: Path) -> None:
    """The baseline store chooses among variants by their manifests: a crafted one is named."""
    store = tmp_path / "baselines"
    copy_trace(recorded, store / "port")
    copy_trace(recorded, store / "port@other", lambda m: m.__setitem__("versions", "torch 2"))
    with pytest.raises(TraceError) as caught:
        choose(store, "port", {"versions": {}, "device": "cpu", "dtype": "float32"})
    assert str(caught.value) == (
        f"{store / 'port@other' / 'manifest.json'}: 'versions' must be an object, got 'torch 2'"
    )
    (store / "port@other" / "manifest.json").write_text('{"versions": {}, "seed": ' + "1" * 4400 + "}")
    reseal(store / "port@other" / "manifest.json")
    with pytest.raises(TraceError, match="more than 4300 digits"):
        choose(store, "port", {"versions": {}, "device": "cpu", "dtype": "float32"})


def _limit_memory() -> None:  # in the child: a run away allocation fails there, not the machine
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_a_world_size_of_a_billion_is_one_message_in_bounded_memory(recorded: Path, tmp_path: Path) -> None:
    """Acceptance: ``precalign compare`` on rank folders whose manifests claim world_size
    10**9 says which rank folder is missing, fast, and its peak RSS stays that of a small
    compare (it once built set(range(10**9)): 23 GB, killed by the kernel)."""
    for side in ("a", "b"):

        def claim(m: dict[str, Any]) -> None:
            m["parallel"] = {"tp": 1, "pp": 1, "dp": 10**9, "world_size": 10**9, "rank": 0}

        copy_trace(recorded, tmp_path / side / "step0" / "rank0", claim)
    code = (
        "import sys\n"
        "from pytest_precalign.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')))\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "compare", str(tmp_path / "a"), str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        preexec_fn=_limit_memory,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip() == (
        f"precalign: error: {tmp_path / 'a' / 'step0'}: rank1/ is missing: the manifests say world_size "
        "1000000000 (rank0/ .. rank999999999/ expected, tp=1, pp=1, dp=1000000000, cp=1, ep=1, "
        "order tp-cp-ep-dp-pp)"
    )
    peak_mb = int(done.stdout.split()[-1]) / 1024
    assert peak_mb < 400, f"peak RSS {peak_mb:.0f} MB"


@pytest.mark.parametrize(
    ("header", "says"),
    [
        (None, "header runs past the end"),
        (b'{"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 4000000000000]}}', "inside the file's"),
        (b'{"t": [1, 2]}', "inside the file's"),
        (b"[1, 2]", "header is not an object"),
    ],
    ids=["length", "offsets", "entry", "list"],
)
def test_a_rank_shard_header_sizes_nothing_from_its_numbers(
    tmp_path: Path, header: bytes | None, says: str
) -> None:
    """The rank merge's shard reader (parallel/store.py) checks a header's length and each
    tensor's byte range against the file before reading or allocating by them."""
    from pytest_precalign.parallel.store import _Header

    shard = tmp_path / "tensors-00000.safetensors"
    if header is None:
        shard.write_bytes((1 << 62).to_bytes(8, "little") + b"{}")
    else:
        shard.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 16)
    with pytest.raises(TraceError, match=says) as caught:
        _Header(shard)
    assert str(caught.value).startswith(f"{shard}: ")
