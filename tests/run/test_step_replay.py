"""Drill-down by replay (run/step_replay.py): a failing training run's first divergent step k
is replayed on both sides from the baseline's state after step k-1 (parameters, optimizer
state, RNG) with every layer recorded in tensor mode, and the origin is named. Tiny factory
models (tests/run/test_training_expect.py's), a few seconds each."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from pytest_precalign.config.loader import load_config
from pytest_precalign.config.specs import AlignConfig, Dumps
from pytest_precalign.errors import ConfigError
from pytest_precalign.reports.document import report_document
from pytest_precalign.reports.outcome import phase_outcome
from pytest_precalign.reports.replay_text import replay_text
from pytest_precalign.reports.text import PhaseReport
from pytest_precalign.reports.training_json import training_dict
from pytest_precalign.run.case import check_modules, run_case
from pytest_precalign.run.outcome import CaseRun
from pytest_precalign.run.step_replay import StateCarrier, not_replayable, replay_step
from tests.helpers.late_nets import LATE_NET

NETS = (
    LATE_NET
    + """


class Transposed(torch.nn.Module):
    # Linear with its weight stored as [in, out] (the mapping transposes it)
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, n))
        self.bias = torch.nn.Parameter(torch.zeros(n))

    def forward(self, x):
        return x @ self.weight + self.bias


class Renamed(torch.nn.Module):
    # Net with 'up' called 'proj' and stored transposed
    def __init__(self, start=10**6):
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Embedding(50, 16)
        self.proj = Transposed(16)
        self.late = Late(start)
        self.head = torch.nn.Linear(16, 50)

    def forward(self, input_ids):
        return self.head(self.late(torch.tanh(self.proj(self.embed(input_ids)))))


def build(**kwargs):
    return Net(**kwargs)


def renamed(**kwargs):
    return Renamed(**kwargs)


def eps_from(step):
    # Net whose AdamW takes eps 1e-3 from its update `step` on (its optimizer's own settings
    # still read 1e-8 when built)
    model = Net()
    owned = {id(p) for p in model.parameters()}
    original = torch.optim.AdamW.__init__

    def init(self, params, *args, **kwargs):
        params = list(params)
        original(self, params, *args, **kwargs)
        mine = any(id(p) in owned for g in self.param_groups for p in g["params"])
        if mine:
            inner, calls = self.step, [0]

            def late_step(*a, **k):
                calls[0] += 1
                if calls[0] > step:
                    for group in self.param_groups:
                        group["eps"] = 1e-3
                return inner(*a, **k)

            self.step = late_step

    torch.optim.AdamW.__init__ = init
    return model


def lr_behind():
    # Net whose LambdaLR falls one update behind once its optimizer has stepped (update s uses
    # the LR of update s - 1): the plan made before training (a scheduler over an optimizer
    # that never steps) cannot see it, the run does
    model = Net()
    owned = {id(p) for p in model.parameters()}
    original = torch.optim.lr_scheduler.LambdaLR.__init__

    def init(self, optimizer, lr_lambda, *args, **kwargs):
        if any(id(p) in owned for g in optimizer.param_groups for p in g["params"]):
            inner = lr_lambda
            lr_lambda = lambda s: inner(max(s - 1, 0) if optimizer.state else s)
        original(self, optimizer, lr_lambda, *args, **kwargs)

    torch.optim.lr_scheduler.LambdaLR.__init__ = init
    return model
"""
)

CONFIG = """
version: 1
models:
  ref: {source: factory, factory: "nets:build"}
  late5: {source: factory, factory: "nets:build", kwargs: {start: 5}}
  late3_renamed: {source: factory, factory: "nets:renamed", kwargs: {start: 3}}
  eps3: {source: factory, factory: "nets:eps_from", kwargs: {step: 3}}
  eps0: {source: factory, factory: "nets:eps_from", kwargs: {step: 0}}
  other_init: {source: factory, factory: "nets:renamed"}
  behind: {source: factory, factory: "nets:lr_behind"}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 6, vocab_size: 50, seed: 3, labels: true}
mappings:
  transposed:
    renames: [{baseline: up, candidate: proj}]
    tensors:
      - {baseline: up.weight, candidate: proj.weight, transform: {op: transpose, dim0: 0, dim1: 1}}
cases:
  - {name: layer_bug, baseline: ref, candidate: late5, inputs: toks, phases: [forward, backward, step],
     steps: 7, optimizer: {name: adamw, lr: 1.0e-2, clip_grad: 1.0, schedule: {warmup_steps: 2}}}
  - {name: layer_bug_no_replay, baseline: ref, candidate: late5, inputs: toks,
     phases: [forward, backward, step], steps: 7, optimizer: {name: adamw, lr: 1.0e-2}, replay: false}
  - {name: mapped, baseline: ref, candidate: late3_renamed, mapping: transposed, inputs: toks,
     phases: [forward, backward, step], steps: 6, optimizer: {name: adamw, lr: 1.0e-2}}
  - {name: eps, baseline: ref, candidate: eps3, inputs: toks, phases: [forward, backward, step],
     steps: 5, optimizer: {name: adamw, lr: 1.0e-2}}
  - {name: eps_at_0, baseline: ref, candidate: eps0, inputs: toks, phases: [forward, backward, step],
     steps: 2, optimizer: {name: adamw, lr: 1.0e-2}}
  - {name: schedule, baseline: ref, candidate: behind, inputs: toks, phases: [forward, backward, step],
     steps: 4, optimizer: {name: adamw, lr: 1.0e-2, schedule: {warmup_steps: 3}}}
  - {name: init, baseline: ref, candidate: other_init, inputs: toks, phases: [forward, backward, step],
     steps: 3, weights: {sync: false}, optimizer: {name: adamw, lr: 1.0e-2}}
"""


@pytest.fixture
def config(tmp_path: Path) -> Iterator[AlignConfig]:
    (tmp_path / "nets.py").write_text(NETS)
    sys.path.insert(0, str(tmp_path))
    saved = torch.optim.AdamW.__init__, torch.optim.lr_scheduler.LambdaLR.__init__
    try:
        yield load_config(CONFIG, tmp_path / "align.yaml")
    finally:
        torch.optim.AdamW.__init__, torch.optim.lr_scheduler.LambdaLR.__init__ = saved  # type: ignore[method-assign]
        sys.path.remove(str(tmp_path))
        sys.modules.pop("nets", None)


def message(run: CaseRun, phase: str) -> tuple[str, dict[str, object]]:
    report = PhaseReport.of_run(
        run, phase, defined_in="align.yaml", baseline="b", candidate="c", reproduce="r"
    )
    outcome = phase_outcome(report)
    assert outcome.entry is not None
    return outcome.message, report_document([outcome.entry], {})["training"]


def test_a_layer_bug_from_step_5_is_replayed_from_step_4s_state_to_its_layer(config: AlignConfig) -> None:
    run = run_case(config, config.case("layer_bug"))
    text, training = message(run, "forward")
    first = text.splitlines()[0]
    assert first.startswith("Step 5 diverged first (loss ")
    assert first.endswith(
        "; replayed from the baseline's state after step 4: origin late (forward) — "
        "its inputs matched, its output did not (activation of late)"
    ), first
    assert training["replay"] == {
        "step": 5,
        "from_step": 4,
        "origin": "late",
        "phase": "forward",
        "evidence": "its inputs matched, its output did not (activation of late)",
        "story": first,
    }


def test_replay_false_leaves_the_run_verdict_alone(config: AlignConfig) -> None:
    run = run_case(config, config.case("layer_bug_no_replay"))
    assert run.training is not None and run.training.first is not None
    assert (run.training.first.step, run.training.replay, replay_text(run.training)) == (5, None, "")
    assert "replayed" not in message(run, "forward")[0]


def test_a_bad_replay_value_is_one_message_naming_the_key(tmp_path: Path) -> None:
    bad = CONFIG.replace("replay: false", "replay: sometimes")
    with pytest.raises(ConfigError, match=r"replay.*expected"):
        load_config(bad, tmp_path / "align.yaml")


def test_the_replay_starts_both_sides_from_the_baselines_state_through_the_mapping(
    config: AlignConfig,
) -> None:
    # The candidate's bug starts at step 3: after step 4 its own parameters differ from the
    # baseline's; the replay of step 5 loads the baseline's into it (proj.weight transposed).
    case = config.case("mapped")
    carrier = StateCarrier(case, lambda: "", keep=True)
    finding = replay_step(config, case, 5, carrier)
    base, kept = carrier.params, carrier.kept
    assert torch.equal(kept["param:proj.weight"], base["up.weight"].T)
    for name in ("embed.weight", "head.weight", "head.bias"):
        assert torch.equal(kept[f"param:{name}"], base[name]), name
    assert torch.equal(kept["param:proj.bias"], base["up.bias"])
    # The optimizer state too, each tensor through the same transform; the step counter alike.
    assert torch.equal(kept["exp_avg:proj.weight"], carrier.state["exp_avg"]["up.weight"].T)
    assert torch.equal(kept["exp_avg_sq:head.weight"], carrier.state["exp_avg_sq"]["head.weight"])
    assert float(kept["step:head.weight"]) == 5.0
    # On equal state step 5 shows the bug itself (the candidate's own counter is past 3).
    assert (finding.step, finding.origin, finding.what) == (5, "late", "forward")
    # Without the load the candidate's state after step 4 is its own: the run diverged before
    # step 5 (by step 3, where its bug starts; the transposed matmul rounds another way).
    run = run_case(config, case)
    assert run.training is not None and run.training.first is not None
    assert run.training.first.step <= 3


def test_an_optimizer_eps_planted_from_step_3_is_named_optimizer_update(config: AlignConfig) -> None:
    run = run_case(config, config.case("eps"))
    assert run.training is not None and run.training.first is not None
    assert run.training.first.step == 3
    found = training_dict(run.training)["replay"]
    assert (found["step"], found["phase"]) == (3, "optimizer_update"), found
    assert "its grad matched, the optimizer update made it differ" in str(found["evidence"])


def test_a_divergence_at_step_0_is_replayed_from_the_synced_weights_in_tensor_mode(
    config: AlignConfig,
) -> None:
    run = run_case(config, config.case("eps_at_0"))
    assert run.training is not None and run.training.first is not None
    assert run.training.first.step == 0
    found = training_dict(run.training)["replay"]
    assert (found["step"], found["from_step"], found["phase"]) == (0, None, "optimizer_update")
    assert "; replayed from the synced initial state in tensor mode: origin " in replay_text(run.training)


def test_the_replay_leaves_the_run_and_the_process_as_the_run_left_them(config: AlignConfig) -> None:
    # The same failing case with and without the replay: the same verdict, bitwise the same
    # curves and traces' scalars, the same torch RNG state and determinism flags afterwards.
    flags = torch.are_deterministic_algorithms_enabled()
    off = run_case(config, config.case("layer_bug_no_replay"))
    rng_off = torch.get_rng_state()
    on = run_case(
        config,
        replace(
            no_replay := config.case("layer_bug_no_replay"), training=replace(no_replay.training, replay=True)
        ),
    )
    rng_on = torch.get_rng_state()
    assert on.training is not None and off.training is not None and on.training.replay is not None
    assert on.training.first == off.training.first and on.training.curves == off.training.curves
    assert on.baseline.manifest["scalars"] == off.baseline.manifest["scalars"]
    assert on.candidate.manifest["scalars"] == off.candidate.manifest["scalars"]
    assert torch.equal(rng_on, rng_off)
    assert torch.are_deterministic_algorithms_enabled() == flags


def test_a_scheduler_one_update_behind_is_named_schedule_on_equal_state(config: AlignConfig) -> None:
    run = run_case(config, config.case("schedule"))
    assert run.training is not None and run.training.first is not None
    assert (run.training.first.step, run.training.first.what) == (1, "schedule")
    found = training_dict(run.training)["replay"]
    assert (found["step"], found["from_step"], found["phase"], found["origin"]) == (1, 0, "schedule", "lr[0]")


def test_a_side_that_cannot_be_replayed_says_why_and_what_to_record(config: AlignConfig) -> None:
    run = run_case(config, config.case("init"))
    assert run.training is not None and run.training.first is not None
    assert run.training.first.what == "weights"
    assert replay_text(run.training).startswith(
        "not replayed: the initial weights differ, and a replay from equal state would hide that; "
        "to go further record step 0 in tensor mode"
    )
    assert "not replayed: the initial weights differ" in message(run, "forward")[0]
    layer = run_case(config, config.case("layer_bug_no_replay")).training
    assert layer is not None
    stored = replace(config.case("layer_bug"), sides=Dumps(Path("a"), Path("b")))
    assert (
        not_replayable(config, stored, layer)
        == "the sides are stored runs, not models this process can train"
    )


def test_modules_a_test_built_are_not_replayed_and_say_why() -> None:
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    cand = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    cand.load_state_dict(base.state_dict())
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cand[2].bias.add_(1e-3)  # differs from step 0 on: no rebuild can give it back
    run = check_modules(base, cand, {"input": x}, phases=("forward", "backward", "step"), steps=3, train=True)
    assert run.training is not None and run.training.first is not None
    assert replay_text(run.training).startswith(
        "not replayed: the modules were built by the test, and the tool cannot rebuild them as "
        "they were at step 0; to go further record step 0 in tensor mode"
    )


@pytest.mark.slow  # two 10-step Qwen runs and a 6-step replay of each side (~20 s of CPU)
def test_the_suites_layer_bug_from_step_5_is_replayed_to_model_layers_1_mlp() -> None:
    suite = Path(__file__).resolve().parents[2] / "example_suites" / "training"
    config = load_config((suite / "align.yaml").read_text(), suite / "align.yaml")
    case = replace(config.case("layer_bug_from_step_5"), expect=None)  # its expectation met: no failure
    run = run_case(config, case)
    text, training = message(run, "forward")
    story = text.splitlines()[0]
    assert story.startswith("Step 5 diverged first (loss "), story
    assert story.endswith(
        "; replayed from the baseline's state after step 4: origin model.layers.1.mlp (forward) — "
        "its inputs matched, its output did not (activation of model.layers.1.mlp)"
    ), story
    replay = training["replay"]
    assert isinstance(replay, dict)
    assert (replay["step"], replay["from_step"], replay["phase"]) == (5, 4, "forward")


TRAINER_CONFIG = """\
version: 1
defaults: {device: cpu, dtype: float32, seed: 0}
models:
  a: &qwen
    source: hf
    class: transformers.Qwen2ForCausalLM
    attn_implementation: eager
    config: {vocab_size: 128, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
              num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64}
  bug3: {<<: *qwen, patch: "late_mlp:from_step_2"}
inputs:
  toks: {kind: tokens, batch: 4, seq_len: 8, vocab_size: 128, seed: 1, labels: true}
tolerances:
  fp32:
    - {match: "*", atol: 1.0e-5, rtol: 1.0e-4}
cases:
  - name: loop_vs_buggy_trainer
    baseline: a
    candidate: bug3
    inputs: toks
    phases: [forward, backward, step]
    steps: 3
    tolerances: fp32
    training: {baseline: loop, candidate: hf_trainer}
    optimizer: {lr: 0.01, weight_decay: 0.1, micro_batches: 2, clip_grad: 0.05,
                schedule: {warmup_steps: 2, decay: cosine, min_lr: 0.001}}
"""

LATE_MLP = """
def from_step_2(model):
    # model.layers.1.mlp scales its output by 1.01 from update 2 on (2 micro-batches a step)
    mlp, calls = model.get_submodule("model.layers.1.mlp"), [0]
    forward = mlp.forward

    def late(x):
        calls[0] += 1
        out = forward(x)
        return out * 1.01 if calls[0] > 4 else out

    mlp.forward = late
"""


def assert_replay_names_late_mlp(run: CaseRun) -> None:
    """The run diverged first at step 2 and its replay named LATE_MLP's layer in the forward."""
    assert run.training is not None and run.training.first is not None
    assert run.training.first.step == 2
    found = training_dict(run.training)["replay"]
    assert (found["step"], found["origin"], found["phase"]) == (2, "model.layers.1.mlp", "forward"), (
        replay_text(run.training)
    )


@pytest.mark.slow  # a Trainer run and its replay (~15 s CPU); the port test below covers the Trainer's boundary
def test_a_trainer_side_is_replayed_through_its_own_trainer(tmp_path: Path) -> None:
    # The candidate is a real transformers.Trainer: it reruns its steps 0-1 itself, a callback
    # loads the loop baseline's state (parameters, AdamW state, RNG) where step 2 begins.
    (tmp_path / "late_mlp.py").write_text(LATE_MLP)
    config = load_config(TRAINER_CONFIG, tmp_path / "align.yaml")
    run = run_case(config, config.cases[0])
    assert_replay_names_late_mlp(run)
    # The Trainer's own AdamW got the loop's state: every parameter and state tensor bitwise.
    case = config.cases[0]
    carrier = StateCarrier(case, lambda: "", keep=True)
    replay_step(config, case, 2, carrier)
    assert carrier.params and set(carrier.state) == {"exp_avg", "exp_avg_sq"}
    for name, value in carrier.params.items():
        assert torch.equal(carrier.kept[f"param:{name}"], value), name
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(carrier.kept[f"{key}:{name}"], carrier.state[key][name]), (key, name)
        assert float(carrier.kept[f"step:{name}"]) == 2.0


MEGATRON_CONFIG = """
version: 1
models:
  mc: &mc
    source: megatron
    config: {vocab_size: 128, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
             num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64,
             tie_word_embeddings: false}
  mc_bug: {<<: *mc, patch: "late_mlp:megatron_from_step_2"}
inputs:
  toks: {kind: tokens, batch: 4, seq_len: 16, vocab_size: 128, seed: 3, labels: true}
cases:
  - name: megatron_layer_bug
    baseline: mc
    candidate: mc_bug
    inputs: toks
    phases: [forward, backward, step]
    steps: 3
    training: {baseline: megatron, candidate: megatron}
    optimizer: {lr: 1.0e-2, weight_decay: 0.1, clip_grad: 1.0, micro_batches: 2,
                schedule: {warmup_steps: 1, decay: cosine, min_lr: 1.0e-3}}
"""

MEGATRON_LATE_MLP = """
def megatron_from_step_2(model):
    # decoder.layers.1.mlp scales its output by 1.01 from update 2 on (2 micro-batches a step)
    mlp, calls = model.get_submodule("decoder.layers.1.mlp"), [0]
    forward = mlp.forward

    def late(*args, **kwargs):
        calls[0] += 1
        out, bias = forward(*args, **kwargs)
        return (out * 1.01 if calls[0] > 4 else out), bias

    mlp.forward = late
"""


@pytest.mark.slow  # two Megatron runs and replays (~15 s CPU); the port test below loads into Megatron
def test_a_megatron_side_is_replayed_through_megatrons_own_stack(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    (tmp_path / "late_mlp.py").write_text(MEGATRON_LATE_MLP)
    config = load_config(MEGATRON_CONFIG, tmp_path / "align.yaml")
    case = config.cases[0]
    run = run_case(config, case)
    assert run.training is not None and run.training.first is not None
    assert run.training.first.step == 2
    found = training_dict(run.training)["replay"]
    assert (found["step"], found["origin"], found["phase"]) == (2, "decoder.layers.1.mlp", "forward"), (
        replay_text(run.training)
    )
    # Megatron's FP32Optimizer steps torch's Adam on the model's own parameters: their state
    # after step 1 is the baseline's, bitwise.
    carrier = StateCarrier(case, lambda: "", keep=True)
    replay_step(config, case, 2, carrier)
    assert set(carrier.state) == {"exp_avg", "exp_avg_sq"}
    for name, value in carrier.params.items():
        assert torch.equal(carrier.kept[f"param:{name}"], value), name
        assert torch.equal(carrier.kept[f"exp_avg:{name}"], carrier.state["exp_avg"][name]), name


PORT_CONFIG = """
version: 1
defaults: {device: cpu, dtype: float32, seed: 0}
models:
  hf:
    source: hf
    class: transformers.Qwen2ForCausalLM
    attn_implementation: eager
    config: &c {vocab_size: 128, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
              num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64,
              tie_word_embeddings: false, rms_norm_eps: 1.0e-6}
  mc_bug: {source: megatron, preset: qwen2.5, config: *c, patch: "late_mlp:megatron_from_step_2"}
inputs:
  toks: {kind: tokens, batch: 4, seq_len: 16, vocab_size: 128, seed: 3, labels: true}
tolerances:
  fp32:
    - {match: "*", atol: 1.0e-5, rtol: 1.0e-4}
cases:
  - name: trainer_vs_megatron_bug
    baseline: hf
    candidate: mc_bug
    mapping: "preset:megatron-qwen2.5"
    inputs: toks
    phases: [forward, backward, step]
    steps: 3
    tolerances: fp32
    training: {baseline: hf_trainer, candidate: megatron}
    record: {mode: tensor}
    optimizer: {lr: 1.0e-3, weight_decay: 0.1, clip_grad: 1.0, micro_batches: 2,
                schedule: {warmup_steps: 1, decay: cosine, min_lr: 1.0e-4}}
"""


def test_a_port_from_a_trainer_to_megatron_is_replayed_through_the_presets_fused_tensors(
    tmp_path: Path,
) -> None:
    # The HF Trainer's state goes into Megatron's through the preset mapping: q, k, v fused
    # into linear_qkv (interleaved per group), gate and up into linear_fc1; AdamW's exp_avg
    # through the same transforms.
    pytest.importorskip("megatron.core")
    (tmp_path / "late_mlp.py").write_text(MEGATRON_LATE_MLP)
    config = load_config(PORT_CONFIG, tmp_path / "align.yaml")
    case = config.cases[0]
    run = run_case(config, case)
    assert run.training is not None and run.training.first is not None
    found = training_dict(run.training)["replay"]
    assert (found["step"], found["origin"], found["phase"]) == (2, "model.layers.1.mlp", "forward"), (
        replay_text(run.training)
    )
    carrier = StateCarrier(case, lambda: "", keep=True)
    replay_step(config, case, 2, carrier)
    base = carrier.state["exp_avg"]
    fused = carrier.kept["exp_avg:decoder.layers.0.self_attention.linear_qkv.weight"]
    parts = [base[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]
    assert torch.equal(fused.flatten().sort().values, torch.cat([p.flatten() for p in parts]).sort().values)
    assert not torch.equal(fused, torch.cat(parts))  # interleaved per group, not stacked
    fc1 = carrier.kept["exp_avg:decoder.layers.1.mlp.linear_fc1.weight"]
    gate_up = [base[f"model.layers.1.mlp.{p}_proj.weight"] for p in ("gate", "up")]
    assert torch.equal(fc1, torch.cat(gate_up))
