"""Baselines keyed by environment: ``DIR/<case>/`` and variants ``DIR/<case>@<label>/``; a run
compares with the variant closest to its environment and says which (baseline/variants.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_precalign.baseline.messages import baseline_dict, context_lines
from pytest_precalign.baseline.store import check_case
from pytest_precalign.baseline.variants import choose, closeness, variant_dir
from pytest_precalign.cli import main
from pytest_precalign.config.loader import load_config_file
from pytest_precalign.errors import ConfigError
from tests.helpers.nets import write_mlp_suite


def _with_dtype(config: Path, dtype: str) -> None:
    lines = [line for line in config.read_text().splitlines() if not line.startswith("defaults:")]
    config.write_text("\n".join([lines[0], f"defaults: {{dtype: {dtype}}}", *lines[1:]]) + "\n")


@pytest.fixture(scope="module")
def two_variants(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Case ``port`` recorded in float32 (the default variant) and in bfloat16 (``@bf16``)."""
    folder = tmp_path_factory.mktemp("variants")
    config = write_mlp_suite(folder)
    _with_dtype(config, "float32")
    assert main(["record", str(config), "--out", str(folder / "bl")]) == 0
    _with_dtype(config, "bfloat16")
    assert main(["record", str(config), "--out", str(folder / "bl"), "--variant", "bf16"]) == 0
    _with_dtype(config, "float32")
    return folder, config


@pytest.mark.parametrize(("dtype", "label"), [("float32", ""), ("bfloat16", "bf16")])
def test_a_run_compares_with_the_variant_of_its_environment(
    two_variants: tuple[Path, Path], dtype: str, label: str
) -> None:
    folder, config = two_variants
    _with_dtype(config, dtype)
    aligned = load_config_file(config)
    outcome = check_case(aligned, aligned.case("port"), folder / "bl", "none", run_id=f"run-{dtype}")
    assert (outcome.action, outcome.variant, outcome.variants) == ("compared", label, 2)
    assert outcome.path == variant_dir(folder / "bl", "port", label)
    assert outcome.run is not None and all(v.passed for v in outcome.run.verdicts.values())
    assert outcome.env_diff == ()
    which = f"variant {label!r}" if label else "the default variant"
    assert f"Baseline variant: {which}, the closest of 2 to this environment" in context_lines(outcome)
    assert baseline_dict(outcome)["variant"] == label


def test_the_wrong_variant_would_fail(two_variants: tuple[Path, Path]) -> None:
    """The choice matters: the bfloat16 run against the float32 baseline alone fails."""
    folder, config = two_variants
    lone = folder / "lone"
    if not lone.exists():
        shutil.copytree(folder / "bl" / "port", lone / "port")
    _with_dtype(config, "bfloat16")
    aligned = load_config_file(config)
    outcome = check_case(aligned, aligned.case("port"), lone, "none", run_id="run-lone")
    assert outcome.run is not None and not all(v.passed for v in outcome.run.verdicts.values())
    assert "dtype float32 → bfloat16" in outcome.env_diff


def _manifest(torch: str, device: str = "cpu", dtype: str = "float32", **versions: str) -> dict[str, object]:
    return {"versions": {"python": "3.11.7", "torch": torch, **versions}, "device": device, "dtype": dtype}


def test_closest_is_device_and_dtype_first_then_the_torch_version(tmp_path: Path) -> None:
    here = _manifest("2.14.1", transformers="5.23.0")
    for label, manifest in {
        "": _manifest("2.13.0", transformers="5.23.0"),
        "npu": _manifest("2.14.1", device="npu", transformers="5.23.0"),
        "t2.14.0": _manifest("2.14.0", transformers="4.49.0"),
        "t2.14.1": _manifest("2.14.1", transformers="4.49.0"),
    }.items():
        folder = variant_dir(tmp_path, "port", label)
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps(manifest))
    chosen = choose(tmp_path, "port", here)
    assert (chosen.label, chosen.among) == ("t2.14.1", 4)
    # Same torch minor beats another minor; the same device beats any version.
    assert closeness(_manifest("2.14.0"), here) > closeness(_manifest("2.13.0"), here)
    assert closeness(_manifest("2.9.0"), here) > closeness(_manifest("2.14.1", device="npu"), here)
    assert choose(tmp_path, "other", here).path == tmp_path / "other"  # none yet: the default


@pytest.mark.parametrize("label", ["a/b", "..", "x@y", "-x", "\n"])
def test_a_bad_variant_label_is_one_message(tmp_path: Path, label: str) -> None:
    with pytest.raises(ConfigError, match="is not a usable label"):
        variant_dir(tmp_path, "port", label)
    assert main(["record", "nope.yaml", "--out", str(tmp_path), f"--variant={label}"]) == 2


def test_an_npu_run_prefers_the_variant_of_its_torch_npu(tmp_path: Path) -> None:
    """torch_npu is a key like torch: on an NPU, the variant recorded with the same torch_npu
    wins over one recorded with another torch_npu (even when the other matches transformers), and
    any NPU variant over a CPU one."""
    here = _manifest("2.13.0", device="npu", torch_npu="2.13.0", transformers="5.23.0")
    variants = {
        "": _manifest("2.13.0", torch_npu="2.13.0", transformers="5.23.0"),  # a CPU recording
        "npu-2.12": _manifest("2.13.0", device="npu", torch_npu="2.12.0", transformers="5.23.0"),
        "npu-2.13": _manifest("2.13.0", device="npu", torch_npu="2.13.0", transformers="4.49.0"),
    }
    for label, manifest in variants.items():
        folder = variant_dir(tmp_path, "port", label)
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps(manifest))
    chosen = choose(tmp_path, "port", here)
    assert (chosen.label, chosen.among) == ("npu-2.13", 3)
    # Under torch_npu 2.12.0 the other NPU variant is the closest.
    older = _manifest("2.13.0", device="npu", torch_npu="2.12.0", transformers="5.23.0")
    assert choose(tmp_path, "port", older).label == "npu-2.12"
