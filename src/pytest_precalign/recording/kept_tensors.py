"""Tensor mode's kept tensors: host copies in the trace, or handed to a background writer
(``tensor_sink.py``); and the statistics of the copies, computed when the trace is taken.

A CPU tensor kept in the trace is a snapshot: its statistics are those of the copy, whenever
they are computed. They are left out of the recorded step (measured on the mid Qwen2 on 2
cores: the statistics of one step's 318 tensors, 668 MB, take ~95 ms of a ~0.8 s step) and
computed by ``fill_stats`` when ``Recorder.trace()`` is called, for all of them with one
host sync. A tensor handed to the background writer, or on a device (its statistics queued
there at capture are cheaper than on the host copy), still has them queued in the step's
``StepBuffer``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from ..trace.records import Record, Stats
from .host_sync import to_host
from .tensor_sink import TensorSink
from .tensor_summary import stats_from_vector, stats_vector

_EMPTY = Stats(0.0, 0.0, 0.0, 0.0)


class KeptTensors:
    """The copies of one recorder (``tensors``, the trace's) and which wait for statistics."""

    def __init__(self, tensors: dict[str, torch.Tensor], sink: TensorSink | None) -> None:
        self.tensors = tensors
        self._sink = sink
        self._later: dict[str, Stats | None] = {}  # key -> statistics (None: not computed yet)

    def keep(self, key: str, data: torch.Tensor) -> bool:
        """Keep (or hand to the writer) a copy of ``data``; True when its statistics wait for
        ``fill_stats``, False when the caller must queue them at capture."""
        if self._sink is not None:
            self._sink.put(key, data)
            return False
        self.tensors[key] = data.to("cpu", copy=True)
        if data.device.type != "cpu":
            return False
        self._later[key] = None
        return True

    def fill_stats(self, records: Sequence[Record]) -> list[Record]:
        """``records`` with the statistics of their kept copies filled in (computed once)."""
        todo = [k for k, v in self._later.items() if v is None]
        if todo:
            vectors = {
                k: stats_vector(self.tensors[k], counts="if_nonfinite") for k in todo if self._numel(k)
            }
            flat = to_host(torch.cat(list(vectors.values()))) if vectors else []
            for i, key in enumerate(vectors):
                self._later[key] = stats_from_vector(flat[6 * i : 6 * i + 6], self._numel(key))
            for key in todo:
                if key not in vectors:
                    self._later[key] = _EMPTY
        out = list(records)
        for i, rec in enumerate(out):
            if rec.stats is None and rec.tensor_key in self._later:
                out[i] = replace(rec, stats=self._later[rec.tensor_key])
        return out

    def _numel(self, key: str) -> int:
        return self.tensors[key].numel()
