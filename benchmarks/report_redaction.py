"""What the redaction rule costs a report: ``redacted`` over a report document (every text of
report.json, report.html and compare_result.csv, once for all three), against the whole
``write_reports`` of that document. The document is the 7B-shaped one of
``report_tree_scale.py`` (28 layers x 12 modules, forward, backward and step), its cases
copied ``--copies`` times under other module names (a bigger model: distinct texts, so the
rule's one look per distinct text is not flattered), the config's path holding a token.
Times are CPU seconds of this process (``time.process_time``: a shared, loaded machine
stretches wall time, not these). Prints a table and a JSON last line.

    python benchmarks/report_redaction.py [--copies 6] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo: tests.helpers

from tests.helpers.tree_document import seven_b_entries  # noqa: E402

from pytest_precalign.redaction import REDACTED, redacted  # noqa: E402
from pytest_precalign.reports.document import report_document, write_reports  # noqa: E402

TOKEN = "hf_" + "Q" * 34


def entries(copies: int) -> list[dict[str, Any]]:
    """The 7B-shaped entries, ``copies`` times, each copy's module names its own."""
    out = []
    for copy in range(copies):
        for entry in seven_b_entries():
            records = [dict(r, name=f"copy{copy}.{r['name']}") for r in entry["records"]]
            out.append(dict(entry, name=f"{entry['name']}_{copy}", config=f"/work/proj_{TOKEN}/align.yaml",
                            records=records))  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cases = entries(args.copies)
    meta = {"config": f"/work/proj_{TOKEN}/align.yaml"}
    document = report_document(cases, meta)
    assert TOKEN not in json.dumps(document) and REDACTED in document["config"]
    redact_s, write_s = [], []
    for _ in range(args.rounds):
        started = time.process_time()
        redacted(document)
        redact_s.append(time.process_time() - started)
        with tempfile.TemporaryDirectory() as folder:
            started = time.process_time()
            write_reports(Path(folder) / "out", cases, meta)
            write_s.append(time.process_time() - started)
            json_bytes = (Path(folder) / "out" / "report.json").stat().st_size
    result = {
        "records": sum(len(c["records"]) for c in cases),
        "json_mb": round(json_bytes / 1e6, 2),
        "redact_s": round(statistics.median(redact_s), 3),
        "write_reports_s": round(statistics.median(write_s), 3),
        "loadavg": os.getloadavg()[0],
    }
    result["share"] = round(result["redact_s"] / result["write_reports_s"], 3)
    print(f"{result['records']} records, report.json {result['json_mb']} MB")
    print(f"median of {args.rounds}, CPU: redacted() {result['redact_s']:.3f} s, write_reports (all three files, "
          f"redaction included) {result['write_reports_s']:.3f} s: {result['share']:.1%}")  # fmt: skip
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
