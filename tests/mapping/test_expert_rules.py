"""Fused experts <-> one module per expert in a mapping: the ``unbind`` op (one ``[experts, ...]``
tensor <-> one tensor per expert) and a tensor rule's ``each: {e: $num_experts}``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precalign.errors import ConfigError
from pytest_precalign.mapping.spec import read_mapping_file, reverse
from pytest_precalign.mapping.transforms import TransformOp, apply_forward, apply_inverse
from pytest_precalign.mapping.weights import sync_weights

RULE = """tensors:
  - baseline: "layers.{i}.experts.gate_up_proj"
    candidate: "layers.{i}.local_experts.{e}.fc1.weight"
    each: {e: %(each)s}
    transform: {op: unbind, size: %(size)s, dim: 0}
"""


class Fused(torch.nn.Module):
    def __init__(self, experts: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.layers[0].experts = torch.nn.Module()
        self.layers[0].experts.gate_up_proj = torch.nn.Parameter(torch.randn(experts, 6, 4))


class PerExpert(torch.nn.Module):
    def __init__(self, experts: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.layers[0].local_experts = torch.nn.ModuleList(
            torch.nn.ModuleDict({"fc1": torch.nn.Linear(4, 6, bias=False)}) for _ in range(experts)
        )


def _mapping(tmp_path: Path, each: str = "$num_experts", size: str = "$num_experts", experts: int = 3):
    (tmp_path / "m.yaml").write_text(RULE % {"each": each, "size": size})
    return read_mapping_file(tmp_path / "m.yaml", "m", {"num_experts": experts})


def test_unbind_round_trips_bitwise_and_checks_its_size():
    t = torch.randn(3, 6, 4)
    op = TransformOp("unbind", (("size", 3), ("dim", 0)))
    parts = apply_forward([op], [t])
    assert len(parts) == 3 and all(torch.equal(p, t[k]) for k, p in enumerate(parts))
    (back,) = apply_inverse([op], parts, [t.shape])
    assert torch.equal(back, t)
    with pytest.raises(ValueError, match="unbind expects 4 slices along dim 0, the tensor has 3"):
        apply_forward([TransformOp("unbind", (("size", 4),))], [t])


def test_each_repeats_the_expert_patterns_in_order(tmp_path):
    (rule,) = _mapping(tmp_path).tensors
    assert rule.baseline == ("layers.{i}.experts.gate_up_proj",)
    assert rule.candidate == tuple(f"layers.{{i}}.local_experts.{k}.fc1.weight" for k in range(3))


def test_fused_experts_sync_into_one_module_per_expert_and_back_bitwise(tmp_path):
    mapping = _mapping(tmp_path)
    fused, per_expert, back = Fused(3), PerExpert(3), Fused(3)
    report = sync_weights(fused, per_expert, mapping, strict=True)
    assert (report.transformed, report.unsynced, report.unused) == (3, (), ())
    for k in range(3):  # expert k's weight is the fused tensor's slice k, as it is
        assert torch.equal(
            per_expert.layers[0].local_experts[k]["fc1"].weight, fused.layers[0].experts.gate_up_proj[k]
        )
    sync_weights(per_expert, back, reverse(mapping), strict=True)
    assert torch.equal(back.layers[0].experts.gate_up_proj, fused.layers[0].experts.gate_up_proj)


def test_unbind_size_that_does_not_fit_the_experts_is_one_message_naming_the_rule(tmp_path):
    mapping = _mapping(tmp_path, size="4", each="4", experts=4)
    with pytest.raises(ConfigError) as info:
        sync_weights(Fused(3), PerExpert(4), mapping, strict=True)
    message = str(info.value)
    assert f"{(tmp_path / 'm.yaml').resolve()}:2: tensors rule" in message, message
    assert "the transform does not fit parameter layers.0.local_experts.0.fc1.weight" in message
    assert "unbind expects 4 slices along dim 0, the tensor has 3" in message and "\n" not in message


@pytest.mark.parametrize(
    ("each", "size", "fragment"),
    [
        ("$experts", "3", "each: unknown variable '$experts' (known here: $num_experts)"),
        ("0", "3", "each: expected a placeholder name and a count >= 1, got e: 0"),
        ("3", "2", "transform: the transform yields 2 tensor(s) but 'candidate' names 3"),
        ("3", "two", "size: expected an integer, got 'two'"),
    ],
)
def test_bad_each_or_unbind_is_a_config_error_naming_the_key(tmp_path, each, size, fragment):
    with pytest.raises(ConfigError) as info:
        _mapping(tmp_path, each=each, size=size)
    assert fragment in str(info.value) and str(tmp_path / "m.yaml") in str(info.value), str(info.value)
