"""precalign check-weights: a real HF folder converted by the suite (through the preset
mapping) into a Megatron legacy checkpoint, verified; planted conversion bugs are named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from pytest_precalign.checkpoints.compare import compare_checkpoints, load_checkpoint
from pytest_precalign.cli import main
from tests.helpers.checkpoints import VARS
from tests.helpers.checkpoints import convert as _convert


def _save_legacy(folder: Path, state: dict[str, torch.Tensor]) -> Path:
    rank = folder / "iter_0000001" / "mp_rank_00"
    rank.mkdir(parents=True)
    torch.save({"model": state, "checkpoint_version": 3.0, "iteration": 1}, rank / "model_optim_rng.pt")
    (folder / "latest_checkpointed_iteration.txt").write_text("1")
    return folder


def _snapshot(folder: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in folder.rglob("*")}


def test_converted_legacy_checkpoint_verified_and_bugs_named(
    hf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = load_checkpoint(hf_dir)
    assert (hf_dir / "model.safetensors.index.json").is_file()  # sharded folder really read
    converted = _convert(hf)
    good = _save_legacy(tmp_path / "good", converted)
    before = _snapshot(hf_dir) | _snapshot(good)

    assert main(["check-weights", str(hf_dir), str(good), "--mapping=preset:megatron-qwen2.5", *VARS]) == 0
    out = capsys.readouterr().out
    assert "ALIGNED" in out and f"{len(converted)} tensor(s) compared" in out
    assert _snapshot(hf_dir) | _snapshot(good) == before  # read-only

    # Planted bug 1: gate/up swapped in layer 1 only.
    bad = dict(converted)
    fc1 = "decoder.layers.1.mlp.linear_fc1.weight"
    bad[fc1] = torch.cat(bad[fc1].chunk(2, dim=0)[::-1])
    # Planted bug 2: q/k/v concatenated without the per-group interleave in layer 0.
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    attn = "model.layers.0.self_attn"
    bad[qkv] = torch.cat([hf[f"{attn}.{p}_proj.weight"] for p in "qkv"])
    wrong = _save_legacy(tmp_path / "bad", bad)
    assert main(["check-weights", str(hf_dir), str(wrong), "--mapping=preset:megatron-qwen2.5", *VARS]) == 1
    out = capsys.readouterr().out
    mismatched = [line.split(":")[0] for line in out.splitlines() if line.startswith("MISMATCH")]
    assert sorted(mismatched) == [f"MISMATCH {qkv}", f"MISMATCH {fc1}"]
    assert "Tensor-likes are not close!" in out and "DIFFERS" in out

    # Without the mapping nothing pairs: names missing on both sides, fail closed.
    diff = compare_checkpoints(hf, converted)
    assert not diff.aligned and diff.compared == 0 and diff.only_first and diff.only_second


def test_bad_input_is_one_message_exit_2(
    hf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    assert main(["check-weights", str(hf_dir), str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "no such checkpoint folder" in err and "Traceback" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["check-weights", str(empty), str(hf_dir)]) == 2
    err = capsys.readouterr().err
    assert "allowed formats: hf" in err and "megatron" in err
    broken = _save_legacy(tmp_path / "broken", {})
    (broken / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"junk")
    assert main(["check-weights", str(hf_dir), str(broken)]) == 2
    assert "model_optim_rng.pt: not a Megatron checkpoint" in capsys.readouterr().err
    assert os.listdir(empty) == []


def test_the_hf_folders_config_json_gives_the_mappings_variables(
    hf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No ``--var``: the heads the preset's qkv rule needs come from the HF folder's config.json."""
    good = _save_legacy(tmp_path / "good", _convert(load_checkpoint(hf_dir)))
    assert main(["check-weights", str(hf_dir), str(good), "--mapping=preset:megatron-qwen2.5"]) == 0
    assert "ALIGNED" in capsys.readouterr().out
