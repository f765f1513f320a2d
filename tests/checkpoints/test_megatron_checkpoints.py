"""Megatron checkpoints written by megatron-core itself (``dist_checkpointing.save``, and a
TP=2 / PP=2 model resharded by ``dist_checkpointing.load`` saved in the legacy layout) from
the suite's conversion of a real HF folder: read back to exactly the converted state (TP
shards merged, fc1 de-interleaved, PP layers renumbered, torch_dist layers unstacked), verified
by ``precalign check-weights`` against the HF folder, planted conversion bugs named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pytest_precalign.checkpoints.compare import load_checkpoint
from pytest_precalign.cli import main
from pytest_precalign.errors import SourceError
from tests.helpers.checkpoints import FC1, VARIANTS, VARS

pytest.importorskip("megatron.core")

FORMATS = ("dist", "tp2", "pp2")
MAPPING = "--mapping=preset:megatron-qwen2.5"


def test_megatron_written_checkpoints_read_back_to_the_converted_state(megatron_ckpts: Path) -> None:
    converted = load_file(str(megatron_ckpts / "good.safetensors"))
    tp2 = megatron_ckpts / "good" / "tp2" / "iter_0000001"
    assert sorted(p.name for p in tp2.iterdir()) == ["mp_rank_00", "mp_rank_01"]
    shard = torch.load(tp2 / "mp_rank_01" / "model_optim_rng.pt", weights_only=False)["model"]
    assert shard[FC1].shape[0] == converted[FC1].shape[0] // 2  # really sharded by megatron
    pp2 = megatron_ckpts / "good" / "pp2" / "iter_0000001"
    assert sorted(p.name for p in pp2.iterdir()) == ["mp_rank_00_000", "mp_rank_00_001"]
    stage = torch.load(pp2 / "mp_rank_00_001" / "model_optim_rng.pt", weights_only=False)["model"]
    assert (
        "decoder.layers.0.mlp.linear_fc1.weight" in stage
        and "decoder.layers.1.mlp.linear_fc1.weight" not in stage
    )
    assert (megatron_ckpts / "good" / "dist" / "metadata.json").is_file()
    for fmt in FORMATS:
        state = load_checkpoint(megatron_ckpts / "good" / fmt)
        assert sorted(state) == sorted(converted), fmt
        assert all(torch.equal(state[k], converted[k]) for k in converted), fmt


@pytest.mark.parametrize("fmt", FORMATS)
def test_check_weights_verifies_the_conversion_and_names_planted_bugs(
    megatron_ckpts: Path, hf_dir: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for variant, bug in VARIANTS.items():
        code = main(["check-weights", str(hf_dir), str(megatron_ckpts / variant / fmt), MAPPING, *VARS])
        out = capsys.readouterr().out
        mismatched = [line.split(":")[0] for line in out.splitlines() if line.startswith("MISMATCH")]
        if bug is None:
            assert code == 0 and "ALIGNED" in out and "17 tensor(s) compared" in out, out
            assert not mismatched and "MISSING" not in out, out
        else:
            assert code == 1 and "DIFFERS" in out, out
            assert mismatched == [f"MISMATCH {bug}"], (variant, out)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_rank(folder: Path, rank: str, name: str, value: torch.Tensor) -> None:
    file = folder / "iter_0000001" / rank / "model_optim_rng.pt"
    state = torch.load(file, weights_only=False)
    state["model"][name] = value
    torch.save(state, file)


def test_shards_that_do_not_merge_are_one_clear_error(
    megatron_ckpts: Path, hf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = megatron_ckpts / "good" / "tp2"
    # A TP rank missing.
    missing = _copy(good, tmp_path / "missing")
    shutil.rmtree(missing / "iter_0000001" / "mp_rank_00")
    with pytest.raises(
        SourceError,
        match=r"incomplete checkpoint: 2 TP x 1 PP ranks expected, no model_optim_rng.pt for tp 0 pp 0",
    ):
        load_checkpoint(missing)
    # A name the GPT local spec does not have, different on the two ranks: not guessed.
    unknown = _copy(good, tmp_path / "unknown")
    for rank, value in (("mp_rank_00", torch.zeros(4)), ("mp_rank_01", torch.ones(4))):
        _edit_rank(unknown, rank, "decoder.layers.0.mlp.router.weight", value)
    with pytest.raises(
        SourceError,
        match=r"decoder\.layers\.0\.mlp\.router\.weight: not a known parameter of the GPT local spec",
    ):
        load_checkpoint(unknown)
    # A replicated norm that differs between the TP ranks.
    norm = "decoder.layers.1.input_layernorm.weight"
    split = _copy(good, tmp_path / "split")
    _edit_rank(split, "mp_rank_01", norm, torch.full((32,), 2.0))
    assert main(["check-weights", str(hf_dir), str(split), MAPPING, *VARS]) == 2
    err = capsys.readouterr().err
    assert f"{norm}: replicated over the TP ranks but differs between" in err and "mp_rank_01" in err
    assert "Traceback" not in err
    # A dist checkpoint whose metadata.json is not megatron-core's.
    broken = _copy(megatron_ckpts / "good" / "dist", tmp_path / "dist")
    (broken / "metadata.json").write_text('{"sharded_backend": "zarr"}')
    assert main(["check-weights", str(hf_dir), str(broken), MAPPING, *VARS]) == 2
    err = capsys.readouterr().err
    assert "sharded_backend 'zarr' is not supported (allowed: torch_dist" in err and "Traceback" not in err
