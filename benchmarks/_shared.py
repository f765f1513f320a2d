"""What the benchmark scripts share: the Qwen2 sizes they measure, how the model is built,
medians, the run facts every JSON line ends with (threads, load, versions), and the seam a
benchmark reads a stats-mode recorder's CPU statistics through (``stats_reads``)."""

from __future__ import annotations

import platform
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import transformers

from pytest_precalign.recording import recorder

try:  # the capture core, out of recorder.py since session 21
    from pytest_precalign.recording import tensor_capture as capture_core
except ImportError:  # a recorder before (compared from a worktree)
    capture_core = recorder

Read = Callable[[torch.Tensor], Any]


@dataclass(frozen=True)
class Size:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    max_positions: int
    batch: int
    seq: int


SIZES: dict[str, Size] = {
    "mid": Size(
        vocab=32000,
        hidden=512,
        intermediate=1408,
        layers=8,
        heads=8,
        kv_heads=2,
        max_positions=512,
        batch=2,
        seq=256,
    ),
    "large": Size(
        vocab=32000,
        hidden=2048,
        intermediate=5504,
        layers=8,
        heads=16,
        kv_heads=4,
        max_positions=512,
        batch=1,
        seq=128,
    ),
    # Qwen2.5-0.5B's layer shapes (hidden 896, 14 heads / 2 KV heads, intermediate 4864) with 4
    # of its 24 layers and the mid vocabulary (its own 151,936 would make the logits alone
    # 311 MB per step): what a layer of the real model costs to record.
    "qwen05": Size(
        vocab=32000,
        hidden=896,
        intermediate=4864,
        layers=4,
        heads=14,
        kv_heads=2,
        max_positions=512,
        batch=2,
        seq=256,
    ),
    "tiny": Size(
        vocab=1000,
        hidden=64,
        intermediate=128,
        layers=2,
        heads=4,
        kv_heads=2,
        max_positions=128,
        batch=2,
        seq=32,
    ),
}


def build_qwen2(size: Size, attn: str) -> torch.nn.Module:
    """A Qwen2ForCausalLM with random weights from seed 0 (nothing downloaded)."""
    config = transformers.Qwen2Config(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model: torch.nn.Module = transformers.Qwen2ForCausalLM._from_config(  # type: ignore[no-untyped-call]
        config, attn_implementation=attn, dtype=torch.float32
    )
    model.train()  # dropout is 0 in Qwen2Config, so train() changes no numerics
    return model


def summarize(values: Sequence[float]) -> tuple[float, float]:
    """(median, min) of a variant's timings."""
    return statistics.median(values), min(values)


def run_facts(load_start: float, load_end: float) -> dict[str, Any]:
    """The facts that make a figure reproducible, for the last JSON line."""
    return {
        "torch_threads": torch.get_num_threads(),
        "loadavg_start": round(load_start, 2),
        "loadavg_end": round(load_end, 2),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


@contextmanager
def stats_reads(wrap: Callable[[Read], Read]) -> Iterator[None]:
    """Within: each stats-mode ``HookRecorder`` made reads its CPU tensors' statistics through
    ``wrap(read)``, ``read`` being its own (``recording.stats_slots.StatsSlots.read``, the
    recorder's seam: a slot index, or ``Stats`` for what the kernels do not take)."""
    if not hasattr(recorder, "StatsSlots"):  # a recorder before session 17 (compared from a worktree)
        reader = recorder.stats_reader
        setattr(recorder, "stats_reader", lambda: wrap(reader()))  # noqa: B010
        try:
            yield
        finally:
            setattr(recorder, "stats_reader", reader)  # noqa: B010
        return
    original = capture_core.StatsSlots

    class Wrapped(original):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.read = wrap(self.read)

    setattr(capture_core, "StatsSlots", Wrapped)  # noqa: B010
    try:
        yield
    finally:
        setattr(capture_core, "StatsSlots", original)  # noqa: B010
