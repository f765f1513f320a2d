"""Lazy key -> tensor view over an msprobe ``dump_tensor_data/`` folder.

Keys are msprobe's ``data_name`` (``Module.lm_head.Linear.forward.0.output.0.pt``); a file is
loaded with ``torch.load(weights_only=True)`` only when its tensor is asked for, so reading a
dump costs no more than reading its dump.json. torch is imported on first access only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import TraceError
from ..trace.checksums import Stamps, check_opened
from ..untrusted import check_regular, open_regular, plain_name

TENSOR_DIR = "dump_tensor_data"


class PtTensors(Mapping[str, Any]):
    """``shapes``: data_name -> the shape dump.json gives, checked on load; ``stamps``: the
    files the folder's checksums were checked on (a file loaded must be one of them, unchanged)."""

    raw_bf16_arrays = True  # ``array(key, raw_bf16=True)``: see ``Trace.raw_array``

    def __init__(
        self, folder: Path, shapes: Mapping[str, tuple[int, ...]], stamps: Stamps | None = None
    ) -> None:
        self._folder = folder
        self._shapes = dict(shapes)
        self._stamps = stamps

    def __getitem__(self, key: str) -> Any:
        if key not in self._shapes:
            raise KeyError(key)
        import pickle

        import torch

        file = plain_name(key, self._folder, "dump.json: data_name", TraceError)
        try:
            handle = open_regular(file, TraceError, "a tensor file")
        except FileNotFoundError:
            raise TraceError(f"{file}: missing (dump.json names it as data_name)") from None
        try:
            with handle:
                check_opened(file, handle.fileno(), self._stamps)
                # The file checked is the file read: torch opens the descriptor already open
                # (a name swapped after the check is not followed). mmap: the bytes are paged
                # in as the compare reads them, not copied up front.
                opened = Path(f"/proc/self/fd/{handle.fileno()}")
                source: Any = opened if opened.exists() else handle
                tensor = torch.load(source, map_location="cpu", weights_only=True, mmap=source is opened)
        except (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError) as exc:
            raise TraceError(
                f"{file}: not a readable torch tensor file (truncated or corrupt?): {exc}"
            ) from None
        if not isinstance(tensor, torch.Tensor):
            raise TraceError(f"{file}: holds a {type(tensor).__name__}, expected a tensor")
        return self._checked(key, file, tensor)

    def array(self, key: str, raw_bf16: bool = False) -> Any:
        """The tensor as a numpy view of the mapped file, read without torch where the file
        holds one plain tensor (what msprobe writes); otherwise through ``torch.load``.
        ``raw_bf16``: a bfloat16 tensor read without torch comes as its uint16 bits."""
        if key not in self._shapes:
            raise KeyError(key)
        from ..trace.arrays import as_numpy
        from ..trace.tensor_files import Unsupported, read_pt

        file = self._file(key)
        try:
            array = read_pt(file, raw_bf16, self._stamps)
        except Unsupported:
            return as_numpy(self[key])
        return self._checked(key, file, array)

    def _file(self, key: str) -> Path:
        """The file of ``key``: a plain name in the folder, a regular file (not a FIFO)."""
        file = plain_name(key, self._folder, "dump.json: data_name", TraceError)
        try:
            check_regular(file, TraceError, "a tensor file")
        except FileNotFoundError:
            raise TraceError(f"{file}: missing (dump.json names it as data_name)") from None
        return file

    def _checked(self, key: str, file: Path, value: Any) -> Any:
        """``value`` (a tensor or an array) when its shape is the one dump.json gives."""
        if tuple(value.shape) != self._shapes[key]:
            raise TraceError(
                f"{file}: holds a tensor of shape {list(value.shape)}, dump.json says {list(self._shapes[key])}"
            )
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._shapes  # without loading (Mapping's default would load the file)

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)
