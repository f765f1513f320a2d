"""Real checkpoints, made once per session (the torchrun run takes ~20 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.checkpoints import VARIANTS, convert, plant, save_hf, save_megatron
from tests.integration.conftest import plugin_args, run_pytest, xdist  # noqa: F401 - the inner-run fixtures


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="session")
def megatron_ckpts(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROOT/{good,bad_fc1,bad_qkv}/{dist,tp2,pp2}: checkpoints megatron-core wrote from the
    suite's conversion of ``hf_dir`` (ROOT/good.safetensors is the converted state)."""
    pytest.importorskip("megatron.core")
    from pytest_precalign.checkpoints.hf import load_hf

    hf = load_hf(hf_dir)
    converted = convert(hf)
    root = tmp_path_factory.mktemp("megatron")
    save_megatron(root, {name: plant(converted, hf, bug) for name, bug in VARIANTS.items()})
    return root
