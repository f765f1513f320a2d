"""Real Megatron checkpoints of a tiny qwen2.5-preset GPTModel, written by megatron-core's own
save functions under torchrun (gloo, CPU, 2 ranks):

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers/megatron_ckpt_run.py ROOT NAME...

ROOT/NAME.safetensors: a full (TP=1) Megatron state converted from an HF folder by the test
(one per variant: the right conversion and planted bugs). OUT = ROOT/NAME gets:

* ``dist/``: a ``torch_dist`` checkpoint (``megatron.core.dist_checkpointing.save``) of the
  TP=1 model (2 data-parallel ranks) holding FULL;
* ``tp2/iter_0000001/mp_rank_0{0,1}/model_optim_rng.pt``: a TP=2 model loaded from ``dist/`` by
  ``dist_checkpointing.load`` (megatron-core reshards: it, not the project, splits the tensors),
  its ``state_dict_for_save_checkpoint`` saved in the legacy layout;
* ``pp2/iter_0000001/mp_rank_00_00{0,1}/model_optim_rng.pt``: the same with PP=2 (each stage
  holds its layers under local numbers).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

CONFIG = """
version: 1
defaults: {device: cpu, dtype: float32, seed: 0, deterministic: true}
models:
  mc: {source: megatron, preset: qwen2.5, tensor_parallel: TP, pipeline_parallel: PP,
       config: {vocab_size: 64, hidden_size: 32, intermediate_size: 48, num_hidden_layers: 2,
                num_attention_heads: 4, num_key_value_heads: 2, rms_norm_eps: 1.0e-6,
                rope_theta: 1000000.0, max_position_embeddings: 64, tie_word_embeddings: false}}
cases: []
"""


def _spec(out: Path, tp: int, pp: int) -> Any:
    from pytest_precalign.config.loader import load_config

    text = CONFIG.replace("TP", str(tp)).replace("PP", str(pp))
    return load_config(text, out / "align.yaml").models["mc"]


def _save_legacy(module: Any, folder: Path, tp: int, pp: int) -> None:
    import torch
    from megatron.core import parallel_state as ps

    name = f"mp_rank_{ps.get_tensor_model_parallel_rank():02d}"
    if pp > 1:
        name += f"_{ps.get_pipeline_model_parallel_rank():03d}"
    rank_dir = folder / "iter_0000001" / name
    rank_dir.mkdir(parents=True, exist_ok=True)
    state = {"model": module.state_dict_for_save_checkpoint(), "checkpoint_version": 3.0, "iteration": 1}
    torch.save(state, rank_dir / "model_optim_rng.pt")
    (folder / "latest_checkpointed_iteration.txt").write_text("1")


def main(argv: list[str]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # megatron-core's dist checkpointing asks CUDA for its device and synchronizes after its
    # copies: answered on the CPU (the project's megatron_cpu, plus a no-op synchronize).
    torch.cuda.synchronize = lambda device=None: None
    dist.init_process_group("gloo")
    for name in argv[1:]:
        _write(Path(argv[0]) / f"{name}.safetensors", Path(argv[0]) / name)
    dist.barrier()
    dist.destroy_process_group()


def _write(full_file: Path, out: Path) -> None:
    from megatron.core import dist_checkpointing
    from safetensors.torch import load_file

    from pytest_precalign import megatron_cpu
    from pytest_precalign.sources import build_model, runtime

    with warnings.catch_warnings(), megatron_cpu():
        warnings.simplefilter("ignore")
        spec = _spec(out, 1, 1)
        with runtime(spec):
            module = build_model(spec, out).module
            missing, unexpected = module.load_state_dict(load_file(str(full_file)), strict=False)
            assert not unexpected and all("_extra_state" in k for k in missing), (missing, unexpected)
            (out / "dist").mkdir(parents=True, exist_ok=True)
            dist_checkpointing.save(module.sharded_state_dict(), str(out / "dist"))
        for tp, pp, folder in ((2, 1, "tp2"), (1, 2, "pp2")):
            spec = _spec(out, tp, pp)
            with runtime(spec):
                module = build_model(spec, out).module
                loaded = dist_checkpointing.load(module.sharded_state_dict(), str(out / "dist"))
                module.load_state_dict(loaded)
                _save_legacy(module, out / folder, tp, pp)


if __name__ == "__main__":
    main(sys.argv[1:])
