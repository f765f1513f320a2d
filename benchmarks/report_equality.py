"""report.json equality across a refactor: re-run the example suites and compare each new
report.json with one written before (``/tmp/before/<suite>/report.json`` by default), ignoring
timing fields (seconds, timestamps, durations) and the checkout's absolute path.

    python benchmarks/report_equality.py [--before DIR] [suite ...]

The old reports were written by
``python -m pytest -q -p no:cacheprovider --align-config example_suites/<suite>/align.yaml
example_suites/<suite> --align-report OUT`` from a checkout's root; this runs the same command
from this checkout's root. Prints every difference; exit 1 when there is one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SUITES = ("qwen2_hf_attention", "qwen2_5_megatron_vs_hf", "msprobe_dumps")
TIMING = {"seconds", "timestamp", "timestamps", "duration", "durations", "written_at", "started", "elapsed"}


def _normal(value: Any, roots: tuple[str, ...]) -> Any:
    """The value without timing fields, with checkout roots replaced by ``<repo>``."""
    if isinstance(value, dict):
        return {k: _normal(v, roots) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [_normal(v, roots) for v in value]
    if isinstance(value, str):
        for root in roots:
            value = value.replace(root, "<repo>")
    return value


def differences(old: Any, new: Any, where: str = "") -> Iterator[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if key not in new:
                yield f"{where}.{key}: only before ({old[key]!r:.80})"
            elif key not in old:
                yield f"{where}.{key}: only after ({new[key]!r:.80})"
            else:
                yield from differences(old[key], new[key], f"{where}.{key}")
    elif isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            yield f"{where}: {len(old)} items before, {len(new)} after"
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            yield from differences(a, b, f"{where}[{i}]")
    elif old != new:
        yield f"{where}: {old!r:.100} before, {new!r:.100} after"


def _by_item(cases: list[Any]) -> dict[tuple[str, str], Any]:
    return {(str(c.get("name")), str(c.get("phase"))): c for c in cases}


def run_suite(suite: str, out: Path) -> int:
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--align-config",
        f"example_suites/{suite}/align.yaml",
        f"example_suites/{suite}",
        "--align-report",
        str(out),
    ]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suites", nargs="*", default=list(SUITES))
    parser.add_argument(
        "--before", default="/tmp/before", help="folder of <suite>/report.json written before"
    )
    args = parser.parse_args(argv)
    failed = False
    for suite in args.suites:
        old = json.loads((Path(args.before) / suite / "report.json").read_text())
        roots = (str(Path(old["config"]).parents[2]), str(REPO))
        with tempfile.TemporaryDirectory() as tmp:
            code = run_suite(suite, Path(tmp) / "out")
            new = json.loads((Path(tmp) / "out" / "report.json").read_text())
        old, new = _normal(old, roots), _normal(new, roots)
        # Cases pair by (case, phase): a case added to a suite shows as added, not as every
        # later case differing.
        old_cases, new_cases = _by_item(old.pop("cases")), _by_item(new.pop("cases"))
        added = sorted(set(new_cases) - set(old_cases))
        found = list(differences(old, new))
        for item in sorted(set(old_cases)):
            if item not in new_cases:
                found.append(f"case {item}: only before")
            else:
                found.extend(differences(old_cases[item], new_cases[item], f"case {item}"))
        shown = f", {len(added)} added ({', '.join('['.join(i) + ']' for i in added)})" if added else ""
        print(f"{suite}: pytest exit {code}, {len(new_cases)} cases{shown}, {len(found)} difference(s)")
        for line in found[:50]:
            print(f"  {line}")
        failed = failed or bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
