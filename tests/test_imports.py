"""The pytest plugin is loaded in every pytest run of a user's environment: importing it must
stay cheap (no torch)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_plugin_does_not_import_torch() -> None:
    code = "import sys, pytest_precalign.plugin, pytest_precalign; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
