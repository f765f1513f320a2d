"""PEFT's ``LoraLayer.set_scale(adapter, scale)`` reset the scaling to ``scale * lora_alpha / r``
even for an rsLoRA adapter, whose scaling is ``lora_alpha / sqrt(r)`` (peft issue #2733; fixed
by PR #2775, commit 20a9829, which branches on ``self.use_rslora[adapter]``).

Both sides are releases from the registry, each in its own venv: peft 0.17.1 (the last release
without the fix: the bug is its own ``set_scale``) and peft 0.18.0 (the first with it), the
same transformers (4.57.6) under both. User path: a LoRA fine-tune (``use_rslora=True``, r=4,
alpha 8, on q_proj and v_proj, adapter weights loaded non-zero as a trained adapter has them)
in the user's own loop recorded with ``Recorder`` (stats), the adapters' scale reset with
``set_scale(name, 1.0)`` before training (as adapter-weighting utilities do). Twin: plain LoRA
(``use_rslora=False``), where both releases' formulas agree."""

from __future__ import annotations

import math
from pathlib import Path

from _loop import train
from _tiny import main, tiny_qwen2


def record(out: Path, side: str, trigger: bool) -> None:
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.layer import LoraLayer

    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_rslora=trigger, init_lora_weights=False
    )
    model = get_peft_model(tiny_qwen2(), config)
    for module in model.modules():
        if isinstance(module, LoraLayer):
            module.set_scale("default", 1.0)
    assert math.isfinite(sum(float(p.sum()) for p in model.parameters()))
    train(out, model)


if __name__ == "__main__":
    main(record)
