"""A fault to inject into the candidate (config ``patch: "faults:scale_first_mlp"``)."""

from __future__ import annotations

import torch


def scale_first_mlp(model: torch.nn.Module) -> None:
    """Scale the output of the first decoder layer's MLP by 1.01 (a silent numerics change)."""
    decoder = model.get_decoder()
    mlp = decoder.layers[0].mlp
    forward = mlp.forward

    def scaled(*args: object, **kwargs: object) -> torch.Tensor:
        return forward(*args, **kwargs) * 1.01

    mlp.forward = scaled
