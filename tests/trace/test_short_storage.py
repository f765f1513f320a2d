"""A tensor file whose storage is shorter than its header says is a file error, not data
(issue #25, item 4): torch refuses it, and so does the torch-free reader."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from pytest_precalign.errors import TraceError
from pytest_precalign.trace.tensor_files import read_pt

torch = pytest.importorskip("torch")


def _shortened(src: Path, dst: Path, keep: int) -> None:
    """``src`` rewritten (stored, uncompressed) with its storage member cut to ``keep`` bytes;
    the members after it (version, byteorder, ...) still follow, so bytes past the storage exist."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if "/data/" in info.filename:
                data = data[:keep]
            zout.writestr(info.filename, data)


@pytest.mark.parametrize("contiguous", [True, False])
def test_a_storage_shorter_than_its_header_is_a_trace_error_naming_the_file(
    tmp_path: Path, contiguous: bool
) -> None:
    tensor = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    if not contiguous:
        tensor = tensor.t()
    whole = tmp_path / "whole.pt"
    torch.save(tensor, whole)
    assert (read_pt(whole) == tensor.numpy()).all()
    short = tmp_path / "Module.layer.forward.0.output.0.pt"
    _shortened(whole, short, keep=4 * 40)  # 40 of 64 elements
    with pytest.raises(Exception):  # noqa: B017 -- torch itself refuses the file
        torch.load(short, weights_only=True)
    with pytest.raises(TraceError, match=r"Module\.layer\.forward\.0\.output\.0\.pt: .*160 bytes.*256"):
        read_pt(short)
