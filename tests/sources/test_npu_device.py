"""``device: npu`` without a usable torch_npu is one message naming the package and CANN, from
``precalign run`` (exit 2) and from pytest ``--align-config`` (a usage error), never a traceback.

Where torch_npu is not installed (the project's venv) that is the "not installed" message.
Where torch-npu is installed from PyPI without the CANN toolkit (``tox -e npu-missing-cann``),
``import torch`` itself fails (torch loads installed device backends): the message names the
missing CANN library, for ``device: npu`` and, for other devices, says how to run without the
NPU. On an NPU machine where torch_npu loads there is no message to show: skipped. A torch_npu built for
another torch (installed with ``pip install --no-deps``) is named as such instead.

Every run here is a subprocess: a failed ``import torch`` leaves a process unable to import it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.version import Version

from pytest_precalign.recording.npu_backend import AUTOLOAD, version_mismatch
from tests.helpers.nets import write_mlp_suite


def _installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


NPU = _installed("torch_npu")
TORCH = _installed("torch") or ""
# torch_npu X.Y.Z(.postN) is built for torch X.Y.Z: another pair is a mismatch (pip install --no-deps).
MISMATCH = NPU is not None and Version(NPU).release[:3] != Version(TORCH).release[:3]
RELEASE = Version(TORCH).base_version if TORCH else ""


@pytest.fixture(scope="module")
def npu_loads() -> bool:
    """torch_npu imports here (an NPU machine with CANN): then there is no message to check."""
    if NPU is None:
        return False
    env = {k: v for k, v in os.environ.items() if k != AUTOLOAD}
    done = subprocess.run(
        [sys.executable, "-c", "import torch_npu"], capture_output=True, env=env, check=False
    )
    return done.returncode == 0


@pytest.fixture
def npu_config(tmp_path: Path, npu_loads: bool, monkeypatch: pytest.MonkeyPatch) -> Path:
    if npu_loads:
        pytest.skip(f"torch_npu {NPU} loads here (CANN is installed): device 'npu' works, no message to show")
    monkeypatch.delenv(AUTOLOAD, raising=False)  # torch loads torch_npu on import, as by default
    return _with_device(write_mlp_suite(tmp_path), "npu")


def _with_device(config: Path, device: str) -> Path:
    text = config.read_text(encoding="utf-8").replace(
        "version: 1", f"version: 1\ndefaults: {{device: {device}}}"
    )
    config.write_text(text, encoding="utf-8")
    return config


def _npu_message() -> str:
    """The message this environment must give, as an fnmatch pattern."""
    if NPU is None:
        return "device 'npu' needs torch_npu, which is not installed: pip install 'pytest-precalign[[]npu[]]' (and the CANN toolkit)"
    if MISMATCH:
        return (
            f"device 'npu': torch_npu {NPU} is built for torch * but torch {TORCH} is installed: "
            f"install the torch-npu release for torch {RELEASE} (pip install 'torch-npu=={RELEASE}.*')*"
        )
    return (
        f"device 'npu': torch_npu {NPU} is installed but cannot load: lib*.so not found"
        " — install the CANN toolkit and source its set_env.sh (e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh)"
    )


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_precalign", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        check=False,
        timeout=300,
    )


@pytest.mark.parametrize("command", ["run", "validate", "record", "calibrate"])
def test_cli_is_one_message_and_exit_2(npu_config: Path, command: str) -> None:
    where = npu_config.parent
    args = {
        "run": ["run", str(npu_config)],
        "validate": ["validate", str(npu_config)],
        "record": ["record", str(npu_config), "--out", str(where / "bl")],
        "calibrate": ["calibrate", "--config", str(npu_config), "--out", str(where / "table.yaml")],
    }[command]
    done = _cli(*args, cwd=where)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    pattern = f"precalign: error: {npu_config}:*: models.ref: {_npu_message()}"
    pytest.LineMatcher(lines).fnmatch_lines([pattern])


@pytest.mark.parametrize("plugin_args", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_pytest_align_config_is_one_usage_error(
    npu_config: Path, pytester: pytest.Pytester, plugin_args: list[str]
) -> None:
    result = pytester.runpytest_subprocess(
        "--align-config", str(npu_config), "-p", "no:cacheprovider", "-rN", *plugin_args
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"ERROR: --align-config: case 'port': {npu_config}:*: models.ref: {_npu_message()}"]
    )
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str()


def _needs_installed_npu(npu_loads: bool) -> None:
    if NPU is None:
        pytest.skip(
            "torch_npu is not installed here: torch imports whatever the device (tox -e npu-missing-cann)"
        )
    if npu_loads:
        pytest.skip(f"torch_npu {NPU} loads here (CANN is installed)")


def test_another_device_says_how_to_run_without_the_npu(tmp_path: Path, npu_loads: bool) -> None:
    """torch_npu installed without CANN stops ``import torch`` for a CPU run too: one message
    with the way out (TORCH_DEVICE_BACKEND_AUTOLOAD=0), and with it the CPU run works and its
    manifest records torch_npu's version (what env-diff and the baseline variants read)."""
    _needs_installed_npu(npu_loads)
    config = _with_device(write_mlp_suite(tmp_path), "cpu")
    env = {k: v for k, v in os.environ.items() if k != AUTOLOAD}
    done = _cli("record", str(config), "--out", str(tmp_path / "bl"), cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stderr
    why = (
        f"which is built for torch * but torch {TORCH} is installed: install the torch-npu release for torch {RELEASE} *"
        if MISMATCH
        else "which cannot load: lib*.so not found — install the CANN toolkit and source its set_env.sh (e.g. *)"
    )
    pytest.LineMatcher(done.stderr.strip().splitlines()).fnmatch_lines(
        [
            f"precalign: error: {config}:*: models.ref: torch {TORCH} cannot be imported: it loads the installed "
            f"torch_npu {NPU}, {why}, or set {AUTOLOAD}=0 to run without the NPU"
        ]
    )
    done = _cli(
        "record", str(config), "--out", str(tmp_path / "bl"), cwd=tmp_path, env={**env, AUTOLOAD: "0"}
    )
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "bl" / "port" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["versions"]["torch_npu"] == NPU


def test_a_torch_npu_built_for_another_torch_is_named() -> None:
    """torch_npu's own requirement (its metadata) against the installed torch."""
    message = version_mismatch("2.12.0", "2.13.0+cpu", ["torch==2.12.0.*", "numpy", "pyyaml"])
    assert message == (
        "device 'npu': torch_npu 2.12.0 is built for torch ==2.12.0.* but torch 2.13.0+cpu is installed: "
        "install the torch-npu release for torch 2.13.0 (pip install 'torch-npu==2.13.0.*') or the torch "
        "torch_npu 2.12.0 needs"
    )
    assert version_mismatch("2.13.0", "2.13.0+cpu", ["torch==2.13.0.*", "numpy"]) is None
    assert version_mismatch("2.13.0.post1", "2.13.0", ["numpy"]) is None  # no torch pin: not detectable
    if NPU is not None and not MISMATCH:  # the real metadata: pip installed the matching pair
        requires = metadata.requires("torch_npu") or []
        assert any(r.startswith("torch") for r in requires)
        assert version_mismatch(NPU, metadata.version("torch"), requires) is None
