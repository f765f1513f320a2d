"""Mapping rules must bite (issue #12): a rule that applies to no record and no parameter is one
error naming its file:line, unless it is ``optional``; a transform that does not fit the
shapes is one message naming the file:line, the rule, the record and both shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precalign.errors import ConfigError
from pytest_precalign.mapping.apply import map_trace
from pytest_precalign.mapping.layer_mapping import read_layer_mapping
from pytest_precalign.mapping.spec import MappingSpec, read_mapping_file, reverse
from pytest_precalign.mapping.usage import MappingUse, check_applied
from pytest_precalign.mapping.weights import sync_weights
from pytest_precalign.recording import HookRecorder
from pytest_precalign.trace.records import Trace


class Base(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(4, 3)
        self.up = torch.nn.Linear(4, 3)
        self.out = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.gate(x) * self.up(x))


class Fused(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 6)
        self.proj = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc1(x).split(3, dim=-1)
        return self.proj(gate * up)


GOOD = """\
renames:
  - {baseline: out, candidate: proj}
tensors:
  - baseline: [gate.weight, up.weight]
    candidate: fc1.weight
    transform: {op: concat, dim: 0}
  - baseline: [gate.bias, up.bias]
    candidate: fc1.bias
    transform: {op: concat, dim: 0}
  - baseline: [gate, up]
    candidate: fc1
    kinds: [activation, grad_output]
    transform: {op: concat, dim: 1}
"""


def _record(model: torch.nn.Module) -> Trace:
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    with HookRecorder(model, mode="tensor") as rec:
        model(x).sum().backward()
    return rec.trace({})


def _check(tmp_path: Path, text: str, *, sync: bool = True, layers: str | None = None) -> None:
    """Sync (optionally), record both models, map, and check every rule applied."""
    (tmp_path / "m.yaml").write_text(text, encoding="utf-8")
    mapping = read_mapping_file(tmp_path / "m.yaml", "m")
    if layers is not None:
        (tmp_path / "layers.yaml").write_text(layers, encoding="utf-8")
        mapping = MappingSpec(
            "m", mapping.renames, layer_mapping=read_layer_mapping(tmp_path / "layers.yaml")
        )
    torch.manual_seed(0)
    base, cand = Base(), Fused()
    report = sync_weights(base, cand, mapping, strict=False) if sync else None
    candidate = _record(cand)
    mapped = map_trace(candidate, _record(base), mapping)
    applied = mapped.applied | (report.applied if report else frozenset())
    check_applied(MappingUse.of(mapping, candidate, applied, params_seen=report is not None))


def test_every_rule_applied_passes(tmp_path: Path) -> None:
    _check(tmp_path, GOOD)
    _check(tmp_path, GOOD, sync=False)  # the param rules are not judged without parameters


def test_tensors_rule_without_kinds_names_its_line_and_the_kinds_it_would_match(tmp_path: Path) -> None:
    """The issue's case: ``kinds`` defaults to [param], so a module rule applied to nothing."""
    text = GOOD.replace("    kinds: [activation, grad_output]\n", "")
    with pytest.raises(ConfigError) as err:
        _check(tmp_path, text)
    assert str(err.value) == (
        f"{(tmp_path / 'm.yaml').resolve()}:10: tensors rule 'fc1' matched no record or parameter "
        "(kinds [param]; did you mean kinds: [activation, grad_output, input]?)"
    )


@pytest.mark.parametrize(
    ("old", "new", "sync", "line", "fragment"),
    [
        (
            "candidate: proj}",
            "candidate: prj}",
            True,
            2,
            "renames rule 'prj' -> 'out' matched no record or parameter",
        ),
        (
            "candidate: fc1.bias",
            "candidate: fc1.b",
            False,
            7,
            "tensors rule 'fc1.b' matched no record (kinds [param]",
        ),
        ("candidate: fc1\n", "candidate: fc\n", True, 10, "tensors rule 'fc' matched no record or parameter"),
    ],
)
def test_a_rule_that_matched_nothing_is_named(
    tmp_path: Path, old: str, new: str, sync: bool, line: int, fragment: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _check(tmp_path, GOOD.replace(old, new), sync=sync)
    message = str(err.value)
    assert message.startswith(f"{(tmp_path / 'm.yaml').resolve()}:{line}: {fragment}"), message
    assert "\n" not in message


def test_optional_rules_may_apply_to_nothing(tmp_path: Path) -> None:
    text = GOOD.replace(
        "candidate: proj}", "candidate: prj, optional: true}\n  - {baseline: out, candidate: proj}"
    )
    text += "layouts:\n  - {candidate: nothing.here, transform: [], optional: true}\n"
    text += "slots:\n  - {candidate: nothing, from: out, to: out.0, optional: true}\n"
    _check(tmp_path, text)


def test_layouts_and_slots_must_bite_and_more_are_counted(tmp_path: Path) -> None:
    text = GOOD + "layouts:\n  - {candidate: nothing.here, transform: []}\n"
    text += "slots:\n  - {candidate: nothing, from: out, to: out.0}\n"
    with pytest.raises(ConfigError) as err:
        _check(tmp_path, text)
    path = (tmp_path / "m.yaml").resolve()
    assert str(err.value) == (
        f"{path}:15: layouts rule 'nothing.here' matched no record (kinds [activation, input, "
        "grad_output, grad_input]; set optional: true on a rule that may apply to nothing); "
        f"1 more rule(s) matched nothing: {path}:17"
    )


def test_rules_of_kinds_not_recorded_are_not_judged(tmp_path: Path) -> None:
    """A rule for module inputs in a case that records none cannot apply; it is not an error."""
    text = (
        GOOD + "  - {baseline: [gate, up], candidate: fc9, kinds: [input], broadcast: true, transform: []}\n"
    )
    (tmp_path / "m.yaml").write_text(text, encoding="utf-8")
    mapping = read_mapping_file(tmp_path / "m.yaml", "m")
    torch.manual_seed(0)
    x = torch.randn(5, 4)
    traces = []
    for model in (Base(), Fused()):
        with HookRecorder(model, mode="tensor", inputs=False) as rec:
            model(x).sum().backward()
        traces.append(rec.trace({}))
    check_applied(
        MappingUse.of(mapping, traces[1], map_trace(traces[1], traces[0], mapping).applied, params_seen=False)
    )
    with_inputs = _record(Fused())  # now there are input records the rule could have matched
    with pytest.raises(
        ConfigError, match=r"m.yaml:14: tensors rule 'fc9' matched no record \(kinds \[input\]"
    ):
        check_applied(
            MappingUse.of(
                mapping, with_inputs, map_trace(with_inputs, traces[0], mapping).applied, params_seen=False
            )
        )


def test_a_reversed_mapping_is_judged_on_the_other_names(tmp_path: Path) -> None:
    """A mapping used the other way round (the fused model is the baseline) bites the same."""
    (tmp_path / "m.yaml").write_text(GOOD.replace("{baseline: out,", "{baseline: ot,"), encoding="utf-8")
    mapping = reverse(read_mapping_file(tmp_path / "m.yaml", "m"))
    torch.manual_seed(0)
    base = _record(Base())
    mapped = map_trace(base, _record(Fused()), mapping)
    with pytest.raises(ConfigError, match=r"m.yaml:2: renames rule 'ot' -> 'proj' matched no record \("):
        check_applied(MappingUse.of(mapping, base, mapped.applied, params_seen=False))


def test_layer_mapping_entries_must_bite_unless_optional(tmp_path: Path) -> None:
    layers = (
        "TopLayer:\n  proj: out\n  module: 0.module\nLinear:\n  weight: w\nVisionModel:\n  blocks: layers\n"
    )
    with pytest.raises(ConfigError) as err:
        _check(tmp_path, "renames: []\n", sync=False, layers=layers)
    path = (tmp_path / "layers.yaml").resolve()
    assert str(err.value) == (
        f"{path}:3: layer_mapping entry TopLayer: 'module: 0.module' matched no record (mark it "
        f"'0.module(optional)' if it may apply to nothing); 1 more rule(s) matched nothing: {path}:7"
    )
    optional = layers.replace("0.module", "0.module(optional)").replace(": layers", ": layers (optional)")
    _check(tmp_path, "renames: []\n", sync=False, layers=optional)
    assert read_layer_mapping(tmp_path / "layers.yaml").rules["VisionModel"] == ((("blocks",), "layers"),)


def test_a_transform_that_does_not_fit_is_one_message(tmp_path: Path) -> None:
    """The concat of gate and up is (5, 6): a reshape to (5, 7) cannot be undone on fc1's output."""
    text = GOOD.replace("{op: concat, dim: 1}", "[{op: concat, dim: 1}, {op: reshape, shape: [5, 7]}]")
    with pytest.raises(ConfigError) as err:
        _check(tmp_path, text, sync=False)
    message = str(err.value)
    assert message.startswith(
        f"{(tmp_path / 'm.yaml').resolve()}:10: tensors rule 'fc1': the transform does not fit "
        "fc1 (activation, out, step 0): candidate shape (5, 6), baseline shape (5, 3), (5, 3) ("
    ), message
    assert "\n" not in message


def test_a_weight_transform_that_does_not_fit_is_one_message(tmp_path: Path) -> None:
    text = GOOD.replace("{op: concat, dim: 0}", "[{op: concat, dim: 0}, {op: reshape, shape: [7, 7]}]", 1)
    with pytest.raises(ConfigError) as err:
        _check(tmp_path, text)
    message = str(err.value)
    assert message.startswith(
        f"{(tmp_path / 'm.yaml').resolve()}:4: tensors rule 'fc1.weight': the transform does not fit "
        "parameter fc1.weight (weights.sync): candidate shape (6, 4), baseline shape (3, 4), (3, 4) ("
    ), message
