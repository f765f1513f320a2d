"""A CPU tensor's statistics, zero count, and an optimizer step's norms, each from ONE read
of its memory, by small C kernels (``native_kernels.c``) the platform's C compiler builds on
first use.

Why C: torch's eager CPU reductions read a tensor once per statistic (``aminmax``, ``sum``,
``vector_norm``: three reads), and ``torch.compile``'s fused kernel costs ~30 s to compile
the first time and was slower than the eager reductions on a step's small tensors. The C
kernels compute max, min, sum and sum of squares in one pass (a mid step's 314 small tensors
in 17.1 ms of CPU against torch's 35.4 ms, the 2048x32000 logits in 10.5 ms against 32.3 ms)
and count zeros 2.7x faster than ``count_nonzero``; the float32 statistics kernel builds in
0.6 s, once per machine (``python benchmarks/stats_one_read.py --rounds 5`` prints all of
these): the library is kept
in a cache folder (``PRECALIGN_CACHE_DIR``, else ``$XDG_CACHE_HOME/pytest-precalign``, else
``~/.cache/pytest-precalign``) under a name that hashes the source, the compiler and its
flags.

Threads: where torch runs on GCC's OpenMP runtime (its Linux wheels) and the compiler is GCC,
the statistics kernels are built with ``-fopenmp`` and read a tensor of four superblocks or
more on torch's own intra-op threads (the loader hands the library the runtime torch loaded,
so no thread is started: the ones torch's last operation left waiting take the shares), a
mid step's statistics in 21-23 ms of wall time through ``tensor_summary.stats_reader`` (25 ms
through ``cpu_stats``, 46 ms on one thread; ``python benchmarks/recorder_split.py --size mid
--rounds 6``); elsewhere on the calling thread. Each superblock's sums are the same whichever
thread reads it and they are added in index order: the bits do not depend on the thread count.

Chosen automatically: where no C compiler works (none installed, ``CC`` naming a missing
one, a read-only cache and temp folder), or with ``PRECALIGN_FUSED_STATS=0``, every function
here returns None and the callers keep torch's reductions (``tensor_summary.py``); why is
said by ``kernel_state()``, which every recording's manifest carries (``stats_kernel``).

Values (``tests/recording/test_native_kernels.py``): max, min and zero counts exact; a
tensor's sum and sum of squares accumulated in float64 (each square of a float exact) in a
fixed order (32 lanes, then a pairwise cascade; a tensor above ``PART`` elements in fixed
pieces added exactly), an optimizer step's norms per block in the tensor's accumulation
dtype: within ``chunked_stats.SUM_ULPS`` epsilon of the exact values -- closer than torch's
fp32 ``vector_norm``, which accumulates nearly serially -- and the same bits on every x86-64
CPU: the order of additions is the source's, not the vector width's or the thread count's (a
multiply-add is fused only where the product is exact, so fusing rounds nothing). Equal
tensors get equal statistics on both sides of a comparison.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import torch

from .sharded import plain

Entry = Callable[..., Any]  # a loaded C entry point (ctypes)
_T = TypeVar("_T")

SOURCE = Path(__file__).with_name("native_kernels.c")

_FLAGS = ("-O3", "-ffp-contract=off", "-fPIC", "-shared")
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64"}
_BITS = {torch.float32: "32", torch.bfloat16: "16", torch.float16: "16", torch.float64: "64"}
_SYMBOLS = {
    family: {dtype: f"precalign_{family}_{suffix}" for dtype, suffix in _SUFFIX.items()}
    for family in ("stats", "norms")
}

# Tensors above this many elements are reduced in pieces of this size (see ``_in_parts``).
PART = 1 << 22

_pool: list[ThreadPoolExecutor | int | None] = [None, 0]  # the helper thread, and its process
_lock = threading.Lock()
_loaded: dict[str, Entry | None] = {}  # symbol -> entry point (None: unavailable)
_problems: dict[str, str] = {}  # symbol -> why it could not be built or loaded
_threaded: set[str] = set()  # symbols whose library reads on torch's own threads (-fopenmp)


def kernel_state() -> str:
    """What computes a CPU tensor's statistics in this process: ``"native"`` (the C kernels),
    or ``"torch: <why>"`` (turned off, or no compiler: its reason)."""
    if not _enabled():
        return "torch: PRECALIGN_FUSED_STATS=0"
    first = "precalign_stats_f32"
    if _entry(first) is None:  # builds (or finds) one kernel to learn whether they work
        return f"torch: {_problems[first]}"
    if _problems:
        return "native; torch for " + "; ".join(f"{s[10:]}: {why}" for s, why in sorted(_problems.items()))
    return "native"


def stats(t: torch.Tensor) -> list[float] | None:
    """(max, min, sum, L2 norm) of a non-empty floating CPU tensor from one read, as Python
    floats: max and min the tensor's own values, the sum and the norm accumulated as the
    module's doc says and kept in float64 (not rounded to float32: tensors a few ulps apart
    in one element keep different sums, as merging replicated ranks needs); None where the
    kernels are unavailable or the dtype has none, and where a value is not finite (a NaN, an
    Inf, a sum that overflowed): torch's reductions apply then, counts and all. Called for
    every tensor a recorder summarises, so it checks what it must and no more."""
    entry = _for(t, "stats")
    n = t.numel()
    if entry is None or not n:
        return None
    flat = _contiguous(t)
    if n > PART:
        return _in_parts(entry, flat, _SYMBOLS["stats"][t.dtype] in _threaded)
    out = (ctypes.c_double * 4)()
    return [out[0], out[1], out[2], math.sqrt(out[3])] if entry(flat.data_ptr(), n, out) else None


class _StatsEntries(dict[torch.dtype, "Entry | None"]):
    """dtype -> its statistics kernel's entry point, built (or found) on first use; None for a
    dtype without one or whose kernel could not be built."""

    def __missing__(self, dtype: torch.dtype) -> Entry | None:
        symbol = _SYMBOLS["stats"].get(dtype)
        entry = None if symbol is None else _entry(symbol)
        self[dtype] = entry
        return entry


_STATS_ENTRIES = _StatsEntries()


def stats_entries() -> dict[torch.dtype, Entry | None] | None:
    """The statistics kernels by dtype (``entries[t.dtype]``: built on first use, None where a
    dtype has none), for a caller that reads a step's many tensors (``tensor_summary.stats_reader``,
    ``stats_slots.StatsSlots``): ``PRECALIGN_FUSED_STATS`` is read here, once, not per tensor;
    None where the kernels are turned off. Their contract is ``stats``'s: a dense, contiguous,
    non-empty CPU tensor of at most ``PART`` elements, ``entry(data_ptr, numel, out)`` filling
    ``out[0:4]`` (max, min, sum, sum of squares; ``out`` an array or an address) and returning
    0 when one is not finite."""
    return _STATS_ENTRIES if _enabled() else None


def _in_parts(entry: Entry, flat: torch.Tensor, threaded: bool) -> list[float] | None:
    """The statistics of a tensor larger than ``PART``: its ``PART``-element pieces reduced
    (each on torch's threads where the kernel is ``threaded``, else the pieces shared with the
    helper thread when torch may use two: such a tensor is read from memory, and a second core
    reads it ~1.6x faster), their sums added exactly (``math.fsum``). The pieces are cut by
    the size alone, so the values do not depend on the thread count."""
    step, item = PART, flat.element_size()
    pieces = [
        (flat.data_ptr() + start * item, min(step, flat.numel() - start))
        for start in range(0, flat.numel(), step)
    ]

    def reduce(piece: tuple[int, int]) -> list[float] | None:
        out = (ctypes.c_double * 4)()
        return list(out) if entry(piece[0], piece[1], out) else None

    def theirs(kept: torch.Tensor) -> list[list[float] | None]:  # ``kept``: the memory read
        return [reduce(p) for p in pieces[1::2]]

    if torch.get_num_threads() > 1 and not threaded:
        later = _worker().submit(theirs, flat)  # holds ``flat`` until it is done, whatever happens here
        rows = [reduce(p) for p in pieces[0::2]]
        rows += later.result()
    else:
        rows = [reduce(p) for p in pieces]
    if any(r is None for r in rows):
        return None
    done = [r for r in rows if r is not None]
    squares = math.fsum(r[3] for r in done)
    return [
        max(r[0] for r in done),
        min(r[1] for r in done),
        math.fsum(r[2] for r in done),
        math.sqrt(squares),
    ]


def _worker() -> ThreadPoolExecutor:
    """This process's one helper thread for ``_in_parts`` (made anew in a forked child)."""
    pid = os.getpid()
    with _lock:
        if _pool[0] is None or _pool[1] != pid:
            _pool[:] = [ThreadPoolExecutor(1, thread_name_prefix="precalign-stats"), pid]
        pool = _pool[0]
    assert isinstance(pool, ThreadPoolExecutor)
    return pool


def zeros(t: torch.Tensor) -> int | None:
    """How many elements of a floating CPU tensor are zero (+0 or -0; NaN is not), from one
    read; None where the kernels are unavailable or the dtype has none."""
    if not _dense_cpu(t) or t.dtype not in _BITS or not _enabled():
        return None
    entry = _entry(f"precalign_zeros_{_BITS[t.dtype]}")
    if entry is None:
        return None
    if not t.numel():
        return 0
    flat = _contiguous(t)
    return int(entry(flat.data_ptr(), flat.numel()))


def norms(after: torch.Tensor, before: torch.Tensor, *, keep: bool = False) -> tuple[float, float] | None:
    """(sum of squares of ``after``, of ``before - after``) of two CPU tensors of one shape
    and floating dtype, in float64 from one read of each; None where the kernels are
    unavailable or the dtype has none. ``keep``: ``after`` is also copied into ``before``
    (both contiguous) block by block as it is read, so ``before`` is the next step's snapshot
    without another read of ``after``; nothing is written when None is returned."""
    entry = _for(after, "norms")
    if entry is None or not _dense_cpu(before) or before.dtype != after.dtype or before.shape != after.shape:
        return None
    if keep and not (after.is_contiguous() and before.is_contiguous()):
        raise ValueError("norms(keep=True) copies raw memory: both tensors must be contiguous")
    if not after.numel():
        return 0.0, 0.0
    a, b = _contiguous(after), _contiguous(before)
    out = (ctypes.c_double * 2)()
    entry(a.data_ptr(), b.data_ptr(), a.numel(), int(keep), out)
    return out[0], out[1]


def norms_of(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], *, keep: bool = False
) -> list[tuple[float, float]] | None:
    """``norms(after, before, keep=keep)`` of every pair, the pairs shared between this thread
    and the helper thread when torch may use two (a step's parameters are read from memory: a
    second core reads them faster); None, having written nothing, unless every pair has a
    kernel. Each pair's values are its own, whichever thread took it."""
    if not all(
        _for(a, "norms") is not None and _dense_cpu(b) and b.dtype == a.dtype and b.shape == a.shape
        for a, b in pairs
    ):
        return None
    threaded = all(_SYMBOLS["norms"][a.dtype] in _threaded for a, _ in pairs)
    got = _on_two_threads([a.numel() for a, _ in pairs], lambda i: norms(*pairs[i], keep=keep), threaded)
    return None if any(g is None for g in got) else [g for g in got if g is not None]


def zeros_of(tensors: Sequence[torch.Tensor]) -> int | None:
    """``zeros`` of every tensor, added; shared between two threads as ``norms_of``; None
    unless every tensor has a kernel."""
    if not all(_dense_cpu(t) and t.dtype in _BITS for t in tensors) or not _enabled():
        return None
    for t in tensors:  # built (and known to share torch's threads or not) before they are shared
        _entry(f"precalign_zeros_{_BITS[t.dtype]}")
    threaded = all(f"precalign_zeros_{_BITS[t.dtype]}" in _threaded for t in tensors)
    got = _on_two_threads([t.numel() for t in tensors], lambda i: zeros(tensors[i]), threaded)
    return None if any(g is None for g in got) else sum(g for g in got if g is not None)


def _on_two_threads(sizes: Sequence[int], work: Callable[[int], _T], threaded: bool = False) -> list[_T]:
    """``[work(i) for i in range(len(sizes))]``, the items shared by size between this thread
    and the helper thread when torch may use two threads (the C kernels release the GIL) and
    the kernels do not share each item with torch's own threads already (``threaded``: a
    helper thread would only compete with them)."""
    if threaded or torch.get_num_threads() < 2 or len(sizes) < 2:
        return [work(i) for i in range(len(sizes))]
    mine: list[int] = []
    theirs: list[int] = []
    load = [0, 0]
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):  # largest first, to the lighter side
        side = 0 if load[0] <= load[1] else 1
        (mine if side == 0 else theirs).append(i)
        load[side] += sizes[i]
    later = _worker().submit(lambda: [(i, work(i)) for i in theirs])
    done = {i: work(i) for i in mine}
    done.update(later.result())
    return [done[i] for i in range(len(sizes))]


def _dense_cpu(t: torch.Tensor) -> bool:
    """A strided tensor in host memory (not sparse, not on a device, not a meta tensor) that
    holds its own values: a tensor subclass (a ``DTensor``: ``data_ptr()`` 0) never reaches
    the kernels (``sharded.plain``)."""
    return bool(t.is_cpu) and t.layout == torch.strided and plain(t)


def _for(t: torch.Tensor, family: str) -> Entry | None:
    """The entry point of ``family`` ("stats", "norms") for ``t``'s dtype (built on first use);
    None where ``t`` is not a dense CPU tensor of a dtype with one, or the kernels are off.
    Run for every tensor a recorder summarises: a lookup, no string built."""
    symbol = _SYMBOLS[family].get(t.dtype)
    if symbol is None or not _dense_cpu(t) or not _enabled():
        return None
    return _loaded[symbol] if symbol in _loaded else _entry(symbol)


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in row-major order (a copy for a non-contiguous tensor: equal values
    get equal statistics whatever their layout); read as raw memory, never through autograd."""
    return t if t.is_contiguous() else t.detach().contiguous()


def _enabled() -> bool:
    return os.environ.get("PRECALIGN_FUSED_STATS", "1") != "0"


def _entry(symbol: str) -> Entry | None:
    if symbol in _loaded:
        return _loaded[symbol]
    with _lock:
        if symbol not in _loaded:
            _loaded[symbol] = _load(symbol)
    return _loaded[symbol]


def _load(symbol: str) -> Entry | None:
    """The entry point ``symbol``, built into the cache folder unless it is there already."""
    try:
        path = _built(symbol)
        library = ctypes.CDLL(str(path))
        loaded = getattr(library, symbol)
        if library.precalign_shared_threads():
            _threaded.add(symbol)
    except (OSError, subprocess.SubprocessError, AttributeError) as exc:
        _problems[symbol] = _reason(exc)
        return None
    if "_zeros_" in symbol:
        loaded.restype, loaded.argtypes = ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int64]
    elif "_norms_" in symbol:  # (after, before, n, keep, out)
        loaded.restype = None
        loaded.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]
    else:
        loaded.restype, loaded.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    entry: Entry = loaded
    return entry


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"the C kernels could not be built ({type(exc).__name__}: {text[0] if text else ''})"


def _built(symbol: str) -> Path:
    """The library of ``symbol`` in the cache folder, built unless it is there: with the
    threads of torch's OpenMP runtime where that can be shared (``_shared_threads``), else
    (or if that build fails) for the calling thread alone."""
    compiler = _compiler()
    shared = _shared_threads(tuple(compiler))
    try:
        return _build(compiler, (*_FLAGS, *shared, f"-DWANT_{symbol}"), symbol)
    except BuildFailed:
        if not shared:
            raise
    return _build(compiler, (*_FLAGS, f"-DWANT_{symbol}"), symbol)


class BuildFailed(OSError):
    """The compiler exited with an error."""


def _build(compiler: list[str], flags: tuple[str, ...], symbol: str) -> Path:
    key = hashlib.sha256()
    for part in (
        SOURCE.read_bytes(),
        _identity(tuple(compiler)).encode(),
        " ".join(flags).encode(),
        platform.machine().encode(),
    ):
        key.update(part)
        key.update(b"\0")
    folder = _cache_folder()
    path = folder / f"{symbol}-{key.hexdigest()[:16]}.so"
    if path.is_file():
        why = _not_ours(path)
        if why is None:
            return path
        raise OSError(f"{path} {why}: not loaded")
    fd, tmp = tempfile.mkstemp(prefix=f".{symbol}-", suffix=".so", dir=folder)
    os.close(fd)
    try:
        done = subprocess.run(
            [*compiler, *flags, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise BuildFailed(f"{shlex.join(compiler)} exited {done.returncode}: {done.stderr.strip()[:300]}")
        os.chmod(tmp, 0o700)  # this user's alone, whatever the umask (see _not_ours)
        os.replace(tmp, path)  # atomic: a concurrent build (another xdist worker) loads either
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


@functools.cache
def _shared_threads(compiler: tuple[str, ...]) -> tuple[str, ...]:
    """``("-fopenmp",)`` where a kernel built with it runs on torch's own intra-op threads:
    torch has GCC's OpenMP runtime loaded under its usual name (``libgomp.so.1``, which a
    library built by GCC with ``-fopenmp`` asks for, so the loader hands it the same runtime
    and its thread pool, the one torch's threads already wait in) and the compiler is GCC. Else
    nothing: a second OpenMP runtime would start threads of its own beside torch's."""
    if not _torch_gomp():
        return ()
    try:
        done = subprocess.run(
            [*compiler, "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    macros = done.stdout
    gcc = "__GNUC__" in macros and not any(
        m in macros for m in ("__clang__", "__INTEL_COMPILER", "__INTEL_LLVM_COMPILER")
    )
    return ("-fopenmp",) if gcc else ()


def _torch_gomp() -> bool:
    """Whether GCC's OpenMP runtime is loaded in this process as ``libgomp.so.1`` (torch's)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    return any(line.endswith("/libgomp.so.1") for line in maps.splitlines())


def _compiler() -> list[str]:
    """The C compiler: ``CC``, else the one Python was built with, else ``cc``."""
    named = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    command = shlex.split(str(named))
    if not command or shutil.which(command[0]) is None:
        if os.environ.get("CC"):
            raise OSError(f"CC={os.environ['CC']!r} is not an executable")
        command = ["cc"]
        if shutil.which("cc") is None:
            raise OSError("no C compiler found (set CC)")
    return command


@functools.cache
def _identity(compiler: tuple[str, ...]) -> str:
    done = subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=30)
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else shlex.join(compiler)


def _cache_folder() -> Path:
    named = os.environ.get("PRECALIGN_CACHE_DIR")
    xdg = os.environ.get("XDG_CACHE_HOME")
    candidates = [Path(named)] if named else []
    candidates.append((Path(xdg) if xdg else Path.home() / ".cache") / "pytest-precalign")
    candidates.append(Path(tempfile.gettempdir()) / f"pytest-precalign-{getattr(os, 'getuid', int)()}")
    refused: list[str] = []
    for folder in candidates:
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            continue
        why = _not_ours(folder)
        if why is None and os.access(folder, os.W_OK):
            return folder
        if why is not None:
            refused.append(f"{folder} {why}")
    said = f" ({'; '.join(refused)})" if refused else ""
    raise OSError(f"no private writable cache folder for the C kernels{said} (set PRECALIGN_CACHE_DIR)")


def _not_ours(path: Path) -> str | None:
    """Why a library there could be another user's (None: it is this user's alone): a
    library is loaded into the process, so neither it nor its folder may be owned or
    writable by anyone else (``/tmp`` is shared)."""
    getuid = getattr(os, "getuid", None)
    if getuid is None:  # no owners to check (Windows)
        return None
    st = path.stat()
    if st.st_uid != getuid():
        return f"is owned by uid {st.st_uid}, not this user"
    if st.st_mode & 0o022:
        return "is writable by others"
    return None
