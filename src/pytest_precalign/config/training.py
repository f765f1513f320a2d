"""A case's training settings from YAML: ``optimizer:`` (schedule, clipping, weight decay and
the parameters it skips, micro-batches), ``training:`` (which machinery trains each side), and
the checks that need the case's models and inputs (a schedule the side's framework cannot
express, micro-batches that do not divide the batch, steps beyond a finite data stream).
Torch-free; the semantics are ``steps/spec.py``'s.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import ConfigError
from ..specs.envelope import EnvelopeSpec
from ..steps.spec import DECAY_STYLES, OPTIMIZERS, OptimizerSpec, ScheduleSpec, SidesTraining
from ..steps.trainer_registry import default_trainer, trainer_info, trainer_names
from ..yaml_reader import Reader
from .dataset_rows import Rows, read_rows
from .specs import InputSpec, ModelSpec

OPTIMIZER_KEYS = (
    "name",
    "lr",
    "betas",
    "eps",
    "weight_decay",
    "momentum",
    "schedule",
    "clip_grad",
    "no_decay",
    "micro_batches",
)
SCHEDULE_KEYS = ("warmup_steps", "decay", "decay_steps", "min_lr")
DATASET_KEYS = ("kind", "path", "batch", "labels")


def parse_optimizer(reader: Reader) -> OptimizerSpec:
    """``optimizer:`` -> ``OptimizerSpec`` (defaults: AdamW, constant LR, no clipping)."""
    opt = reader.get_mapping("optimizer")
    if opt is None:
        return OptimizerSpec()
    opt.check_keys(OPTIMIZER_KEYS)
    betas = opt.raw("betas", [0.9, 0.999])
    if (
        not isinstance(betas, list)
        or len(betas) != 2
        or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas)
    ):
        opt.fail(f"expected two numbers, got {betas!r}", "betas")
    if not all(0 <= b < 1 for b in betas):  # False for NaN too
        opt.fail(f"each beta must be in [0, 1) (Adam's running averages), got {betas!r}", "betas")
    lr = _finite(opt, "lr", 1e-3)
    clip = opt.get_float("clip_grad", None, non_negative=True)
    if clip is not None and not 0 < clip < math.inf:
        opt.fail(f"must be > 0 and finite (or leave it out: no clipping), got {clip}", "clip_grad")
    optimizer = OptimizerSpec(
        name=opt.get_choice("name", OPTIMIZERS, "adamw"),
        lr=lr,
        betas=(float(betas[0]), float(betas[1])),
        eps=_finite(opt, "eps", 1e-8),
        weight_decay=_finite(opt, "weight_decay", 0.0),
        momentum=_finite(opt, "momentum", 0.0),
        schedule=_schedule(opt, lr),
        clip_grad=clip,
        no_decay=_no_decay(opt),
        micro_batches=opt.get_int("micro_batches", 1, minimum=1),
    )
    opt.done()
    return optimizer


def _finite(reader: Reader, key: str, default: float) -> float:
    """A finite number >= 0 (``.inf`` trains NaN: an LR or weight decay of inf on both sides
    once compared "equal" as NaN vs NaN)."""
    value = reader.get_float(key, default, non_negative=True)
    if not math.isfinite(value):
        reader.fail(f"must be a finite number >= 0, got {value}", key)
    return value


def _schedule(opt: Reader, lr: float) -> ScheduleSpec | None:
    sub = opt.get_mapping("schedule")
    if sub is None:
        return None
    sub.check_keys(SCHEDULE_KEYS)
    warmup = sub.get_int("warmup_steps", 0, minimum=0)
    decay_steps = sub.get_int("decay_steps", None, minimum=1)
    if decay_steps is not None and decay_steps < warmup:
        sub.fail(
            f"must be >= warmup_steps ({warmup}): it counts from update 0 and includes the warmup",
            "decay_steps",
        )
    min_lr = _finite(sub, "min_lr", 0.0)
    if min_lr > lr:
        sub.fail(f"must be <= the optimizer's lr ({lr}), got {min_lr}", "min_lr")
    spec = ScheduleSpec(
        warmup_steps=warmup,
        decay=sub.get_choice("decay", DECAY_STYLES, "constant"),
        decay_steps=decay_steps,
        min_lr=min_lr,
    )
    sub.done()
    return spec


def _no_decay(opt: Reader) -> tuple[str, ...] | None:
    value = opt.raw("no_decay")
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        opt.fail(
            "expected a glob or a list of globs of parameter names (e.g. ['*.bias', '*norm*'])", "no_decay"
        )
    return tuple(value)


def _defaulted(side: str | None, model: ModelSpec | None) -> str | None:
    """A side without ``training:`` trains with its model source's default trainer
    (``trainer_registry.default_trainer``; None: the tool's loop)."""
    if side is not None or model is None:
        return side
    return default_trainer(trained_as(model))


def trained_as(model: ModelSpec) -> str:
    """The source whose trainers train ``model``: a megatron-core model of the user's own
    (``source: factory``, ``runtime: megatron``) as a preset's."""
    return "megatron" if model.megatron_core else model.source


def parse_training(reader: Reader, baseline: ModelSpec | None, candidate: ModelSpec | None) -> SidesTraining:
    """``training:`` one trainer for both sides, or ``{baseline: ..., candidate: ...}``; a side
    left out gets its model's default (``trainer_registry.default_trainer``)."""
    given = _given_training(reader, baseline, candidate)
    return SidesTraining(
        baseline=_defaulted(given.baseline, baseline), candidate=_defaulted(given.candidate, candidate)
    )


def _given_training(reader: Reader, baseline: ModelSpec | None, candidate: ModelSpec | None) -> SidesTraining:
    value = reader.raw("training")
    if value is None:
        return SidesTraining()
    if isinstance(value, str):
        chosen = {"baseline": value, "candidate": value}
        sub = reader
        keys = {"baseline": "training", "candidate": "training"}
    else:
        sub = reader.get_mapping("training") or reader
        sub.check_keys(("baseline", "candidate"))
        chosen = {side: sub.raw(side) for side in ("baseline", "candidate")}
        keys = {"baseline": "baseline", "candidate": "candidate"}
        sub.done()
    models = {"baseline": baseline, "candidate": candidate}
    for side, trainer in chosen.items():
        if trainer is None:
            continue
        if not isinstance(trainer, str) or trainer not in trainer_names():
            sub.fail(f"unknown trainer {trainer!r} (allowed: {', '.join(trainer_names())})", keys[side])
        model = models[side]
        if model is None:
            sub.fail("a trainer trains a model: not with {dump: path} sides", keys[side])
        allowed = tuple(name for name in trainer_names() if trained_as(model) in trainer_info(name).sources)
        if trainer not in allowed:
            kind = "runtime: megatron" if model.source != trained_as(model) else f"source {model.source!r}"
            sub.fail(
                f"trainer {trainer!r} cannot train model {model.name!r} ({kind}; allowed: {', '.join(allowed)})",
                keys[side],
            )
    return SidesTraining(baseline=chosen["baseline"], candidate=chosen["candidate"])


def check_training(
    reader: Reader,
    optimizer: OptimizerSpec,
    training: SidesTraining,
    steps: int,
    spec: InputSpec | None,
) -> None:
    """What needs the case's inputs and trainers: micro-batches dividing the batch, a finite
    data stream long enough for the steps, a schedule each side's framework can express."""
    key = "optimizer" if reader.has("optimizer") else "steps"
    if (
        spec is not None
        and spec.kind in ("tokens", "ids", "dataset")
        and spec.batch % optimizer.micro_batches
    ):
        reader.fail(
            f"micro_batches {optimizer.micro_batches} does not divide inputs.{spec.name}'s batch "
            f"{spec.batch}: each step's batch is split into equal micro-batches",
            key,
        )
    if spec is not None and spec.kind == "dataset" and spec.path is not None:
        # The rows the case's steps use, read (and checked) now: only those are ever held.
        rows = _rows(reader, spec.path, steps * spec.batch, "inputs")
        if len(rows) < steps * spec.batch:
            reader.fail(
                f"steps {steps} is beyond inputs.{spec.name}'s data: {len(rows)} rows make "
                f"{len(rows) // spec.batch} batch(es) of {spec.batch}",
                "steps",
            )
    _check_warmup(reader, optimizer, steps)
    _check_trainers_can_express(reader, optimizer, training, steps)


def _check_warmup(reader: Reader, optimizer: OptimizerSpec, steps: int) -> None:
    """A warmup no longer than the run."""
    schedule = optimizer.schedule
    opt = reader.get_mapping("optimizer")
    sub = opt.get_mapping("schedule") if opt is not None else None
    if schedule is not None and sub is not None and schedule.warmup_steps > steps:
        sub.fail(
            f"warmup_steps {schedule.warmup_steps} is longer than the run (steps {steps}): "
            "the LR would never reach lr",
            "warmup_steps",
        )


def _check_trainers_can_express(
    reader: Reader, optimizer: OptimizerSpec, training: SidesTraining, steps: int
) -> None:
    """What of the optimizer spec a side's framework cannot express (its trainer's
    ``problem``), named at the key under ``optimizer:`` that says it (``run`` would refuse it
    only once training started)."""
    for side in ("baseline", "candidate"):
        name = getattr(training, side)
        info = None if name is None else trainer_info(name)
        found = None if info is None or info.problem is None else info.problem(optimizer, steps)
        if found is None or info is None:
            continue
        *path, key = ("optimizer." + found.key).strip(".").split(".")
        sub = reader
        for part in path:
            sub = sub.get_mapping(part) or sub
        sub.fail(f"the {side} side trains with {info.framework}: {found.message}", key)


def parse_dataset(name: str, reader: Reader, base_dir: Path) -> InputSpec:
    """``kind: dataset``: token rows read from a file (``.jsonl``: a JSON list of ids per line;
    else whitespace-separated ids per line), ``batch`` rows per step, in file order. Only the
    first batch is read here; each case reads the rows its steps need (``check_training``)."""
    reader.check_keys(DATASET_KEYS)
    reader.raw("kind")
    given = reader.get_str("path", required=True)
    path = (base_dir / given).resolve()
    batch = reader.get_int("batch", 1, minimum=1)
    rows = _rows(reader, path, batch, "path")
    if len(rows) < batch:
        reader.fail(f"{path} has {len(rows)} row(s), fewer than one batch of {batch}", "batch")
    spec = InputSpec(
        name=name,
        kind="dataset",
        batch=batch,
        seq_len=len(rows[0]),
        labels=reader.get_bool("labels", True),
        where=reader.where(),
        path=path,
    )
    reader.done()
    return spec


def _rows(reader: Reader, path: Path, count: int, key: str) -> Rows:
    """The first ``count`` rows of a dataset file; a bad file or row is one message naming the
    YAML key and the file's line."""
    try:
        return read_rows(path, count, ConfigError)
    except ConfigError as exc:
        reader.fail(str(exc), key)


ENVELOPE_KEYS = ("reruns", "factor", "steps_over", "floor")


def parse_envelope(reader: Reader, phases: tuple[str, ...], steps: int, dumps: bool) -> EnvelopeSpec | None:
    """``envelope:`` -> ``EnvelopeSpec`` (the run verdict's noise-envelope lane: the baseline run
    again ``reruns`` times with determinism off; see ``verdict/training_envelope.py``)."""
    env = reader.get_mapping("envelope")
    if env is None:
        return None
    env.check_keys(ENVELOPE_KEYS)
    if dumps:
        reader.fail("reruns the baseline's model: not available for stored runs (dump: sides)", "envelope")
    if "step" not in phases or "backward" not in phases:
        reader.fail(
            "judges a training run's per-step scalars: the case needs phases backward and step", "envelope"
        )
    factor = env.get_float("factor", 4.0, non_negative=True)
    if factor <= 0:
        env.fail(f"must be > 0 (the envelope is factor x the reruns' spread), got {factor}", "factor")
    floor = env.get_float("floor", None, non_negative=True)
    if floor is not None and floor <= 0:
        env.fail(
            f"must be > 0 (a relative floor), or leave it out: the tolerance table's bound, got {floor}",
            "floor",
        )
    steps_over = env.get_int("steps_over", 0, minimum=0)
    if steps_over >= steps:
        env.fail(
            f"must be < steps ({steps}): {steps_over} would allow every step over the envelope", "steps_over"
        )
    spec = EnvelopeSpec(env.get_int("reruns", 2, minimum=1), factor, steps_over, floor)
    env.done()
    return spec
