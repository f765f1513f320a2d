"""How much of a calibrated table the fault-free pair uses, per margin, and how far the bug is.

Calibrates the example suite's eager/sdpa case (baseline: eager) with ``precalign calibrate``
at several margins and perturbation sets, then runs the suite's cases under each table and
prints, per phase, whether the fault-free pair passes and the largest share of a bound it
uses (value / allowed), and for the ``known_mlp_bug`` case the first divergence with its
value / allowed. These are the figures the README's "Calibrated tolerances" section quotes.

    python benchmarks/calibration_margin.py
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import tempfile
import warnings
from pathlib import Path

from pytest_precalign.cli import main as precalign
from pytest_precalign.compare.tolerances import parse_table
from pytest_precalign.config.loader import load_config_file
from pytest_precalign.run.case import run_case

DEFAULT = Path(__file__).resolve().parents[1] / "example_suites" / "qwen2_hf_attention" / "align.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(DEFAULT))
    parser.add_argument("--margins", default="1,2,4")
    parser.add_argument("--perturbations", default="float64;float64,attn,seed")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    config = load_config_file(args.config)
    with tempfile.TemporaryDirectory() as tmp:
        for perturbations in args.perturbations.split(";"):
            for margin in args.margins.split(","):
                out = Path(tmp) / f"{perturbations.replace(',', '_')}_{margin}.yaml"
                argv = ["calibrate", "--config", args.config, "--case", "eager_vs_sdpa", "--out", str(out)]
                with contextlib.redirect_stdout(io.StringIO()):
                    code = precalign([*argv, "--margin", margin, "--perturbations", perturbations])
                assert code == 0, code
                table = parse_table("fp32", str(out), str(out), "", Path(tmp))
                tables = dict.fromkeys(config.tolerances, table)
                calibrated = dataclasses.replace(config, tolerances=tables)
                fine = run_case(calibrated, calibrated.case("eager_vs_sdpa"))
                for phase, verdict in fine.verdicts.items():
                    pairs = [p for p in fine.comparison.by_phase(phase) if p.paired]
                    worst = max(pairs, key=lambda p: p.severity)
                    print(
                        f"perturbations={perturbations} margin={margin} eager_vs_sdpa[{phase}]: "
                        f"{'PASS' if verdict.aligned else 'FAIL'} ({verdict.failed_count} failing), "
                        f"largest share of a bound {worst.severity:.3f} at {worst.record.name} "
                        f"({worst.record.kind})"
                    )
                case = dataclasses.replace(calibrated.case("known_mlp_bug"), expect=None)
                first = run_case(calibrated, case).verdicts["forward"].first
                assert first is not None
                print(
                    f"perturbations={perturbations} margin={margin} known_mlp_bug[forward]: first "
                    f"divergence {first.name} ({first.kind}, origin={first.origin}), "
                    f"{first.value:.3g} vs {first.allowed:.3g} allowed ({first.value / first.allowed:.0f}x)"
                )


if __name__ == "__main__":
    main()
