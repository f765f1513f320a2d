"""Parallel layouts of a distributed run and where its rank folders are (no torch).

A layout is the run's parallel sizes (tp, pp, dp, cp, ep, vpp) and Megatron's rank order
(``tp-cp-ep-dp-pp``: tp varies fastest). It comes from the ``parallel`` block of each rank's
``manifest.json`` (our Recorder) or, for msprobe dumps whose rank folders carry none, from
``--parallel SIDE:tp=2,pp=2[,vpp=2][,order=...]`` or a compare.json ``parallel_merge`` block.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, TraceError
from ..untrusted import numbered_folders, read_json

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
RECORDER_KEY = "recorder"  # the mark of a manifest our ``Recorder`` (or the callback) wrote
DIMS = ("tp", "cp", "ep", "dp", "pp")
# What a run's DP replicas are: joined when they saw different rows (auto), always joined, or
# copies that must agree (same); ``dp_join``.
REPLICA_MODES = ("auto", "joined", "same")
_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^rank(\d+)$")


@dataclass(frozen=True)
class ParallelLayout:
    """The sizes of a run's parallel dimensions, as megatron-core counts them: the world is
    ``tp * pp * dp * cp``; expert-parallel ranks are carved out of the data-parallel ones
    (``ep`` divides ``dp * cp``), so ``ep`` adds no ranks."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int | None = None
    order: str = DEFAULT_ORDER
    sequence_parallel: bool = False
    # Megatron's GPTModel(parallel_output=True) leaves the output layer's logits split over the
    # vocabulary on the TP ranks (vocab-parallel cross entropy reads them so).
    parallel_output: bool = False
    source: str = ""
    # What DP replicas are (``--parallel SIDE:replicas=...``; ``dp_join``): auto (joined along
    # the batch when they saw different rows, else copies checked equal), joined, or same.
    replicas: str = "auto"

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def coords(self, rank: int) -> dict[str, int]:
        """``{"tp": .., "cp": .., "ep": .., "dp": .., "pp": ..}`` of a global rank (the first
        dim of ``order`` varies fastest, as Megatron's RankGenerator numbers them; the expert
        rank is ``(rank // tp) % ep``, as its expert RankGenerator numbers them)."""
        out: dict[str, int] = {}
        rest = rank
        for dim in self.order.split("-"):
            size = 1 if dim == "ep" else int(getattr(self, dim))
            out[dim] = rest % size
            rest //= size
        out["ep"] = (rank // self.tp) % self.ep
        return out

    def describe(self) -> str:
        sizes = ", ".join(f"{d}={getattr(self, d)}" for d in ("tp", "pp", "dp", "cp", "ep"))
        vpp = f", vpp={self.vpp}" if self.vpp else ""
        sp = ", sequence_parallel" if self.sequence_parallel else ""
        return f"{sizes}{vpp}, order {self.order}{sp}"


def _check_order(order: Any, where: str) -> str:
    if not isinstance(order, str) or sorted(order.split("-")) != sorted(DIMS):
        raise ConfigError(
            f"{where}: order {order!r} must name tp, cp, ep, dp and pp once each (e.g. {DEFAULT_ORDER})"
        )
    return order


def _size(value: Any, key: str, where: str, *, null_ok: bool = False) -> int | None:
    if value is None and null_ok:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{where}: {key} must be an integer >= 1, got {value!r}")
    return value


# The keys a user may give (``Recorder(layout=...)``); a manifest adds source, parallel_output,
# chunks and sharding (written by ``steps.layout_probe``).
SIZES = ("tp", "pp", "dp", "cp", "ep")
RANKS = tuple(f"{s}_rank" for s in SIZES)
LAYOUT_KEYS = (*SIZES, "vpp", "world_size", "rank", *RANKS, "order", "sequence_parallel")


def check_layout_block(block: Any, where: str, *, user: bool = False) -> ParallelLayout:
    """THE validator of a ``parallel`` block, for the Recorder that writes it and for the
    compare that reads it back (``ConfigError``): sizes >= 1, ``order`` a permutation of the
    five dims, ``world_size`` = tp*pp*dp*cp, ``ep`` dividing dp*cp, ``rank`` in the world and
    each ``<dim>_rank`` the one the rank has in this layout. ``user``: only ``LAYOUT_KEYS``."""
    if not isinstance(block, Mapping):
        raise ConfigError(f"{where}: expected a mapping with tp, pp, dp, ... (got {block!r})")
    if user:
        for key in block:
            if key not in LAYOUT_KEYS:
                raise ConfigError(f"{where}: unknown key {key!r} (allowed: {', '.join(LAYOUT_KEYS)})")
    sizes = {k: _size(block.get(k, 1), repr(k), where) or 1 for k in SIZES}
    vpp = _size(block.get("vpp"), "'vpp'", where, null_ok=True)
    for key in ("sequence_parallel", "parallel_output"):
        if not isinstance(block.get(key, False), bool):
            raise ConfigError(f"{where}: {key!r} must be true or false, got {block[key]!r}")
    layout = ParallelLayout(
        vpp=vpp,
        order=_check_order(block.get("order", DEFAULT_ORDER), where),
        sequence_parallel=bool(block.get("sequence_parallel", False)),
        parallel_output=bool(block.get("parallel_output", False)),
        source=str(block.get("source", "")),
        tp=sizes["tp"],
        pp=sizes["pp"],
        dp=sizes["dp"],
        cp=sizes["cp"],
        ep=sizes["ep"],
    )
    if (layout.dp * layout.cp) % layout.ep:
        raise ConfigError(
            f"{where}: ep {layout.ep} must divide dp*cp = {layout.dp * layout.cp} "
            "(expert-parallel ranks are data-parallel ranks, as in megatron-core)"
        )
    world = block.get("world_size", layout.world_size)
    if world != layout.world_size:
        raise ConfigError(
            f"{where}: world_size {world!r} is not tp*pp*dp*cp = {layout.world_size} ({layout.describe()})"
        )
    _check_ranks(block, layout, where)
    return layout


def _check_ranks(block: Mapping[str, Any], layout: ParallelLayout, where: str) -> None:
    rank = block.get("rank")
    if rank is not None and not (_int(rank) and 0 <= rank < layout.world_size):
        raise ConfigError(f"{where}: 'rank' must be an integer in 0..{layout.world_size - 1}, got {rank!r}")
    coords = layout.coords(rank) if rank is not None else {}
    for dim, key in zip(SIZES, RANKS, strict=True):
        if key not in block:
            continue
        size, value = getattr(layout, dim), block[key]
        if not (_int(value) and 0 <= value < size):
            raise ConfigError(
                f"{where}: {key!r} must be an integer in 0..{size - 1} ({dim} = {size}), got {value!r}"
            )
        if coords and value != coords[dim]:
            raise ConfigError(
                f"{where}: {key} {value!r}, but rank {rank} of {layout.describe()} is {key} {coords[dim]}"
            )


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def layout_from_manifest(block: Any, where: str) -> ParallelLayout:
    """The ``parallel`` block of a rank's manifest (the Recorder's contract), read back."""
    try:
        return check_layout_block(block, f"{where}: parallel")
    except ConfigError as exc:
        raise TraceError(str(exc)) from None


# ``--parallel`` sides: baseline/candidate; msprobe's words for them (golden/target) are read too.
_SIDE_WORDS = {"baseline": "baseline", "candidate": "candidate", "golden": "baseline", "target": "candidate"}


def parse_parallel_option(text: str) -> tuple[str, ParallelLayout]:
    """``candidate:tp=2,pp=2[,vpp=2][,dp=1][,order=tp-cp-ep-dp-pp][,sp=1][,replicas=auto]`` ->
    (side, layout); ``candidate:replicas=joined`` alone says only what its DP replicas are;
    the side is ``baseline`` or ``candidate`` (msprobe's ``golden`` and ``target`` are read as
    them)."""
    where = f"--parallel {text!r}"
    word, sep, body = text.partition(":")
    side = _SIDE_WORDS.get(word)
    if not sep or side is None:
        raise ConfigError(
            f"{where}: expected baseline:KEY=VALUE,... or candidate:KEY=VALUE,... (e.g. candidate:tp=2,pp=2)"
        )
    values: dict[str, Any] = {}
    for item in body.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq or key not in ("tp", "pp", "dp", "cp", "ep", "vpp", "order", "sp", "replicas"):
            raise ConfigError(
                f"{where}: {item!r}: expected KEY=VALUE with KEY one of tp, pp, dp, cp, ep, vpp, order, sp, replicas"
            )
        if key == "replicas":
            if value not in REPLICA_MODES:
                raise ConfigError(f"{where}: replicas={value!r}: expected one of {', '.join(REPLICA_MODES)}")
            values[key] = value
        elif key == "order":
            values[key] = _check_order(value, where)
        elif not value.isdigit() or int(value) < (0 if key == "sp" else 1):
            raise ConfigError(f"{where}: {key}={value!r}: expected a whole number >= 1")
        else:
            values[key] = int(value)
    sp = bool(values.pop("sp", 0))
    return side, ParallelLayout(sequence_parallel=sp, source="option", **values)


def layout_from_msprobe_block(block: Any, where: str) -> ParallelLayout:
    """One side of msprobe's compare.json ``parallel_merge`` (``{"rank_size": 8, "tp": 8,
    "pp": 1, "vpp": 1, "order": "tp-cp-ep-dp-pp"}``); dp = rank_size / (tp * pp), cp = 1."""
    if not isinstance(block, Mapping):
        raise ConfigError(f"{where}: expected an object with rank_size, tp, pp (got {block!r})")
    unknown = sorted(set(block) - {"rank_size", "tp", "pp", "vpp", "order"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: rank_size, tp, pp, vpp, order)")
    for key in ("rank_size", "tp", "pp"):
        if key not in block:
            raise ConfigError(f"{where}: missing {key!r} (rank_size, tp and pp are required)")
    rank_size, tp, pp = (_size(block[k], k, where) or 1 for k in ("rank_size", "tp", "pp"))
    vpp = _size(block.get("vpp", 1), "vpp", where) or 1
    if rank_size % (tp * pp):
        raise ConfigError(f"{where}: rank_size {rank_size} is not a multiple of tp*pp = {tp * pp}")
    order = _check_order(block.get("order", DEFAULT_ORDER), where)
    return ParallelLayout(
        tp=tp, pp=pp, dp=rank_size // (tp * pp), vpp=vpp if vpp > 1 else None, order=order, source="msprobe"
    )


def read_msprobe_compare_config(path: str | Path) -> dict[str, Any]:
    """msprobe's compare.json: ``npu_path`` (candidate), ``bench_path`` (baseline) and optional
    ``parallel_merge: {npu: {...}, bench: {...}}``; returns baseline, candidate and layouts."""
    file = Path(path)
    try:
        data = read_json(file, ConfigError, what="an msprobe compare.json")
    except ConfigError as exc:
        raise ConfigError(f"--msprobe-config: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("npu_path"), str):
        raise ConfigError(f"{file}: expected an msprobe compare.json with 'npu_path' (and 'bench_path')")
    if not isinstance(data.get("bench_path"), str):
        raise ConfigError(f"{file}: 'bench_path' is needed for a compare (a path string)")
    base = file.resolve().parent
    layouts: dict[str, ParallelLayout] = {}
    merge = data.get("parallel_merge")
    if merge is not None:
        if not isinstance(merge, dict) or not set(merge) <= {"npu", "bench"}:
            raise ConfigError(f"{file}: parallel_merge: expected {{'npu': {{...}}, 'bench': {{...}}}}")
        for key, side in (("npu", "candidate"), ("bench", "baseline")):
            if key in merge:
                layouts[side] = layout_from_msprobe_block(merge[key], f"{file}: parallel_merge.{key}")
    return {
        "baseline": str(base / data["bench_path"]),
        "candidate": str(base / data["npu_path"]),
        "layouts": layouts,
    }


# -- rank folders of our traces ------------------------------------------------------------------


def _children(path: Path, kind: re.Pattern[str]) -> dict[int, Path]:
    found = numbered_folders(path, kind, TraceError, "a recorded run")  # no link, no look-alike
    return dict(sorted((number, p) for (_, number), p in found.items()))


def _recorded_rank(folder: Path) -> bool:
    """A rank folder our ``Recorder`` (or a launched rank) wrote: a trace manifest with a
    ``parallel`` block or the Recorder's mark (a step recorded as scalars only), or an msprobe
    dump with the Recorder's manifest beside it."""
    from ..msprobe.layout import DUMP_FILE, MANIFEST_SIDECAR, recorded_by_us
    from ..trace.checksums import sealed_names

    # An msprobe dump our Recorder wrote: its manifest beside dump.json, or its checksums listing
    # one: then that manifest missing, unreadable or not an object is named, not skipped.
    ours = recorded_by_us(folder) or (
        (folder / DUMP_FILE).is_file() and MANIFEST_SIDECAR in sealed_names(folder)
    )
    file = folder / MANIFEST_SIDECAR if ours else folder / "manifest.json"
    try:
        data = read_json(file, TraceError, what="the Recorder's manifest", why="the Recorder writes it here")
    except TraceError:
        if ours:
            raise
        return False
    if ours and not isinstance(data, dict):
        raise TraceError(f"{file}: expected a JSON object (the Recorder's trace manifest)")
    return isinstance(data, dict) and ("parallel" in data or RECORDER_KEY in data)


def parallel_rank_folders(path: str | Path) -> dict[int, dict[int, Path]] | None:
    """step -> rank -> folder when ``path`` is a step folder (``rank<R>/`` folders our
    ``Recorder`` or launched ranks wrote: trace manifests with a ``parallel`` block, steps
    recorded as scalars only, msprobe dumps with the Recorder's manifest beside them) or a run
    root of such step folders; else None. A run root is one multi-step run
    (``parallel.sides.load_parallel_side``)."""
    root = Path(path)
    try:
        if not root.is_dir() or (root / "manifest.json").exists():
            return None
        steps = _children(root, _STEP)
        if steps:
            found = {s: _children(folder, _RANK) for s, folder in steps.items()}
        else:
            found = {_step_number(root): _children(root, _RANK)}
    except OSError:
        return None
    if not any(_recorded_rank(folder) for ranks in found.values() for folder in ranks.values()):
        return None
    return found


def _step_number(folder: Path) -> int:
    m = _STEP.match(folder.name)
    return int(m.group(1)) if m else 0


def compare_sides(
    baseline: str | None, candidate: str | None, options: list[str], msprobe_config: str | None
) -> tuple[str, str, dict[str, ParallelLayout]]:
    """``precalign compare``'s sides and layouts from its arguments: BASELINE CANDIDATE, or
    ``--msprobe-config`` (its parallel_merge), with ``--parallel`` options on top."""
    layouts: dict[str, ParallelLayout] = {}
    if msprobe_config is not None:
        if baseline is not None or candidate is not None:
            raise ConfigError(
                "--msprobe-config names both sides (bench_path, npu_path): give no BASELINE CANDIDATE"
            )
        config = read_msprobe_compare_config(msprobe_config)
        baseline, candidate, layouts = config["baseline"], config["candidate"], dict(config["layouts"])
    if baseline is None or candidate is None:
        raise ConfigError("compare needs BASELINE and CANDIDATE (or --msprobe-config compare.json)")
    for text in options:
        side, layout = parse_parallel_option(text)
        if side in layouts and msprobe_config is None:
            raise ConfigError(f"--parallel {text!r}: {side} is given twice")
        layouts[side] = layout
    return baseline, candidate, layouts
