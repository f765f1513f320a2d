"""Real checkpoints for the checkpoint tests: a tiny Qwen2 HF ``save_pretrained`` folder
(sharded), converted by the suite through the preset mapping into Megatron's names and
layouts (written here from the mapping, not copied from any tool), with two planted
conversion bugs, and saved by megatron-core itself under torchrun (``megatron_ckpt_run.py``):
``torch_dist``, legacy TP=2 and legacy PP=2."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from pytest_precalign.mapping.spec import to_candidate_name
from pytest_precalign.mapping.transforms import apply_forward
from pytest_precalign.mapping.weights import expand_rule
from pytest_precalign.run.offline import load_mapping

HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2}
VARS = [f"--var={k}={v}" for k, v in HEADS.items()]
QWEN = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, **HEADS}
SCRIPT = Path(__file__).parent / "megatron_ckpt_run.py"
# The planted conversion bugs and the one parameter each must be named at.
FC1 = "decoder.layers.1.mlp.linear_fc1.weight"
QKV = "decoder.layers.0.self_attention.linear_qkv.weight"
VARIANTS = {"good": None, "bad_fc1": FC1, "bad_qkv": QKV}
# The head of an align config whose model ``hf`` loads the HF folder ``{hf}`` (``QWEN``'s
# shapes, anchored as ``*c`` for the Megatron models the tests add); a ``str.format`` template.
HF_CONFIG_HEAD = """\
version: 1
defaults: {{device: cpu, dtype: float32, seed: 0, deterministic: true}}
models:
  hf:
    source: hf
    class: transformers.Qwen2ForCausalLM
    attn_implementation: eager
    config: &c {{vocab_size: 64, hidden_size: 32, intermediate_size: 48, num_hidden_layers: 2,
                num_attention_heads: 4, num_key_value_heads: 2, rms_norm_eps: 1.0e-6,
                rope_theta: 1000000.0, max_position_embeddings: 64, tie_word_embeddings: false}}
    weights: {{load: {hf}, format: hf}}
"""


def save_hf(folder: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(7)  # not the models' seed 0: a model that did not load these weights differs
    config = Qwen2Config(**QWEN, rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=64)
    Qwen2ForCausalLM(config).save_pretrained(folder, max_shard_size="20KB")
    return folder


def convert(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF -> Megatron names and layouts through the preset mapping."""
    mapping = load_mapping("preset:megatron-qwen2.5", HEADS)
    assert mapping is not None
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for rule in mapping.tensors:
        for base, cand in expand_rule(rule, hf):
            if all(n in hf for n in base):
                out.update(zip(cand, apply_forward(rule.ops, [hf[n] for n in base]), strict=True))
                used.update(base)
    for name, tensor in hf.items():
        if name not in used:
            out[to_candidate_name(mapping, name)] = tensor.clone()
    return {k: v.contiguous() for k, v in out.items()}


def plant(
    converted: dict[str, torch.Tensor], hf: dict[str, torch.Tensor], bug: str | None
) -> dict[str, torch.Tensor]:
    """A conversion with one bug: gate/up swapped in layer 1's fc1, or layer 0's q/k/v
    concatenated whole instead of interleaved per KV group."""
    bad = dict(converted)
    if bug == FC1:
        bad[FC1] = torch.cat(bad[FC1].chunk(2, dim=0)[::-1])
    elif bug == QKV:
        bad[QKV] = torch.cat([hf[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    return bad


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def save_megatron(root: Path, states: dict[str, dict[str, torch.Tensor]]) -> None:
    """ROOT/NAME/{dist,tp2,pp2} for each state, by one 2-rank torchrun run."""
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    for name, state in states.items():
        save_file(state, str(root / f"{name}.safetensors"))
    cmd = [sys.executable, "-W", "ignore", "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--master_port", str(_free_port()), str(SCRIPT), str(root), *states]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun failed ({cmd}):\n{(proc.stdout + proc.stderr)[-6000:]}")
