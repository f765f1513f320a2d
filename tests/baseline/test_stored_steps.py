"""A stored baseline's optimizer steps are judged on their inputs too (run/update_check.py):
a run whose grads moved within tolerance (another CPU's sum order, planted) passes where AdamW
amplifies that past the step table; an eps changed since the baseline was recorded is named at
the optimizer step."""

from __future__ import annotations

from pathlib import Path

from pytest_precalign.baseline.store import check_case
from pytest_precalign.cli import main
from pytest_precalign.config.loader import load_config_file
from pytest_precalign.vocabulary import OPTIMIZER_UPDATE

NET = """
import torch


class Net(torch.nn.Module):
    # The last embedding feature is ~1e-9: the grads of fc.weight's last column are near zero.
    def __init__(self, grad_noise=0.0):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.fc = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 50)
        self.register_buffer("scale", torch.tensor([1.0] * 7 + [1e-9]))
        if grad_noise:
            signs = (torch.arange(64).reshape(8, 8) % 3 - 1).float()
            self.fc.weight.register_hook(lambda g: g + grad_noise * g.abs().max() * signs)

    def forward(self, input_ids):
        return self.head(torch.tanh(self.fc(self.embed(input_ids) * self.scale)))


def build(**kwargs):
    return Net(**kwargs)
"""

CONFIG = """
version: 1
models:
  net: {{source: factory, factory: "steps_net:build", kwargs: {{grad_noise: {noise}}}}}
inputs:
  toks: {{kind: tokens, batch: 4, seq_len: 8, vocab_size: 50, seed: 3, labels: true}}
tolerances:
  t:
    - {{match: "*", phase: backward, atol: 1.0e-6, rtol: 1.0e-5, why: "grads"}}
    - {{match: "*", atol: 2.0e-5, rtol: 1.0e-4, why: "after AdamW steps"}}
cases:
  - {{name: steps, baseline: net, candidate: net, inputs: toks, phases: [forward, backward, step],
     steps: 1, optimizer: {{name: adamw, lr: 1.0e-3, weight_decay: 0.01, eps: {eps}}},
     record: {{mode: tensor}}, tolerances: t}}
"""


def _write(folder: Path, noise: float, eps: float = 1e-8) -> Path:
    (folder / "steps_net.py").write_text(NET, encoding="utf-8")
    config = folder / "align.yaml"
    config.write_text(CONFIG.format(noise=noise, eps=eps), encoding="utf-8")
    return config


def test_a_stored_baselines_steps_are_judged_on_their_inputs(tmp_path: Path) -> None:
    config = _write(tmp_path, 0.0)
    assert main(["record", str(config), "--out", str(tmp_path / "bl")]) == 0

    _write(tmp_path, 1e-7)  # grads moved by 1e-7 of their largest element
    aligned = load_config_file(config)
    outcome = check_case(aligned, aligned.case("steps"), tmp_path / "bl", "none", run_id="noise")
    assert outcome.run is not None
    verdicts = outcome.run.verdicts
    assert verdicts["backward"].passed and verdicts["step"].passed, verdicts["step"].first
    explained = [p for p in outcome.run.comparison.pairs if p.note.startswith("beyond the table")]
    assert explained and all(p.checks[0].metric == OPTIMIZER_UPDATE for p in explained)

    _write(tmp_path, 0.0, eps=1e-6)  # the config's eps changed since the baseline was recorded
    aligned = load_config_file(config)
    outcome = check_case(aligned, aligned.case("steps"), tmp_path / "bl", "none", run_id="eps")
    assert outcome.run is not None
    first = outcome.run.verdicts["step"].first
    assert first is not None and (first.step, first.metric) == (0, OPTIMIZER_UPDATE), first
