"""No tensor subclass reaches raw-pointer code (the C kernels read ``data_ptr()``, which is 0 for a
wrapper subclass: a SIGSEGV) or a host conversion (``.tolist()`` refuses subclasses): a DTensor,
a ``__torch_dispatch__`` wrapper subclass and a meta tensor through every statistics path. A
DTensor gives the statistics of the full tensor it stands for; a subclass the tool cannot read
and a meta tensor give one ``RecorderError`` naming the record and ``exclude=``.

The DTensor lives on a 1-rank gloo mesh in this process; the combination over 2 ranks is
tested under torchrun (``tests/training/test_sharded_runs.py``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from pytest_precalign.errors import RecorderError  # noqa: E402
from pytest_precalign.recording import HookRecorder, native_kernels  # noqa: E402
from pytest_precalign.recording.stats_slots import StatsSlots  # noqa: E402
from pytest_precalign.recording.step_buffer import StepBuffer  # noqa: E402
from pytest_precalign.recording.tensor_summary import (  # noqa: E402
    cpu_stats,
    finite_sum,
    stats_reader,
    stats_row,
    stats_vector,
    sum_vector,
    tensor_crc32,
    tensor_stats,
)
from pytest_precalign.steps.step_evidence import StepEvidence, grad_norm, zero_count  # noqa: E402
from pytest_precalign.trace.records import Stats  # noqa: E402
from tests.helpers.one_rank_mesh import one_rank_mesh  # noqa: E402


class Wrapped(torch.Tensor):
    """A wrapper subclass (as torchao's float8 / NF4 tensors are): no storage of its own."""

    @staticmethod
    def __new__(cls, inner: Any) -> Any:
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        def unwrap(x: Any) -> Any:
            return x.inner if isinstance(x, Wrapped) else x

        return func(
            *torch.utils._pytree.tree_map(unwrap, args), **torch.utils._pytree.tree_map(unwrap, kwargs or {})
        )


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from one_rank_mesh(tmp_path_factory)


def values() -> Any:
    torch.manual_seed(0)
    return torch.randn(64, 16)


def dtensor(mesh: Any, t: Any) -> Any:
    from torch.distributed.tensor import Shard, distribute_tensor

    return distribute_tensor(t, mesh, [Shard(0)])


READERS: dict[str, Callable[[Any], Any]] = {
    "tensor_stats": tensor_stats,
    "stats_vector": lambda t: Stats(*stats_vector(t).tolist()),
    "stats_vector_counts": lambda t: Stats(*stats_vector(t, counts=True).tolist()[:4]),
    "stats_row": lambda t: Stats(*stats_row(t)[:4]),
    "cpu_stats": cpu_stats,
    "stats_reader": lambda t: stats_reader()(t),
    "stats_slots": lambda t: _slot_stats(t),
}


def _slot_stats(t: Any) -> Any:
    slots = StatsSlots()
    got = slots.read(t)
    return slots.stats(got, t.numel()) if isinstance(got, int) else got


def _same(got: Any, want: Any) -> None:
    assert got.max == want.max and got.min == want.min
    assert math.isclose(got.norm, want.norm, rel_tol=1e-12)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_dtensor_is_read_as_its_full_tensor(mesh: Any, reader: str) -> None:
    plain = values()
    got, want = READERS[reader](dtensor(mesh, plain)), READERS[reader](plain)
    _same(got, want)
    if reader in ("tensor_stats", "cpu_stats", "stats_reader", "stats_slots"):
        assert got == want  # Stats: the same bits


def test_a_dtensor_hash_sum_and_kernels(mesh: Any) -> None:
    plain = values()
    d = dtensor(mesh, plain)
    assert tensor_crc32(d) == tensor_crc32(plain)
    assert finite_sum(d) and sum_vector(d).tolist() == sum_vector(plain).tolist()
    # the raw-pointer entry points refuse it (callers fall back to torch on the plain tensor)
    assert native_kernels.stats(d) is None and native_kernels.zeros(d) is None
    assert native_kernels.norms(d, d) is None and native_kernels.zeros_of([d]) is None
    assert native_kernels.norms_of([(d, d)]) is None


@pytest.mark.parametrize("kind", ["wrapper", "meta"])
@pytest.mark.parametrize(
    "reader",
    [*sorted(READERS), "crc32", "finite_sum", "sum_vector", "step_buffer"],
)
def test_an_unreadable_tensor_is_one_recorder_error(kind: str, reader: str) -> None:
    t = Wrapped(values()) if kind == "wrapper" else torch.empty(64, 16, device="meta")
    call: Callable[[Any], Any] = {
        **READERS,
        "crc32": tensor_crc32,
        "finite_sum": finite_sum,
        "sum_vector": sum_vector,
        "step_buffer": lambda t: StepBuffer().add_stats(t),
    }[reader]
    with pytest.raises(RecorderError, match="exclude="):
        call(t)
    # the kernels never see it
    if kind == "wrapper":
        assert native_kernels.stats(t) is None and native_kernels.zeros(t) is None


class Scale(torch.nn.Module):
    """Returns its input as a wrapper subclass (a quantised activation)."""

    def forward(self, x: Any) -> Any:
        return Wrapped(x.detach() * 2)


@pytest.mark.parametrize("mode", ["stats", "hash", "tensor"])
def test_the_recorder_names_the_record_of_an_unreadable_subclass(mode: str) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), Scale())
    with (
        pytest.raises(RecorderError, match=r"1\|activation\|out\|.*exclude="),
        HookRecorder(model, mode=mode, grads=False) as rec,
    ):
        model(values())
    del rec


@pytest.mark.parametrize("mode", ["stats", "hash", "tensor"])
def test_the_recorder_records_dtensor_params_and_grads_as_full_tensors(mesh: Any, mode: str) -> None:
    """A model whose parameters are DTensors (as ``fully_shard`` / ``distribute_module`` leave
    them): params and param grads recorded with the full tensor's statistics / hash / values,
    and ``StepEvidence`` on the full tensors' norms."""
    torch.manual_seed(0)
    bare = torch.nn.Linear(16, 8)
    sharded = torch.nn.Linear(16, 8)
    sharded.load_state_dict(bare.state_dict())
    for name, p in list(sharded.named_parameters()):
        setattr(sharded, name, torch.nn.Parameter(dtensor(mesh, p.detach().clone())))
    traces, scalars = [], []
    for model in (bare, sharded):
        evidence = StepEvidence(model.parameters())
        with HookRecorder(model, mode=mode, inputs=False) as rec:
            evidence.begin()
            x = values()
            if model is sharded:
                from torch.distributed.tensor import Replicate, distribute_tensor

                x = distribute_tensor(x, mesh, [Replicate()])
            out = model(x)
            (out.full_tensor() if hasattr(out, "full_tensor") else out).square().sum().backward()
            evidence.grads_before_clip()
            evidence.grads_after_clip()
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(0.1 * p.grad)
            rec.record_params()
        scalars.append(evidence.finish(0))
        traces.append({r.id: r for r in rec.trace().records if r.kind in ("param", "param_grad")})
    want, got = traces
    assert sorted(got) == sorted(want) and len(got) == 4
    for rid, r in want.items():
        g = got[rid]
        assert g.module_class == r.module_class == "Linear" and g.shape == r.shape
        if mode == "hash":
            assert g.crc32 == r.crc32
        else:
            assert g.stats is not None and r.stats is not None
            assert g.stats.max == r.stats.max and g.stats.min == r.stats.min
            assert math.isclose(g.stats.norm, r.stats.norm, rel_tol=1e-12)
            assert math.isclose(g.stats.mean, r.stats.mean, rel_tol=1e-9, abs_tol=1e-15)
    plain, sharded_scalars = scalars
    assert sharded_scalars.zero_grads == plain.zero_grads
    for field in ("grad_norm", "param_norm", "update_norm"):
        assert math.isclose(getattr(sharded_scalars, field), getattr(plain, field), rel_tol=1e-6), field


def test_step_evidence_functions_take_dtensor_grads(mesh: Any) -> None:
    plain = values()
    plain[0] = 0.0
    d = dtensor(mesh, plain)
    assert zero_count([d]) == zero_count([plain]) == 16
    assert math.isclose(grad_norm([d]), grad_norm([plain]), rel_tol=1e-6)


def test_a_rank_selection_that_leaves_out_a_sharded_rank_is_refused(mesh: Any, tmp_path: Any) -> None:
    """``Recorder(ranks=...)`` that records some of the ranks whose DTensor records are combined
    (the rank's peers) and leaves out others would leave the recording ranks waiting for the
    others' shards at the step's end: one ConfigError. Ranks that share no shard with a
    recording rank may be left out (under torchrun: ``test_sharded_runs.py``, ``--alone``)."""
    from pytest_precalign import Recorder
    from pytest_precalign.errors import ConfigError
    from pytest_precalign.steps.sharded_layout import check_rank_selection, record_peers

    model = torch.nn.Linear(16, 8)
    model.weight = torch.nn.Parameter(dtensor(mesh, model.weight.detach().clone()))
    assert record_peers([model]) == frozenset({0}) and record_peers([torch.nn.Linear(2, 2)]) is None
    with pytest.raises(ConfigError, match=r"ranks=\[0\] leaves out ranks \[1\] of a sharded model"):
        check_rank_selection(frozenset({0}), frozenset({0, 1}))
    for ranks in (None, frozenset({0, 1}), frozenset({2}), frozenset({0, 1, 2})):
        check_rank_selection(ranks, frozenset({0, 1}))  # all of the peers, or none of them
    rec = Recorder(tmp_path / "all", ranks=[0])  # every rank of this 1-rank world: recorded
    rec.start(model)
    rec.stop()


def test_a_partial_dtensor_is_reduced_first(mesh: Any) -> None:
    """A ``Partial`` DTensor (each rank a summand) is reduced before it is read, in every mode."""
    from torch.distributed.tensor import DTensor, Partial

    plain = values()
    partial = DTensor.from_local(plain, mesh, [Partial()])
    assert tensor_stats(partial) == tensor_stats(plain)
    for mode in ("stats", "hash"):
        model = torch.nn.Identity()
        with HookRecorder(model, mode=mode, grads=False, inputs=False) as rec:
            rec.capture(partial, name="x", module_class="Identity", kind="activation", slot="out")
        (got,) = rec.trace().records
        if mode == "hash":
            assert got.crc32 == tensor_crc32(plain)
        else:
            assert got.stats is not None and (got.stats.max, got.stats.min) == (plain.max(), plain.min())
            assert math.isclose(got.stats.norm, float(torch.linalg.vector_norm(plain.double())), rel_tol=1e-9)
