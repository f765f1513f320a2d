"""``training: lightning``: PyTorch Lightning's own loop trains a side (a ``LightningModule``
around the case's model, ``configure_optimizers`` from the case's optimizer spec,
``gradient_clip_val``, ``accumulate_grad_batches`` with the loss per token over the step),
with real Lightning on a tiny Qwen2: it aligns with itself, with the tool's loop and with a
real ``transformers.Trainer``; it trains bit for bit as the loop does on micro-batches of
uneven token counts; its plan is Lightning's own scheduler; the step replay's boundary and a
model it cannot train are handled."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")
pytest.importorskip("accelerate")

import torch  # noqa: E402

from pytest_precalign.config.loader import load_config  # noqa: E402
from pytest_precalign.errors import CaseError  # noqa: E402
from pytest_precalign.recording import HookRecorder  # noqa: E402
from pytest_precalign.run.case import run_case  # noqa: E402
from pytest_precalign.run.step_boundary import Boundary  # noqa: E402
from pytest_precalign.run.trainers import case_trainer  # noqa: E402
from pytest_precalign.run.trainers.skeleton import StepSkeleton  # noqa: E402
from pytest_precalign.sources import LoadedModel, build_model  # noqa: E402
from pytest_precalign.sources.inputs import build_inputs  # noqa: E402
from pytest_precalign.trace.step_scalars import scalars_of  # noqa: E402
from pytest_precalign.trace.training_record import read_run_record  # noqa: E402
from tests.helpers.tiny_lm import tiny_qwen2_yaml  # noqa: E402

HEAD = (
    "version: 1\ndefaults: {device: cpu, dtype: float32, seed: 0, deterministic: true}\nmodels:\n"
    + tiny_qwen2_yaml("a")
    + """\
  a16: {source: hf, class: transformers.Qwen2ForCausalLM, attn_implementation: eager, dtype: bfloat16,
        config: {vocab_size: 128, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
                 num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64}}
inputs:
  toks: {kind: tokens, batch: 4, seq_len: 8, vocab_size: 128, seed: 1, labels: true}
  # micro-batch 0 (rows 0-1) has 14 loss tokens, micro-batch 1 (rows 2-3) 4
  padded:
    kind: ids
    labels: true
    input_ids: [[5, 9, 17, 3, 44, 8, 21, 60], [7, 7, 90, 12, 1, 33, 2, 71],
                [11, 64, 3, 0, 0, 0, 0, 0], [19, 2, 100, 0, 0, 0, 0, 0]]
    attention_mask: [[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1],
                     [1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]]
tolerances:
  fp32:
    - {match: "*", atol: 1.0e-5, rtol: 1.0e-4}
cases:
"""
)
OPTIMIZER = (
    "{lr: 0.01, weight_decay: 0.1, micro_batches: 2, clip_grad: 0.05, "
    "schedule: {warmup_steps: 1, decay: cosine, min_lr: 0.001}}"
)


def _case(
    name: str, training: str, optimizer: str = OPTIMIZER, inputs: str = "toks", model: str = "a"
) -> str:
    return f"""  - name: {name}
    baseline: {model}
    candidate: {model}
    inputs: {inputs}
    phases: [forward, backward, step]
    steps: 3
    tolerances: fp32
    training: {training}
    optimizer: {optimizer}
"""


def _config(tmp_path: Path, *cases: str) -> Any:
    return load_config(HEAD + "".join(cases), tmp_path / "align.yaml")


def test_lightning_on_both_sides_passes_and_writes_its_translation(tmp_path: Path) -> None:
    config = _config(tmp_path, _case("both", "lightning"))
    run = run_case(config, config.cases[0])
    assert all(v.passed for v in run.verdicts.values()), run.verdicts
    assert run.training is not None and run.training.passed and run.training.steps_compared == 3
    training = run.candidate.manifest["training"]
    assert (training["trainer"], training["framework"]["name"]) == ("lightning", "lightning")
    trainer = training["arguments"]["Trainer"]
    assert (trainer["max_steps"], trainer["accumulate_grad_batches"]) == (3, 2)
    assert (trainer["gradient_clip_val"], trainer["gradient_clip_algorithm"]) == (0.05, "norm")
    assert training["arguments"]["lr_schedulers"][0]["class"] == "torch.optim.lr_scheduler.LambdaLR"
    plan = training["plan"]
    assert plan["loss_normalisation"] == "per_token_over_step" and plan["weight_decay"] == [0.1, 0.0]
    assert plan["lr"][0] == [0.0, 0.0] and plan["lr"][1] == [0.01, 0.01]  # warmup 1 from 0
    scalars = scalars_of(run.candidate.manifest)
    assert sorted(scalars) == [0, 1, 2] and all(s.micro_batches == 2 for s in scalars.values())
    assert all(s.clip_coef is not None and s.clip_coef < 1 for s in scalars.values())  # clipped at 0.05
    # named as the HF model names them (not as the LightningModule's "model." attribute)
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= set(run.candidate.manifest["initial_params"])
    assert not any(n.startswith("model.model.") for n in run.candidate.manifest["initial_params"])


# vs the loop by default: test_a_factory_model_trains_as_the_loop_under_the_default_table
@pytest.mark.parametrize("other", ["hf_trainer", pytest.param("loop", marks=pytest.mark.slow)])
def test_lightning_vs_another_trainer_passes_step_after_step(tmp_path: Path, other: str) -> None:
    config = _config(tmp_path, _case("pair", f"{{baseline: {other}, candidate: lightning}}"))
    run = run_case(config, config.cases[0])
    assert all(v.passed for v in run.verdicts.values()), run.verdicts
    base, cand = read_run_record(run.baseline.manifest), read_run_record(run.candidate.manifest)
    assert base.plan is not None and cand.plan is not None
    assert cand.plan.lr == base.plan.lr and cand.plan.groups == base.plan.groups
    for step, b in base.scalars.items():
        c = cand.scalars[step]
        assert (b.batch_hash, b.tokens, b.lr, b.weight_decay) == (
            c.batch_hash,
            c.tokens,
            c.lr,
            c.weight_decay,
        )
        assert math.isclose(b.loss or 0, c.loss or 1, rel_tol=1e-6)
        assert math.isclose(b.grad_norm or 0, c.grad_norm or 1, rel_tol=1e-5)
    # every layer of every micro-batch, forward and backward, and the parameters compared
    kinds = {r.kind for r in run.candidate.records}
    assert {"activation", "grad_output", "param", "param_grad", "logits", "loss"} <= kinds


FACTORY = """
version: 1
models:
  net: {source: factory, factory: "lightning_nets:build"}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 6, vocab_size: 50, seed: 3, labels: true}
cases:
  - {name: f, baseline: net, candidate: net, inputs: toks, phases: [forward, backward, step],
     training: {baseline: loop, candidate: lightning}, steps: 3,
     optimizer: {name: sgd, lr: 0.05, momentum: 0.9, clip_grad: 1.0, micro_batches: 2, schedule: {warmup_steps: 2}}}
"""


def test_a_factory_model_trains_as_the_loop_under_the_default_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No tolerances (the default table: equal): every record and every step's scalars of the
    Lightning side, the loss summed over the micro-batches included, are the loop's."""
    from tests.helpers.late_nets import LATE_NET

    (tmp_path / "lightning_nets.py").write_text(
        LATE_NET + "\n\ndef build(**kwargs):\n    return Net(**kwargs)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lightning_nets", raising=False)
    config = load_config(FACTORY, tmp_path / "align.yaml")
    run = run_case(config, config.cases[0])
    assert run.training is not None and run.training.passed and run.training.first is None
    assert all(v.passed for v in run.verdicts.values()), run.verdicts
    assert scalars_of(run.baseline.manifest) == scalars_of(run.candidate.manifest)


def _trained(
    tmp_path: Path, trainer: str, boundary: Boundary | None = None
) -> tuple[LoadedModel, dict[str, Any]]:
    config = _config(tmp_path, _case("uneven", trainer, inputs="padded"))
    case = config.cases[0]
    data = build_inputs(config.inputs["padded"], tmp_path, case.steps)
    model = build_model(config.models["a"], tmp_path)
    recorder = HookRecorder(model.module, mode="stats")
    with recorder:
        extra = case_trainer(trainer).train(model, data, case, StepSkeleton(recorder, 0, boundary))
    return model, extra.manifest_keys()


def test_uneven_micro_batches_train_bit_for_bit_as_the_loop(tmp_path: Path) -> None:
    """Micro-batches of 14 and 4 loss tokens: Lightning divides each micro-batch's loss by
    accumulate_grad_batches; the module compensates, so every update is the loop's (a mean of
    micro-batch means would weigh the 4 tokens as much as the 14)."""
    loop, loop_extra = _trained(tmp_path, "loop")
    lightning, extra = _trained(tmp_path, "lightning")
    for (name, a), (_, b) in zip(
        loop.module.named_parameters(), lightning.module.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    ours, theirs = scalars_of(extra), scalars_of(loop_extra)
    assert [s.tokens for s in ours.values()] == [22, 22, 22]  # labels not -100
    assert [s.grad_norm for s in ours.values()] == [s.grad_norm for s in theirs.values()]
    assert [s.update_norm for s in ours.values()] == [s.update_norm for s in theirs.values()]


def test_a_mean_of_micro_batch_means_is_what_its_plan_says_and_trains_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plain user's Lightning the example suite plants (each micro-batch's mean loss,
    Lightning's mean of them): its plan says so, and on micro-batches of 14 and 4 tokens its
    step-0 grads are not the loop's -- the contract names a real difference, not a label."""
    from pytest_precalign.run.trainers.lightning import MEAN_OF_MEANS, CaseModule

    loop, loop_extra = _trained(tmp_path, "loop")
    monkeypatch.setattr(CaseModule, "loss_normalisation", MEAN_OF_MEANS)
    _, extra = _trained(tmp_path, "lightning")
    plan = read_run_record(extra).plan
    assert plan is not None and plan.loss_normalisation == MEAN_OF_MEANS
    ours, theirs = scalars_of(extra)[0], scalars_of(loop_extra)[0]
    assert ours.grad_norm is not None and theirs.grad_norm is not None
    assert abs(ours.grad_norm - theirs.grad_norm) > 1e-3 * theirs.grad_norm


def test_the_step_replay_boundary_runs_through_lightnings_loop(tmp_path: Path) -> None:
    """Boundary at step 1: step 0 runs unrecorded, ``at`` gets the module and Lightning's
    torch optimizer where step 1 starts, step 1 is recorded and the fit stops after it."""
    seen: list[tuple[torch.nn.Module, Any]] = []
    model, extra = _trained(tmp_path, "lightning", Boundary(1, lambda m, o: seen.append((m, o))))
    assert len(seen) == 1 and seen[0][0] is model.module
    assert isinstance(seen[0][1], torch.optim.AdamW)
    assert sorted(scalars_of(extra)) == [0, 1]


def test_a_bf16_model_is_refused_in_one_message(tmp_path: Path) -> None:
    config = _config(tmp_path, _case("bf16", "lightning", model="a16"))
    with pytest.raises(CaseError, match="training: lightning trains a float32 model on CPU"):
        run_case(config, config.cases[0])


@pytest.mark.slow  # a Lightning run and its replay; the boundary test above covers the mechanism
def test_a_lightning_side_is_replayed_through_lightnings_own_loop(tmp_path: Path) -> None:
    """A layer bug from step 2 in the Lightning candidate: its fit reruns steps 0-1 unrecorded,
    the loop baseline's state (parameters, AdamW state, RNG) is loaded into Lightning's own
    optimizer where step 2 begins, and the replay names the layer."""
    from tests.run.test_step_replay import LATE_MLP, TRAINER_CONFIG, assert_replay_names_late_mlp

    (tmp_path / "late_mlp.py").write_text(LATE_MLP)
    text = TRAINER_CONFIG.replace("candidate: hf_trainer}", "candidate: lightning}")
    config = load_config(text, tmp_path / "align.yaml")
    assert_replay_names_late_mlp(run_case(config, config.cases[0]))
