"""``precalign compare --mapping``: a rule that applied to nothing, or a transform that does not
fit the shapes, is one ``precalign: error:`` line and exit code 2 (issue #12); a rule that
applies on some step or rank only is checked over all of them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from pytest_precalign.cli import main
from pytest_precalign.recording import HookRecorder
from pytest_precalign.trace.native_io import write_trace
from tests.helpers.paths import MSPROBE_DATA
from tests.mapping.test_usage import GOOD, Base, Fused


def _traces(tmp_path: Path) -> tuple[Path, Path]:
    torch.manual_seed(0)
    base, fused = Base(), Fused()
    with torch.no_grad():  # the fused model computes what the baseline does
        fused.fc1.weight.copy_(torch.cat([base.gate.weight, base.up.weight]))
        fused.fc1.bias.copy_(torch.cat([base.gate.bias, base.up.bias]))
        fused.proj.load_state_dict(base.out.state_dict())
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    out = []
    for name, model in (("base", base), ("fused", fused)):
        with HookRecorder(model, mode="tensor") as rec:
            model(x).sum().backward()
        out.append(write_trace(rec.trace({"side": name}), tmp_path / name))
    return out[0], out[1]


def _compare(tmp_path: Path, capsys: pytest.CaptureFixture[str], mapping: str) -> tuple[int, str]:
    a, b = _traces(tmp_path)
    (tmp_path / "m.yaml").write_text(mapping, encoding="utf-8")
    code = main(["compare", str(a), str(b), "--mapping", str(tmp_path / "m.yaml")])
    return code, capsys.readouterr().err


def test_a_mapping_whose_rules_all_apply_compares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _compare(tmp_path, capsys, GOOD)
    assert (code, err) == (0, "")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("    kinds: [activation, grad_output]\n", ""),
            "m.yaml:10: tensors rule 'fc1' matched no record (kinds [param]; "
            "did you mean kinds: [activation, grad_output, input]?)",
        ),
        (
            ("candidate: proj}", "candidate: prj}"),
            "m.yaml:2: renames rule 'prj' -> 'out' matched no record (",
        ),
        (
            ("{op: concat, dim: 1}", "[{op: concat, dim: 1}, {op: reshape, shape: [99]}]"),
            "m.yaml:10: tensors rule 'fc1': the transform does not fit fc1 (activation, out, step 0): "
            "candidate shape (5, 6), baseline shape (5, 3), (5, 3) (shape '[99]' is invalid for input of size 30)",
        ),
    ],
)
def test_a_rule_that_does_not_bite_exits_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: tuple[str, str], message: str
) -> None:
    code, err = _compare(tmp_path, capsys, GOOD.replace(*edit))
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("precalign: error: "), err
    assert f"{(tmp_path / 'm.yaml').resolve()}:{message.split(':', 1)[1]}" in err, err
    assert "Traceback" not in err


def _dump_set(root: Path, ranks: dict[int, str]) -> Path:
    """A dump root whose ranks hold the given msprobe dumps (tests/data/msprobe/micro)."""
    for rank, source in ranks.items():
        rank_dir = next((MSPROBE_DATA / "micro" / source / "step0").iterdir())
        shutil.copytree(rank_dir, root / "step0" / f"rank{rank}")
    return root


def test_rules_are_checked_over_every_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1 also dumped API calls (msprobe's mix level): a rule for them applies on rank 1
    only, which is enough; one that applies on no rank is the error, once, not once per rank."""
    ranks = {0: "base_micro_statistics_L0_statistics", 1: "base_micro_statistics_mix_statistics"}
    gold, targ = _dump_set(tmp_path / "g", ranks), _dump_set(tmp_path / "t", ranks)
    mapping = tmp_path / "m.yaml"
    mapping.write_text("renames:\n  - {baseline: Functional.silu, candidate: Functional.silu}\n")
    assert main(["compare", str(gold), str(targ), "--mapping", str(mapping)]) == 0
    capsys.readouterr()
    mapping.write_text(mapping.read_text() + "  - {baseline: Functional.gelu, candidate: Functional.gelu}\n")
    assert main(["compare", str(gold), str(targ), "--mapping", str(mapping)]) == 2
    assert capsys.readouterr().err == (
        f"precalign: error: {mapping.resolve()}:3: renames rule 'Functional.gelu' -> 'Functional.gelu' "
        "matched no record (set optional: true on a rule that may apply to nothing)\n"
    )


def test_layer_mapping_entries_must_bite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = "base_micro_statistics_L0_statistics"
    gold, targ = _dump_set(tmp_path / "g", {0: source}), _dump_set(tmp_path / "t", {0: source})
    lm = tmp_path / "lm.yaml"
    lm.write_text("Qwen2Model:\n  norm: norm\n")
    assert main(["compare", str(gold), str(targ), "--layer-mapping", str(lm)]) == 0
    capsys.readouterr()
    lm.write_text("Qwen2Model:\n  norm: norm\n  nothing.here: there\n")
    assert main(["compare", str(gold), str(targ), "--layer-mapping", str(lm)]) == 2
    assert capsys.readouterr().err == (
        f"precalign: error: {lm.resolve()}:3: layer_mapping entry Qwen2Model: 'nothing.here: there' "
        "matched no record (mark it 'there(optional)' if it may apply to nothing)\n"
    )
