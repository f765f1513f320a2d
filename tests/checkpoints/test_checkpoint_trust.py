"""A checkpoint is unpickled in full only on the user's word (issue #26 item 1).

Real files: a legacy ``model_optim_rng.pt`` holding what megatron-core's save_checkpoint
writes besides the model (the ``args`` Namespace with enums and dtypes, numpy/python/torch RNG
states, an optimizer state) loads untrusted; the same file with one object whose
``__reduce__`` would create a marker folder is refused before anything runs (exit 2, one
message), and runs only with ``--trust-checkpoint`` / ``trust: true`` /
``--align-trust-checkpoint``. The same for a torch_dist ``.metadata`` that megatron-core wrote.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pytest_precalign.cli import main
from tests.helpers.checkpoints import HF_CONFIG_HEAD, VARS
from tests.helpers.checkpoints import convert as _convert

MAPPING = "--mapping=preset:megatron-qwen2.5"


class Payload:
    """Pickles as ``os.makedirs(marker, exist_ok=True)``: unpickling it creates the marker folder."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.makedirs, (str(self.marker), 0o777, True))


def _megatron_extras() -> dict[str, Any]:
    """What megatron.training's save_checkpoint writes besides the model."""
    pytest.importorskip("megatron.core")
    from megatron.core.enums import ModelType
    from megatron.core.transformer.enums import AttnBackend

    args = argparse.Namespace(
        tensor_model_parallel_size=1,
        params_dtype=torch.float32,
        attention_backend=AttnBackend.auto,
        model_type=ModelType.encoder_or_decoder,
        save=Path("/ckpt"),
        lr=1.0e-4,
    )
    rng = {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "rng_tracker_states": {"model-parallel-rng": torch.get_rng_state()},
    }
    optimizer = {"state": {0: {"step": torch.tensor(1.0)}}, "param_groups": [{"lr": 1.0e-4, "params": [0]}]}
    return {
        "args": args,
        "rng_state": [rng],
        "optimizer": optimizer,
        "num_floating_point_operations_so_far": 0,
    }


def _save_legacy(folder: Path, state: dict[str, Any]) -> Path:
    rank = folder / "iter_0000001" / "mp_rank_00"
    rank.mkdir(parents=True)
    torch.save(state, rank / "model_optim_rng.pt")
    (folder / "latest_checkpointed_iteration.txt").write_text("1")
    return folder


@pytest.fixture
def converted(hf_dir: Path) -> dict[str, torch.Tensor]:
    from pytest_precalign.checkpoints.hf import load_hf

    return _convert(load_hf(hf_dir))


def _base(converted: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {"model": converted, "checkpoint_version": 3.0, "iteration": 1, **_megatron_extras()}


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def test_megatron_checkpoint_loads_untrusted(
    hf_dir: Path, converted: dict[str, torch.Tensor], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _save_legacy(tmp_path / "good", _base(converted))
    assert main(["check-weights", str(hf_dir), str(good), MAPPING, *VARS]) == 0
    assert "ALIGNED" in capsys.readouterr().out


def test_payload_in_legacy_checkpoint_is_refused_unless_trusted(
    hf_dir: Path, converted: dict[str, torch.Tensor], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "pwned"
    evil = _save_legacy(tmp_path / "evil", {**_base(converted), "extra": Payload(marker)})
    rank_file = evil / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt"

    assert main(["check-weights", str(hf_dir), str(evil), MAPPING, *VARS]) == 2
    captured = capsys.readouterr()
    assert not marker.exists(), "the payload ran"
    lines = _error_lines(captured.err)
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"precalign: error: {rank_file}: not loaded: it holds 'os.makedirs'")
    assert "--trust-checkpoint" in lines[0] and "ALIGNED" not in captured.out

    assert main(["check-weights", str(hf_dir), str(evil), MAPPING, *VARS, "--trust-checkpoint"]) == 0
    assert marker.is_dir()  # the user said so: unpickled in full
    assert "ALIGNED" in capsys.readouterr().out


def test_payload_in_torch_dist_metadata_is_refused_unless_trusted(
    hf_dir: Path, megatron_ckpts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    evil = tmp_path / "dist"
    shutil.copytree(megatron_ckpts / "good" / "dist", evil)
    with (evil / ".metadata").open("rb") as f:
        metadata = pickle.load(f)  # the test's own file, written by megatron-core above
    marker = tmp_path / "pwned"
    metadata.planner_data = Payload(marker)
    with (evil / ".metadata").open("wb") as f:
        pickle.dump(metadata, f)

    assert main(["check-weights", str(hf_dir), str(evil), MAPPING, *VARS]) == 2
    captured = capsys.readouterr()
    assert not marker.exists(), "the payload ran"
    lines = _error_lines(captured.err)
    assert len(lines) == 1 and f"{evil / '.metadata'}: not loaded: it holds 'os.makedirs'" in lines[0], lines

    # The untouched torch_dist checkpoint loads untrusted (its metadata classes are allowed).
    good = megatron_ckpts / "good" / "dist"
    assert main(["check-weights", str(hf_dir), str(good), MAPPING, *VARS]) == 0
    capsys.readouterr()
    assert main(["check-weights", str(hf_dir), str(evil), MAPPING, *VARS, "--trust-checkpoint"]) == 0
    assert marker.is_dir() and "ALIGNED" in capsys.readouterr().out


CONFIG = (
    HF_CONFIG_HEAD
    + """\
  mc: {{source: megatron, config: *c, weights: {{load: {ck}, format: megatron{trust}}}}}
inputs:
  tokens: {{kind: tokens, batch: 2, seq_len: 8, vocab_size: 64, seed: 1}}
cases:
  - {{name: converted, baseline: hf, candidate: mc, inputs: tokens, mapping: "preset:megatron-qwen2.5",
     phases: [forward], weights: {{sync: false}}}}
"""
)


def _config(folder: Path, hf: Path, ck: Path, trust: str = "") -> Path:
    path = folder / "align.yaml"
    path.write_text(CONFIG.format(hf=hf, ck=ck, trust=trust), encoding="utf-8")
    return path


def test_config_key_and_run_flag_say_trust(
    hf_dir: Path, converted: dict[str, torch.Tensor], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "pwned"
    evil = _save_legacy(tmp_path / "evil", {**_base(converted), "extra": Payload(marker)})
    config = _config(tmp_path, hf_dir, evil)
    assert main(["run", str(config)]) == 2
    lines = _error_lines(capsys.readouterr().err)
    assert not marker.exists() and len(lines) == 1 and "not loaded: it holds 'os.makedirs'" in lines[0]

    assert main(["run", str(config), "--trust-checkpoint"]) == 0
    assert marker.is_dir()
    marker.rmdir()
    assert main(["run", str(_config(tmp_path, hf_dir, evil, ", trust: true"))]) == 0
    assert marker.is_dir()
    assert "PASSED" in capsys.readouterr().out


def test_pytest_option_says_trust(
    pytester: pytest.Pytester, hf_dir: Path, converted: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    evil = _save_legacy(tmp_path / "evil", {**_base(converted), "extra": Payload(marker)})
    _config(pytester.path, hf_dir, evil)
    result = pytester.runpytest_inprocess("--align-config", "align.yaml", "-p", "no:cacheprovider")
    assert not marker.exists()
    # refused at collection, before any case runs: a usage error naming the model's key
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*case 'converted': *: models.mc.weights: *not loaded: it holds 'os.makedirs'*--trust-checkpoint*"]
    )

    result = pytester.runpytest_inprocess(
        "--align-config", "align.yaml", "--align-trust-checkpoint", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=1)
    assert marker.is_dir()


def test_untrusted_load_never_calls_full_unpickling(tmp_path: Path) -> None:
    """A file whose pickle is not a torch.save archive is refused as such, not unpickled."""
    from pytest_precalign.checkpoints.trust import load_pt

    marker = tmp_path / "pwned"
    raw = tmp_path / "raw.pt"
    raw.write_bytes(pickle.dumps({"model": Payload(marker)}))
    with pytest.raises(ValueError, match="Expected input to be a checkpoint returned by torch.save"):
        load_pt(raw, trust=False)
    assert not marker.exists()


def test_fifo_in_torch_dist_checkpoint_is_refused(hf_dir: Path, megatron_ckpts: Path, tmp_path: Path) -> None:
    """torch opens the ``.distcp`` files by name: a FIFO among them is refused before (#26 item 4)."""
    import subprocess
    import sys

    import pytest_precalign

    folder = tmp_path / "dist"
    shutil.copytree(megatron_ckpts / "good" / "dist", folder)
    fifo = sorted(folder.glob("*.distcp"))[0]
    fifo.unlink()
    os.mkfifo(fifo)
    src = Path(pytest_precalign.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [
        sys.executable,
        "-m",
        "pytest_precalign",
        "check-weights",
        str(hf_dir),
        str(folder),
        MAPPING,
        *VARS,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"check-weights hung on the FIFO {fifo}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"precalign: error: {fifo}: is a FIFO, expected a torch_dist checkpoint file (a regular file)"
    )


def test_torch_dist_storage_file_outside_the_folder_is_refused(
    hf_dir: Path, megatron_ckpts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``.metadata`` names the ``.distcp`` files torch opens: a name leading outside the
    folder is refused, trusted or not (#26 item 2)."""
    folder = tmp_path / "dist"
    shutil.copytree(megatron_ckpts / "good" / "dist", folder)
    with (folder / ".metadata").open("rb") as f:
        metadata = pickle.load(f)  # the test's own file, written by megatron-core
    first = sorted(folder.glob("*.distcp"))[0]
    shutil.copy(first, tmp_path / "outside.distcp")
    for info in metadata.storage_data.values():
        if info.relative_path == first.name:
            info.relative_path = "../outside.distcp"
    with (folder / ".metadata").open("wb") as f:
        pickle.dump(metadata, f)
    for trust in ([], ["--trust-checkpoint"]):
        assert main(["check-weights", str(hf_dir), str(folder), MAPPING, *VARS, *trust]) == 2
        lines = _error_lines(capsys.readouterr().err)
        assert len(lines) == 1 and lines[0] == (
            f"precalign: error: {folder / '.metadata'}: storage file: '../outside.distcp' is not a plain "
            f"file name; a name inside a file must name a file in {folder} (no '/', '..', absolute path or NUL byte)"
        ), lines
