"""TRL's IPO loss used the summed log-probabilities of each completion, which makes its
regularisation depend on the completion's length; the IPO authors' loss averages them over
the completion's tokens (trl PR #1265, "[DPO] average_log_prob when loss is IPO"; the
discussion is trl issues #1294 and #1677).

Buggy side, a re-implementation: the user's IPO loop computes each completion's log-prob as
the sum over its tokens (``average_log_prob=False``) instead of the mean. User path: the
user's own preference-tuning loop (policy + frozen reference, ``loss = (logits - 1/(2 beta))^2``)
recorded with ``Recorder`` (stats) and its per-step scalars. Twin: completions of one token
each, where the sum is the mean."""

from __future__ import annotations

from pathlib import Path

import torch
from _loop import train
from _tiny import PAD, main, tiny_qwen2, token_rows

BETA = 0.1


def completion_logps(model: torch.nn.Module, batch: dict[str, torch.Tensor], average: bool) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    per_token = torch.gather(logits.log_softmax(-1), 2, labels.clamp(min=0).unsqueeze(2)).squeeze(2)
    summed = (per_token * mask).sum(-1)
    return summed / mask.sum(-1) if average else summed


def pairs(count: int, completion: tuple[int, int]) -> list[list[int]]:
    """Rows of prompt + chosen and prompt + rejected, alternating; the completion marked by its
    length (the prompt's labels are -100 in ``collate``)."""
    prompts = token_rows(count, 4, 6, seed=5)
    chosen = token_rows(count, *completion, seed=6)
    rejected = token_rows(count, *completion, seed=7)
    rows = []
    for p, c, r in zip(prompts, chosen, rejected, strict=True):
        rows += [[len(p), *p, *c], [len(p), *p, *r]]
    return rows


def collate(features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    rows = [f["input_ids"] for f in features]
    longest = max(len(r) - 1 for r in rows)
    ids = torch.full((len(rows), longest), PAD)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (prompt, *tokens) in enumerate(rows):
        ids[i, : len(tokens)] = torch.tensor(tokens)
        mask[i, : len(tokens)] = 1
        labels[i, prompt : len(tokens)] = ids[i, prompt : len(tokens)]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def record(out: Path, side: str, trigger: bool) -> None:
    policy = tiny_qwen2()
    reference = tiny_qwen2().eval().requires_grad_(False)
    average = side == "fixed"

    def ipo_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], tokens: int) -> torch.Tensor:
        pi = completion_logps(model, batch, average)
        with torch.no_grad():
            ref = completion_logps(reference, batch, average)
        logits = (pi[0::2] - pi[1::2]) - (ref[0::2] - ref[1::2])
        return ((logits - 1 / (2 * BETA)) ** 2).mean() / 2  # two micro-batches a step

    rows = pairs(8, (3, 6) if trigger else (1, 1))
    train(out, policy, rows=rows, collate=collate, loss=ipo_loss)


if __name__ == "__main__":
    main(record)
