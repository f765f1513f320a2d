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


def soften_first_attention(model: torch.nn.Module) -> None:
    """The first decoder layer's eager attention takes its softmax at temperature 1.02 (as an
    upgrade that changes how attention's softmax is computed would)."""
    decoder = model.get_decoder()
    attention = decoder.layers[0].self_attn
    forward = attention.forward
    softmax = torch.nn.functional.softmax

    def softened(*args: object, **kwargs: object) -> object:
        def warm(scores: torch.Tensor, *more: object, **options: object) -> torch.Tensor:
            return softmax(scores / 1.02, *more, **options)  # type: ignore[arg-type]

        torch.nn.functional.softmax = warm  # type: ignore[assignment]
        try:
            return forward(*args, **kwargs)
        finally:
            torch.nn.functional.softmax = softmax

    attention.forward = softened
