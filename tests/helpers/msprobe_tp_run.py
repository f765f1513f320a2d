"""A tiny megatron-core GPTModel dumped by msprobe's real ``PrecisionDebugger`` under
torchrun (gloo, CPU), at TP=1 or TP=2, for the msprobe multi-rank merge tests.

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers/msprobe_tp_run.py OUT TASKS [FAULT]

TASK: ``statistics``, ``tensor`` or both, comma-separated (level L0). The TP=1 run (one process) writes the full
weights beside OUT (``weights.safetensors``); a TP=2 run loads each rank's shard of them (the
sharding rules of ``tensor_parallel.shard_state``), so both runs compute with the same
weights. FAULT ``fc2_rank1``: on tp rank 1, layer 1's ``linear_fc2`` weight shard is scaled
by 1.05, i.e. that rank's partial fc2 output before the all-reduce.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

CONFIG = """
version: 1
defaults: {device: cpu, dtype: float32, seed: 0, deterministic: true}
models:
  mc: {source: megatron, preset: qwen2.5, tensor_parallel: TP,
       config: {vocab_size: 256, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
                num_attention_heads: 4, num_key_value_heads: 2, rms_norm_eps: 1.0e-6,
                rope_theta: 1000000.0, max_position_embeddings: 64, tie_word_embeddings: false}}
cases: []
"""
FAULT_LAYER = "decoder.layers.1.mlp.linear_fc2"


def _debugger(out: Path, task: str) -> Any:
    """A new msprobe debugger (the class keeps one instance per process: the previous one
    is dropped, its API patches undone first)."""
    from msprobe.pytorch import PrecisionDebugger

    old = PrecisionDebugger._instance
    register = getattr(getattr(old, "service", None), "api_register", None)
    if register is not None and register.all_api_registered:
        register.restore_all_api()
    PrecisionDebugger._instance = None

    scope: dict[str, Any] = {"scope": [], "list": [], "data_mode": ["all"]}
    config = {
        "task": task,
        "dump_path": str(out / task),
        "rank": [],
        "step": [],
        "level": "L0",
        "async_dump": False,
        "statistics": {**scope, "summary_mode": "statistics"},
        "tensor": dict(scope),
    }
    file = out / f"config_{task}_{os.environ.get('RANK', '0')}.json"
    file.write_text(json.dumps(config), encoding="utf-8")
    return PrecisionDebugger(config_path=str(file))


def _spec(out: Path, tp: int) -> Any:
    from pytest_precalign.config.loader import load_config

    text = CONFIG.replace("TP", str(tp))
    return load_config(text, out / "align.yaml").models["mc"]


def _model(out: Path, spec: Any, tp: int, rank: int, fault: str) -> Any:
    import torch
    from safetensors.torch import load_file, save_file

    from pytest_precalign.run.tensor_parallel import shard_state
    from pytest_precalign.sources import build_model

    torch.manual_seed(0)
    loaded = build_model(spec, out)
    module = loaded.module
    weights = out.parent / "weights.safetensors"
    if tp == 1:
        save_file({n: p.detach().contiguous() for n, p in module.named_parameters()}, str(weights))
    else:
        shard = shard_state(load_file(str(weights)), tp, rank)
        with torch.no_grad():
            for name, param in module.named_parameters():
                param.copy_(shard[name])
    if fault == "fc2_rank1" and rank == 1:
        with torch.no_grad():
            dict(module.named_parameters())[f"{FAULT_LAYER}.weight"].mul_(1.05)
    return loaded


def main(argv: list[str]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    out, tasks = Path(argv[0]), argv[1]
    fault = argv[2] if len(argv) > 2 else "none"
    dist.init_process_group("gloo")
    tp, rank = dist.get_world_size(), dist.get_rank()
    from pytest_precalign.sources import runtime

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = _spec(out, tp)
        with runtime(spec):
            ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
            for one in tasks.split(","):
                loaded = _model(out, spec, tp, rank, fault)  # fresh: msprobe's hooks stay on a model
                debugger = _debugger(out, one)
                debugger.start(model=loaded.module)
                logits = loaded({"input_ids": ids})
                loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
                loss.backward()
                debugger.stop()
                debugger.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
