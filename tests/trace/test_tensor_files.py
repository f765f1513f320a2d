"""Tensor files read without torch (tensor_files) agree with torch's own readers, bit for bit,
and the chunked numpy metrics agree with torch.testing and a direct torch computation."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from pytest_precalign.compare import metrics
from pytest_precalign.errors import TraceError
from pytest_precalign.trace.tensor_files import SafetensorsFile, Unsupported, read_pt

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
]


def _sample(dtype: torch.dtype, shape: tuple[int, ...] = (3, 5)) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 100).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=gen).to(dtype)


def _same(array: np.ndarray, tensor: torch.Tensor) -> None:
    expected = tensor.float() if tensor.dtype == torch.bfloat16 else tensor
    assert tuple(array.shape) == tuple(tensor.shape)
    assert np.array_equal(array, expected.numpy())
    assert array.dtype == expected.numpy().dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_read_pt_matches_torch_load(tmp_path: Path, dtype: torch.dtype) -> None:
    tensor = _sample(dtype)
    torch.save(tensor, tmp_path / "t.pt")
    _same(read_pt(tmp_path / "t.pt"), tensor)


def test_read_pt_views_slices_transposes_and_scalars(tmp_path: Path) -> None:
    base = _sample(torch.float32, (6, 8))
    cases = {
        "slice": base[2:5],  # a storage offset
        "transposed": base.t(),  # non-contiguous strides
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
    }
    for name, tensor in cases.items():
        torch.save(tensor, tmp_path / f"{name}.pt")
        _same(read_pt(tmp_path / f"{name}.pt"), tensor)


def test_read_pt_leaves_other_content_to_torch(tmp_path: Path) -> None:
    torch.save({"a": torch.ones(2)}, tmp_path / "dict.pt")
    with pytest.raises(Unsupported):
        read_pt(tmp_path / "dict.pt")


def test_read_pt_truncated_or_missing_is_a_trace_error(tmp_path: Path) -> None:
    torch.save(_sample(torch.float32, (64, 64)), tmp_path / "t.pt")
    data = (tmp_path / "t.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match=r"cut\.pt: not a readable torch tensor file"):
        read_pt(tmp_path / "cut.pt")
    with pytest.raises(TraceError, match="missing"):
        read_pt(tmp_path / "absent.pt")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_safetensors_reader_matches_safetensors(tmp_path: Path, dtype: torch.dtype) -> None:
    tensors = {"a": _sample(dtype), "b": _sample(dtype, (2, 3, 4))}
    save_file(tensors, str(tmp_path / "s.safetensors"))
    reader = SafetensorsFile(tmp_path / "s.safetensors")
    for key, tensor in tensors.items():
        _same(reader.array(key), tensor)


def test_safetensors_reader_refuses_bad_files(tmp_path: Path) -> None:
    save_file({"a": _sample(torch.float32, (32, 32))}, str(tmp_path / "s.safetensors"))
    data = (tmp_path / "s.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) - 100])
    with pytest.raises(TraceError, match="runs past the end of the file"):
        SafetensorsFile(tmp_path / "cut.safetensors").array("a")
    (tmp_path / "tiny.safetensors").write_bytes(b"\x01")
    with pytest.raises(TraceError, match="shorter than its header"):
        SafetensorsFile(tmp_path / "tiny.safetensors")
    header = json.dumps({"a": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}}).encode()
    (tmp_path / "odd.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0")
    with pytest.raises(TraceError, match=r"dtype 'F8_E4M3' \(readable: F64, F32"):
        SafetensorsFile(tmp_path / "odd.safetensors").array("a")


def _torch_metrics(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """The definitions, computed directly in torch (float64) as a reference."""
    ok = torch.isfinite(a) & torch.isfinite(b)
    a, b = a[ok].double(), b[ok].double()
    d = (b - a).abs()
    rel = d / a.abs().clamp_min(1e-30)
    return {
        "cosine": float(a @ b / (a.norm() * b.norm())),
        "max_abs": float(d.max()),
        "mean_abs": float(d.mean()),
        "max_rel": float(rel.max()),
        "euclidean": float(d.norm()),
        "one_thousandth": float((rel <= 1e-3).double().mean()),
        "five_thousandth": float((rel <= 5e-3).double().mean()),
    }


def test_chunked_metrics_match_torch_across_chunks() -> None:
    gen = torch.Generator().manual_seed(3)
    n = metrics.CHUNK * 3 + 17  # several chunks and a ragged tail
    a = torch.randn(n, generator=gen, dtype=torch.float64)
    b = a + 1e-3 * torch.randn(n, generator=gen, dtype=torch.float64)
    a[5], b[metrics.CHUNK + 1] = float("nan"), float("inf")  # excluded from the metrics
    got = metrics.metric_values(a, b, tuple(metrics.METRICS))
    want = _torch_metrics(a, b)
    for name, value in want.items():
        assert got[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name


def test_closeness_finds_the_worst_element_in_a_later_chunk() -> None:
    n = metrics.CHUNK * 2 + 5
    a = torch.zeros(n)
    b = torch.zeros(n)
    b[3] = 5e-6  # within atol, in the first chunk
    b[metrics.CHUNK + 9] = 2e-5  # the only mismatch, in the second chunk
    b[2 * metrics.CHUNK + 1] = 1e-5
    c = metrics.closeness(a, b, atol=1e-5, rtol=1.3e-6)
    assert c.mismatched == 1
    assert c.worst_index == (metrics.CHUNK + 9,)
    assert c.greatest_abs == pytest.approx(2e-5)
    with pytest.raises(AssertionError, match="Mismatched elements: 1 /"):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1.3e-6)
    aligned = metrics.closeness(a, a + 1e-6, atol=1e-5, rtol=0.0)
    assert (aligned.mismatched, aligned.greatest_abs) == (0, pytest.approx(1e-6))


def test_closeness_counts_like_torch_testing_on_random_data() -> None:
    gen = torch.Generator().manual_seed(11)
    a = torch.randn(metrics.CHUNK + 1000, generator=gen)
    b = a + 1e-4 * torch.randn(a.shape, generator=gen)
    atol, rtol = 1e-5, 1e-4
    c = metrics.closeness(a, b, atol, rtol)
    expected = int((~torch.isclose(b, a, atol=atol, rtol=rtol)).sum())
    assert c.mismatched == expected > 0
    assert c.greatest_abs == pytest.approx(float((b - a).abs().max()))
    assert math.isfinite(c.greatest_rel)


def test_offline_compare_does_not_import_torch(tmp_path: Path) -> None:
    """An msprobe tensor dump pair compares without torch (the ~1 s import is most of a CLI
    run), and finds the same first divergence as with torch loaded."""
    from pytest_precalign.msprobe import write_msprobe_dump
    from pytest_precalign.recording import HookRecorder

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    for name in ("golden", "target"):
        if name == "target":
            with torch.no_grad():
                model[2].weight[0, 0] += 0.5
        with HookRecorder(model, mode="tensor") as rec:
            model(x).sum().backward()
        write_msprobe_dump(rec.trace(), tmp_path / name)
        model.zero_grad(set_to_none=True)
    golden, target = (tmp_path / n / "step0" / "rank0" for n in ("golden", "target"))
    code = (
        "import sys; from pytest_precalign.run.offline import compare_runs; "
        f"run = compare_runs({str(golden)!r}, {str(target)!r}); "
        "first = run.verdicts['forward'].first; "
        "tensors = sum(p.evidence == 'tensor' for p in run.comparison.pairs); "
        "print(tensors, first.name if first else None, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    count, first, torch_loaded = out.stdout.split()
    assert int(count) > 0
    assert first == "2"  # the perturbed Linear
    assert torch_loaded == "False"


def test_dtype_names_are_torch_dtypes() -> None:
    """The trace readers check dtype strings without importing torch: the list must be torch's."""
    from pytest_precalign.trace.records import DTYPE_NAMES

    torch_names = {n for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype)}
    assert torch_names <= DTYPE_NAMES | {"float8_e8m0fnu"}  # newer torch may add; older may lack
    assert torch_names | {"float4_e2m1fn_x2", "float8_e8m0fnu"} >= DTYPE_NAMES
