"""A recorded step's statistics and hashes, kept on the device until the step ends.

``add_stats`` queues a tensor's max/min/sum/norm as a small device tensor (no host sync; stats
mode reads a CPU tensor's at capture instead, ``read_at_capture``);
``add_evidence`` queues only its sum (hash mode's NaN/Inf check); ``add_crc`` hashes a CPU
tensor at once (its bytes are already on the host: zlib, no device sync) and, for a device
tensor, starts a non-blocking copy to the host (pinned memory on CUDA) that is hashed at the
step's end. ``flush`` fetches every queued value of the step in ONE host sync per device
(which also waits for the copies).

NaN/Inf counts are wanted only for a tensor that is not finite. A tensor on a device (CUDA,
NPU) has them computed there at once, queued with its statistics (two extra passes, cheap on
a device). A CPU tensor has them computed at once only when its statistics are not finite
(``stats_vector(counts="if_nonfinite")``: the statistics are in host memory already, read at
once, which waits for nothing). Either way no reference to the tensor is kept, so a step's short-lived tensors
(activation grads) are freed as in an unrecorded step: keeping them until the step's end, as
this buffer did before, made the mid Qwen2 step ~50 ms slower on the CPU (the memory they
held had to be found anew for every later tensor). Hash mode's evidence (a sum) is the
exception: statistics are wanted only if the sum is not finite, taken at the step's end in a
second host sync, for those tensors only; the buffer keeps a reference to each queued CPU
tensor until then (no copy).

Values are bit-identical to ``tensor_stats`` / ``finite_sum`` / ``tensor_crc32`` taken at
capture: device work is queued in stream order, so it sees the tensor as it was then. Hash
mode's late statistics are taken from the tensor as it is at the step's end (the same, unless
the model modified it in place after it was recorded).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..trace.records import Stats
from .host_sync import to_host
from .tensor_summary import all_finite, stats_from_vector, stats_vector, sum_vector, tensor_crc32

_EMPTY = Stats(0.0, 0.0, 0.0, 0.0)


@dataclass
class _Queued:
    data: torch.Tensor | None  # kept (CPU) for NaN/Inf counts at the step's end; None: counted
    vector: torch.Tensor | None  # None: an empty tensor
    evidence: bool  # statistics are wanted only if the sum is not finite
    numel: int
    counted: bool = False  # the vector holds the NaN/Inf counts too (a device tensor)


def read_at_capture(t: torch.Tensor) -> bool:
    """Whether stats mode reads a tensor's statistics at capture rather than queueing them
    here: a CPU tensor's values are in host memory, so reading them waits for nothing (no
    host sync) and nothing is left for the step's end (``tensor_summary.cpu_stats``)."""
    return bool(t.is_cpu)


def counts_at_capture(device: torch.device) -> bool:
    """Whether a tensor on ``device`` has its NaN/Inf counts taken at capture (see the module's
    doc): on a device, not on the CPU."""
    return device.type != "cpu"


def _queue(data: torch.Tensor, evidence: bool) -> _Queued:
    """What to keep of a tensor until the step ends (see the module's doc)."""
    if not data.numel():
        return _Queued(data, None, evidence, 0)
    if counts_at_capture(data.device):
        return _Queued(None, stats_vector(data, counts=True), evidence, data.numel(), counted=True)
    if not evidence:  # CPU statistics: the counts only for a tensor that is not finite
        return _Queued(None, stats_vector(data, counts="if_nonfinite"), False, data.numel(), counted=True)
    return _Queued(data, sum_vector(data), evidence, data.numel())


class StepBuffer:
    """Pending statistics and hashes of one step; handles index the result of ``flush``."""

    def __init__(self) -> None:
        self._queued: list[_Queued] = []
        self._crcs: list[str | torch.Tensor] = []  # a CRC, or the host copy still to hash
        self._copying: set[torch.device] = set()  # devices with host copies in flight

    def add_stats(self, data: torch.Tensor) -> int:
        self._queued.append(_queue(data, evidence=False))
        return len(self._queued) - 1

    def add_evidence(self, data: torch.Tensor) -> int:
        self._queued.append(_queue(data, evidence=True))
        return len(self._queued) - 1

    def add_crc(self, data: torch.Tensor) -> int:
        if data.device.type == "cpu":
            self._crcs.append(tensor_crc32(data))
        else:
            pin = data.device.type == "cuda"
            host = torch.empty(data.shape, dtype=data.dtype, device="cpu", pin_memory=pin)
            host.copy_(data, non_blocking=True)
            self._crcs.append(host)
            self._copying.add(data.device)
        return len(self._crcs) - 1

    def flush(self) -> tuple[list[Stats | None], list[str]]:
        """The step's statistics (None: evidence found finite) and CRCs, by handle."""
        queued, crcs, copying = self._queued, self._crcs, self._copying
        self._queued, self._crcs, self._copying = [], [], set()
        stats: list[Stats | None] = [None if q.evidence else _EMPTY for q in queued]
        values = _fetch(queued, range(len(queued)), copying)
        again = []
        for i, row in values.items():
            q = queued[i]
            finite = all_finite(row[2:3] if q.evidence and q.counted else row[:4])
            if q.counted and not (finite and q.evidence):
                stats[i] = stats_from_vector(row, q.numel)
            elif not finite:
                again.append(i)
            elif not q.evidence:
                stats[i] = stats_from_vector(row, q.numel)
        for i, row in _fetch(queued, again, set(), counts=True).items():
            stats[i] = stats_from_vector(row, queued[i].numel)
        return stats, [c if isinstance(c, str) else tensor_crc32(c) for c in crcs]


def _fetch(
    queued: list[_Queued], index: range | list[int], copying: set[torch.device], counts: bool = False
) -> dict[int, list[float]]:
    """The queued vectors (``counts``: full statistics with NaN/Inf counts, computed now) of
    ``index`` on the host: one ``to_host`` per device."""
    by_device: dict[torch.device, list[int]] = {d: [] for d in copying}
    for i in index:
        vector = queued[i].vector
        if vector is not None:
            by_device.setdefault(vector.device, []).append(i)
    out: dict[int, list[float]] = {}
    for device, rows in by_device.items():
        if not rows:  # only host copies on this device: one sync waits for them
            to_host(torch.zeros((), device=device))
            continue
        vectors = [_with_counts(queued[i]) if counts else queued[i].vector for i in rows]
        flat = to_host(torch.cat([v for v in vectors if v is not None]))
        pos = 0
        for i, v in zip(rows, vectors, strict=True):
            n = v.numel() if v is not None else 0
            out[i] = flat[pos : pos + n]
            pos += n
    return out


def _with_counts(q: _Queued) -> torch.Tensor:
    assert q.data is not None  # only kept (CPU) tensors are counted at the step's end
    return stats_vector(q.data, counts=True)
