from __future__ import annotations

import pytest
import torch

from pytest_precalign.errors import CaseError
from pytest_precalign.mapping.apply import map_trace
from pytest_precalign.mapping.spec import (
    MappingSpec,
    NameRule,
    TensorRule,
    to_baseline_name,
    to_candidate_name,
)
from pytest_precalign.mapping.transforms import TransformOp, apply_forward, apply_inverse
from pytest_precalign.mapping.weights import expand_rule, sync_weights
from pytest_precalign.trace.records import Record, Trace

MEGATRON_RENAMES = MappingSpec(
    name="m",
    renames=(
        NameRule("model.layers.{i}.self_attn.o_proj", "decoder.layers.{i}.self_attention.linear_proj"),
        NameRule("model.layers", "decoder.layers"),
        NameRule("model.embed_tokens", "embedding.word_embeddings"),
    ),
)


@pytest.mark.parametrize(
    ("candidate", "baseline"),
    [
        ("decoder.layers.3.self_attention.linear_proj", "model.layers.3.self_attn.o_proj"),
        ("decoder.layers.3.self_attention.linear_proj.weight", "model.layers.3.self_attn.o_proj.weight"),
        ("decoder.layers.12.mlp", "model.layers.12.mlp"),
        ("embedding.word_embeddings.weight", "model.embed_tokens.weight"),
        ("output_layer", "output_layer"),  # no rule: the name is kept
        ("decoder.layersX", "decoder.layersX"),  # prefixes match at dot boundaries only
    ],
)
def test_renames_both_ways(candidate, baseline):
    assert to_baseline_name(MEGATRON_RENAMES, candidate) == baseline
    if candidate != baseline:
        assert to_candidate_name(MEGATRON_RENAMES, baseline) == candidate


def _rule(ops, n_in, n_out):
    base = tuple(f"b{i}" for i in range(n_in))
    cand = tuple(f"c{i}" for i in range(n_out))
    return TensorRule(base, cand, tuple(TransformOp(name, tuple(params.items())) for name, params in ops))


CASES = [
    ("concat", [("concat", {"dim": 0})], [(3, 4), (5, 4)], 1),
    ("concat dim1", [("concat", {"dim": 1})], [(3, 4), (3, 2)], 1),
    ("split", [("split", {"dim": 0, "sizes": [2, 4]})], [(6, 3)], 2),
    ("permute", [("permute", {"dims": [2, 0, 1]})], [(2, 3, 4)], 1),
    ("transpose", [("transpose", {"dim0": 0, "dim1": 1})], [(2, 3)], 1),
    ("reshape", [("reshape", {"shape": [6, 4]})], [(2, 3, 4)], 1),
    ("qkv", [("qkv_fuse", {"num_heads": 4, "num_kv_heads": 2})], [(4 * 8, 16), (2 * 8, 16), (2 * 8, 16)], 1),
    ("qkv bias", [("qkv_fuse", {"num_heads": 6, "num_kv_heads": 3})], [(6 * 4,), (3 * 4,), (3 * 4,)], 1),
    (
        "qkv last dim",
        [("qkv_fuse", {"num_heads": 4, "num_kv_heads": 1, "dim": 2})],
        [(2, 5, 32), (2, 5, 8), (2, 5, 8)],
        1,
    ),
    ("chain", [("concat", {"dim": 0}), ("transpose", {"dim0": 0, "dim1": 1})], [(3, 4), (5, 4)], 1),
]


@pytest.mark.parametrize(("label", "ops", "shapes", "n_out"), CASES, ids=[c[0] for c in CASES])
def test_every_transform_round_trips_bitwise(label, ops, shapes, n_out):
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(s, generator=gen) for s in shapes]
    rule = _rule(ops, len(shapes), n_out)
    forward = apply_forward(rule.ops, tensors)
    assert len(forward) == n_out
    back = apply_inverse(rule.ops, forward, shapes)
    assert len(back) == len(tensors)
    for a, b in zip(tensors, back, strict=True):
        assert torch.equal(a, b)


def test_qkv_fuse_groups_rows_per_kv_group():
    heads, groups, d = 4, 2, 2
    q = torch.arange(heads * d).float().reshape(-1, 1)  # q rows 0..7: heads 0,1 in group 0
    k = 100 + torch.arange(groups * d).float().reshape(-1, 1)
    v = 200 + torch.arange(groups * d).float().reshape(-1, 1)
    rule = _rule([("qkv_fuse", {"num_heads": heads, "num_kv_heads": groups})], 3, 1)
    (fused,) = apply_forward(rule.ops, [q, k, v])
    expected = [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]
    assert fused.reshape(-1).tolist() == expected


def test_gate_up_concat_is_not_a_plain_shard_concat():
    """fc1 = [gate; up]; a TP layout bug (plain concat of [gate_r; up_r] shards) is visible."""
    gate, up = torch.randn(8, 4), torch.randn(8, 4)
    rule = _rule([("concat", {"dim": 0})], 2, 1)
    (fc1,) = apply_forward(rule.ops, [gate, up])
    shards = [torch.cat([gate[:4], up[:4]]), torch.cat([gate[4:], up[4:]])]
    assert not torch.equal(torch.cat(shards), fc1)


def test_expand_rule_binds_placeholders():
    rule = TensorRule(
        ("model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"),
        ("decoder.layers.{i}.mlp.linear_fc1.weight",),
        (TransformOp("concat", (("dim", 0),)),),
    )
    names = [f"model.layers.{i}.mlp.{p}.weight" for i in range(2) for p in ("gate_proj", "up_proj")]
    assert expand_rule(rule, names) == [
        (
            ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"],
            ["decoder.layers.0.mlp.linear_fc1.weight"],
        ),
        (
            ["model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight"],
            ["decoder.layers.1.mlp.linear_fc1.weight"],
        ),
    ]


class _Split(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(4, 6, bias=False)
        self.up = torch.nn.Linear(4, 6, bias=False)
        self.out = torch.nn.Linear(6, 4)


class _Fused(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 12, bias=False)
        self.proj = torch.nn.Linear(6, 4)


FUSED = MappingSpec(
    name="fused",
    renames=(NameRule("out", "proj"),),
    tensors=(
        TensorRule(("gate.weight", "up.weight"), ("fc1.weight",), (TransformOp("concat", (("dim", 0),)),)),
    ),
)


def test_sync_weights_renames_and_transforms():
    torch.manual_seed(0)
    base, cand = _Split(), _Fused()
    report = sync_weights(base, cand, FUSED, strict=True)
    assert (report.copied, report.transformed, report.unsynced, report.unused) == (2, 1, (), ())
    assert torch.equal(cand.fc1.weight, torch.cat([base.gate.weight, base.up.weight]))
    assert torch.equal(cand.proj.bias, base.out.bias)


def test_sync_weights_strict_names_what_is_missing():
    base, cand = _Split(), _Fused()
    with pytest.raises(
        CaseError,
        match=r"3 candidate parameter\(s\) have no baseline source: fc1.weight, proj.weight, proj.bias",
    ):
        sync_weights(base, cand, None, strict=True)
    report = sync_weights(base, cand, None, strict=False)
    assert report.unsynced == ("fc1.weight", "proj.weight", "proj.bias")


def test_sync_weights_strict_names_baseline_parameters_nothing_consumed():
    """A baseline parameter no candidate parameter reads (HF Qwen3's q_norm against a mapping
    without it) is an error under strict, named with the count and the mapping; strict: false
    reports it instead."""
    base = torch.nn.ModuleDict({f"l{i}": torch.nn.Linear(2, 2) for i in range(4)})
    base["norm"] = torch.nn.LayerNorm(2)
    cand = torch.nn.ModuleDict({f"l{i}": torch.nn.Linear(2, 2) for i in range(4)})
    mapping = MappingSpec(name="mine", where="align.yaml:7")
    extra = "l0.weight, l0.bias, l1.weight, l1.bias, l2.weight ... (10 in all)"
    with pytest.raises(CaseError) as info:
        sync_weights(base, torch.nn.ModuleDict({"x": torch.nn.Linear(3, 3)}), mapping, strict=True)
    assert f"10 baseline parameter(s) were not consumed: {extra}" in str(info.value)
    assert "mapping 'mine' (align.yaml:7)" in str(info.value)
    with pytest.raises(
        CaseError, match=r"2 baseline parameter\(s\) were not consumed: norm.weight, norm.bias \("
    ):
        sync_weights(base, cand, mapping, strict=True)
    report = sync_weights(base, cand, mapping, strict=False)
    assert (report.copied, report.unsynced, report.unused) == (8, (), ("norm.weight", "norm.bias"))
    assert report.as_dict()["unused"] == ["norm.weight", "norm.bias"]
    assert torch.equal(cand["l3"].weight, base["l3"].weight)


def test_sync_weights_shape_mismatch_is_a_clear_error():
    base = torch.nn.Sequential(torch.nn.Linear(4, 4))
    cand = torch.nn.Sequential(torch.nn.Linear(4, 5))
    with pytest.raises(
        CaseError, match=r"shape mismatch: candidate 0.weight \(5, 4\) <- baseline 0.weight \(4, 4\)"
    ):
        sync_weights(base, cand, None, strict=True)


def test_map_trace_renames_records_and_dependencies():
    rec = Record(
        seq=0,
        name="decoder.layers.0.mlp",
        module_class="MLP",
        phase="forward",
        step=0,
        call=0,
        kind="activation",
        slot="out",
        dtype="float32",
        shape=(2,),
        deps=("decoder.layers.0.mlp|input|in.0|0|0",),
    )
    dep = Record(
        seq=0,
        name="decoder.layers.0.mlp",
        module_class="MLP",
        phase="forward",
        step=0,
        call=0,
        kind="input",
        slot="in.0",
        dtype="float32",
        shape=(2,),
    )
    rec = Record(**{**rec.__dict__, "seq": 1})
    mapped = map_trace(Trace({"record_mode": "stats"}, (dep, rec)), Trace({}, ()), MEGATRON_RENAMES).trace
    assert mapped.records[1].name == "model.layers.0.mlp"
    assert mapped.records[1].deps == ("model.layers.0.mlp|input|in.0|0|0",)
