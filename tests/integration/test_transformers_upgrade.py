"""The framework-upgrade example: baselines recorded under transformers 4.49.0 (a second venv,
``.venv-transformers-4.49``, which .ci/run creates), compared under this environment's
transformers. Without that venv the tests fail on CI (CI set) and are skipped elsewhere, with
the commands that create it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from tests.helpers.paths import EXAMPLES, REPO
from tests.helpers.runs import ExampleSuite, RunPytest

OLD_VENV = REPO / ".venv-transformers-4.49"
OLD_PYTHON = OLD_VENV / "bin" / "python"
CREATE = (
    "python3.11 -m venv .venv-transformers-4.49 && "
    ".venv-transformers-4.49/bin/pip install torch==2.13.0 && "
    ".venv-transformers-4.49/bin/pip install transformers==4.49.0 && "
    ".venv-transformers-4.49/bin/pip install -e ."
)
SUITE = "transformers_upgrade"


def _old_python() -> Path:
    if not OLD_PYTHON.exists():
        message = f"{OLD_VENV} is missing; create it from the repository root with: {CREATE}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return OLD_PYTHON


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example suite's baselines, recorded with transformers 4.49.0 (once per worker)."""
    python = _old_python()
    folder = tmp_path_factory.mktemp("old_env") / SUITE
    shutil.copytree(EXAMPLES / SUITE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}  # this tree's code, that env's packages
    version = subprocess.run(
        [str(python), "-c", "import transformers; print(transformers.__version__)"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.strip()
    assert version == "4.49.0", f"{OLD_VENV} has transformers {version}; recreate it with: {CREATE}"
    done = subprocess.run(
        [str(python), "-m", "pytest_precalign", "record", "align.yaml", "--out", "baselines"],
        cwd=folder,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "recorded qwen2_5_vl (candidate 'qwen2_5_vl')" in done.stdout
    manifest = json.loads((folder / "baselines" / "qwen2_5_vl" / "manifest.json").read_text())
    assert manifest["versions"]["transformers"] == "4.49.0"
    return folder / "baselines"


def _suite(baselines: Path, example_suite: ExampleSuite) -> Path:
    folder = example_suite(SUITE)
    shutil.copytree(baselines, folder / "baselines")
    return folder


def test_upgrade_to_current_transformers_is_within_budget(
    pytester: pytest.Pytester,
    example_suite: ExampleSuite,
    recorded: Path,
    run_pytest: RunPytest,
    xdist: bool,
    request: pytest.FixtureRequest,
) -> None:
    folder = _suite(recorded, example_suite)
    # Qwen2.5-VL's 4.49 weights (visual.*, model.*) load into today's model (model.visual.*,
    # model.language_model.*) through the suite's renames.
    stored = json.loads((folder / "baselines" / "qwen2_5_vl" / "manifest.json").read_text())
    assert any(n.startswith("visual.") for n in stored["weights"]["params"])
    result = run_pytest(
        "--align-config",
        f"{SUITE}/align.yaml",
        "--align-baseline",
        f"{SUITE}/baselines",
        "--align-report",
        "out",
    )
    result.assert_outcomes(passed=4)
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    current = metadata.version("transformers")
    assert len(report["cases"]) == 4
    for entry in report["cases"]:
        assert f"transformers 4.49.0 → {current}" in entry["baseline"]["environment_changes"]
        assert entry["baseline"]["weights_changes"] == []


def test_injected_fault_fails_with_the_environment_diff_and_the_layer(
    example_suite: ExampleSuite, recorded: Path, run_pytest: RunPytest, xdist: bool
) -> None:
    folder = _suite(recorded, example_suite)
    config = folder / "align.yaml"
    text = config.read_text()
    spec = 'qwen2_5_vl: {source: factory, factory: "tiny_models:qwen2_5_vl"}'
    assert spec in text
    config.write_text(text.replace(spec, spec[:-1] + ', patch: "faults:scale_first_mlp"}'))
    result = run_pytest(
        "--align-config", f"{SUITE}/align.yaml", "--align-baseline", f"{SUITE}/baselines", "-k", "qwen2_5_vl"
    )
    result.assert_outcomes(failed=2, deselected=0 if xdist else 2)  # xdist does not count deselection
    current = metadata.version("transformers")
    result.stdout.fnmatch_lines(
        [
            f"*Environment changed since it was recorded: transformers 4.49.0 → {current}*",
            "*Weights: the same as the baseline's (checksum matches; loaded from the baseline's weights.safetensors)*",
            "*First divergence: model.layers.0.mlp (activation, out, step 0), origin*",
        ]
    )


def test_attention_fault_across_releases_is_told_at_the_attention_with_masks_set_aside(
    pytester: pytest.Pytester, example_suite: ExampleSuite, recorded: Path, run_pytest: RunPytest, xdist: bool
) -> None:
    """The attention mask and ``cache_position`` changed form between 4.49 and today's release:
    they neither stop the walk at ``self_attn`` nor let a ModuleList that never runs
    (``model.layers``) be named the origin."""
    folder = _suite(recorded, example_suite)
    config = folder / "align.yaml"
    spec = 'qwen2_5: {source: factory, factory: "tiny_models:qwen2_5"}'
    config.write_text(
        config.read_text().replace(spec, spec[:-1] + ', patch: "faults:soften_first_attention"}')
    )
    result = run_pytest(
        "--align-config",
        f"{SUITE}/align.yaml",
        "--align-baseline",
        f"{SUITE}/baselines",
        "--align-report",
        "out",
        "-k",
        "qwen2_5 and forward and not vl",
    )
    result.assert_outcomes(failed=1, deselected=0 if xdist else 3)
    result.stdout.fnmatch_lines(
        [
            "*Origin: model.layers.0.self_attn (forward, step 0) — its inputs and children q_proj, k_proj, "
            "v_proj matched, o_proj's input did not*set aside (not data; their shape, dtype or presence "
            "changed between the sides): attention_mask*",
        ]
    )
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    (entry,) = report["cases"]
    assert entry["origin"]["module"] == "model.layers.0.self_attn"
    assert entry["origin"]["proven"] is True
    assert "attention_mask" in entry["first_divergence"]["set_aside"]
