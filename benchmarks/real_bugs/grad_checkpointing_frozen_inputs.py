"""Reentrant gradient checkpointing (``use_reentrant=True``) of a model whose input embeddings
are frozen (a LoRA fine-tune) computes no gradients inside the checkpointed layers: the
recomputed segment's inputs do not require grad. With a trainable module outside the layers
(``modules_to_save=["lm_head"]``) the backward runs without error and the adapters silently
never learn (transformers issue #21381). ``gradient_checkpointing_enable`` called the remedy,
``enable_input_require_grads()``, only for an adapter loaded through transformers' own PEFT
integration (``_hf_peft_config_loaded``), not for a ``peft.get_peft_model`` model (issue
#42489, PR #42494); transformers 5.0.0 calls it for every model whose main input is
``input_ids`` (``needs_embedding_grads`` in ``_gradient_checkpointing_enable``).

Both sides are releases from the registry, each in its own venv, the same peft (0.18.1) under
both: transformers 4.57.6 (the last 4.x release: the bug is its own
``gradient_checkpointing_enable``) and 5.0.0 (the first release that enables the input grads).
User path: a PEFT LoRA fine-tune (q_proj, v_proj; lm_head trained and saved) with
``gradient_checkpointing_enable({"use_reentrant": True})`` in the user's own loop recorded with
``Recorder`` (stats). Twin: gradient checkpointing off (the same two releases)."""

from __future__ import annotations

from pathlib import Path

from _loop import train
from _tiny import main, tiny_qwen2


def record(out: Path, side: str, trigger: bool) -> None:
    from peft import LoraConfig, get_peft_model

    base = tiny_qwen2()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])
    model = get_peft_model(base, config)
    if trigger:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    train(out, model)


if __name__ == "__main__":
    main(record)
