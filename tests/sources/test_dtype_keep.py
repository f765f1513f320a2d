"""``dtype: keep``: a model the user built (factory) or loaded (pretrained) keeps its own dtypes
by default -- a bf16 model with an fp32 norm stays so, and is recorded per tensor in its dtypes;
the manifest says what building did ("kept: ..." or "cast to ... from ...")."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_precalign.config.loader import load_config_file
from pytest_precalign.errors import CaseError
from pytest_precalign.run.case import run_case
from pytest_precalign.sources.loading import build_model

NETS = """
import torch


class Mixed(torch.nn.Module):
    \"\"\"bf16 weights, an fp32 norm that the forward feeds in fp32 (as real bf16 models do).\"\"\"

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8).to(torch.bfloat16)
        self.norm = torch.nn.LayerNorm(8)  # float32
        self.head = torch.nn.Linear(8, 16).to(torch.bfloat16)

    def forward(self, input_ids):
        h = self.embed(input_ids)
        h = self.norm(h.float()).to(torch.bfloat16)
        return self.head(h)


def build():
    return Mixed()
"""

CONFIG = """
version: 1
{defaults}models:
  a: {{source: factory, factory: "mixed_nets:build"}}
inputs:
  toks: {{kind: tokens, batch: 1, seq_len: 4, vocab_size: 16, labels: true}}
cases:
  - {{name: same, baseline: a, candidate: a, inputs: toks, phases: [forward, backward]}}
"""


@pytest.fixture
def suite(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "mixed_nets.py").write_text(NETS, encoding="utf-8")
    yield tmp_path
    sys.modules.pop("mixed_nets", None)


def test_a_factory_model_keeps_its_dtypes_by_default(suite: Path) -> None:
    (suite / "align.yaml").write_text(CONFIG.format(defaults=""), encoding="utf-8")
    config = load_config_file(suite / "align.yaml")
    assert config.models["a"].dtype == "keep"
    run = run_case(config, config.case("same"))
    assert all(v.passed for v in run.verdicts.values())
    assert run.candidate.manifest["dtypes"] == "kept: bfloat16 x3, float32 x2"
    dtypes = {(r.name, r.kind): r.dtype for r in run.candidate.records if r.kind in ("activation", "param")}
    assert dtypes[("norm", "activation")] == "float32" and dtypes[("head", "activation")] == "bfloat16"


def test_a_dtype_in_the_defaults_casts_the_whole_model(suite: Path) -> None:
    """What keep avoids: cast whole, the model's own bf16 step meets fp32 weights. The cast is
    said (``LoadedModel.cast``, the manifest's ``dtypes``) and the failure is one line at the
    user's code."""
    (suite / "align.yaml").write_text(
        CONFIG.format(defaults="defaults: {dtype: float32}\n"), encoding="utf-8"
    )
    config = load_config_file(suite / "align.yaml")
    assert build_model(config.models["a"], suite).cast == "cast to float32 from bfloat16 x3, float32 x2"
    with pytest.raises(CaseError) as excinfo:
        run_case(config, config.case("same"))
    assert "the run raised RuntimeError: mat1 and mat2 must have the same dtype" in str(excinfo.value)
    assert f"(at {suite / 'mixed_nets.py'}:17, in forward)" in str(excinfo.value)
