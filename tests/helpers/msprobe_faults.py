"""A fault corpus made with the real msprobe (mindstudio-probe ``PrecisionDebugger``).

Each *run* is one training step (or two) of a tiny ``Qwen2ForCausalLM`` (seed 0, fp32, CPU,
eager attention) recorded the way msprobe's users do: ``start(model=model)``, forward with
labels, ``loss.backward()``, ``stop()``, ``step()``. A run is the golden model or the golden
model with one fault whose true origin is known (``Fault.expected``).

msprobe's debugger is a process-wide singleton that patches torch's APIs, so dumps are made in
a subprocess, one per msprobe config (task, level, summary mode), all runs of that config in
turn: ``python tests/helpers/msprobe_faults.py OUT TASK LEVEL SUMMARY RUN...``. msprobe numbers the
steps of a process 0, 1, 2...; each run's step folders are moved to ``OUT/<run>/step<i>``
(i from 0), as if each run had been its own job. The files are msprobe's, unedited.
"""

from __future__ import annotations

import fcntl
import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED = 0
BATCH, SEQ = 2, 8
TINY = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": False,
    "max_position_embeddings": 64,
}


@dataclass(frozen=True)
class Expected:
    """Where the divergence truly starts."""

    name: str  # module path of the first divergence
    phase: str  # forward | backward
    origin: bool  # the named module is itself the origin (its inputs matched)
    origin_module: str = ""  # when not the origin: the enclosing module that is
    step: int = 0
    overflow: bool = False  # the first NaN/Inf is made there (overflow level critical)
    dtype_note: bool = False  # the sides differ in dtype there


@dataclass(frozen=True)
class Fault:
    name: str
    doc: str
    expected: Expected | None  # None: the golden model
    steps: int = 1
    attention: str = "eager"  # or "sdpa" (one fused call in the L1/mix dumps)

    @property
    def golden(self) -> str:
        """The fault-free run to compare this one with."""
        if self.steps == 2:
            return "golden_2steps"
        return "golden_sdpa" if self.attention == "sdpa" else "golden"


# -- faults ----------------------------------------------------------------------------------


def _perturb(model: Any, path: str, scale: float = 1e-2) -> None:
    import torch

    param = model.get_parameter(path)
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        param.add_(scale * torch.randn(param.shape, generator=gen))


def _wrong_eps(model: Any) -> None:
    model.model.layers[1].input_layernorm.variance_epsilon = 1e-2


def _softmax_scale(model: Any) -> None:
    model.model.layers[0].self_attn.scaling *= 1.25


def _attn_bf16(model: Any) -> None:
    """Layer 1's attention computed in bfloat16 (q, k, v rounded, result rounded back)."""
    import torch
    from transformers.models.qwen2 import modeling_qwen2 as m

    target = model.model.layers[1].self_attn
    original = m.eager_attention_forward

    def attention(module: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        if module is not target:
            return original(module, query, key, value, *args, **kwargs)
        bf = torch.bfloat16
        out, weights = original(module, query.to(bf), key.to(bf), value.to(bf), *args, **kwargs)
        return out.float(), weights

    m.eager_attention_forward = attention


def _rope_theta(model: Any) -> None:
    """The rotary embedding built with theta 1e6 instead of the config's 1e4."""
    import torch

    rotary = model.model.rotary_emb
    dim = rotary.inv_freq.numel() * 2
    with torch.no_grad():
        rotary.inv_freq.copy_(1.0 / (1e6 ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)))


def _gelu(model: Any) -> None:
    from transformers.activations import ACT2FN

    model.model.layers[1].mlp.act_fn = ACT2FN["gelu"]


def _grad_scale(model: Any) -> None:
    """Layer 0's MLP activation: right forward, gradient scaled by 1.5 (a wrong backward)."""
    import torch
    import torch.nn.functional as F

    class SiluWrongGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            ctx.save_for_backward(x)
            return F.silu(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            (x,) = ctx.saved_tensors
            s = torch.sigmoid(x)
            return 1.5 * grad * s * (1 + x * (1 - s))

    act = model.model.layers[0].mlp.act_fn
    act.forward = SiluWrongGrad.apply


def _nonfinite_output(path: str, value: float) -> Callable[[Any], None]:
    """The module at ``path`` returns one non-finite element."""

    def apply(model: Any) -> None:
        module = model.get_submodule(path)
        original = module.forward

        def forward(x: Any) -> Any:
            out = original(x).clone()
            out[0, 3, 5] = value
            return out

        module.forward = forward

    return apply


def _bf16_layer(model: Any) -> None:
    """Layer 1's down_proj kept in bfloat16: bf16 weight, bf16 output."""
    import torch
    import torch.nn.functional as F

    down = model.model.layers[1].mlp.down_proj
    down.to(torch.bfloat16)

    def forward(x: Any) -> Any:
        return F.linear(x.to(torch.bfloat16), down.weight)

    down.forward = forward


APPLY: dict[str, Callable[[Any], None]] = {
    "q_proj": lambda m: _perturb(m, "model.layers.0.self_attn.q_proj.weight"),
    "o_proj": lambda m: _perturb(m, "model.layers.1.self_attn.o_proj.weight"),
    "rmsnorm_weight": lambda m: _perturb(m, "model.layers.0.post_attention_layernorm.weight"),
    "embedding": lambda m: _perturb(m, "model.embed_tokens.weight"),
    "lm_head": lambda m: _perturb(m, "lm_head.weight"),
    "rmsnorm_eps": _wrong_eps,
    "softmax_scale": _softmax_scale,
    "softmax_scale_sdpa": _softmax_scale,
    "attn_bf16": _attn_bf16,
    "rope_theta": _rope_theta,
    "gelu": _gelu,
    "grad_scale": _grad_scale,
    "inf_output": _nonfinite_output("model.layers.0.mlp.down_proj", math.inf),
    "nan_output": _nonfinite_output("model.layers.1.self_attn.v_proj", math.nan),
    "bf16_layer": _bf16_layer,
    # applied after the first optimizer step (see run_once)
    "step1_weight": lambda m: _perturb(m, "model.layers.1.mlp.up_proj.weight"),
}

FAULTS = {
    f.name: f
    for f in (
        Fault("golden", "the fault-free model", None),
        Fault("golden_2steps", "the fault-free model, two steps", None, steps=2),
        Fault("golden_sdpa", "the fault-free model, sdpa attention", None, attention="sdpa"),
        Fault("q_proj", "perturbed weight", Expected("model.layers.0.self_attn.q_proj", "forward", True)),
        Fault("o_proj", "perturbed weight", Expected("model.layers.1.self_attn.o_proj", "forward", True)),
        Fault(
            "rmsnorm_weight",
            "perturbed RMSNorm weight",
            Expected("model.layers.0.post_attention_layernorm", "forward", True),
        ),
        Fault("embedding", "perturbed embedding", Expected("model.embed_tokens", "forward", True)),
        Fault("lm_head", "perturbed lm_head", Expected("lm_head", "forward", True)),
        Fault(
            "rmsnorm_eps", "wrong RMSNorm eps", Expected("model.layers.1.input_layernorm", "forward", True)
        ),
        # The attention kernel is a function, not a module: the first module output that
        # differs is o_proj (on a differing input), made by self_attn's own code.
        Fault(
            "softmax_scale",
            "wrong softmax scale",
            Expected("model.layers.0.self_attn.o_proj", "forward", False, "model.layers.0.self_attn"),
        ),
        Fault(
            "softmax_scale_sdpa",
            "wrong softmax scale, sdpa attention",
            Expected("model.layers.0.self_attn.o_proj", "forward", False, "model.layers.0.self_attn"),
            attention="sdpa",
        ),
        Fault(
            "attn_bf16",
            "attention in bfloat16",
            Expected("model.layers.1.self_attn.o_proj", "forward", False, "model.layers.1.self_attn"),
        ),
        Fault("rope_theta", "rope theta 1e6 (config: 1e4)", Expected("model.rotary_emb", "forward", True)),
        Fault("gelu", "gelu instead of silu", Expected("model.layers.1.mlp.act_fn", "forward", True)),
        Fault(
            "grad_scale", "gradient scaled by 1.5", Expected("model.layers.0.mlp.act_fn", "backward", True)
        ),
        Fault(
            "inf_output",
            "an Inf in down_proj's output",
            Expected("model.layers.0.mlp.down_proj", "forward", True, overflow=True),
        ),
        Fault(
            "nan_output",
            "a NaN in v_proj's output",
            Expected("model.layers.1.self_attn.v_proj", "forward", True, overflow=True),
        ),
        Fault(
            "bf16_layer",
            "down_proj in bfloat16",
            Expected("model.layers.1.mlp.down_proj", "forward", True, dtype_note=True),
        ),
        Fault(
            "step1_weight",
            "weight corrupted after the first optimizer step",
            Expected("model.layers.1.mlp.up_proj", "forward", True, step=1),
            steps=2,
        ),
    )
}


# -- dumping ---------------------------------------------------------------------------------


def msprobe_config(task: str, level: str, summary: str, dump_path: Path) -> dict[str, Any]:
    """Like the configs of the shared samples (tests/data/msprobe/*_config.json)."""
    scope: dict[str, Any] = {"scope": [], "list": [], "data_mode": ["all"]}
    return {
        "task": task,
        "dump_path": str(dump_path),
        "rank": [],
        "step": [],
        "level": level,
        "extra_info": True,
        "async_dump": False,
        "statistics": {**scope, "summary_mode": summary},
        "tensor": dict(scope),
    }


def build_model(attention: str = "eager") -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(SEED)
    config = Qwen2Config(**TINY)
    config._attn_implementation = attention
    return Qwen2ForCausalLM(config).eval()


def run_once(debugger: Any, fault: Fault) -> None:
    import torch

    model = build_model(fault.attention)
    if fault.name != "step1_weight" and fault.name in APPLY:
        APPLY[fault.name](model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, TINY["vocab_size"], (BATCH, SEQ), generator=gen)
    for step in range(fault.steps):
        debugger.start(model=model)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        debugger.stop()
        debugger.step()
        opt.step()
        opt.zero_grad()
        if step == 0 and fault.name == "step1_weight":
            APPLY[fault.name](model)


@dataclass(frozen=True)
class DumpConfig:
    task: str  # statistics | tensor
    level: str  # L0 | L1 | mix
    summary: str  # statistics | md5 (task statistics only)

    @property
    def label(self) -> str:
        return f"{self.task}_{self.level}" + (f"_{self.summary}" if self.task == "statistics" else "")


ALL_FAULTS = tuple(n for n in FAULTS if not n.startswith("golden") and FAULTS[n].attention == "eager")
S_L0 = DumpConfig("statistics", "L0", "statistics")
MD5_L0 = DumpConfig("statistics", "L0", "md5")
T_L0 = DumpConfig("tensor", "L0", "statistics")
S_MIX = DumpConfig("statistics", "mix", "statistics")
T_MIX = DumpConfig("tensor", "mix", "statistics")
S_L1 = DumpConfig("statistics", "L1", "statistics")
T_L1 = DumpConfig("tensor", "L1", "statistics")
# Which faults each config dumps: every fault at L0 (three ways), a representative few with
# APIs (mix, L1), to keep the corpus quick to make.
MATRIX: dict[DumpConfig, tuple[str, ...]] = {
    S_L0: ALL_FAULTS,
    MD5_L0: ALL_FAULTS,
    T_L0: ALL_FAULTS,
    S_MIX: (
        "q_proj",
        "softmax_scale",
        "attn_bf16",
        "rope_theta",
        "grad_scale",
        "inf_output",
        "softmax_scale_sdpa",
    ),
    T_MIX: ("softmax_scale", "gelu", "grad_scale", "inf_output", "bf16_layer", "step1_weight"),
    S_L1: ("q_proj", "softmax_scale", "gelu", "lm_head"),
    T_L1: ("softmax_scale", "gelu", "grad_scale", "softmax_scale_sdpa"),
}


def plans() -> tuple[list[tuple[DumpConfig, list[str]]], list[tuple[DumpConfig, list[str]]]]:
    """Two processes' work: each dumps the golden runs of every config (so golden vs golden
    compares two processes) and every other fault."""
    first: list[tuple[DumpConfig, list[str]]] = []
    second: list[tuple[DumpConfig, list[str]]] = []
    for config, faults in MATRIX.items():
        goldens = sorted({"golden"} | {FAULTS[f].golden for f in faults})
        first.append((config, goldens + list(faults[0::2])))
        second.append((config, goldens + list(faults[1::2])))
    return first, second


def _fresh_debugger(config_file: Path) -> Any:
    """A new msprobe debugger: the class keeps one instance per process, so the previous
    one is dropped (its API patches undone first)."""
    from msprobe.pytorch import PrecisionDebugger

    old = PrecisionDebugger._instance
    register = getattr(getattr(old, "service", None), "api_register", None)
    if register is not None and register.all_api_registered:
        register.restore_all_api()
    PrecisionDebugger._instance = None
    return PrecisionDebugger(config_path=str(config_file))


def dump_runs(out: Path, config: DumpConfig, runs: Sequence[str]) -> None:
    """In this process: every run, each moved to ``out/<config label>/<run>``."""
    out.mkdir(parents=True, exist_ok=True)
    scratch = out / f"_msprobe_{config.label}"
    config_file = out / f"{config.label}_config.json"
    settings = msprobe_config(config.task, config.level, config.summary, scratch)
    config_file.write_text(json.dumps(settings, indent=2))
    debugger = _fresh_debugger(config_file)
    done = 0
    for name in runs:
        fault = FAULTS[name]
        run_once(debugger, fault)
        target = out / config.label / name
        target.mkdir(parents=True, exist_ok=True)
        for i in range(fault.steps):
            shutil.move(scratch / f"step{done + i}", target / f"step{i}")
        done += fault.steps
    shutil.rmtree(scratch, ignore_errors=True)


def make_dumps(out: Path, plan: Sequence[tuple[DumpConfig, Sequence[str]]]) -> subprocess.Popen[str]:
    """Start dumping ``plan`` under ``out`` in a fresh Python process (msprobe patches torch);
    ``finish`` waits for it."""
    out.mkdir(parents=True, exist_ok=True)
    spec = [[c.task, c.level, c.summary, list(runs)] for c, runs in plan]
    cmd = [sys.executable, "-W", "ignore", str(Path(__file__).resolve()), str(out), json.dumps(spec)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str]) -> None:
    log, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"msprobe dump failed ({proc.args}):\n{log[-6000:]}")


def main(argv: Sequence[str]) -> None:
    import torch

    torch.set_num_threads(1)  # tiny tensors: threads only contend with the test workers
    out, spec = Path(argv[0]), json.loads(argv[1])
    for task, level, summary, runs in spec:
        dump_runs(out, DumpConfig(task, level, summary), runs)


def make_corpus(shared: Path) -> Path:
    """The corpus root under ``shared`` (``a/`` and ``b/``, one per dumping process), made by
    the first caller; others (xdist workers sharing ``shared``) wait on a lock file for it."""
    root = shared / "msprobe_fault_corpus"
    with open(shared / "msprobe_fault_corpus.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done").exists():
            first, second = plans()
            procs = [make_dumps(root / "a", first), make_dumps(root / "b", second)]
            for proc in procs:
                finish(proc)
            (root / "done").write_text("ok")
    return root


def dumps(corpus: Path, config: DumpConfig, run: str) -> tuple[Path, Path]:
    """(golden, run): the golden dump of the process that did not make ``run``."""
    side = "a" if (corpus / "a" / config.label / run).is_dir() else "b"
    other = "b" if side == "a" else "a"
    return corpus / other / config.label / FAULTS[run].golden, corpus / side / config.label / run


if __name__ == "__main__":
    main(sys.argv[1:])
