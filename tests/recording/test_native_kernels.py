"""The C kernels (``recording/native_kernels.py``): a CPU tensor's statistics from one read
against torch's reductions (max, min and NaN/Inf counts bit for bit, sum and norm within the
stated bound of the exact values) on the tensors a recording meets; the same bits whatever
vector instructions the compiler used; exact zero counts; an optimizer step's two norms
without writing ``before - after``; and, where no compiler works, torch's reductions with the
reason in the manifest."""

from __future__ import annotations

import ctypes
import json
import math
import os
import platform
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pytest_precalign.recording import native_kernels
from pytest_precalign.recording.chunked_stats import SUM_ULPS
from pytest_precalign.recording.tensor_summary import stats_vector

pytestmark = pytest.mark.skipif(
    native_kernels.kernel_state() != "native", reason=f"no C kernels here: {native_kernels.kernel_state()}"
)


def _bits(values: list[float]) -> list[bytes]:
    return [struct.pack("<d", v) for v in values]


def _reference(t: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    with monkeypatch.context() as m:
        m.setenv("PRECALIGN_FUSED_STATS", "0")
        return list(stats_vector(t, counts="if_nonfinite").tolist())


def _exact(t: torch.Tensor) -> tuple[float, float, float]:
    values = t.double().reshape(-1).tolist()
    return math.fsum(values), math.sqrt(math.fsum(v * v for v in values)), math.fsum(map(abs, values))


def _cases() -> Iterator[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100_003, generator=g) * 3 + 1  # not a multiple of a block: a tail
    yield "random", x
    yield "constant", torch.full((70_001,), 0.1)
    yield "all_zero", torch.zeros(4_097)
    yield "denormal", torch.full((5_000,), 1e-40)
    yield "bfloat16", x.bfloat16()
    yield "float16", x.half()
    yield "float16_subnormal", torch.full((300,), 3e-6).half()
    yield "float64", x.double()
    yield "non_contiguous", torch.randn(300, 701, generator=g).t()
    yield "one_element", torch.tensor([2.5])
    yield "negative_zero", torch.tensor([-0.0, 0.0, -0.0])
    yield "large_values", torch.full((1000,), 1e18)
    nan_inf = x.clone()
    nan_inf[[3, 7]] = float("nan")
    nan_inf[11] = float("inf")
    yield "nan_and_inf", nan_inf
    yield "only_inf", torch.tensor([float("inf"), float("-inf"), 1.0])
    yield "bf16_nan", nan_inf.bfloat16()
    yield "overflowing_norm", torch.full((4,), 3e38)
    yield "in_pieces", torch.randn(native_kernels.PART + 1001, generator=g) - 0.5  # two threads


@pytest.mark.parametrize(("name", "t"), list(_cases()))
def test_one_read_gives_torchs_max_min_and_counts_and_the_exact_sum_and_norm_within_the_bound(
    name: str, t: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    got, ref = stats_vector(t, counts="if_nonfinite").tolist(), _reference(t, monkeypatch)
    assert got[4:] == ref[4:]
    total, norm, magnitude = _exact(t) if bool(torch.isfinite(t).all()) else (math.nan,) * 3
    if not (math.isfinite(total) and math.isfinite(norm)):
        assert _bits(got) == _bits(ref)  # not finite: torch's reductions take it, counts and all
        return
    if not all(map(math.isfinite, ref[:4])):  # torch's fp32 sum or norm overflowed; the exact did not
        assert name in ("large_values", "overflowing_norm")
    assert got[:2] == ref[:2]  # exact (-0.0 and 0.0 are one value)
    eps = torch.finfo(torch.float64 if t.dtype == torch.float64 else torch.float32).eps
    underflow = math.sqrt(t.numel() * torch.finfo(torch.float32).smallest_normal * eps)
    assert abs(got[2] - total) <= SUM_ULPS * eps * magnitude
    assert abs(got[3] - norm) <= SUM_ULPS * eps * norm + underflow
    assert _bits(stats_vector(t.clone(), counts="if_nonfinite").tolist()) == _bits(got)  # equal -> equal


def test_the_kernel_is_used_and_closer_than_torchs_fp32_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    t = torch.full((1 << 20,), 0.1)
    _, norm, _ = _exact(t)
    eps = torch.finfo(torch.float32).eps
    assert abs(_reference(t, monkeypatch)[3] - norm) > 10 * SUM_ULPS * eps * norm  # torch's: far off
    assert abs(stats_vector(t).tolist()[3] - norm) <= eps * norm  # here: about the rounding


# -- the same bits whatever vector instructions the compiler used ---------------------------


def _build(tmp: Path, march: str | None, symbol: str) -> ctypes.CDLL:
    flags = ["-O3", "-ffp-contract=off", "-fPIC", "-shared", f"-DWANT_{symbol}"]
    if march:
        flags += [f"-march={march}", "-DPRECALIGN_NO_CLONES"]
    out = tmp / f"{symbol}-{march or 'clones'}.so"
    subprocess.run(["cc", *flags, "-o", str(out), str(native_kernels.SOURCE)], check=True)
    return ctypes.CDLL(str(out))


def _supported(march: str) -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    need = {"x86-64": [], "x86-64-v3": ["avx2", "fma"], "x86-64-v4": ["avx512f", "avx512bw"]}[march]
    return all(f" {n}" in flags for n in need)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the vector paths compared are x86-64's")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_sse2_avx2_and_avx512_builds_give_the_same_bits(dtype: torch.dtype, tmp_path: Path) -> None:
    suffix = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64"}[dtype]
    symbol = f"precalign_stats_{suffix}"
    marches = [m for m in ("x86-64", "x86-64-v3", "x86-64-v4") if _supported(m)]
    assert marches[0] == "x86-64" and len(marches) >= 2, "this machine runs at least two vector widths"
    g = torch.Generator().manual_seed(1)
    tensors = [
        (torch.randn(n, generator=g) * 10 ** (n % 5)).to(dtype) for n in (1, 31, 257, 16_385, 1_000_003)
    ]
    results: dict[str | None, list[list[float]]] = {}
    for march in [None, *marches]:
        entry = getattr(_build(tmp_path, march, symbol), symbol)
        entry.restype, entry.argtypes = None, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        rows = []
        for t in tensors:
            out = (ctypes.c_double * 4)()
            entry(t.data_ptr(), t.numel(), out)
            rows.append(list(out))
        results[march] = rows
    first = _bits([v for row in results[None] for v in row])
    for march, rows in results.items():
        assert _bits([v for row in rows for v in row]) == first, march


# -- zero counts and an optimizer step's norms -----------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_zero_counts_are_count_nonzeros_exactly(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    t = torch.randn(10_007, generator=g)
    t[t.abs() < 0.5] = 0.0
    t[::7] = -0.0
    t[[1, 2]] = float("nan")
    t = t.to(dtype)
    for view in (t, t[1:].reshape(-1, 2)[:, 0], t[:1], t[:0]):
        assert native_kernels.zeros(view) == view.numel() - int(torch.count_nonzero(view))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_step_norms_are_the_exact_ones_within_the_bound_from_one_read(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    before = torch.randn(70_001, generator=g).to(dtype)
    after = (before.float() - 1e-3 * torch.randn(70_001, generator=g)).to(dtype)
    kept = before.clone()
    got = native_kernels.norms(after, before)
    assert got is not None and torch.equal(before, kept)  # nothing written
    exact_p = math.fsum(v * v for v in after.double().tolist())
    exact_u = math.fsum(v * v for v in (before.double() - after.double()).tolist())
    eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    assert abs(got[0] - exact_p) <= SUM_ULPS * eps * exact_p
    assert abs(got[1] - exact_u) <= SUM_ULPS * eps * exact_u


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_keeping_writes_after_over_before_and_changes_no_norm(dtype: torch.dtype, threads: int) -> None:
    g = torch.Generator().manual_seed(5)
    for n in (1, 255, 257, 70_001, 1_000_003):  # a tail, a block, superblocks shared by threads
        before = torch.randn(n, generator=g).to(dtype)
        after = (before.double() - 1e-2 * torch.randn(n, generator=g, dtype=torch.float64)).to(dtype)
        copy, after_bits = before.clone(), after.clone()
        saved = torch.get_num_threads()
        try:
            torch.set_num_threads(threads)
            plain = native_kernels.norms(after, copy)
            kept = native_kernels.norms(after, before, keep=True)
        finally:
            torch.set_num_threads(saved)
        assert plain is not None and kept == plain, n
        assert torch.equal(before.view(torch.uint8), after.view(torch.uint8)), n  # the bits, -0 and NaN too
        assert torch.equal(after.view(torch.uint8), after_bits.view(torch.uint8)), n  # after not written


def test_keeping_needs_contiguous_memory_and_a_refused_pair_writes_nothing() -> None:
    after, before = torch.randn(8, 4), torch.randn(4, 8)
    with pytest.raises(ValueError, match="contiguous"):
        native_kernels.norms(after, before.t(), keep=True)
    fine, kept = torch.randn(300), torch.randn(300)
    pairs = [(fine, kept.clone()), (torch.randn(3), torch.randn(4))]  # the second has no kernel
    assert native_kernels.norms_of(pairs, keep=True) is None
    assert torch.equal(pairs[0][1], kept)


def test_no_kernel_for_a_sparse_meta_integer_or_mismatched_tensor() -> None:
    sparse = torch.eye(4).to_sparse()
    assert native_kernels.stats(sparse) is None and native_kernels.zeros(sparse) is None
    assert native_kernels.stats(torch.empty(4, device="meta")) is None
    assert native_kernels.norms(torch.zeros(4), torch.empty(4, device="meta")) is None
    assert native_kernels.stats(torch.arange(5)) is None
    assert native_kernels.zeros(torch.arange(5)) is None
    assert native_kernels.norms(torch.zeros(3), torch.zeros(4)) is None
    assert native_kernels.norms(torch.zeros(3), torch.zeros(3, dtype=torch.float64)) is None


# -- no compiler, a fresh cache: torch's reductions, and why ---------------------------------

_PROBE = """
import json, torch
from pytest_precalign.recording import native_kernels
from pytest_precalign.recording.determinism import numerics
from pytest_precalign.recording.tensor_summary import stats_vector
t = torch.randn(1000, generator=torch.Generator().manual_seed(0))
print(json.dumps({"state": native_kernels.kernel_state(), "numerics": numerics()["stats_kernel"],
                  "stats": stats_vector(t).tolist()}))
"""


def _probe(tmp_path: Path, **env: str) -> dict[str, object]:
    run_env = {**os.environ, "PRECALIGN_CACHE_DIR": str(tmp_path / "cache"), **env}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=run_env, capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_without_a_compiler_torch_reduces_and_the_manifest_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = _probe(tmp_path, CC=str(tmp_path / "no-such-cc"))
    assert missing["state"] == missing["numerics"]
    assert str(missing["state"]).startswith("torch: the C kernels could not be built")
    assert "no-such-cc" in str(missing["state"])
    t = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    with monkeypatch.context() as m:
        m.setenv("PRECALIGN_FUSED_STATS", "0")
        assert _bits(list(missing["stats"])) == _bits(stats_vector(t).tolist())  # type: ignore[call-overload]
    built = _probe(tmp_path)
    assert built["state"] == "native" and list((tmp_path / "cache").glob("precalign_stats_f32-*.so"))
    assert _bits(list(built["stats"])) == _bits(stats_vector(t).tolist())  # type: ignore[call-overload]
    off = _probe(tmp_path, PRECALIGN_FUSED_STATS="0")
    assert off["state"] == "torch: PRECALIGN_FUSED_STATS=0"


def test_a_steps_norms_and_zeros_on_two_threads_are_the_one_threads_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(4)
    after = [torch.randn(n, generator=g) for n in (70_001, 5, 300_000, 1, 4096)]
    before = [a + 1e-3 * torch.randn(a.shape, generator=g) for a in after]
    for a in after:
        a[::3] = 0.0
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = native_kernels.norms_of(list(zip(after, before, strict=True))), native_kernels.zeros_of(after)
        torch.set_num_threads(1)
        one = native_kernels.norms_of(list(zip(after, before, strict=True))), native_kernels.zeros_of(after)
    finally:
        torch.set_num_threads(threads)
    assert two == one and one[1] == sum(a.numel() - int(torch.count_nonzero(a)) for a in after)
    assert one[0] == [native_kernels.norms(a, b) for a, b in zip(after, before, strict=True)]


def test_a_library_or_cache_folder_others_could_write_is_never_loaded(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # like a folder in /tmp anyone may write into
    private = tmp_path / "private"
    run = _probe(tmp_path, PRECALIGN_CACHE_DIR=str(shared), XDG_CACHE_HOME=str(private))
    assert run["state"] == "native"
    assert not list(shared.glob("*.so")) and list(
        (private / "pytest-precalign").glob("precalign_stats_f32-*.so")
    )
    for built in (private / "pytest-precalign").glob("*.so"):
        assert built.stat().st_mode & 0o077 == 0  # private whatever the umask
        built.chmod(0o666)  # now someone else could have replaced it
    again = _probe(tmp_path, PRECALIGN_CACHE_DIR=str(shared), XDG_CACHE_HOME=str(private))
    assert str(again["state"]).startswith("torch: the C kernels could not be built")
    assert "is writable by others: not loaded" in str(again["state"])


# -- shared with torch's own threads ---------------------------------------------------------


def _sizes() -> list[int]:
    """Around the superblock (16384 elements), the smallest shared read (4 superblocks) and
    a share boundary of odd superblock counts, with tails."""
    sb = 64 * 256
    return [
        1,
        255,
        sb - 1,
        sb,
        3 * sb + 5,
        4 * sb - 1,
        4 * sb,
        4 * sb + 1,
        7 * sb + 300,
        45 * sb + 777,
        200 * sb + 3,
    ]  # at most PART: one call


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_a_read_shared_by_torchs_threads_gives_one_threads_bits(dtype: torch.dtype, tmp_path: Path) -> None:
    """The library the recorder loads (on torch's OpenMP threads where it can be: see
    ``_shared_threads``) against a build without threads, at torch's thread counts 1 and 2:
    the same bits, -0 before +0 kept as the first of equal values."""
    suffix = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64"}[dtype]
    symbol = f"precalign_stats_{suffix}"
    alone = getattr(_build(tmp_path, "x86-64" if platform.machine() == "x86_64" else None, symbol), symbol)
    alone.restype, alone.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    g = torch.Generator().manual_seed(7)
    tensors = [(torch.randn(n, generator=g) * 4).to(dtype) for n in _sizes()]
    zeros = torch.zeros(5 * 64 * 256, dtype=dtype)
    zeros[::2] = -0.0  # max/min among equal values: the first one read, whoever read it
    tensors.append(zeros)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            for t in tensors:
                out = (ctypes.c_double * 4)()
                assert alone(t.data_ptr(), t.numel(), out)
                expected = [out[0], out[1], out[2], math.sqrt(out[3])]
                assert _bits(native_kernels.stats(t) or []) == _bits(expected), (n, t.numel())
    finally:
        torch.set_num_threads(threads)


def test_where_torch_runs_on_gccs_openmp_the_statistics_share_its_threads() -> None:
    """torch's own libgomp, not a second runtime with threads of its own: one libgomp mapped,
    no thread started by a shared read."""
    if not native_kernels._torch_gomp():
        pytest.skip("torch does not run on GCC's OpenMP runtime here")
    t = torch.randn(64 * 64 * 256)
    assert native_kernels.stats(t) is not None
    assert "precalign_stats_f32" in native_kernels._threaded  # GCC builds it with -fopenmp
    maps = [
        line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "libgomp" in line
    ]
    assert len(set(maps)) == 1, set(maps)
    tasks = len(os.listdir("/proc/self/task"))
    for _ in range(5):
        native_kernels.stats(t)
    assert len(os.listdir("/proc/self/task")) == tasks
