"""What the bug reproductions share, as a user's own project module would: tiny models built
from a config with a fixed seed (nothing downloaded), rows of token ids of varying length,
a right-padding collator, and ``main`` (``python CASE.py OUT SIDE``: record the case's run and
its clean twin under ``OUT/SIDE`` and ``OUT/SIDE_twin``; SIDE is ``fixed`` or ``buggy``).

It runs under every interpreter the benchmark uses (the current venv and the releases' venvs
under ``--venvs``): only APIs that transformers 4.48 and 5.x share."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

VOCAB, PAD, EOS = 256, 0, 1
QUIET_CPU_RUN: dict[str, Any] = {
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": [],
    "disable_tqdm": True,
    "use_cpu": True,
    "seed": 0,
    "dataloader_drop_last": True,
}


def small_config(cls: Any, **extra: Any) -> Any:
    """A config of ``cls`` (Qwen2Config, LlamaConfig, MistralConfig, GemmaConfig...): vocab 256,
    hidden 32, 2 layers, 4 heads / 2 KV heads, untied head."""
    base: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "pad_token_id": PAD,
        "eos_token_id": EOS,
        "tie_word_embeddings": False,
    }
    base.update(extra)
    return cls(**base)


def build(model_cls: Any, config: Any, attn: str = "eager", dtype: torch.dtype = torch.float32) -> Any:
    torch.manual_seed(0)
    model = model_cls._from_config(config, attn_implementation=attn)
    return model.to(dtype)


def tiny_qwen2(attn: str = "eager", **extra: Any) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return build(Qwen2ForCausalLM, small_config(Qwen2Config, **extra), attn)


def token_rows(count: int, low: int = 6, high: int = 16, seed: int = 1) -> list[list[int]]:
    """``count`` rows of ``low``..``high`` token ids (never PAD or EOS), from a fixed seed."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        length = int(torch.randint(low, high + 1, (1,), generator=gen))
        rows.append(torch.randint(2, VOCAB, (length,), generator=gen).tolist())
    return rows


def pad_batch(features: list[dict[str, list[int]]], left: bool = False) -> dict[str, torch.Tensor]:
    """Dynamic padding to the longest row (right side, or ``left``); padding is not learned."""
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), longest), PAD)
    mask = torch.zeros((len(features), longest), dtype=torch.long)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        span = slice(longest - n, longest) if left else slice(0, n)
        ids[i, span] = torch.tensor(f["input_ids"])
        mask[i, span] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def main(record: Callable[[Path, str, bool], None]) -> None:
    """``python CASE.py OUT SIDE [SIDE]``: for each SIDE, ``record(OUT/SIDE, SIDE, True)`` (the
    bug's trigger on) and ``record(OUT/SIDE_twin, SIDE, False)`` (the clean twin: the same run,
    trigger off). Two sides share one process when they share an interpreter (a
    re-implementation): the import is paid once; each run builds its model from its seed, and
    a state one run left behind would show as a difference between the twins.

    One intra-op thread: a tiny model gains nothing from more, and on a shared machine their
    spin-waits cost ten times the run's own CPU time (measured: 0.17 s vs 2.5-5 s a run)."""
    sides = sys.argv[2:]
    if len(sys.argv) not in (3, 4) or not set(sides) <= {"fixed", "buggy"} or len(set(sides)) < len(sides):
        sys.exit(f"usage: {sys.argv[0]} OUT fixed|buggy [fixed|buggy]")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out = Path(sys.argv[1])
    for side in sides:
        for trigger, name in ((True, side), (False, f"{side}_twin")):
            record(out / name, side, trigger)
            print(f"recorded {out / name}", flush=True)
