"""A stats-mode recorder's ``DTensor`` records: each rank reads the statistics of its local shard
at capture (no collective in a hook), and the step's end combines them over the mesh
dimensions that shard each tensor in ONE all-gather per process group (of every sharded record
of the step, stacked), after one all-gather of the record count and a checksum of their names
that proves every rank recorded the same ones in the same order (else one ``RecorderError``
on every rank, none left waiting).

Combined exactly as the merged statistics of sharded ranks are: the max of the maxima, the min
of the minima, the sum of the sums and of the squares (a rank whose shard is empty adds
nothing), the NaN and Inf counts added; mean = sum / the full tensor's element count, norm =
sqrt(sum of squares). So a DTensor's record holds the statistics of the full tensor it stands
for, up to the order of the additions (the sums are float64).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import RecorderError
from ..trace.records import Stats
from .sharded import local_part, refusal
from .tensor_summary import stats_vector

_COLUMNS = 7  # max, min, sum, sum of squares, nan count, inf count, name checksum


class ShardedStats:
    """One step's DTensor records: ``add`` at capture, ``combine`` at the step's end."""

    def __init__(self) -> None:
        # seq -> (local row, the full tensor's numel, groups, record id)
        self._rows: dict[int, tuple[torch.Tensor, int, tuple[Any, ...], str]] = {}
        self._aliases: dict[int, int] = {}  # seq -> the seq of the same tensor read before

    def __contains__(self, seq: int) -> bool:
        return seq in self._rows or seq in self._aliases

    def add(self, seq: int, t: Any, rid: str) -> None:
        """Read the local shard of the DTensor ``t`` (record ``seq``, id ``rid``)."""
        try:
            local, groups = local_part(t)
        except TypeError:
            raise refusal(t, rid) from None
        local = local.detach()
        if local.numel():
            vector = stats_vector(local, counts=True)
            # the norm squared back to the sum of squares, in float64
            vector = torch.cat([vector[:3], vector[3:4].square(), vector[4:6]])
        else:  # an empty shard (uneven sharding) adds nothing
            vector = torch.tensor([-math.inf, math.inf, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
        check = torch.tensor([float(zlib.crc32(rid.encode()))], dtype=torch.float64)
        row = torch.cat([vector.to(torch.float64), check.to(vector.device)])
        self._rows[seq] = (row, t.numel(), groups, rid)

    def alias(self, seq: int, earlier: int) -> None:
        self._aliases[seq] = earlier

    def combine(self, step: int) -> dict[int, tuple[Stats, None]]:
        """The full tensors' ``Stats`` by seq (collectives: see the module doc); clears."""
        rows, aliases = self._rows, self._aliases
        self._rows, self._aliases = {}, {}
        if not rows:
            return {}
        by_groups: dict[tuple[Any, ...], list[int]] = {}
        for seq, (_, _, groups, _) in rows.items():  # in seq order: the same on every rank
            by_groups.setdefault(groups, []).append(seq)
        combined: dict[int, list[float]] = {}
        for groups, seqs in by_groups.items():
            stacked = torch.stack([rows[s][0] for s in seqs])
            for group in groups:
                stacked = _over(stacked, group, step, [rows[s][3] for s in seqs])
            combined.update(zip(seqs, stacked.cpu().tolist(), strict=True))
        out: dict[int, tuple[Stats, None]] = {}
        for seq, values in combined.items():
            out[seq] = (_stats(values, rows[seq][1]), None)
        for seq, earlier in aliases.items():
            if earlier in out:
                out[seq] = out[earlier]
        return out


def _over(stacked: torch.Tensor, group: Any, step: int, rids: Sequence[str]) -> torch.Tensor:
    """The rows of this rank combined with those of every rank of ``group``."""
    dist = torch.distributed
    size = dist.get_world_size(group)
    if size == 1:
        return stacked
    count = torch.tensor([float(len(rids))], dtype=torch.float64, device=stacked.device)
    counts = [torch.empty_like(count) for _ in range(size)]
    dist.all_gather(counts, count, group=group)
    if any(int(c.item()) != len(rids) for c in counts):
        raise RecorderError(
            f"recorder: step {step}: the ranks recorded {sorted({int(c.item()) for c in counts})} sharded "
            "tensors (DTensors): every rank of a mesh must record the same modules (the same "
            "include=/exclude= and steps) to combine their shards"
        )
    gathered = [torch.empty_like(stacked) for _ in range(size)]
    dist.all_gather(gathered, stacked, group=group)
    every = torch.stack(gathered)  # [ranks, records, columns]
    if not bool((every[:, :, 6] == stacked[:, 6]).all()):
        raise RecorderError(
            f"recorder: step {step}: the ranks recorded other sharded tensors (DTensors) in another "
            f"order (this rank: {', '.join(rids[:3])}...): every rank of a mesh must record the same "
            "modules to combine their shards"
        )
    return torch.cat(
        [
            every[:, :, 0:1].amax(0),
            every[:, :, 1:2].amin(0),
            every[:, :, 2:6].sum(0),
            stacked[:, 6:7],
        ],
        dim=1,
    )


def _stats(values: list[float], numel: int) -> Stats:
    vmax, vmin, total, squares, nan, inf, _ = values
    if not numel:
        return Stats(0.0, 0.0, 0.0, 0.0)
    return Stats(vmax, vmin, total / numel, math.sqrt(squares), int(nan), int(inf))
