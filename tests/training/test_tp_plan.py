"""The DTensor tensor-parallel plan read back from a model ``parallelize_module`` parallelised
(``steps/tp_plan.py``, torch's real style hooks, a 1-rank gloo mesh in this process), and the
merge rules derived from it (``parallel/dtensor_rules.py``). The 2-rank and 4-rank runs compared
end to end are in ``test_dp_runs.py``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from pytest_precalign.parallel.dtensor_rules import (  # noqa: E402
    HASHED,
    OWN_SHARE,
    UNREAD,
    UNSPLIT,
    plan_rules,
)
from pytest_precalign.parallel.rules import rule_for  # noqa: E402
from pytest_precalign.trace.records import Record, Stats  # noqa: E402
from tests.helpers.one_rank_mesh import one_rank_mesh  # noqa: E402


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from one_rank_mesh(tmp_path_factory)


class Block(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.gate_proj = torch.nn.Linear(8, 16)
        self.up_proj = torch.nn.Linear(8, 16)
        self.act_fn = torch.nn.SiLU()
        self.down_proj = torch.nn.Linear(16, 8)

    def forward(self, x: Any) -> Any:
        x = self.norm(x)  # (the plan below is read, not run)
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def test_the_plan_is_read_from_the_hooks_parallelize_module_leaves(mesh: Any) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    from pytest_precalign.steps.sharded_layout import dtensor_block
    from pytest_precalign.steps.tp_plan import tp_plan

    model = torch.nn.Sequential(Block())
    plan = {
        "0.norm": SequenceParallel(),
        "0.gate_proj": ColwiseParallel(),
        "0.up_proj": ColwiseParallel(use_local_output=False),
        "0.down_proj": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate()),
    }
    parallelize_module(model, mesh, plan)
    read = tp_plan([model], ["m."])
    assert set(read) == {"m.0.norm", "m.0.gate_proj", "m.0.up_proj", "m.0.down_proj"}
    gate = read["m.0.gate_proj"]
    assert gate == {
        "style": "ColwiseParallel",
        "mesh": [1],
        "group": [0],
        "input": ["replicate"],
        "output": [{"shard": -1}],
        "use_local_output": True,
    }
    assert read["m.0.up_proj"]["use_local_output"] is False
    assert read["m.0.down_proj"]["input"] == [{"shard": -1}] and read["m.0.down_proj"]["output"] == [
        "replicate"
    ]
    assert read["m.0.norm"]["style"] == "SequenceParallel" and read["m.0.norm"]["use_local_output"] is False
    block = dtensor_block([model], ["m."])
    assert block is not None and block["tp_plan"] == read


def rec(name: str, kind: str, slot: str, shape: tuple[int, ...], seq: int, **kw: Any) -> Record:
    phase = "forward" if kind in ("input", "activation") else "backward"
    return Record(seq, name, "M", phase, 0, 0, kind, slot, "float32", shape, **kw)  # type: ignore[arg-type]


COL = {
    "style": "ColwiseParallel",
    "input": ["replicate"],
    "output": [{"shard": -1}],
    "use_local_output": True,
}
ROW = {
    "style": "RowwiseParallel",
    "input": [{"shard": -1}],
    "output": ["replicate"],
    "use_local_output": True,
}


def test_rules_from_the_plan_shard_local_outputs_and_what_runs_between_them() -> None:
    plan = {"b.gate_proj": COL, "b.up_proj": COL, "b.down_proj": ROW, "b.attn.q_proj": COL}
    records = [
        rec("b.gate_proj", "input", "in.0", (2, 3, 8), 0),
        rec("b.gate_proj", "activation", "out", (2, 3, 8), 1),
        rec("b.act_fn", "input", "in.0", (2, 3, 8), 2),
        rec("b.act_fn", "activation", "out", (2, 3, 8), 3),
        rec("b.up_proj", "activation", "out", (2, 3, 8), 4),
        rec("b.down_proj", "input", "in.0", (2, 3, 16), 5),
        rec("b.down_proj", "activation", "out", (2, 3, 8), 6),
        rec("b.dropout", "activation", "out", (2, 3, 8), 7),  # after the Rowwise input: replicated
        rec("b", "activation", "out.1", (2, 2, 3, 3), 8),
    ]
    derived = plan_rules(plan, records)
    sharded = {(r.name, r.role, r.dim) for r in derived.rules}
    assert sharded == {
        ("b.gate_proj", "out", -1),
        ("b.up_proj", "out", -1),
        ("b.attn.q_proj", "out", -1),
        ("b.act_fn", "in", -1),
        ("b.act_fn", "out", -1),
    }
    assert derived.own_share == {"b.gate_proj", "b.up_proj", "b.attn.q_proj"}
    grad = rec("b.act_fn", "grad_output", "out", (2, 3, 8), 9)
    assert rule_for(grad, derived.rules) is not None  # the grads follow their tensors
    assert rule_for(records[7], derived.rules) is None and rule_for(records[5], derived.rules) is None
    # Not merged, with the reason: a Colwise input's grad; an unsplit parent record the ranks
    # disagree on (the same one, agreeing, merges as replicated); a hashed shard.
    gin = rec("b.gate_proj", "grad_input", "in.0", (2, 3, 8), 10)
    assert derived.unmerged(gin, None, ranks_differ=False) == OWN_SHARE
    assert derived.unmerged(records[8], None, ranks_differ=True) == UNSPLIT
    assert derived.unmerged(records[8], None, ranks_differ=False) is None
    hashed = rec("b.gate_proj", "activation", "out", (2, 3, 8), 1, crc32=5)
    assert derived.unmerged(hashed, rule_for(hashed, derived.rules), ranks_differ=True) == HASHED
    stats = Stats(1.0, 0.0, 0.5, 1.0)
    kept = rec("b.gate_proj", "activation", "out", (2, 3, 8), 1, stats=stats)
    assert derived.unmerged(kept, rule_for(kept, derived.rules), ranks_differ=True) is None


def test_a_custom_parallel_style_is_read_as_unread_and_its_records_are_not_merged(mesh: Any) -> None:
    """A user's own ``ParallelStyle`` (``distribute_module`` with its own functions; the one of
    ``example_suites/recorded_runs/tp_styles.py``): an ``unread`` entry naming its class, so
    that its records are listed as not merged rather than taken for replicated ones."""
    import sys

    from pytest_precalign.steps.tp_plan import tp_plan
    from tests.helpers.user_runs import SCRIPTS

    sys.path.insert(0, str(SCRIPTS))
    try:
        from tp_styles import OwnColwise
    finally:
        sys.path.remove(str(SCRIPTS))
    from torch.distributed.tensor.parallel import parallelize_module

    model = torch.nn.Sequential(Block())
    parallelize_module(model, mesh, {"0.gate_proj": OwnColwise()})
    assert tp_plan([model]) == {
        "0.gate_proj": {"style": "OwnColwise", "unread": True, "mesh": [1], "group": [0]}
    }
    plan = {"b.gate_proj": {"style": "OwnColwise", "unread": True}, "b.down_proj": ROW}
    derived = plan_rules(plan, [])
    out = rec("b.gate_proj", "activation", "out", (2, 3, 8), 1)
    assert derived.unmerged(out, None, ranks_differ=True) == UNREAD
    assert derived.unmerged(out, None, ranks_differ=False) is None  # the same on every rank: merged
    gin = rec("b.gate_proj", "grad_input", "in.0", (2, 3, 8), 2)
    assert derived.unmerged(gin, None, ranks_differ=False) == UNREAD
    act = rec("b.act_fn", "activation", "out", (2, 3, 8), 3)  # in its parent, the ranks differ
    assert derived.unmerged(act, None, ranks_differ=True) == UNSPLIT


def test_a_sequence_parallel_norms_input_grad_is_its_own_share() -> None:
    """A ``SequenceParallel`` norm's input is a DTensor made from the rank's part of the residual
    stream for the norm alone: its grad is not the residual's, listed as not merged."""
    derived = plan_rules({"l.input_layernorm": {"style": "SequenceParallel", "use_local_output": False}}, [])
    gin = rec("l.input_layernorm", "grad_input", "in.0", (2, 6, 8), 1)
    assert derived.unmerged(gin, None, ranks_differ=False) == OWN_SHARE
    assert "SequenceParallel" in OWN_SHARE


def test_prepare_module_styles_are_read_and_their_local_tensors_merged(mesh: Any) -> None:
    """``PrepareModuleInput`` / ``PrepareModuleOutput`` / ``PrepareModuleInputOutput`` (the
    styles torchtitan gives the attention and feed-forward modules) leave lambdas over the style
    object: read from it (on main before this: not read, no entry, their local shards merged as
    replicated records: "ranks disagree"). What they hand on as a local ``Shard(d)`` tensor is
    concatenated on ``d``; the grads of the inputs they made are the module's share, listed."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        PrepareModuleInputOutput,
        PrepareModuleOutput,
        parallelize_module,
    )

    from pytest_precalign.steps.tp_plan import tp_plan

    model = torch.nn.Sequential(Block(), Block(), Block())
    plan = {
        "0": PrepareModuleInput(
            input_layouts=(Shard(1), None),
            desired_input_layouts=(Replicate(), None),
            input_kwarg_layouts={"mask": Replicate()},
            desired_input_kwarg_layouts={"mask": Replicate()},
        ),
        "1": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1)),
        "2": PrepareModuleInputOutput(
            input_layouts=(Shard(1),),
            desired_input_layouts=(Shard(1),),
            use_local_input=True,
            output_layouts=(Replicate(), Replicate()),
            desired_output_layouts=(Shard(0), Replicate()),
        ),
    }
    parallelize_module(model, mesh, plan)  # type: ignore[arg-type]
    read = tp_plan([model])
    where = {"mesh": [1], "group": [0]}
    assert read == {
        "0": {
            "style": "PrepareModuleInput",
            "input": ["replicate", None],
            "input_kwargs": {"mask": "replicate"},
            "use_local_input": False,
            **where,
        },
        "1": {"style": "PrepareModuleOutput", "output": [{"shard": 1}], "use_local_output": True, **where},
        "2": {
            "style": "PrepareModuleInputOutput",
            "input": [{"shard": 1}],
            "input_kwargs": {},
            "use_local_input": True,
            "output": [{"shard": 0}, "replicate"],
            "use_local_output": True,
            **where,
        },
    }
    derived = plan_rules({f"b.m{k}": v for k, v in read.items()}, [])
    assert {(r.name, r.role, r.slot, r.dim) for r in derived.rules} == {
        ("b.m1", "out", "*", 1),  # one local Shard(1) output
        ("b.m2", "in", "in.0", 1),  # a local input shard
        ("b.m2", "out", "out.0", 0),  # the first of two outputs, a local Shard(0)
    }
    assert derived.own_share == {"b.m0", "b.m2"}
    gin = rec("b.m0", "grad_input", "in.mask", (2, 3, 8), 1)
    assert derived.unmerged(gin, None, ranks_differ=False) == OWN_SHARE and "PrepareModuleInput" in OWN_SHARE
    replicated = rec("b.m0", "input", "in.0", (2, 3, 8), 0)  # a DTensor input: the full tensor
    assert rule_for(replicated, derived.rules) is None
    assert derived.unmerged(replicated, None, ranks_differ=False) is None
