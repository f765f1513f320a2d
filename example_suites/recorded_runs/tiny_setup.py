"""What the user's scripts here share, as a user's own project module would: a tiny Qwen2 built
from a config (nothing downloaded), rows of token ids of varying length from a fixed seed, a
dynamic-padding collator, and the scripts' ``NAME:key=value,...`` run specs."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB, PAD, EOS = 256, 0, 1
# The TrainingArguments every run here shares: the rows in order, a log line every step, no
# checkpoints or trackers, CPU, one seed.
QUIET_CPU_RUN: dict[str, Any] = {
    "train_sampling_strategy": "sequential",
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": [],
    "disable_tqdm": True,
    "use_cpu": True,
    "seed": 0,
}


def tiny_qwen2(attn: str = "eager") -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=PAD,
        eos_token_id=EOS,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM._from_config(config, attn_implementation=attn)


def token_rows(count: int, *, permute_after: int | None = None) -> list[list[int]]:
    """``count`` rows of 6 to 16 token ids (never PAD or EOS); ``permute_after=n``: rows n..
    in another order (the same rows overall)."""
    gen = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(count):
        length = int(torch.randint(6, 17, (1,), generator=gen))
        rows.append(torch.randint(2, VOCAB, (length,), generator=gen).tolist())
    if permute_after is not None:
        tail = rows[permute_after:]
        order = torch.randperm(len(tail), generator=torch.Generator().manual_seed(7)).tolist()
        rows = rows[:permute_after] + [tail[i] for i in order]
    return rows


def pad_batch(features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Dynamic padding to the micro-batch's longest row (right side); padding is not learned."""
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), longest), PAD)
    mask = torch.zeros((len(features), longest), dtype=torch.long)
    for i, f in enumerate(features):
        ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[i, : len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def parse_run(spec: str, defaults: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``NAME`` or ``NAME:key=value,key=value``: the run's name and its settings (``defaults``
    with the given keys replaced, each converted to the default's type; ``steps=3+4``)."""
    name, _, rest = spec.partition(":")
    run = dict(defaults)
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in run:
            sys.exit(f"{spec}: unknown key {key!r} (allowed: {', '.join(defaults)})")
        if key == "steps":
            run[key] = [int(s) for s in value.split("+")]
        elif isinstance(defaults[key], float):
            run[key] = float(value)
        elif isinstance(defaults[key], int) or key.endswith("_from"):
            run[key] = int(value)
        else:
            run[key] = value
    return name, run


def sweep(
    argv: list[str], defaults: dict[str, Any], train: Callable[[Path, dict[str, Any]], None], usage: str
) -> None:
    """``OUT RUN [RUN ...]``: train and record each run under ``OUT/NAME``, deterministically."""
    if len(argv) < 2:
        sys.exit(usage)
    torch.use_deterministic_algorithms(True)
    out = Path(argv[0])
    for spec in argv[1:]:
        name, run = parse_run(spec, defaults)
        train(out / name, run)
        print(f"recorded {out / name}", flush=True)
