"""torch.save archives read from their mapped bytes (pt_zip) agree with zipfile member for
member, and read_pt takes that path for what torch.save writes, falls back to zipfile for
what it does not cover, and names the file of a corrupt one."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from pytest_precalign.errors import TraceError
from pytest_precalign.trace import pt_zip, tensor_files
from pytest_precalign.trace.tensor_files import read_pt

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int64, torch.int32]


def _sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 50).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=gen).to(dtype)


def _expected(tensor: torch.Tensor) -> np.ndarray:
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).contiguous().numpy()


def test_members_are_zipfiles_members(tmp_path: Path) -> None:
    path = tmp_path / "t.pt"
    torch.save(_sample(torch.float32, (33, 7)), path)
    data = path.read_bytes()
    members = pt_zip.stored_members(data)
    assert members is not None
    with zipfile.ZipFile(path) as archive:
        assert sorted(members) == sorted(archive.namelist())
        for name, m in members.items():
            start = pt_zip.data_start(data, m)
            assert start is not None and data[start : start + m.size] == archive.read(name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_read_pt_takes_the_direct_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """Without zipfile (the fallback raises), torch.save files of each dtype read exactly,
    also a slice with a storage offset and a transposed (non-contiguous) view."""

    def no_zipfile(*_: object) -> np.ndarray:
        raise AssertionError("zipfile path taken")

    monkeypatch.setattr(tensor_files, "_read_pt_zipfile", no_zipfile)
    base = _sample(dtype, (40, 24))
    for name, tensor in {"whole": base, "slice": base[5:17], "t": base.t(), "col": base[3:, 2]}.items():
        torch.save(tensor, tmp_path / f"{name}.pt")
        got = read_pt(tmp_path / f"{name}.pt")
        assert got.shape == tuple(tensor.shape) and got.dtype == _expected(tensor).dtype
        assert np.array_equal(got, _expected(tensor)), name


def test_a_compressed_member_falls_back_to_zipfile(tmp_path: Path) -> None:
    tensor = _sample(torch.float32, (9, 4))
    torch.save(tensor, tmp_path / "t.pt")
    with zipfile.ZipFile(tmp_path / "t.pt") as src, zipfile.ZipFile(tmp_path / "z.pt", "w") as out:
        for info in src.infolist():  # data.pkl deflated, the storage stored, as zipfile writes them
            deflate = info.filename.endswith("data.pkl")
            out.writestr(
                info.filename, src.read(info), zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
            )
    assert pt_zip.stored_members((tmp_path / "z.pt").read_bytes()) is None
    assert np.array_equal(read_pt(tmp_path / "z.pt"), tensor.numpy())


@pytest.mark.parametrize("damage", ["directory", "pickle", "truncated", "storage", "local header"])
def test_a_corrupt_file_is_one_trace_error_naming_it(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "t.pt"
    torch.save(_sample(torch.float32, (64, 64)), path)
    data = bytearray(path.read_bytes())
    members = pt_zip.stored_members(bytes(data))
    assert members is not None
    pkl = next(m for n, m in members.items() if n.endswith("data.pkl"))
    pkl_start = pt_zip.data_start(bytes(data), pkl)
    assert pkl_start is not None
    if damage == "directory":
        at = data.index(b"PK\x01\x02")
        data[at : at + 4] = b"XXXX"
    elif damage == "pickle":
        data[pkl_start : pkl_start + pkl.size] = b"\xff" * pkl.size
    elif damage == "truncated":
        data = data[: len(data) - 30]
    elif damage == "storage":  # the storage's bytes end early, the directory intact
        storage = next(m for n, m in members.items() if n.endswith("data/0"))
        start = pt_zip.data_start(bytes(data), storage)
        assert start is not None
        data = data[: start + 100] + data[start + storage.size :]
    else:  # the storage's local header overwritten, the directory intact
        storage = next(m for n, m in members.items() if n.endswith("data/0"))
        data[storage.local : storage.local + 4] = b"XXXX"
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(data))
    with pytest.raises(TraceError, match=r"bad\.pt: not a readable torch tensor file") as info:
        read_pt(bad)
    assert "\n" not in str(info.value)
