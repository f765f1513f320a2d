"""Setup paid once (issue #35): the package versions every manifest records are read from the
installed metadata once per process, not at every ``Recorder.start()`` (a recorder started
every step paid ~5 ms of metadata parsing each time); each call still returns its own dict."""

from __future__ import annotations

from importlib import metadata

import pytest
import torch

from pytest_precalign.recording import determinism


def test_package_versions_read_the_metadata_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.version
    calls: list[str] = []

    def counting(dist: str) -> str:
        calls.append(dist)
        return real(dist)

    determinism._distribution_versions.cache_clear()
    monkeypatch.setattr(metadata, "version", counting)
    try:
        first = determinism.package_versions()
        first["torch"] = first["transformers"] = "changed by the caller"
        second = determinism.package_versions()
        third = determinism.package_versions()
    finally:
        determinism._distribution_versions.cache_clear()
    assert sorted(calls) == sorted(determinism.VERSIONED)  # once each, for three calls
    assert second == third and second is not third
    assert second["torch"] == torch.__version__ and second["transformers"] == real("transformers")
    assert second["python"] and second["pytest-precalign"] == real("pytest-precalign")
