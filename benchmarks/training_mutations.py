"""Training-level mutation benchmark: seeded training-loop faults on megatron-core's real stack
(DDP, get_megatron_optimizer, OptimizerParamScheduler, the pipeline schedule; a tiny GPTModel,
10 steps), clean reruns and benign perturbations, each judged against one baseline run by the
training-run verdict (``verdict/training_run.py``) from both sides' plans, per-step scalars and
per-layer statistics (the ``HookRecorder`` in stats mode, every step).

Scores: detected (the verdict fails), right step (the first divergent step is the expected
one), right class (what diverged first), right origin (for the mutations that name one),
false alarms (a clean or benign pair that fails). The last line of stdout is one JSON object.
Run through ``python benchmarks/mutations.py --training`` or directly:

    python benchmarks/training_mutations.py
    python benchmarks/training_mutations.py --only adam_eps_planted,clean_rerun
    python benchmarks/training_mutations.py --tensor   # tensors: every update checked on its inputs
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402
from tests.training.megatron_tiny import logits_of, megatron_world, split, tiny_gpt, token_batches  # noqa: E402
from training_faults import (  # noqa: E402
    bf16_grad_buffer,
    clip_before_accumulation,
    clip_one_group,
    mean_of_micro_batch_means,
    reset_step_counter,
    sdpa_attention,
    swap_optimizer,
)

from pytest_precalign.compare.pairs import compare_traces  # noqa: E402
from pytest_precalign.compare.tolerances import default_table  # noqa: E402
from pytest_precalign.megatron_core.megatron_stack import build_megatron_stack  # noqa: E402
from pytest_precalign.recording import HookRecorder  # noqa: E402
from pytest_precalign.reports.run_pattern_text import pattern_text  # noqa: E402
from pytest_precalign.reports.training_evidence_text import evidence_text, finding_text  # noqa: E402
from pytest_precalign.run.update_check import judge_updates, snapshot  # noqa: E402
from pytest_precalign.steps.spec import OptimizerSpec, ScheduleSpec  # noqa: E402
from pytest_precalign.trace.records import Trace  # noqa: E402
from pytest_precalign.trace.step_scalars import SCALARS_KEY, scalars_manifest  # noqa: E402
from pytest_precalign.trace.training_record import RunRecord  # noqa: E402
from pytest_precalign.verdict.training_records import step_records  # noqa: E402
from pytest_precalign.verdict.training_run import TrainingVerdict, judge_run  # noqa: E402

STEPS = 10
SPEC = OptimizerSpec(
    lr=1e-2,
    weight_decay=0.1,
    schedule=ScheduleSpec(warmup_steps=2, decay="cosine", min_lr=1e-3),
    clip_grad=0.5,
)
Plant = Callable[[Any], None]  # (stack) -> None: a bug in the side's machinery, plan untouched


@dataclass(frozen=True)
class Mutation:
    name: str
    step: int | None  # None: fault-free (must pass)
    what: str = ""
    spec: OptimizerSpec = SPEC
    plant: Plant | None = None
    batches: Callable[[list[Any]], list[Any]] | None = None
    hook: Callable[[Any], Any] | None = None  # (model) -> a bug in the model, from a step on
    threads: int | None = None
    origin: str = ""  # a substring the origin (or its evidence) must contain; "a|b": either
    model: tuple[tuple[str, float], ...] = ()  # tiny_gpt's arguments (dropout)
    base: str = "baseline"  # the baseline run it is judged against (BASELINES)


def _groups(key: str, value: Any) -> Plant:
    def plant(stack: Any) -> None:
        for group in stack.optimizer.param_groups:
            group[key] = value

    return plant


def _scheduler(after: Callable[[Any, int], None] | None = None, lost: int = 0) -> Plant:
    """Wrap the side's scheduler: its first ``lost`` advances are lost, ``after`` runs after each."""

    def plant(stack: Any) -> None:
        original, calls = stack.scheduler.step, [0]

        def step(increment: int) -> None:
            calls[0] += 1
            original(increment=0 if calls[0] <= lost else increment)
            if after is not None:
                after(stack, calls[0])

        stack.scheduler.step = step

    return plant


def _scale_lr(stack: Any, _: int) -> None:
    for group in stack.optimizer.param_groups:
        group["lr"] *= 0.9


def _decay(stack: Any, _: int) -> None:
    stack.optimizer.param_groups[0]["weight_decay"] = 0.2


def _clip_off(stack: Any) -> None:
    stack.optimizer.config.clip_grad = 0.0


def _grads(factor: float) -> Callable[[Any], Any]:
    def hook(model: Any) -> Any:
        return [p.register_hook(lambda g: g * factor) for p in model.parameters()]

    return hook


def _late_layer(name: str, start: int, factor: float = 1.01) -> Callable[[Any], Any]:
    def hook(model: Any) -> Any:
        module, calls = model.get_submodule(name), [0]

        def scale(_m: Any, _i: Any, out: Any) -> Any:
            calls[0] += 1
            if calls[0] <= start:
                return out
            return (out[0] * factor, *out[1:]) if isinstance(out, tuple) else out * factor

        return [module.register_forward_hook(scale)]

    return hook


def _swap(k: int) -> Callable[[list[Any]], list[Any]]:
    def order(batches: list[Any]) -> list[Any]:
        out = list(batches)
        out[k], out[k + 1] = out[k + 1], out[k]
        return out

    return order


def _padded(batches: list[Any]) -> list[Any]:
    """Each batch's first sequence padded after 6 tokens (labels -100): its micro-batches then
    hold different numbers of tokens."""
    out = []
    for batch in batches:
        labels = batch["labels"].clone()
        labels[0, 6:] = -100
        out.append({**batch, "labels": labels})
    return out


def _at(k: int, action: Callable[[Any], None]) -> Callable[[Any, int], None]:
    """A scheduler ``after``: ``action(stack)`` once the update of step ``k - 1`` is done."""

    def after(stack: Any, calls: int) -> None:
        if calls == k:
            action(stack)

    return after


def _spec(**changes: Any) -> OptimizerSpec:
    return replace(SPEC, **changes)


def _schedule(**changes: Any) -> OptimizerSpec:
    assert SPEC.schedule is not None
    return replace(SPEC, schedule=replace(SPEC.schedule, **changes))


SPEC2 = _spec(micro_batches=2)
MICRO2: dict[str, Any] = {"spec": SPEC2, "batches": _padded, "base": "2_micro_batches"}
BASELINES = {
    "baseline": Mutation("baseline", None),
    "2_micro_batches": Mutation("baseline_2_micro_batches", None, spec=SPEC2, batches=_padded),
}
MLP = "decoder.layers.1.mlp"
ATTN = "decoder.layers.0.self_attention"


def mutations() -> list[Mutation]:
    return [
        # the contract: translated settings that differ, named before step 0
        Mutation("horizon_shortened_by_warmup", 3, "settings", _schedule(decay_steps=STEPS - 2)),
        Mutation("warmup_longer", 1, "settings", _schedule(warmup_steps=3)),
        Mutation("min_lr_other", 3, "settings", _schedule(min_lr=0.0)),
        Mutation("decay_linear_not_cosine", 3, "settings", _schedule(decay="linear")),
        Mutation("peak_lr_other", 1, "settings", _spec(lr=1.1e-2)),
        Mutation("wd_on_norms", 0, "settings", _spec(no_decay=("*.bias",)), origin="layernorm"),
        Mutation("wd_on_everything", 0, "settings", _spec(no_decay=()), origin="bias|layernorm"),
        Mutation("wd_other_value", 0, "settings", _spec(weight_decay=0.01)),
        Mutation("clipping_off", 0, "settings", _spec(clip_grad=None), origin="clip_grad"),
        Mutation("clip_threshold_other", 0, "settings", _spec(clip_grad=1.0), origin="clip_grad"),
        Mutation("adam_eps_config", 0, "settings", _spec(eps=1e-6), origin="eps"),
        Mutation("adam_betas_config", 0, "settings", _spec(betas=(0.9, 0.95)), origin="betas"),
        Mutation("micro_batches_2_vs_1", 0, "settings", _spec(micro_batches=2), origin="micro_batches"),
        # the machinery: the plan looks right, the run does something else
        Mutation("warmup_one_step_behind", 1, "schedule", plant=_scheduler(lost=1), origin="lr"),
        Mutation("warmup_two_steps_behind", 1, "schedule", plant=_scheduler(lost=2), origin="lr"),
        Mutation("lr_scaled_by_scheduler", 1, "schedule", plant=_scheduler(_scale_lr), origin="lr"),
        Mutation("wd_applied_wrong", 1, "schedule", plant=_scheduler(_decay), origin="weight_decay"),
        Mutation("adam_eps_planted", 1, "optimizer_update", plant=_groups("eps", 1e-3)),
        Mutation("adam_beta1_planted", 1, "optimizer_update", plant=_groups("betas", (0.5, 0.999))),
        Mutation("adam_beta2_planted", 1, "optimizer_update", plant=_groups("betas", (0.9, 0.9))),
        Mutation("clipping_off_planted", 0, "clipping", plant=_clip_off, origin="clip_coef"),
        Mutation("dp_grads_not_averaged", 0, "grad_reduction", hook=_grads(2.0)),
        Mutation("loss_scale_not_undone", 0, "grad_reduction", hook=_grads(0.5)),
        Mutation("data_order_from_step_5", 5, "data", batches=_swap(5), origin="batch"),
        Mutation("data_order_from_step_2", 2, "data", batches=_swap(2), origin="batch"),
        Mutation("mlp_bug_from_step_5", 5, "forward", hook=_late_layer(MLP, 5), origin=MLP),
        Mutation("attention_bug_from_step_7", 7, "forward", hook=_late_layer(ATTN, 7), origin=ATTN),
        Mutation(
            "adam_bias_correction_off", 1, "optimizer_update", plant=swap_optimizer(bias_correction=False)
        ),
        Mutation(
            "adam_bias_correction_off_from_step_6",
            6,
            "optimizer_update",
            plant=swap_optimizer(bias_correction=False, from_step=6),
        ),
        Mutation("adam_step_counter_off_by_one", 1, "optimizer_update", plant=swap_optimizer(step_offset=1)),
        Mutation(
            "adam_step_counter_reset_at_step_4",
            4,
            "optimizer_update",
            plant=_scheduler(_at(4, reset_step_counter)),
        ),
        Mutation(
            "adam_decays_the_no_decay_group",
            1,
            "optimizer_update",
            plant=swap_optimizer(decay_every_group=True),
            origin="layernorm|bias",
        ),
        Mutation("clipping_on_one_group", 0, "clipping", plant=clip_one_group, origin="clip_coef|grad_norm"),
        Mutation("attention_dropout_left_on", 0, "forward", model=(("attention_dropout", 0.1),), origin=ATTN),
        Mutation(
            "hidden_dropout_left_on", 0, "forward", model=(("hidden_dropout", 0.1),), origin="embedding"
        ),
        # two micro-batches of different token counts on both sides
        Mutation("loss_mean_of_micro_batch_means", 0, "loss", **MICRO2, plant=mean_of_micro_batch_means),
        Mutation("clipping_before_accumulation", 0, "clipping", **MICRO2, plant=clip_before_accumulation),
        Mutation("bf16_grad_accumulation", 0, "grad_reduction", **MICRO2, plant=bf16_grad_buffer),
    ]


def clean_pairs() -> list[Mutation]:
    return [
        Mutation("clean_rerun", None),
        Mutation("clean_rerun_again", None),
        Mutation("benign_one_thread", None, threads=1),
        Mutation("benign_sdpa_attention", None, hook=sdpa_attention),
        Mutation("clean_rerun_2_micro_batches", None, **MICRO2),
        Mutation("benign_sdpa_attention_2_micro_batches", None, **MICRO2, hook=sdpa_attention),
    ]


Side = tuple[RunRecord, Trace, dict[str, torch.Tensor]]  # its run, its records, its initial parameters


def train(m: Mutation, mode: str = "stats") -> Side:
    spec = m.spec
    model = tiny_gpt(**dict(m.model))
    initial = snapshot(model)
    stack = build_megatron_stack([model], spec, STEPS, global_batch=4)
    settings = stack.training_manifest(STEPS, micro_batches=spec.micro_batches)
    handles = m.hook(model) if m.hook is not None else []
    if m.plant is not None:
        m.plant(stack)
    batches = token_batches(STEPS)
    if m.batches is not None:
        batches = m.batches(batches)
    threads = torch.get_num_threads()
    if m.threads is not None:
        torch.set_num_threads(m.threads)
    scalars = {}
    try:
        with HookRecorder(model, mode=mode, param_grads="step") as recorder:
            for step, batch in enumerate(batches):
                recorder.step = step
                scalars[step] = _step(stack, recorder, step, split(batch, spec.micro_batches))
            trace = recorder.trace(
                {"side": m.name, SCALARS_KEY: scalars_manifest(scalars)}, RunRecord(scalars=scalars)
            )
    finally:
        torch.set_num_threads(threads)
        for handle in handles:
            handle.remove()
    return RunRecord(settings, scalars), trace, initial


def _step(stack: Any, recorder: HookRecorder, step: int, parts: list[Any]) -> Any:
    """One step recorded as ``run/trainers/megatron.py`` records it: each micro-batch's logits
    and loss, the grads the optimizer is given (``main_grad`` after the reduction), the
    parameters after the update."""
    calls: dict[str, int] = {}

    def on_output(kind: str, tensor: torch.Tensor) -> None:
        calls[kind] = calls.get(kind, -1) + 1
        recorder.record_output("logits" if kind == "logits" else "loss", tensor, call=calls[kind])

    _, scalars = stack.train_step(
        step,
        parts,
        logits_of,
        on_output=on_output,
        grads_ready=partial(recorder.record_param_grads, len(parts)),
    )
    recorder.record_params()
    return scalars


def judge(base: Side, cand: Side, spec: OptimizerSpec, check_updates: bool = False) -> TrainingVerdict:
    """The run verdict; ``check_updates`` (tensors recorded): each parameter after each update first
    judged on its inputs by ``run/update_check.py`` (the baseline's spec, each side's LR
    and clip factor of the step)."""
    comparison = compare_traces(base[1], cand[1], default_table())
    if check_updates:
        initial = {"baseline": base[2], "candidate": cand[2]}
        comparison = judge_updates(comparison, base[1], cand[1], spec, initial)
    return judge_run(base[0], cand[0], step_records(comparison), default_table())


def score(m: Mutation, v: TrainingVerdict) -> dict[str, Any]:
    first = v.first
    row: dict[str, Any] = {
        "name": m.name,
        "expected": None if m.step is None else [m.step, m.what],
        "found": None if first is None else [first.step, first.what, first.origin],
        "evidence": None if first is None else evidence_text(first.evidence),
        "pattern": None if first is None else pattern_text(first.pattern),
        "findings": [finding_text(f) for f in v.findings],
        "passed": v.passed,
    }
    if m.step is not None:
        row["detected"] = not v.passed
        row["right_step"] = first is not None and first.step == m.step
        row["right_class"] = first is not None and first.what == m.what
        if m.origin:
            told = f"{first.origin} {evidence_text(first.evidence)}" if first is not None else ""
            row["right_origin"] = any(part in told for part in m.origin.split("|")) and bool(told)
    return row


def run(selected: list[Mutation], mode: str = "stats") -> dict[str, Any]:
    rows = []
    started = time.perf_counter()
    world = megatron_world()
    next(world)
    try:
        bases: dict[str, Side] = {}
        for m in selected:
            if m.base not in bases:
                bases[m.base] = train(BASELINES[m.base], mode)
            base_spec = BASELINES[m.base].spec
            rows.append(
                score(m, judge(bases[m.base], train(m, mode), base_spec, check_updates=mode == "tensor"))
            )
            print(f"{m.name}: expected {rows[-1]['expected']}, found {rows[-1]['found']}", flush=True)
    finally:
        next(world, None)
    faults = [r for r in rows if r["expected"] is not None]
    origins = [r for r in faults if "right_origin" in r]
    return {
        "mutations": len(faults),
        "clean_pairs": len(rows) - len(faults),
        "detected": sum(r["detected"] for r in faults),
        "right_step": sum(r["right_step"] for r in faults),
        "right_class": sum(r["right_class"] for r in faults),
        "with_origin": len(origins),
        "right_origin": sum(r["right_origin"] for r in origins),
        "false_alarms": sum(not r["passed"] for r in rows if r["expected"] is None),
        "missed": [r["name"] for r in faults if not (r["detected"] and r["right_step"] and r["right_class"])],
        "seconds": round(time.perf_counter() - started, 1),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated mutation names")
    parser.add_argument(
        "--tensor",
        action="store_true",
        help="record tensors: each update judged on its inputs (the update check)",
    )
    args = parser.parse_args(argv)
    cases = mutations() + clean_pairs()
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(wanted) - {c.name for c in cases})
        if unknown:
            parser.error(
                f"--only: unknown mutation(s) {', '.join(unknown)} (allowed: {', '.join(c.name for c in cases)})"
            )
        cases = [c for c in cases if c.name in wanted]
    figures = run(cases, "tensor" if args.tensor else "stats")
    rows = figures.pop("rows")
    n = figures["mutations"]
    pct = lambda a, b: f"{100.0 * a / b:.0f} %" if b else "n/a"  # noqa: E731
    print(
        f"\ndetected {figures['detected']}/{n} ({pct(figures['detected'], n)}), right step "
        f"{figures['right_step']}/{n}, right class {figures['right_class']}/{n}, right origin "
        f"{figures['right_origin']}/{figures['with_origin']}, false alarms {figures['false_alarms']}/"
        f"{figures['clean_pairs']}; {figures['seconds']} s"
    )
    print(json.dumps({**figures, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
