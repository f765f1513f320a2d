"""Tiny Qwen2.5 and Qwen2.5-VL, built by hand the same way under transformers 4.49 and 5.x
(random weights from the case's seed; nothing downloaded), and a fake image input."""

from __future__ import annotations

import torch

VOCAB = 512
IMAGE_TOKEN = 500
VISION_START = 501
VISION_END = 502
PATCH, MERGE, TEMPORAL = 14, 2, 2

TEXT = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}
VISION = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": PATCH,
    "spatial_merge_size": MERGE,
    "temporal_patch_size": TEMPORAL,
    "window_size": 56,
    "fullatt_block_indexes": [1],
    "out_hidden_size": 64,
}


def qwen2_5() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**TEXT, bos_token_id=503, eos_token_id=504)
    config._attn_implementation = "eager"
    return Qwen2ForCausalLM(config)


def qwen2_5_vl() -> torch.nn.Module:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    rope = {"type": "mrope", "mrope_section": [2, 3, 3]}  # 2 * (2 + 3 + 3) = head_dim 16
    ids = {
        "image_token_id": IMAGE_TOKEN,
        "video_token_id": 505,
        "vision_start_token_id": VISION_START,
        "vision_end_token_id": VISION_END,
    }
    text = {**TEXT, "rope_scaling": rope, "bos_token_id": 503, "eos_token_id": 504}
    if _major() >= 5:  # a text_config of its own
        config = Qwen2_5_VLConfig(text_config=text, vision_config=VISION, **ids, tie_word_embeddings=False)
    else:  # 4.x: the text fields at the top level
        config = Qwen2_5_VLConfig(**text, vision_config=VISION, **ids)
    config._attn_implementation = "eager"
    return Qwen2_5_VLForConditionalGeneration(config)


def image_prompt(
    batch: int = 1, grid: tuple[int, int, int] = (1, 4, 4), text: int = 8
) -> dict[str, torch.Tensor]:
    """Token ids with one fake image: pixel_values (patches) and image_grid_thw."""
    t, h, w = grid
    patches = t * h * w
    pixel_values = torch.randn(batch * patches, 3 * TEMPORAL * PATCH * PATCH)
    image_tokens = patches // (MERGE * MERGE)
    rows = []
    for _ in range(batch):
        words = torch.randint(0, IMAGE_TOKEN, (text,))
        rows.append(
            torch.cat(
                [
                    words[: text // 2],
                    torch.tensor([VISION_START]),
                    torch.full((image_tokens,), IMAGE_TOKEN),
                    torch.tensor([VISION_END]),
                    words[text // 2 :],
                ]
            )
        )
    input_ids = torch.stack(rows)
    labels = input_ids.clone()
    labels[(input_ids == IMAGE_TOKEN) | (input_ids == VISION_START) | (input_ids == VISION_END)] = -100
    inputs = {
        "input_ids": input_ids,
        "pixel_values": pixel_values,
        "image_grid_thw": torch.tensor([list(grid)] * batch),
        "labels": labels,
    }
    if _major() >= 5:
        # transformers 5 computes the 3D (mrope) positions only when told which tokens are the
        # image's (its processor returns this); 4.49 found them by the image token id.
        inputs["mm_token_type_ids"] = (input_ids == IMAGE_TOKEN).int()
    return inputs


def _major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])
