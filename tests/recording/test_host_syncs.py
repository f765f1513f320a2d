"""One host synchronisation per recorded step: every tensor-to-Python conversion of the
recording path goes through ``host_sync.to_host`` (counted); a recorded forward+backward
makes a constant number of them whatever the model's depth, and the values are the ones
the per-tensor functions (``tensor_stats``, ``tensor_crc32``) give."""

from __future__ import annotations

import math
import struct

import pytest
import torch
from torch import nn

from pytest_precalign.recording import HookRecorder
from pytest_precalign.recording.host_sync import host_syncs
from pytest_precalign.recording.tensor_summary import tensor_crc32, tensor_stats
from pytest_precalign.trace.records import Stats, Trace


class _Block(nn.Module):
    def __init__(self, blowup: bool) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.act = nn.GELU()
        self.norm = nn.LayerNorm(16)
        self.blowup = blowup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.proj(x))
        if self.blowup:  # fp32 overflow: +inf and -inf, then NaN downstream
            y = y * 1e30 * 1e30
        return self.norm(x + y)


class _Net(nn.Module):
    def __init__(self, n: int, blowup: int = -1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(50, 16)
        self.layers = nn.ModuleList(_Block(i == blowup) for i in range(n))
        self.head = nn.Linear(16, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _ids() -> torch.Tensor:
    return torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))


def _record(model: nn.Module, mode: str, steps: int = 1) -> tuple[Trace, int]:
    """A recorded forward+backward per step; the host syncs from enter to ``trace()``."""
    ids = _ids()
    before = host_syncs()
    with HookRecorder(model, mode=mode) as rec:
        for step in range(steps):
            rec.step = step
            model.zero_grad(set_to_none=True)
            logits = model(ids)
            rec.record_output("logits", logits)
            nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
    trace = rec.trace()
    return trace, host_syncs() - before


def _bits(s: Stats | None) -> tuple[object, ...] | None:
    """Stats compared bit for bit (NaN equal to NaN, -0.0 not equal to 0.0)."""
    if s is None:
        return None
    floats = (s.max, s.min, s.mean, s.norm)
    return (*(struct.pack("<d", v) for v in floats), s.nan, s.inf)


@pytest.mark.parametrize("blowup", [-1, 1], ids=["finite", "overflow"])
@pytest.mark.parametrize("mode", ["stats", "hash", "tensor"])
def test_host_syncs_per_step_do_not_grow_with_depth(mode: str, blowup: int) -> None:
    counts, records = {}, {}
    for n in (2, 4, 8):
        trace, counts[n] = _record(_Net(n, blowup), mode)
        records[n] = len(trace.records)
    assert records[2] < records[4] < records[8]  # deeper models record more tensors ...
    assert counts[2] == counts[4] == counts[8]  # ... with the same number of host syncs
    # one; in hash mode a second when some sum is not finite (the statistics are taken then);
    # stats and tensor modes take NaN/Inf counts at capture, where torch decides they are needed;
    # stats mode reads a CPU tensor's statistics at capture from host memory: no sync at all
    assert counts[2] == (2 if blowup >= 0 and mode == "hash" else 0 if mode == "stats" else 1), counts


@pytest.mark.parametrize("mode", ["stats", "hash", "tensor"])
def test_one_host_sync_per_step(mode: str) -> None:
    _, one = _record(_Net(4), mode, steps=1)
    trace, three = _record(_Net(4), mode, steps=3)
    # tensor mode on the CPU: the statistics of the kept copies are computed by trace(), with
    # one host sync for all the steps (kept_tensors.py); stats mode reads a CPU tensor's at
    # capture, from host memory (none; the device path's one per step: below)
    assert three == (one if mode == "tensor" else 3 * one) and one == (0 if mode == "stats" else 1)
    assert {r.step for r in trace.records} == {0, 1, 2}
    assert all(r.stats is not None for r in trace.records if mode != "hash")


@pytest.mark.parametrize("blowup", [-1, 1], ids=["finite", "overflow"])
def test_stats_are_bitwise_the_per_tensor_ones(blowup: int) -> None:
    stats, _ = _record(_Net(4, blowup), "stats")
    tensors, _ = _record(_Net(4, blowup), "tensor")
    assert [r.id for r in stats.records] == [r.id for r in tensors.records]
    assert [(r.shape, r.dtype, r.deps) for r in stats.records] == [
        (r.shape, r.dtype, r.deps) for r in tensors.records
    ]
    nonfinite = 0
    for s, t in zip(stats.records, tensors.records, strict=True):
        assert t.tensor_key is not None
        expected = tensor_stats(tensors.tensors[t.tensor_key])
        assert _bits(s.stats) == _bits(expected) == _bits(t.stats), s.id
        assert s.crc32 is None and s.tensor_key is None
        nonfinite += not expected.finite
    assert (nonfinite > 0) == (blowup >= 0)  # the overflow case does exercise NaN/Inf counts


@pytest.mark.parametrize("blowup", [-1, 1], ids=["finite", "overflow"])
def test_hash_mode_crcs_and_nonfinite_evidence_as_before(blowup: int) -> None:
    hashed, _ = _record(_Net(4, blowup), "hash")
    tensors, _ = _record(_Net(4, blowup), "tensor")
    assert [r.id for r in hashed.records] == [r.id for r in tensors.records]
    evidence = 0
    for h, t in zip(hashed.records, tensors.records, strict=True):
        assert t.tensor_key is not None
        data = tensors.tensors[t.tensor_key]
        assert h.crc32 == tensor_crc32(data), h.id
        # today's rule: statistics only for a float tensor whose sum is not finite
        kept = data.is_floating_point() and not math.isfinite(float(data.sum(dtype=torch.float32)))
        assert _bits(h.stats) == (_bits(tensor_stats(data)) if kept else None), h.id
        evidence += kept
    assert (evidence > 0) == (blowup >= 0)


def test_a_capture_modified_in_place_later_keeps_its_capture_time_stats() -> None:
    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.inner(x)  # recorded as inner's output, then changed in place
            return y.mul_(3.0)

    torch.manual_seed(0)
    model, x = InPlace(), torch.randn(2, 4)
    with torch.no_grad():
        expected = tensor_stats(model.inner(x))
        with HookRecorder(model, mode="stats", grads=False) as rec:
            out = model(x)
    inner = next(r for r in rec.trace().records if r.name == "inner" and r.kind == "activation")
    assert _bits(inner.stats) == _bits(expected)
    assert _bits(inner.stats) != _bits(tensor_stats(out))


@pytest.fixture
def counted_at_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path a CUDA/NPU tensor takes (NaN/Inf counts on the device at capture, no reference
    kept), taken here by CPU tensors: no device is lent to CI."""
    from pytest_precalign.recording import step_buffer

    monkeypatch.setattr(step_buffer, "counts_at_capture", lambda device: True)
    monkeypatch.setattr(step_buffer, "read_at_capture", lambda t: False)  # queued to the step's end


@pytest.mark.parametrize("steps", [1, 3])
def test_the_device_path_of_stats_mode_one_sync_per_step(monkeypatch: pytest.MonkeyPatch, steps: int) -> None:
    """What a device tensor takes in stats mode: queued, fetched at the step's end, one sync
    per step; the records the same bits as the ones read at capture."""
    at_capture, _ = _record(_Net(4), "stats", steps=steps)
    from pytest_precalign.recording import step_buffer

    monkeypatch.setattr(step_buffer, "read_at_capture", lambda t: False)
    queued, syncs = _record(_Net(4), "stats", steps=steps)
    assert syncs == steps
    assert [(r.id, _bits(r.stats)) for r in queued.records] == [
        (r.id, _bits(r.stats)) for r in at_capture.records
    ]


@pytest.mark.usefixtures("counted_at_capture")
@pytest.mark.parametrize("blowup", [-1, 1], ids=["finite", "overflow"])
@pytest.mark.parametrize("mode", ["stats", "hash"])
def test_counted_at_capture_one_sync_even_with_nonfinite_values_and_the_same_stats(
    mode: str, blowup: int
) -> None:
    counts = {n: _record(_Net(n, blowup), mode)[1] for n in (2, 8)}
    assert counts[2] == counts[8] == 1  # the counts came with the first fetch
    recorded, _ = _record(_Net(4, blowup), mode)
    tensors, _ = _record(_Net(4, blowup), "tensor")
    nonfinite = 0
    for r, t in zip(recorded.records, tensors.records, strict=True):
        assert t.tensor_key is not None
        data = tensors.tensors[t.tensor_key]
        expected = tensor_stats(data)
        if mode == "hash":
            kept = data.is_floating_point() and not math.isfinite(float(data.sum(dtype=torch.float32)))
            assert _bits(r.stats) == (_bits(expected) if kept else None), r.id
        else:
            assert _bits(r.stats) == _bits(expected), r.id
        nonfinite += not expected.finite
    assert (nonfinite > 0) == (blowup >= 0)


@pytest.mark.parametrize("at_capture", [False, True], ids=["cpu", "device-path"])
def test_the_step_buffer_keeps_no_tensor_alive_but_hash_evidence(
    monkeypatch: pytest.MonkeyPatch, at_capture: bool
) -> None:
    import gc
    import weakref

    from pytest_precalign.recording import step_buffer

    monkeypatch.setattr(step_buffer, "counts_at_capture", lambda device: at_capture)
    buffer = step_buffer.StepBuffer()
    t, bad = torch.randn(64), torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    refs = [weakref.ref(t), weakref.ref(bad)]
    handles = [buffer.add_stats(t), buffer.add_stats(bad)]
    expected = [tensor_stats(t), tensor_stats(bad)]
    del t, bad
    gc.collect()
    # no tensor is kept until the step's end: its NaN/Inf counts are taken at capture (on the
    # CPU only when it is not finite), so the step's short-lived tensors are freed as usual
    assert all(ref() is None for ref in refs)
    stats, _ = buffer.flush()
    assert [_bits(stats[h]) for h in handles] == [_bits(e) for e in expected]
    assert (stats[handles[1]].nan, stats[handles[1]].inf) == (1, 2)
    # hash mode's evidence (a sum) keeps a CPU tensor: statistics only if the sum is not finite
    kept = torch.tensor([float("nan"), 1.0])
    ref = weakref.ref(kept)
    handle = buffer.add_evidence(kept)
    del kept
    gc.collect()
    assert (ref() is None) == at_capture
    stats, _ = buffer.flush()
    assert stats[handle] is not None and stats[handle].nan == 1
