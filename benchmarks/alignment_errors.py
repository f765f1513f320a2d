"""Measured numeric differences of an alignment suite, per case, phase, kind and step.

Runs every case of a config (default: the Megatron vs HF example suite) and prints, for each
(phase, kind, step), the greatest absolute difference over all compared tensors, and the
number of tensors compared. The last line is a JSON object of the same figures. These are
the numbers the README's accuracy statements quote.

    python benchmarks/alignment_errors.py example_suites/qwen2_5_megatron_vs_hf/align.yaml
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections import defaultdict
from pathlib import Path

from pytest_precalign.config.loader import load_config_file
from pytest_precalign.run.case import run_case

DEFAULT = Path(__file__).resolve().parents[1] / "example_suites" / "qwen2_5_megatron_vs_hf" / "align.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(DEFAULT))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    config = load_config_file(args.config)
    figures: dict[str, dict[str, dict[str, float | int]]] = {}
    for case in config.cases:
        run = run_case(config, case)
        worst: dict[tuple[str, str, int], float] = defaultdict(float)
        count: dict[tuple[str, str, int], int] = defaultdict(int)
        for pair in run.comparison.pairs:
            if pair.closeness is None or pair.record.kind == "input":
                continue
            key = (pair.record.phase, pair.record.kind, pair.record.step)
            worst[key] = max(worst[key], pair.closeness.greatest_abs)
            count[key] += 1
        print(f"{case.name}  ({run.seconds:.2f} s)")
        figures[case.name] = {}
        for key in sorted(worst):
            label = f"{key[0]}/{key[1]}/step{key[2]}"
            print(f"  {label:32s} max |diff| {worst[key]:.3e}  over {count[key]} tensors")
            figures[case.name][label] = {"max_abs": worst[key], "tensors": count[key]}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
