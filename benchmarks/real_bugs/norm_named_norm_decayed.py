"""The Trainer's weight-decay filter excluded parameters whose names held ``bias``,
``layernorm`` or ``rmsnorm``, and norm layers by class; a final norm named just ``norm``
(``model.norm.weight``) of a model whose RMSNorm class is not in the list was still decayed
(transformers PR #38922: the forbidden patterns gained ``(?:^|\\.)norm(?:$|\\.)`` and
``_norm(?:$|\\.)``).

Buggy side, a re-implementation quoting the fix's diff: the Trainer's
``get_decay_parameter_names`` with the patterns before it (``bias``, ``layernorm``,
``rmsnorm``). User path: a Trainer fine-tune recorded with ``PrecalignCallback`` (scalars).
Twin: ``weight_decay=0`` (nothing is decayed either way)."""

from __future__ import annotations

from pathlib import Path

from _tiny import main, tiny_qwen2
from _trainer import finetune


def buggy_trainer() -> type:
    from torch import nn
    from transformers import Trainer
    from transformers.trainer_pt_utils import get_parameter_names

    class BeforeTheFix(Trainer):
        def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
            return get_parameter_names(model, [nn.LayerNorm], [r"bias", r"layernorm", r"rmsnorm"])

    return BeforeTheFix


def record(out: Path, side: str, trigger: bool) -> None:
    cls = buggy_trainer() if side == "buggy" else None
    finetune(out, tiny_qwen2(), weight_decay=0.1 if trigger else 0.0, trainer_cls=cls)


if __name__ == "__main__":
    main(record)
