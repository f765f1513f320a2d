"""Our traces written as msprobe dumps: read back by our reader, accepted by msprobe itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precalign.errors import TraceError
from pytest_precalign.msprobe import read_msprobe_dump, write_msprobe_dump
from pytest_precalign.recording import HookRecorder
from tests.helpers.msprobe_cli import msprobe_compare, needs_msprobe
from tests.helpers.tiny_lm import tiny_causal_lm


def _tiny_qwen2(perturb: bool):
    model = tiny_causal_lm(vocab=128, hidden=16, layers=1)
    if perturb:
        with torch.no_grad():
            weight = model.model.layers[0].mlp.down_proj.weight
            weight += 1e-2 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(3))
    return model


def _dump(tmp_path: Path, name: str, mode: str, perturb: bool) -> Path:
    model = _tiny_qwen2(perturb)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))
    with HookRecorder(model, mode=mode) as rec:
        model(input_ids=ids, labels=ids).loss.backward()
    write_msprobe_dump(rec.trace(), tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize("mode", ["tensor", "stats", "hash"])
def test_written_dump_reads_back_as_the_same_records(tmp_path, mode):
    model = _tiny_qwen2(False)
    ids = torch.randint(0, 128, (1, 8))
    with HookRecorder(model, mode=mode) as rec:
        model(input_ids=ids, labels=ids).loss.backward()
    trace = rec.trace()
    write_msprobe_dump(trace, tmp_path / "d")
    back = read_msprobe_dump(tmp_path / "d" / "step0" / "rank0")
    assert back.manifest["task"] == ("tensor" if mode == "tensor" else "statistics")
    ours = {(r.name, r.kind, r.call) for r in trace.records if r.kind not in ("logits", "loss", "param")}
    theirs = {(r.name, r.kind, r.call) for r in back.records}
    assert ours == theirs
    q = next(
        r for r in back.records if r.name == "model.layers.0.self_attn.q_proj" and r.kind == "activation"
    )
    original = next(r for r in trace.records if r.name == q.name and r.kind == "activation")
    if mode == "hash":
        assert q.crc32 == original.crc32
    else:
        assert q.stats is not None and original.stats is not None
        assert q.stats.max == pytest.approx(original.stats.max)
    if mode == "tensor":
        assert torch.equal(back.tensor(q), trace.tensor(original))
    with pytest.raises(TraceError, match="a dump already exists there; refusing to overwrite it"):
        write_msprobe_dump(trace, tmp_path / "d")
    write_msprobe_dump(trace, tmp_path / "d", overwrite=True)  # replaced whole, nothing left over
    assert sorted(p.name for p in (tmp_path / "d" / "step0").iterdir()) == ["rank0"]
    assert read_msprobe_dump(tmp_path / "d" / "step0" / "rank0").records == back.records


@needs_msprobe
@pytest.mark.parametrize("mode", ["tensor", "stats", "hash"])
def test_msprobe_compare_accepts_our_dumps(tmp_path, mode):
    base = _dump(tmp_path, "base", mode, perturb=False)
    pert = _dump(tmp_path, "pert", mode, perturb=True)
    out = tmp_path / "out"
    text = msprobe_compare(pert / "step0", base / "step0", out)
    assert "Module.model.layers.0.mlp.down_proj.Linear.forward.0.output.0" in text


def test_written_dump_keeps_execution_order(tmp_path):
    """A parent's output is written after its children's, as msprobe's hooks do, so the first
    divergence read back from our dumps is the innermost module."""
    base = read_msprobe_dump(_dump(tmp_path, "b", "stats", perturb=False) / "step0" / "rank0")
    acts = [r.name for r in base.records if r.kind == "activation"]
    assert acts.index("model.layers.0.mlp.down_proj") < acts.index("model.layers.0.mlp") < acts.index("model")
    pert = read_msprobe_dump(_dump(tmp_path, "p", "stats", perturb=True) / "step0" / "rank0")
    from pytest_precalign.compare.pairs import compare_traces
    from pytest_precalign.compare.tolerances import ToleranceRule, ToleranceTable
    from pytest_precalign.verdict.phase import phase_verdict

    table = ToleranceTable("t", (ToleranceRule(atol=1e-6, rtol=1e-5),))
    verdict = phase_verdict(
        compare_traces(base, pert, table), "forward", None, False, parents=base.manifest["parents"]
    )
    assert verdict.first is not None and (verdict.first.name, verdict.first.origin) == (
        "model.layers.0.mlp.down_proj",
        True,
    )
