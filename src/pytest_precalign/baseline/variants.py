"""Baselines keyed by environment (transformers' ``Expectations`` pattern): beside the default
``DIR/<case>/``, a baseline folder may hold variants ``DIR/<case>@<label>/`` recorded in other
environments (another device, dtype, torch / torch_npu / megatron-core / transformers version;
``precalign record --variant LABEL``). A run compares with the variant whose environment is
closest to its own, and says which one it used and how the environments differ."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, TraceError
from ..trace.environment import check_environment
from ..untrusted import read_json

SEPARATOR = "@"
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")

# What must match, in order of weight: a variant of the same device and dtype beats any version
# match; then the exact torch (torch_npu) version, the same torch minor, and the frameworks.
_VERSION_KEYS = ("torch_npu", "torch", "megatron-core", "transformers", "python")


@dataclass(frozen=True)
class Chosen:
    path: Path
    label: str  # "" for the default DIR/<case>/
    among: int  # how many recorded variants there were (0: none yet)


def check_label(label: str) -> str:
    if not _LABEL.match(label) or SEPARATOR in label:
        raise ConfigError(
            f"--variant: {label!r} is not a usable label (allowed: letters, digits, '.', '_', '+', '-', "
            "starting with a letter or digit; e.g. torch2.14-cpu)"
        )
    return label


def variant_dir(root: Path, case: str, label: str = "") -> Path:
    return root / (f"{case}{SEPARATOR}{check_label(label)}" if label else case)


def recorded_variants(root: Path, case: str) -> list[tuple[str, Path]]:
    """``(label, folder)`` of each recorded variant of ``case``: the default first, then by label."""
    out: list[tuple[str, Path]] = []
    if (root / case / "manifest.json").is_file():
        out.append(("", root / case))
    if root.is_dir():
        prefix = f"{case}{SEPARATOR}"
        for entry in sorted(root.iterdir(), key=lambda p: p.name):
            label = entry.name[len(prefix) :]
            if entry.name.startswith(prefix) and _LABEL.match(label) and (entry / "manifest.json").is_file():
                out.append((label, entry))
    return out


def closeness(stored: Mapping[str, Any], current: Mapping[str, Any]) -> tuple[bool, ...]:
    """How close a recorded environment is to this one: compared as a tuple, larger is closer."""
    sv, cv = stored.get("versions") or {}, current.get("versions") or {}
    same_place = (stored.get("device") == current.get("device"), stored.get("dtype") == current.get("dtype"))
    versions = []
    for key in _VERSION_KEYS:
        versions.append(sv.get(key) == cv.get(key))
        if key == "torch":
            versions.append(_minor(sv.get(key)) == _minor(cv.get(key)))
    return (*same_place, *versions)


def choose(root: Path, case: str, current: Mapping[str, Any]) -> Chosen:
    """The variant to compare with: the closest to ``current`` (ties go to the default, then
    by label); the default folder when there is none yet (where a missing baseline is written)."""
    found = recorded_variants(root, case)
    if len(found) <= 1:
        label, path = found[0] if found else ("", root / case)
        return Chosen(path, label, len(found))
    scored = [(closeness(_manifest(path), current), -i, label, path) for i, (label, path) in enumerate(found)]
    _, _, label, path = max(scored)
    return Chosen(path, label, len(found))


def _manifest(path: Path) -> dict[str, Any]:
    """A variant's manifest, read as any recording is (untrusted): a crafted one is one
    ``TraceError`` naming the file, not a traceback while choosing."""
    file = path / "manifest.json"
    data = read_json(file, TraceError, what="a baseline manifest", bad="not a readable manifest")
    if not isinstance(data, dict):
        raise TraceError(f"{file}: not a pytest-precalign manifest (expected an object)")
    check_environment(data, file)
    return data


def _minor(version: Any) -> str | None:
    if not isinstance(version, str):
        return None
    return ".".join(version.split("+")[0].split(".")[:2])
