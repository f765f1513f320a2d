"""The Trainer's weight-decay filter excluded parameters whose names held ``bias``,
``layernorm`` or ``rmsnorm``, and norm layers by class; a final norm named just ``norm``
(``model.norm.weight``) of a model whose RMSNorm class is not in the list was still decayed
(transformers PR #38922: the forbidden patterns gained ``(?:^|\\.)norm(?:$|\\.)`` and
``_norm(?:$|\\.)``).

Buggy and fixed releases from the registry: transformers 4.52.4 (``get_parameter_names(model,
ALL_LAYERNORM_LAYERS, ["bias", "layernorm", "rmsnorm"])``) and 4.53.0 (the first with the new
patterns), each in its own venv, the same script. User path: a Trainer fine-tune of a tiny
Qwen2 recorded with ``PrecalignCallback`` (scalars). Twin: the same upgrade with
``weight_decay=0`` (nothing is decayed under either release)."""

from __future__ import annotations

from pathlib import Path

from _tiny import main, tiny_qwen2
from _trainer import finetune


def record(out: Path, side: str, trigger: bool) -> None:
    finetune(out, tiny_qwen2(), weight_decay=0.1 if trigger else 0.0)


if __name__ == "__main__":
    main(record)
