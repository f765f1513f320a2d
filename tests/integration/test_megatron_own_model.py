"""Your own Megatron model: the example suite ``megatron_own_model`` end to end (a Gemma2-like
megatron-core GPTModel the user builds, through ``source: factory`` with ``runtime: megatron``,
against HF's Gemma2ForCausalLM), and the message a megatron-core factory without the runtime
gets."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import EXAMPLES
from tests.helpers.runs import ExampleSuite, RunPytest

pytest.importorskip("megatron.core")


def test_own_gemma2_like_megatron_model_aligns_and_names_planted_bugs(
    pytester: pytest.Pytester, example_suite: ExampleSuite, run_pytest: RunPytest
) -> None:
    """Forward, backward and two AdamW steps aligned with every parameter synced through the
    user's mapping; the (1 + w) norm bug named as the origin at its module, the soft-cap bug
    entering in layer 1's self_attn (the walk up and isolation agree). On main the config's
    ``runtime: megatron`` is refused; without it megatron-core fails for want of its parallel
    state, and then the model is called as ``model(**inputs)``."""
    folder = example_suite("megatron_own_model")
    result = run_pytest("--align-config", str(folder / "align.yaml"), str(folder), "--align-report", "out")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) == 6, result.stdout.str()
    cases = json.loads((pytester.path / "out" / "report.json").read_text())["cases"]
    by_case = {(c["name"], c["phase"]): c for c in cases}
    for case in cases:
        # strict sync: every parameter on both sides paired by the user's mapping
        assert case["weights"] == {**case["weights"], "unsynced": [], "unused": []}, case["name"]
        assert case["weights"]["copied"] + case["weights"]["transformed"] == 18, case["weights"]
        for side in ("baseline", "candidate"):
            assert all(u["reason"] for u in case["unmatched"][side]), (case["name"], case["unmatched"][side])
    for phase in ("forward", "backward", "step"):
        aligned = by_case[("fp32_train", phase)]
        assert aligned["first_divergence"] is None and aligned["compared"] > 40, aligned["name"]
    forward = {r["name"] for r in by_case[("fp32_train", "forward")]["records"]}
    # the four norms a layer, the attention probabilities and the soft-capped logits compared
    norms = (
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    )
    assert {f"model.layers.{i}.{n}" for i in (0, 1) for n in norms} <= forward
    assert {"model.layers.0.self_attn", "model.layers.1.self_attn", "logits", "loss"} <= forward
    step = {r["name"] for r in by_case[("fp32_train", "step")]["records"] if r["kind"] == "param"}
    assert {f"model.layers.{i}.{n}.weight" for i in (0, 1) for n in norms} <= step
    norm_bug = by_case[("known_norm_bug", "forward")]["first_divergence"]
    assert (norm_bug["name"], norm_bug["origin"]) == ("model.layers.0.post_feedforward_layernorm", True)
    softcap = by_case[("known_softcap_bug", "forward")]
    first = softcap["first_divergence"]
    assert (first["name"], first["origin"], first["origin_module"]) == (
        "model.layers.1.self_attn.o_proj",
        False,
        "model.layers.1.self_attn",
    ), first
    assert softcap["isolation"]["origin"] == "model.layers.1.self_attn"


MEGATRON_FACTORY = """
import warnings

import torch

with warnings.catch_warnings():  # megatron-core's notices about apex and Transformer Engine
    warnings.simplefilter("ignore")
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig


def build():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True)
        return GPTModel(config, get_gpt_layer_local_spec(), vocab_size=32, max_sequence_length=16)


class Wrapper(torch.nn.Module):  # the user's own calling convention around a GPTModel
    def __init__(self):
        super().__init__()
        self.gpt = build()

    def forward(self, input_ids):
        s = input_ids.shape[-1]
        causal = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]
        positions = torch.arange(s)[None].expand_as(input_ids)
        return self.gpt(input_ids, positions, causal)


def build_wrapped():
    return Wrapper()
"""

CONFIG = """\
version: 1
models:
  base: {{source: factory, factory: "gpt_factory:{build}"{extra}}}
  cand: {{source: factory, factory: "gpt_factory:{build}"{extra}}}
inputs:
  tokens: {{kind: tokens, batch: 1, seq_len: 8, vocab_size: 32}}
cases:
  - {{name: gpt, baseline: base, candidate: cand, inputs: tokens, phases: [forward]}}
"""


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ("", "'runtime: megatron' on models.base"),
        (", runtime: nccl", "models.base.runtime: unknown value 'nccl' (allowed: megatron)"),
    ],
    ids=["runtime-missing", "runtime-unknown"],
)
def test_megatron_core_factory_without_its_runtime_is_one_message_naming_it(
    pytester: pytest.Pytester, run_pytest: RunPytest, extra: str, fragment: str
) -> None:
    """The issue's first symptom: megatron-core's "data parallel group is not initialized",
    now with what to set; a runtime the tool does not have is refused with the allowed one."""
    pytester.makepyfile(gpt_factory=MEGATRON_FACTORY)
    pytester.makefile(".yaml", align=CONFIG.format(build="build", extra=extra))
    result = run_pytest("--align-config", "align.yaml")
    text = result.stdout.str() + "\n" + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    errors = [line for line in text.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and fragment in errors[0], text
    assert "Traceback" not in text


@pytest.mark.parametrize(
    ("build", "prefix"), [("build", ""), ("build_wrapped", "gpt.")], ids=["gpt-model", "users-wrapper"]
)
def test_megatron_core_factory_with_its_runtime_is_called_as_gpt_model(
    pytester: pytest.Pytester, run_pytest: RunPytest, build: str, prefix: str
) -> None:
    """A plain megatron-core GPTModel from the user's factory, ``runtime: megatron`` on both
    sides: built inside the parallel state, called with position ids and the causal mask (the
    issue's second symptom: forward() missing position_ids and attention_mask); the same model
    twice is aligned. The user's own module around one is called as ``model(**inputs)`` inside
    the CPU workarounds (rotary embedding's torch.cuda.current_device)."""
    import torch
    from megatron.core import parallel_state

    current_device = torch.cuda.current_device
    before = (parallel_state.model_parallel_is_initialized(), torch.distributed.is_initialized())
    pytester.makepyfile(gpt_factory=MEGATRON_FACTORY)
    pytester.makefile(".yaml", align=CONFIG.format(build=build, extra=", runtime: megatron"))
    result = run_pytest("--align-config", "align.yaml", "--align-report", "out")
    assert result.parseoutcomes() == {"passed": 1}, result.stdout.str()
    # in process: the runtime the tool set up and the CPU workarounds are gone after the case
    assert (parallel_state.model_parallel_is_initialized(), torch.distributed.is_initialized()) == before
    assert torch.cuda.current_device is current_device
    (case,) = json.loads((pytester.path / "out" / "report.json").read_text())["cases"]
    assert case["first_divergence"] is None and case["compared"] > 10, case
    names = {r["name"] for r in case["records"]}
    assert {f"{prefix}decoder.layers.0.self_attention", f"{prefix}decoder.final_layernorm", "logits"} <= names


@pytest.mark.slow  # two subprocesses importing torch, transformers and megatron-core; tox -e slow
def test_own_megatron_model_from_the_command_line(tmp_path: Path) -> None:
    """The user's path without pytest: ``precalign run`` on the example (a subprocess); the
    aligned training case exits 0, the (1 + w) bug without its ``expect:`` exits 1 naming its
    origin."""
    folder = tmp_path / "megatron_own_model"
    shutil.copytree(EXAMPLES / "megatron_own_model", folder, ignore=shutil.ignore_patterns("__pycache__"))
    config = folder / "align.yaml"
    text = config.read_text()
    expect = "    expect: {phase: forward, first_divergence: model.layers.0.post_feedforward_layernorm, origin: true}\n"
    assert text.count(expect) == 1
    config.write_text(text.replace(expect, ""))

    def run(case: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest_precalign", "run", "align.yaml", "--case", case],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=900,
        )

    aligned = run("fp32_train")
    assert aligned.returncode == 0, aligned.stdout + aligned.stderr
    assert all(f"PASSED fp32_train[{p}]" in aligned.stdout for p in ("forward", "backward", "step"))
    bug = run("known_norm_bug")
    assert bug.returncode == 1, bug.stdout + bug.stderr
    assert "Origin: model.layers.0.post_feedforward_layernorm (forward, step 0)" in bug.stdout, bug.stdout
