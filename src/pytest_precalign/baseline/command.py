"""``precalign record``: store one side of cases, with its weights, outside pytest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..errors import ConfigError, TraceError


def record_cases(
    config_path: Path, out: Path, cases: list[str], side: str, overwrite: bool, variant: str = ""
) -> Iterator[str]:
    """Record ``side`` of the cases as ``out/<case>/`` (``out/<case>@<variant>/`` for an
    environment variant); yields a line per case recorded."""
    from ..config.loader import load_config_file
    from ..run.devices import check_devices

    config = load_config_file(config_path)
    selected = [config.case(name) for name in cases] if cases else list(config.cases)
    for case in selected:
        if case.dumps is not None:
            raise ConfigError(
                f"{config.path}: case {case.name!r} gates stored dumps; it has no model to record"
            )
        check_devices(config, case)  # before torch is imported: torch_npu without CANN stops it
    from ..run.case import preflight_case
    from .record_side import record_side
    from .store import case_lock, recover, write_stored
    from .variants import variant_dir

    for case in selected:
        preflight_case(config, case)
    for case in selected:
        target = variant_dir(out, case.name, variant)
        with case_lock(out, case.name):
            recover(out, target.name)
            if target.exists() and not overwrite:
                raise TraceError(f"{target}: already recorded; refusing to overwrite it (pass --overwrite)")
            rec = record_side(config, case, side)
            write_stored(rec.trace, rec.weights, target, extra={"written_by": "precalign record"})
        model = case.models.candidate if side == "candidate" else case.models.baseline
        yield (
            f"recorded {case.name} ({side} {model!r}): {len(rec.trace.records)} records, "
            f"{len(rec.weights)} weights (sha256 {rec.digest.sha256[:12]}) -> {target}"
        )
