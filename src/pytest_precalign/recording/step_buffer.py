"""A recorded step's statistics and hashes, kept on the device until the step ends.

``add_stats`` computes a tensor's statistics as a small device tensor (no host sync) and
returns a handle; ``add_crc`` hashes a CPU tensor at once (its bytes are already on the
host: zlib, no device sync) and, for a device tensor, starts a non-blocking copy to the host
(pinned memory on CUDA) whose CRC is taken at the step's end. ``flush`` fetches every pending
statistic of the step in ONE host sync per device (``to_host`` of the stacked vectors), which
also waits for the pending copies, then hashes them. Values are bit-identical to
``tensor_stats`` / ``tensor_crc32`` taken at capture time: device work is queued in stream
order, so it sees the tensor as it was when captured.
"""

from __future__ import annotations

import torch

from ..trace.records import Stats
from .host_sync import to_host
from .tensor_summary import stats_from_vector, stats_vector, tensor_crc32

_EMPTY = Stats(0.0, 0.0, 0.0, 0.0)


class StepBuffer:
    """Pending statistics and hashes of one step; handles index the result of ``flush``."""

    def __init__(self) -> None:
        self._vectors: list[tuple[torch.Tensor, int] | None] = []  # (vector, numel); None: empty
        self._crcs: list[str | torch.Tensor] = []  # a CRC, or the host copy still to hash
        self._copying: set[torch.device] = set()  # devices with host copies in flight

    def add_stats(self, data: torch.Tensor) -> int:
        self._vectors.append((stats_vector(data), data.numel()) if data.numel() else None)
        return len(self._vectors) - 1

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

    def flush(self) -> tuple[list[Stats], list[str]]:
        """The step's statistics and CRCs, by handle; the buffer is empty afterwards."""
        vectors, crcs, copying = self._vectors, self._crcs, self._copying
        self._vectors, self._crcs, self._copying = [], [], set()
        by_device: dict[torch.device, list[int]] = {d: [] for d in copying}
        for i, v in enumerate(vectors):
            if v is not None:
                by_device.setdefault(v[0].device, []).append(i)
        stats = [_EMPTY] * len(vectors)
        for device, index in by_device.items():
            if not index:  # only copies on this device: one sync waits for them
                to_host(torch.zeros((), device=device))
                continue
            pending = [v for v in (vectors[i] for i in index) if v is not None]
            rows = to_host(torch.stack([v[0] for v in pending]))
            for i, row, (_, numel) in zip(index, rows, pending, strict=True):
                stats[i] = stats_from_vector(row, numel)
        return stats, [c if isinstance(c, str) else tensor_crc32(c) for c in crcs]
