"""report.html at the scale of a 7B model: the size of report.html / report.json for a
7B-shaped document (28 layers x 12 modules, forward, backward and step; records summarised,
never tensors) and how long its module tree takes in headless Chromium (/usr/bin/chromium) to
load and draw, search, and filter + switch phase. Prints a table and a JSON last line.

    python benchmarks/report_tree_scale.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.helpers

from tests.helpers.browser import launch  # noqa: E402
from tests.helpers.tree_document import measure_tree  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs = []
    browsers = launch()
    browser = next(browsers)
    try:
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as folder:
                runs.append(measure_tree(Path(folder), browser))
    finally:
        browsers.close()
    result = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    result["loadavg"] = os.getloadavg()[0]
    print(f"{int(result['records'])} records, {int(result['nodes'])} tree nodes")
    print(f"report.html {result['html_bytes'] / 1e6:.2f} MB, report.json {result['json_bytes'] / 1e6:.2f} MB, "
          f"written in {result['write_s']:.2f} s")  # fmt: skip
    print(f"median of {args.rounds}: load and draw {result['load_s']:.2f} s, search {result['search_s']:.2f} s, "
          f"filter + phase switch {result['filter_switch_s']:.2f} s")  # fmt: skip
    print(json.dumps({k: round(v, 4) for k, v in result.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
