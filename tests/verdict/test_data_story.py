"""Data is data (issue #32, item 5): two recorded training runs whose batches differ from step 2
(the candidate's rows swapped) are judged ``data`` at step 2, and the case's story names no
module whose inputs matched there: the embedding that read the other ids is the first divergent
paired module, unproven, not "its inputs matched, its output did not"."""

from __future__ import annotations

import time

import torch

from pytest_precalign.compare.tolerances import default_table
from pytest_precalign.recording import HookRecorder
from pytest_precalign.reports.outcome import phase_outcome
from pytest_precalign.reports.text import PhaseReport
from pytest_precalign.reports.training_evidence_text import case_origin_text
from pytest_precalign.run.outcome import CaseRun, FinishInputs, finish
from pytest_precalign.steps.step_evidence import StepEvidence, batch_hash, group_settings, token_count
from pytest_precalign.trace.records import Trace
from pytest_precalign.trace.step_scalars import StepScalars
from pytest_precalign.trace.training_record import RunRecord
from pytest_precalign.verdict.origin_facts import OtherData

STEPS, VOCAB = 4, 32
PHASES = ("forward", "backward", "step")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, 8)
        self.up = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.up(self.embed(input_ids))))  # type: ignore[no-any-return]


def batches(swap_from: int | None = None) -> list[torch.Tensor]:
    out = [torch.randint(0, VOCAB, (4, 6), generator=torch.Generator().manual_seed(s)) for s in range(STEPS)]
    if swap_from is not None:  # the candidate's data loader: rows of step k and k+1 exchanged
        out[swap_from], out[swap_from + 1] = out[swap_from + 1], out[swap_from]
    return out


def recorded(name: str, data: list[torch.Tensor], fault_from: int | None = None) -> Trace:
    """A training loop recorded at every step: layers, grads, parameters and the step's scalars
    (``fault_from``: ``up``'s output scaled by 1.1 from that step on, a layer bug)."""
    model = Net()
    at = [0]
    if fault_from is not None:
        model.up.register_forward_hook(lambda m, a, out: out * 1.1 if at[0] >= fault_from else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    evidence = StepEvidence(model.parameters())
    scalars: dict[int, StepScalars] = {}
    with HookRecorder(model, mode="stats", param_grads="step") as recorder:
        for step, ids in enumerate(data):
            recorder.step = at[0] = step
            evidence.begin()
            logits = model(ids)
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1)
            )
            recorder.record_output("loss", loss)
            loss.backward()
            recorder.record_param_grads()
            evidence.grads_before_clip()
            lr, wd = group_settings(optimizer)
            optimizer.step()
            optimizer.zero_grad()
            recorder.record_params()
            batch = [{"input_ids": ids, "labels": ids}]
            scalars[step] = evidence.finish(
                step, loss=float(loss.detach()), lr=lr, weight_decay=wd, tokens=token_count(batch),
                batch_hash=batch_hash(batch), micro_batches=1, skipped=False,
            )  # fmt: skip
        return recorder.trace({"side": name}).with_run(RunRecord(scalars=scalars))


def judged(candidate: list[torch.Tensor], fault_from: int | None = None) -> CaseRun:
    inputs = FinishInputs(
        name="swapped", phases=PHASES, baseline=recorded("baseline", batches()),
        candidate=recorded("candidate", candidate, fault_from), table=default_table(), started=time.perf_counter(),
    )  # fmt: skip
    return finish(inputs)


def test_a_step_whose_batch_differs_is_data_and_no_module_is_said_to_have_matching_inputs() -> None:
    run = judged(batches(swap_from=2))
    training = run.training
    assert training is not None and training.first is not None
    assert (training.first.step, training.first.what, training.first.origin) == (2, "data", "batch")
    forward = run.verdicts["forward"]
    assert forward.first is not None and forward.first.step == 2 and not forward.first.origin
    origin = forward.case_origin
    assert origin is not None and not origin.proven and origin.step == 2
    told = case_origin_text(origin)
    assert isinstance(origin.evidence, OtherData) and (origin.evidence.step, origin.evidence.downstream) == (
        2,
        False,
    )
    assert "inputs matched" not in told and "the batch of step 2 differs" in told
    assert origin.role == "first_paired"
    report = PhaseReport.of_run(run, "forward", defined_in="d", baseline="a", candidate="b", reproduce="r")
    message = phase_outcome(report).message
    assert "its inputs matched" not in message, message
    assert "Step 2 diverged first: data" in message, message
    for phase in ("backward", "step"):
        first = run.verdicts[phase].first
        assert first is not None and not first.origin  # downstream, or unproven: never an origin


def test_the_same_data_still_names_a_module_origin() -> None:
    """The rule is about differing data only: with the same batches, a layer fault at step 2
    keeps its proven origin (the story above is not an origin switched off)."""
    run = judged(batches(), fault_from=2)
    training = run.training
    assert training is not None and training.first is not None
    assert (training.first.step, training.first.what, training.first.origin) == (2, "forward", "up")
    origin = run.verdicts["forward"].case_origin
    assert origin is not None and origin.proven and (origin.module, origin.step) == ("up", 2)
    assert case_origin_text(origin) == "its inputs matched, its output did not"
