"""One story per case, and origins only with evidence, on real tiny models (fixed seeds):
a forward fault makes the later phases downstream of it, a backward-only fault is its own
origin, a fault in a parent's own code between its children is headed by the parent, and a
one-sided reentrant checkpoint never has an origin claimed on inputs that were not compared."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from pytest_precalign.reports.text import PhaseReport, failure_message
from pytest_precalign.reports.training_evidence_text import case_origin_text
from pytest_precalign.run.case import check_modules
from pytest_precalign.run.outcome import CaseRun
from pytest_precalign.vocabulary import Phase
from tests.helpers.nets import MLP_NETS

PHASES: tuple[Phase, ...] = ("forward", "backward", "step")


def _message(run: CaseRun, phase: str) -> str:
    report = PhaseReport.of_run(run, phase, defined_in="t.yaml", baseline="a", candidate="b", reproduce="-")
    return failure_message(report)


def _mlp(**kwargs: Any) -> torch.nn.Module:
    namespace: dict[str, Any] = {}
    exec(MLP_NETS, namespace)  # the end-to-end tests' nets.py, built in-process
    torch.manual_seed(0)
    model: torch.nn.Module = namespace["build"](**kwargs)
    return model


def _tokens(vocab: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, vocab, (2, 6), generator=torch.Generator().manual_seed(3))}


def test_a_forward_fault_is_the_case_origin_and_later_phases_are_downstream() -> None:
    run = check_modules(_mlp(), _mlp(bug="between", bug_block=1), _tokens(50), phases=PHASES)
    origin = run.verdicts["forward"].case_origin
    assert origin is not None
    assert (origin.module, origin.phase, origin.record, origin.proven) == (
        "blocks.1",
        "forward",
        "blocks.1.up",
        True,
    )
    assert (
        case_origin_text(origin)
        == "its inputs and children norm matched, up's input did not: the divergence enters in its own code"
    )
    for phase in ("backward", "step"):
        verdict = run.verdicts[phase]
        assert not verdict.passed and verdict.downstream and verdict.case_origin == origin
        assert verdict.first is not None and not verdict.first.origin
        text = _message(run, phase)
        assert text.splitlines()[0].startswith("Downstream of blocks.1 (forward, step 0)")
        assert "First divergence" not in text and "enters in" not in text
    head = _message(run, "forward").splitlines()
    assert head[0] == f"Origin: blocks.1 (forward, step 0) \u2014 {case_origin_text(origin)}"
    first = next(line for line in head if line.startswith("First divergence"))
    assert first.startswith("First divergence: blocks.1.up (activation, out, step 0), propagated")


class ScaleGrad(torch.autograd.Function):
    """Identity forward, a wrong backward (the gradient scaled by 1.5)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 1.5


class WrongBackward(torch.nn.Module):
    def __init__(self, wrong: bool) -> None:
        super().__init__()
        self.wrong = wrong

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = ScaleGrad.apply(x) if self.wrong else x.clone()
        return out


def test_a_backward_only_fault_has_its_own_origin() -> None:
    def model(wrong: bool) -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(4, 8), WrongBackward(wrong), torch.nn.Tanh(), torch.nn.Linear(8, 3)
        )

    x = {"input": torch.randn(2, 4, generator=torch.Generator().manual_seed(1))}
    run = check_modules(model(False), model(True), x, phases=PHASES)
    assert run.verdicts["forward"].passed
    origin = run.verdicts["backward"].case_origin
    assert origin is not None
    assert (origin.module, origin.phase, origin.kind, origin.proven) == ("1", "backward", "grad_input", True)
    assert not run.verdicts["backward"].downstream
    assert _message(run, "backward").startswith("Origin: 1 (backward, step 0) \u2014 its inputs matched")


class Attention(torch.nn.Module):
    """A hand-written attention: its softmax scale is its own code, between its children."""

    def __init__(self, width: int, scale: float) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (torch.nn.Linear(width, width) for _ in range(4))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        weights = torch.softmax(q @ k.transpose(-1, -2) * self.scale, dim=-1)
        return self.o_proj(weights @ v)


class Tiny(torch.nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(20, 8)
        self.self_attn = Attention(8, scale)
        self.head = torch.nn.Linear(8, 20)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        return self.head(x + self.self_attn(x))


def test_a_fault_in_a_parents_own_code_is_headed_by_the_parent() -> None:
    right = 1 / math.sqrt(8)
    run = check_modules(Tiny(right), Tiny(right * 2), _tokens(20), phases=("forward", "backward"))
    origin = run.verdicts["forward"].case_origin
    assert origin is not None and (origin.module, origin.record) == ("self_attn", "self_attn.o_proj")
    assert case_origin_text(origin).startswith(
        "its inputs and children q_proj, k_proj, v_proj matched, o_proj's input did not"
    )
    assert _message(run, "forward").splitlines()[0].startswith("Origin: self_attn (forward, step 0)")
    assert run.verdicts["backward"].downstream


class UpProj(torch.nn.Linear):
    def __init__(self, width: int, wrong: bool) -> None:
        super().__init__(width, 2 * width)
        self.wrong = wrong

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = super().forward(x)
        return ScaleGrad.apply(out) if self.wrong else out


class Layer(torch.nn.Module):
    def __init__(self, width: int, wrong: bool, recompute: bool) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up_proj, self.down_proj = UpProj(width, wrong), torch.nn.Linear(2 * width, width)
        self.recompute = recompute

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.nn.functional.gelu(self.up_proj(self.norm(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute:
            out: torch.Tensor = checkpoint(self.mlp, x, use_reentrant=True)
            return x + out
        return x + self.mlp(x)


class Stack(torch.nn.Module):
    def __init__(self, wrong: bool = False, recompute: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(20, 8)
        self.layers = torch.nn.ModuleList(Layer(8, wrong and i == 1, recompute) for i in range(2))
        self.head = torch.nn.Linear(8, 20)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_one_sided_reentrant_checkpoint_claims_no_origin_on_unmatched_inputs() -> None:
    run = check_modules(Stack(), Stack(wrong=True, recompute=True), _tokens(20), phases=PHASES)
    assert run.verdicts["forward"].passed
    every = {p.record.id: p for p in run.comparison.pairs if p.status != "only_candidate"}
    for phase in PHASES:
        first = run.verdicts[phase].first
        if first is None or not first.origin:
            continue
        deps = [every.get(d) for d in first.pair.record.deps]
        # "its inputs matched" is said only about a record whose inputs were all compared.
        assert all(p is not None and p.paired and p.passed for p in deps), (phase, first.name)
    origin = run.verdicts["backward"].case_origin
    assert origin is not None and origin.phase == "backward" and origin.module.startswith("layers.1.up_proj")
    assert run.verdicts["step"].downstream
