"""Stats mode on a ``torch.compile``d model (``recording/compiled_stats.py``): the statistics are
computed inside the compiled graph, so recording changes neither dynamo's graph and break
counts nor the loss and grads (bitwise), and the statistics are the eager recorder's within
the documented rule. The backend is ``aot_eager`` (dynamo and AOT autograd as inductor gets
them, without inductor's minutes of compiling on 2 cores): the same tensors as eager, so the
statistics can be held to the eager recorder's bits; inductor runs in the slow tests."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from pytest_precalign.recording import HookRecorder
from pytest_precalign.recording.compiled_stats import in_graph_stats
from pytest_precalign.recording.in_graph_vector import NORM_BOUND, SUM_BOUND, stats_vector_in_graph
from pytest_precalign.trace.records import Record
from tests.helpers.user_runs import compare
from tests.recording.compiled_user_run import TinyLM

HERE = Path(__file__).parent
REPO = HERE.parents[1]


def _step(
    model: torch.nn.Module, run: torch.nn.Module, ids: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(run(ids)[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _counts() -> tuple[int, int]:
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def _bitwise(
    a: tuple[torch.Tensor, dict[str, torch.Tensor]], b: tuple[torch.Tensor, dict[str, torch.Tensor]]
) -> bool:
    return (
        torch.equal(a[0], b[0])
        and a[1].keys() == b[1].keys()
        and all(torch.equal(a[1][k], b[1][k]) for k in a[1])
    )


def _same_stats(eager: Record, compiled: Record) -> None:
    """The documented rule: max, min and the counts exact; the mean within SUM_BOUND * mean|x|
    (<= max|x|) and the norm within NORM_BOUND relatively of the eager recorder's float64 sums
    (1e-12 more for the float64 roundings of both)."""
    a, b = eager.stats, compiled.stats
    assert a is not None and b is not None, eager.id
    assert (eager.dtype, eager.shape, eager.deps) == (compiled.dtype, compiled.shape, compiled.deps), eager.id
    assert (a.max, a.min, a.nan, a.inf) == (b.max, b.min, b.nan, b.inf), eager.id
    scale = max(abs(a.max), abs(a.min), 1e-30)
    assert abs(a.mean - b.mean) <= (SUM_BOUND + 1e-12) * scale, (eager.id, a.mean, b.mean)
    assert math.isclose(a.norm, b.norm, rel_tol=NORM_BOUND + 1e-12), (eager.id, a.norm, b.norm)


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_stats_mode_keeps_the_compiled_graph_whole_and_the_numbers_bitwise() -> None:
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = TinyLM()
    ids = torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(1))
    run = torch.compile(model, backend="aot_eager")

    with HookRecorder(run, mode="stats") as rec:  # the first compiled forward is a recorded one
        recorded = _step(model, run, ids)
    assert _counts() == (1, 0)  # one whole graph, the statistics in it
    bare = _step(model, run, ids)  # unrecorded: the variant without them, compiled once
    assert _counts() == (2, 0)
    assert in_graph_stats(model).calls == []  # an unrecorded step keeps nothing
    assert _bitwise(recorded, bare)
    with HookRecorder(run, mode="stats") as again:  # both variants cached: nothing compiled
        assert _bitwise(_step(model, run, ids), bare)
    assert _counts() == (2, 0)

    with HookRecorder(run, mode="stats") as twice:  # two micro-batches in a step: nothing compiled
        assert _bitwise(_step(model, run, ids), bare) and _bitwise(_step(model, run, ids), bare)
    assert _counts() == (2, 0)
    grads = {(r.name, r.slot, r.call): r.stats for r in twice.trace({}).records if r.kind == "grad_output"}
    assert grads and {c for _, _, c in grads} == {0, 1}  # each forward's rows from its own backward
    assert all(grads[n, s, 1] == stats for (n, s, c), stats in grads.items() if c == 0)

    trace = rec.trace({})
    assert [r.id for r in again.trace({}).records] == [r.id for r in trace.records]
    with HookRecorder(model, mode="stats") as eager_rec:  # the eager model, eager hooks
        assert _step(model, model, ids)[0].item() == pytest.approx(bare[0].item(), rel=1e-6)
    eager = {r.id: r for r in eager_rec.trace({}).records}
    compiled = {r.id: r for r in trace.records}
    assert not any("_orig_mod" in rid for rid in compiled)
    # every record of the eager recorder, the module inputs' grads included, the module records
    # in its order (the parameter grads' hooks run after the compiled backward)
    assert compiled.keys() == eager.keys()
    assert [i for i in compiled if "param_grad" not in i] == [i for i in eager if "param_grad" not in i]
    assert "not_recordable" not in trace.manifest
    assert trace.manifest["compiled"] == {"stats": "in the graph"}
    kinds = {r.kind for r in trace.records}
    assert kinds == {"input", "activation", "grad_output", "grad_input", "param_grad"}
    for rid, record in compiled.items():
        _same_stats(eager[rid], record)
    # Each input here is another module's output: its grad takes that output's row, so the
    # compiled backward computes each grad's statistics once (one sink row per output grad).
    outputs = sum(r.kind == "grad_output" for r in trace.records)
    assert sum(r.kind == "grad_input" for r in trace.records) == 11
    with HookRecorder(run, mode="stats"):
        run(ids)  # the rows one recorded forward took: nothing compiled
        assert in_graph_stats(model).grads.next_row == outputs
    assert _counts() == (2, 0)


def test_compiled_user_run_records_what_the_eager_run_does_and_compares_aligned(tmp_path: Path) -> None:
    """A user's loop on a compiled model (``compiled_user_run.py``, steps 1 and 2 recorded: the
    model was compiled on a step ``Recorder.start`` did not record) against the same loop
    eager: the same losses and grad norms bit for bit, one whole graph per variant, and
    ``precalign compare`` aligned, saying which records the compiled side could not take."""
    runs = {}
    for backend in ("eager", "aot_eager"):
        done = subprocess.run(
            [sys.executable, str(HERE / "compiled_user_run.py"), str(tmp_path / backend), backend, "1+2"],
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs[backend] = json.loads((tmp_path / backend / "facts.json").read_text(encoding="utf-8"))
    assert runs["aot_eager"]["bits"] == runs["eager"]["bits"]
    assert (runs["aot_eager"]["graphs"], runs["aot_eager"]["breaks"]) == (2, 0)  # unrecorded, recorded
    judged = compare(tmp_path / "eager" / "run", tmp_path / "aot_eager" / "run", tmp_path / "report")
    assert judged.exit_code == 0, judged.output
    assert judged.training["first_divergent_step"] is None
    assert judged.training["not_compared"] == []  # the module inputs' grads compared too
    # 2 steps of 12 output grads, 11 input grads, 15 parameter grads: each of the eager run's
    assert "PASSED run_vs_run[backward]: 76 compared" in judged.output, judged.output


@pytest.mark.slow  # two runs of the user's script and a compare (~25 s on a loaded machine)
def test_a_fault_in_a_module_backward_is_found_at_that_module_under_compile(tmp_path: Path) -> None:
    """The eager run against a compiled one whose second block's activation has a wrong
    backward (``compiled_user_run.py ... fault``): the compare names that module, from its
    input's grad (its output's grad matched), at step 0's backward."""
    for side, args in (("eager", ["eager"]), ("fault", ["aot_eager", "0+1+2", "fault"])):
        done = subprocess.run(
            [sys.executable, str(HERE / "compiled_user_run.py"), str(tmp_path / side), *args],
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads((tmp_path / "fault" / "facts.json").read_text(encoding="utf-8"))
    assert (facts["graphs"], facts["breaks"]) == (1, 0)
    judged = compare(tmp_path / "eager" / "run", tmp_path / "fault" / "run", tmp_path / "report")
    assert judged.exit_code == 1, judged.output
    assert judged.verdict() == (0, "backward")
    assert judged.training["origin"] == "layers.1.act"
    assert "first divergence layers.1.act (grad_input" in judged.output


@pytest.mark.slow  # an inductor compile (C++), ~10 s on 2 cores
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_graph_statistics_are_vectorised_and_count_nan_and_inf_exactly(dtype: torch.dtype) -> None:
    """Inductor's CPU code for the statistics vector has no element-by-element loop (it has no
    vector ``isnan``/``isinf`` for float64: those tested 16 values one at a time, most of the
    kernel's time); max, min and the counts run on the tensor's own lanes (float, int32 counts:
    twice as many per vector as the float64 widening and int64), the sums in float32 within a
    block and in float64 across blocks, all from one load of each vector; the counts are exact
    with NaN, +Inf and -Inf in the tensor, the sums within the documented bound."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    t = torch.randn(4096, generator=torch.Generator().manual_seed(0)).to(dtype)
    t[[3, 700, 701]] = torch.nan
    t[[5, 9]] = torch.inf
    t[4000] = -torch.inf
    vector, codes = run_and_get_code(torch.compile(stats_vector_in_graph, backend="inductor"), t)
    assert vector[4:].tolist() == [3.0, 3.0]
    assert torch.isnan(vector[:4]).all()  # max, min, sum, squares of a tensor holding NaN
    code = "\n".join(codes)
    assert "std::isnan(tmpbuf" not in code and "std::isinf(tmpbuf" not in code, code[:2000]
    lanes = r"VectorizedN?<{}(,\d+)?> tmp_acc\d+_vec "  # an accumulator's lanes
    assert re.search(lanes.format("float"), code), code[:4000]  # max, min
    assert re.search(lanes.format("int32_t"), code) and not re.search(lanes.format("int64_t"), code)
    # one pass: the 4 vectors of a block loaded once for all six statistics, and widened to
    # float64 only as the two block sums (before: each loaded vector widened, 1 load / 1 widening)
    loads, widened = re.findall(r"loadu\(in_ptr0 ", code), re.findall(r"at::vec::convert<double", code)
    assert (len(loads), len(widened)) == (4, 2), code[:4000]
    finite = torch.randn(4096, generator=torch.Generator().manual_seed(1)).to(dtype)
    vector = torch.compile(stats_vector_in_graph, backend="inductor")(finite)
    wide = finite.double()
    assert vector[:2].tolist() == [wide.max().item(), wide.min().item()]
    assert vector[4:].tolist() == [0.0, 0.0]
    _within_the_bound(vector, finite)
    same_sign = torch.full((2**20 + 100,), 1 / 3, dtype=dtype)  # every float32 sum rounds alike
    _within_the_bound(torch.compile(stats_vector_in_graph, backend="inductor")(same_sign), same_sign)


def _within_the_bound(vector: torch.Tensor, t: torch.Tensor) -> None:
    """max, min and the counts exact, the sum and the norm within the documented bound of the
    exact float64 sums (1e-12 more: the float64 roundings)."""
    wide = t.double()
    assert vector[:2].tolist() == [wide.max().item(), wide.min().item()]
    assert vector[4:].tolist() == [wide.isnan().sum().item(), wide.isinf().sum().item()]
    total, magnitude = wide.sum().item(), wide.abs().sum().item()
    assert abs(vector[2].item() - total) <= (SUM_BOUND + 1e-12) * magnitude, (vector[2].item(), total)
    norm, got = wide.square().sum().sqrt().item(), vector[3].item() ** 0.5
    assert math.isclose(got, norm, rel_tol=NORM_BOUND + 1e-12), (got, norm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float32_block_sums_stay_within_the_documented_bound_on_same_sign_values(dtype: torch.dtype) -> None:
    """The sums add 4 values per lane in float32 before float64: on long runs of
    same-sign values of large magnitude, where every float32 rounding goes the same way (a
    float32 sum of the whole tensor is 2.9 * 2**-24 off in norm on the constant one, over the
    bound), the sum and the norm stay within the documented bound, with a tail past the last
    whole block of 64 and a tensor too small for a block."""
    uniform = torch.rand(1024, 1027, generator=torch.Generator().manual_seed(0)) * 1024 + 1024
    for t in (torch.full((2**20 + 100,), 1 / 3), uniform, uniform[:3, :41]):
        t = t.to(dtype)
        _within_the_bound(stats_vector_in_graph(t), t)


class Nested(torch.nn.Module):
    """A module whose output nests a tuple in a tuple (not rebuilt by the in-graph grads)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor]]:
        y = self.lin(x)
        return y, (y * 2,)


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.nested, self.head = Nested(), torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, (z,) = self.nested(x)
        return self.head(y + z)


@pytest.mark.slow  # two aot_eager compiles (~20 s on a loaded machine)
def test_compiled_grads_no_backward_delivered_once_are_listed_with_why_not_recorded() -> None:
    """Fail closed: a recorded forward no backward followed (a grad-enabled evaluation) and an
    output nested deeper than one container have no grad records; each is listed as not
    recordable with why, and the forward that was followed by its backward is recorded."""
    from pytest_precalign.recording.compiled_grads import NESTED, NOT_DELIVERED

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TwoLayers()
    run = torch.compile(model, backend="aot_eager")
    x = torch.randn(3, 4)
    with HookRecorder(run, mode="stats") as rec:
        run(x)  # no backward
        run(x).sum().backward()
    trace = rec.trace({})
    grads = {r.id for r in trace.records if r.kind == "grad_output"}
    assert grads == {"head|grad_output|out|0|1", "nested.lin|grad_output|out|0|1"}
    why = trace.manifest["not_recordable"]
    assert why["head|grad_output|out|0|0"] == why["nested.lin|grad_output|out|0|0"] == NOT_DELIVERED
    assert why["nested|grad_output|out.0|0|1"] == why["nested|grad_output|out.1.0|0|1"] == NESTED


class Gate(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.lin(hidden_states) * mask


class Pair(torch.nn.Module):
    def forward(self, pair: tuple[torch.Tensor, torch.Tensor], scale: float) -> torch.Tensor:
        return pair[0] * pair[1] * scale


class Inputs(torch.nn.Module):
    """Module inputs of every kind: another module's output, a residual sum (also used after the
    module: its grad counts that use), keyword inputs, a mask without grad, a tuple of tensors
    beside a float, a parameter given as an input (a leaf) and a slice (a view)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.shift = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.norm, self.gate, self.pair = torch.nn.LayerNorm(8), Gate(), Pair()
        self.head = torch.nn.Linear(8, 4)
        self.extra = torch.nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.a(x) + x
        h = self.norm(h) + h
        g = self.gate(hidden_states=h, mask=mask)
        p = self.pair((g, self.b(h)), 0.5) + self.shift(self.extra)
        out: torch.Tensor = self.head(p[:, 1:])
        return out


@pytest.mark.slow  # two aot_eager compiles (~20 s on a loaded machine)
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_module_input_grads_of_every_kind_are_the_eager_recorders_under_compile() -> None:
    """Every ``grad_input`` record of the eager recorder is there under compile with its
    statistics (a residual sum rebased in place: all its uses counted; keyword and tuple
    inputs; the same tensor given to two modules measured once), or listed as not recordable
    with why (a leaf, a view); nothing where the eager recorder has nothing (a mask without
    grad, a float); the graph whole and the numbers bitwise."""
    from pytest_precalign.recording.compiled_grads import LEAF, VIEW

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = Inputs()
    x, mask = torch.randn(2, 5, 8), (torch.rand(2, 5, 8) > 0.3).float()
    run = torch.compile(model, backend="aot_eager")

    def step(module: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = module(x, mask).square().mean()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    with HookRecorder(run, mode="stats") as rec:
        recorded = step(run)
    assert _counts() == (1, 0)
    assert _bitwise(recorded, step(run)) and _counts() == (2, 0)
    with HookRecorder(model, mode="stats") as eager_rec:
        step(model)
    trace = rec.trace({})
    eager = {r.id: r for r in eager_rec.trace({}).records if r.kind == "grad_input"}
    compiled = {r.id: r for r in trace.records if r.kind == "grad_input"}
    why = trace.manifest["not_recordable"]
    assert set(compiled) | set(why) == set(eager), set(eager) ^ set(compiled)
    assert why == {"shift|grad_input|in.0|0|0": LEAF, "head|grad_input|in.0|0|0": VIEW}
    assert {"gate|grad_input|in.hidden_states|0|0", "pair|grad_input|in.0.0|0|0"} <= set(compiled)
    assert {"gate.lin|grad_input|in.0|0|0", "norm|grad_input|in.0|0|0"} <= set(compiled)
    for rid, record in compiled.items():
        _same_stats(eager[rid], record)
    # h after the norm goes to the gate (rebased there), its linear and b: one row for the three
    assert compiled["b|grad_input|in.0|0|0"].stats == compiled["gate.lin|grad_input|in.0|0|0"].stats
