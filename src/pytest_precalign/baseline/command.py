"""``precalign record``: store one side of cases, with its weights, outside pytest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..errors import ConfigError, TraceError


def record_cases(config_path: Path, out: Path, cases: list[str], side: str, overwrite: bool) -> Iterator[str]:
    """Record ``side`` of the cases as ``out/<case>/``; yields a line per case recorded."""
    from ..config.loader import load_config_file
    from ..run.case import preflight_case
    from .record_side import record_side
    from .store import baseline_dir, case_lock, recover, write_stored

    config = load_config_file(config_path)
    selected = [config.case(name) for name in cases] if cases else list(config.cases)
    for case in selected:
        if case.baseline_dump is not None:
            raise ConfigError(
                f"{config.path}: case {case.name!r} gates stored dumps; it has no model to record"
            )
        preflight_case(config, case)
    for case in selected:
        target = baseline_dir(out, case.name)
        with case_lock(out, case.name):
            recover(out, case.name)
            if target.exists() and not overwrite:
                raise TraceError(f"{target}: already recorded; refusing to overwrite it (pass --overwrite)")
            rec = record_side(config, case, side)
            write_stored(rec.trace, rec.weights, target, extra={"written_by": "precalign record"})
        model = case.candidate if side == "candidate" else case.baseline
        yield (
            f"recorded {case.name} ({side} {model!r}): {len(rec.trace.records)} records, "
            f"{len(rec.weights)} weights (sha256 {rec.digest.sha256[:12]}) -> {target}"
        )
