"""What the recorder keeps of a tensor when it does not keep the tensor: statistics, a CRC-32,
its dtype's name; and the tensors of a nested module output. Shared by the recorder, the
mapping stage (layout transforms re-summarise), isolation and tensor-parallel gathering."""

from __future__ import annotations

import ctypes
import dataclasses
import math
import zlib
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, cast

import torch

from ..errors import RecorderError
from ..trace.records import Stats
from . import native_kernels
from .chunked_stats import CHUNKED_NUMEL, chunked_values
from .fused_stats import fused_for, fused_vector
from .host_sync import to_host
from .sharded import plain, whole

_T = TypeVar("_T")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_stats(t: torch.Tensor) -> Stats:
    """max, min, mean, L2 norm in one sync; nan/inf counts only when something is non-finite."""
    t = readable(t)
    if t.numel() == 0:
        return Stats(0.0, 0.0, 0.0, 0.0)
    values = to_host(stats_vector(t))
    if not all_finite(values):
        values = to_host(stats_vector(t, counts=True))
    return stats_from_vector(values, t.numel())


# NaN/Inf counts in a statistics vector: never, always, or only when the statistics are not finite.
Counts = Literal[False, True, "if_nonfinite"]


def stats_vector(t: torch.Tensor, counts: Counts = False) -> torch.Tensor:
    """The values of ``tensor_stats(t)`` as a float64 tensor on ``t``'s device, computed
    without a host sync: max, min, sum, L2 norm (each in the dtype ``tensor_stats`` uses, then
    widened exactly to float64) and, with ``counts``, the nan and inf counts (two more passes:
    only worth it once the values are known not to be finite). ``counts="if_nonfinite"``:
    the six values too, the counts taken only when the statistics are not all finite (zeros
    when they are), so that no reference to the tensor is kept until the step's end: on a
    device the tensor is selected by a mask of its non-finiteness, decided by torch without a
    host sync (a finite one selects nothing); on the CPU the four values are read at once
    (``stats_row``). ``t`` must not be empty.

    A CPU tensor's four values come from one read by a C kernel (``native_kernels.py``: max
    and min exact, sum and norm within its stated bound, the same bits on every x86-64 CPU)
    where the platform builds one; torch's reductions take a tensor that is not finite (its
    NaN/Inf counts are wanted then) and every tensor where no kernel is built: then a CPU
    tensor is reduced on one thread (the thread count is restored after): each parallel
    reduction is a barrier across torch's threads, which on a loaded machine waits for a
    descheduled thread (~30 ms instead of ~30 us for a 262K-element ``aminmax`` at load 13 on
    2 cores), while one thread reads 8 MB in about a millisecond. The values then do not
    depend on the thread count either. A contiguous CPU tensor of more than
    ``CHUNKED_NUMEL`` elements (larger than the caches) is then read from memory once, in
    pieces (``chunked_stats.py``); a smaller one gets the one-call reductions, which read it
    from cache. A CUDA tensor's full statistics (``counts=True``, what the step buffer queues
    for a device tensor) come from one fused compiled kernel where Triton is installed
    (``fused_stats.py``)."""
    t = readable(t)
    if t.device.type != "cpu":
        if counts is True and fused_for(t):  # one read, the counts with it (fused_stats.py)
            return fused_vector(t)
        return _stats_vector(t, counts)
    if counts == "if_nonfinite":
        return torch.tensor(stats_row(t), dtype=torch.float64)
    row = _native_row(t)
    if row is not None:
        return torch.tensor(row if not counts else [*row, 0.0, 0.0], dtype=torch.float64)
    return _on_one_thread(lambda: _stats_vector(t, counts))


def _native_row(t: torch.Tensor) -> list[float] | None:
    """The four values of a CPU tensor from the C kernel, when it has one and they are finite
    (an 8-bit float's: the float32 tensor it widens to exactly, see ``_widened``)."""
    if not t.is_floating_point():
        return None
    return native_kernels.stats(t.float() if t.element_size() == 1 else t)


def _on_one_thread(reduce: Callable[[], _T]) -> _T:
    """``reduce()`` with torch on one thread, the thread count restored after (see
    ``stats_vector``); a plain call, not a context manager: it runs for every recorded tensor."""
    threads = torch.get_num_threads()
    if threads == 1:
        return reduce()
    torch.set_num_threads(1)
    try:
        return reduce()
    finally:
        torch.set_num_threads(threads)


def stats_row(t: torch.Tensor) -> list[float]:
    """``stats_vector(t, counts="if_nonfinite")`` of a non-empty CPU tensor as a host list:
    the four values are read at once -- they are in host memory already, so reading them waits
    for nothing (not a host sync; not counted by ``host_sync``) -- and the NaN/Inf counts are
    taken only when one is not finite. The same six float64 values as torch's masked
    selection, without its dozen small operations (~45 us a tensor, most of a small tensor's
    cost)."""
    row = _native_row(readable(t))
    if row is not None:
        return [*row, 0.0, 0.0]
    return _torch_row(t)


def _torch_row(t: torch.Tensor) -> list[float]:
    """``stats_row`` by torch's reductions (no kernel, or a value not finite)."""
    return _on_one_thread(lambda: _row(_widened(t.detach())))


def cpu_stats(t: torch.Tensor) -> Stats:
    """``tensor_stats(t)`` of a CPU tensor, read at once (its values are in host memory: no
    host sync), the same bits as ``stats_from_vector(stats_row(t), numel)``: what a recorder
    keeps of each CPU tensor in stats mode, so the fewest calls between the tensor and its
    ``Stats``."""
    t = readable(t)
    n = t.numel()
    if not n:
        return Stats(0.0, 0.0, 0.0, 0.0)
    row = _native_row(t)
    if row is None:
        return stats_from_vector(_torch_row(t), n)
    return Stats(row[0], row[1], row[2] / n, row[3])


def as_dense(t: torch.Tensor) -> torch.Tensor:
    """``t``, or for a sparse tensor (an ``Embedding(sparse=True)``'s grad) the dense one it
    stands for: what a dense run holds beside it (torch's reductions and norms take no sparse
    tensor). Used by the recorder and by ``StepEvidence``'s grads."""
    return t if t.layout is torch.strided else t.detach().to_dense()


def readable(t: torch.Tensor) -> torch.Tensor:
    """``summarisable(t, ...)`` for the statistics functions here, which anyone may call: a
    plain dense tensor at once (the common case: two type checks), else the plain tensor it
    stands for or one ``RecorderError``. The one way into the reads below: no tensor subclass
    reaches raw-pointer code or a host conversion (``sharded.py``)."""
    cls = type(t)
    if (cls is torch.Tensor or cls is torch.nn.Parameter) and t.layout is torch.strided and not t.is_meta:
        return t
    return summarisable(t, f"a {cls.__qualname__} of shape {tuple(t.shape)}")


def summarisable(t: torch.Tensor, rid: str) -> torch.Tensor:
    """``t`` as the recorder summarises it (``as_dense``); a meta or nested tensor refused with
    one message naming the record ``rid`` (torch's reductions raise an internal error on both);
    a tensor subclass as the plain tensor it stands for (a ``DTensor``: its full tensor, gathered
    over its mesh), or refused likewise where the tool cannot read it (``sharded.whole``)."""
    if t.is_meta or t.is_nested:  # a meta DTensor too; a jagged nested tensor is a subclass
        what = "on the meta device (it holds no values)" if t.is_meta else "a nested tensor"
        raise RecorderError(
            f"recorder: {rid} is {what}: its statistics cannot be taken; leave its module out of "
            "the recording (exclude=) or record another level"
        )
    return as_dense(t if plain(t) else whole(t, rid))


def stats_reader() -> Callable[[torch.Tensor], Stats]:
    """``cpu_stats`` for the many tensors of a recorded step: the same values, the kernels
    looked up once (``native_kernels.stats_entries``: ``PRECALIGN_FUSED_STATS`` is read when
    the reader is made, not per tensor) and a tensor the kernel takes read in one call frame.
    Each frame and lookup counts: a hook runs right after a large torch operation has pushed
    the interpreter's own data out of the caches, and there ``cpu_stats`` takes 42 us a small
    tensor where this takes 21 us (5.0 / 2.9 us at once again; ``python
    benchmarks/stats_one_read.py``, ``after_matmul``)."""
    entries = native_kernels.stats_entries()
    if entries is None:
        return cpu_stats
    part, strided, tensor, parameter, sqrt, out_type, new = (
        native_kernels.PART,
        torch.strided,
        torch.Tensor,
        torch.nn.Parameter,
        math.sqrt,
        ctypes.c_double * 4,
        new_stats,
    )

    def read(t: torch.Tensor) -> Stats:
        n = t.numel()
        cls = type(t)
        if (
            (cls is tensor or cls is parameter)
            and 0 < n <= part
            and t.layout is strided
            and t.is_cpu
            and t.is_contiguous()
        ):
            entry = entries[t.dtype]
            if entry is not None:
                out = out_type()
                if entry(t.data_ptr(), n, out):
                    return new(out[0], out[1], out[2] / n, sqrt(out[3]))
                return stats_from_vector(_torch_row(t), n)  # a value not finite: torch counts them
        return cpu_stats(t)

    return read


def new_stats(vmax: float, vmin: float, mean: float, norm: float) -> Stats:
    """``Stats(vmax, vmin, mean, norm)`` without the frozen dataclass's ``__init__`` (which
    sets each field through ``object.__setattr__``): run for every tensor a step reads."""
    stats = object.__new__(Stats)
    object.__setattr__(
        stats, "__dict__", {"max": vmax, "min": vmin, "mean": mean, "norm": norm, "nan": 0, "inf": 0}
    )
    return stats


def _row(t: torch.Tensor) -> list[float]:
    row = torch.stack(_values(t)).tolist()  # one conversion, not one per value
    if all_finite(row):
        return [*row, 0.0, 0.0]
    nan, inf = torch.count_nonzero(torch.isnan(t)), torch.count_nonzero(torch.isinf(t))
    return [*row, float(nan), float(inf)]


def _widened(t: torch.Tensor) -> torch.Tensor:
    """A floating tensor whose statistics are ``t``'s: integers as float64, complex as |t|,
    8-bit floats (which torch's reductions do not take) as float32, exactly."""
    if not (t.is_floating_point() or t.is_complex()):
        t = t.double()
    elif t.element_size() == 1:  # float8_e4m3fn, float8_e5m2, ... (each value exact in float32)
        t = t.float()
    return t.abs() if t.is_complex() else t


def _values(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(max, min, sum, L2 norm) of a floating tensor, each a 0-d tensor in the accumulation
    dtype (float32, float64 for float64)."""
    acc = torch.float32 if t.dtype != torch.float64 else torch.float64
    if t.numel() > CHUNKED_NUMEL and t.device.type == "cpu" and t.is_contiguous():
        return chunked_values(t, acc)
    mn, mx = torch.aminmax(t)
    total = t.sum(dtype=acc)
    norm = torch.linalg.vector_norm(t, dtype=acc)
    if t.dtype != acc:  # an fp32 / fp64 tensor's max and min are in acc already
        mx, mn = mx.to(acc), mn.to(acc)
    return mx, mn, total, norm


def _stats_vector(t: torch.Tensor, counts: Counts) -> torch.Tensor:
    t = _widened(t)
    values = torch.stack(_values(t)).to(torch.float64)
    if not counts:
        return values
    if counts == "if_nonfinite":
        t = t.reshape(1, -1)[torch.isfinite(values).all().logical_not().reshape(1)]  # [0, n] or [1, n]
    # count_nonzero: a bool tensor's sum() is several times slower on CPU
    nan, inf = torch.count_nonzero(torch.isnan(t)), torch.count_nonzero(torch.isinf(t))
    return torch.cat([values, torch.stack([nan, inf]).to(torch.float64)])


def sum_vector(t: torch.Tensor) -> torch.Tensor:
    """The sum ``finite_sum`` checks, as a 1-element float64 tensor on ``t``'s device."""
    t = readable(t)
    return t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32).reshape(1).double()


def stats_from_vector(values: list[float], numel: int) -> Stats:
    """The ``Stats`` of a host copy of ``stats_vector(t, counts=True)`` (or of the four values
    of a finite one); equal to ``tensor_stats(t)``."""
    vmax, vmin, vsum, vnorm, *counts = values
    nan, inf = counts or (0, 0)
    return Stats(vmax, vmin, vsum / numel, vnorm, int(nan), int(inf))


def all_finite(values: list[float]) -> bool:
    return all(map(_finite, values))


def finite_sum(t: torch.Tensor) -> bool:
    """False when ``t`` may hold a NaN or Inf: its sum is then not finite. One read pass and
    no temporary, about twice as cheap as ``isfinite(t).all()``; a finite tensor whose fp32
    sum overflows only costs an extra statistics pass."""
    t = readable(t)
    total = t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
    return _finite(float(to_host(total)))


def _finite(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))


def tensor_crc32(t: torch.Tensor) -> str:
    """CRC-32 of the tensor's bytes, as 8 hex digits (what msprobe calls md5); taken outside
    any compiled graph (traced into one, the bytes of a fake tensor cannot be read)."""
    crc: str = _crc32_eager(readable(t))
    return crc


def _crc32(t: torch.Tensor) -> str:
    flat = t.detach().contiguous().cpu().reshape(-1)
    if not flat.numel():
        return f"{zlib.crc32(b''):08x}"
    # zlib reads the numpy buffer in place: no bytes copy of the tensor.
    data = cast("bytes", flat.view(torch.uint8).numpy())
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


_crc32_eager = torch.compiler.disable(_crc32)


def flatten(value: Any, prefix: str) -> list[tuple[str, torch.Tensor]]:
    """(slot, tensor) pairs of a nested output: tensors, tuples/lists, mappings (ModelOutput)
    and dataclasses (their fields, as a mapping's keys). Other objects (a KV cache) are not
    looked into. Slot names are
    unambiguous: a key that is not a plain name (``"0"`` beside ``0``, ``"a.b"`` beside
    ``{"a": {"b": ...}}``) is written quoted (``out.'0'``, ``out.'a.b'``). Run on every
    module call's inputs and outputs: a list, built without a generator per level."""
    if isinstance(value, torch.Tensor):
        return [(prefix, value)]
    if type(value) is tuple and all(isinstance(v, torch.Tensor) for v in value):  # most modules' args
        return [(f"{prefix}.{i}", v) for i, v in enumerate(value)]
    found: list[tuple[str, torch.Tensor]] = []
    _flatten_into(found, value, prefix, set())
    return found


def _flatten_into(found: list[tuple[str, torch.Tensor]], value: Any, prefix: str, path: set[int]) -> None:
    """``flatten``'s walk; ``path``: the containers being walked (a container inside itself
    is not walked again)."""
    if isinstance(value, torch.Tensor):
        found.append((prefix, value))
        return
    if (
        value is None
        or isinstance(value, (str, bytes, int, float, torch.nn.Module, type))
        or id(value) in path
    ):
        return
    path.add(id(value))
    if isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _flatten_into(found, item, f"{prefix}.{i}", path)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _flatten_into(found, item, f"{prefix}.{slot_key(key)}", path)
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            _flatten_into(found, getattr(value, f.name, None), f"{prefix}.{slot_key(f.name)}", path)
    path.discard(id(value))


def slot_key(key: Any) -> str:
    """A mapping key as one slot component: a plain name or an int as it is, anything else
    quoted, so no two keys of one output get the same slot."""
    if isinstance(key, bool):
        return repr(key)
    if isinstance(key, int):
        return str(key)
    if isinstance(key, str) and key and "." not in key and not key.isdigit() and "'" not in key:
        return key
    return repr(key) if isinstance(key, str) else repr(repr(key))
