"""The Trainer excluded from weight decay the biases and the parameters of ``nn.LayerNorm``
modules only: every RMSNorm weight of a Llama/Qwen2 model was decayed (transformers PR
#35927, "Exclude RMSNorm weights from weight decay": the filter also skips parameter names
holding ``layernorm`` / ``rmsnorm``; released in 4.49.0).

Buggy and fixed releases from the registry: transformers 4.48.3 (buggy) and 4.49.0 (fixed),
each in its own venv, the same script. User path: a Trainer fine-tune recorded with
``PrecalignCallback`` (scalars). Twin: ``weight_decay=0``, where nothing is decayed under
either release."""

from __future__ import annotations

from pathlib import Path

from _tiny import main, tiny_qwen2
from _trainer import finetune


def record(out: Path, side: str, trigger: bool) -> None:
    finetune(out, tiny_qwen2(), weight_decay=0.1 if trigger else 0.0)


if __name__ == "__main__":
    main(record)
