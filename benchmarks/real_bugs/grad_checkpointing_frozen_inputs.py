"""Reentrant gradient checkpointing (``use_reentrant=True``) of a model whose input embeddings
are frozen (a LoRA fine-tune) computes no gradients inside the checkpointed layers: the
recomputed segment's inputs do not require grad. With a trainable module outside the layers
(``modules_to_save=["lm_head"]``) the backward runs without error and the adapters silently
never learn (transformers issue #21381; the remedy ``enable_input_require_grads()`` was skipped
by ``gradient_checkpointing_enable`` for such models: transformers issue #42489, PR #42494).

Buggy side, a re-implementation: ``enable_input_require_grads`` is a no-op (the path without
it). User path: a PEFT LoRA fine-tune (q_proj, v_proj; lm_head trained and saved) with
``gradient_checkpointing_enable({"use_reentrant": True})`` in the user's own loop recorded with
``Recorder`` (stats). Twin: gradient checkpointing off."""

from __future__ import annotations

from pathlib import Path

from _loop import train
from _tiny import main, tiny_qwen2


def record(out: Path, side: str, trigger: bool) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import PreTrainedModel

    if side == "buggy":
        PreTrainedModel.enable_input_require_grads = lambda self: None
    base = tiny_qwen2()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])
    model = get_peft_model(base, config)
    if trigger:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        if side == "fixed":
            model.enable_input_require_grads()
    train(out, model)


if __name__ == "__main__":
    main(record)
