"""Whether torch_npu can serve ``device: npu``, found out before torch is imported, as one
message naming the package and CANN when it cannot:

* torch_npu is not installed;
* the installed torch_npu was built for another torch (its own ``torch==X.Y.Z.*`` requirement
  against the installed torch, read from the packages' metadata);
* torch_npu is installed without the CANN toolkit: its extension cannot find CANN's shared
  libraries (``libhccl.so``, ``libascendcl.so``, ...). torch loads installed device backends when
  it is imported, so then ``import torch`` itself fails, whatever the device (``torch_problem``).

Torch-free at import: the load check imports torch_npu (and torch) only when called.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Iterable
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

CANN_HINT = (
    "install the CANN toolkit and source its set_env.sh (e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh)"
)
NOT_INSTALLED = (
    "device 'npu' needs torch_npu, which is not installed: "
    "pip install 'pytest-precalign[npu]' (and the CANN toolkit)"
)
# torch's switch for loading installed device backends (torch_npu) when torch is imported.
AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"
_SHARED_LIBRARY = re.compile(r"([\w.+-]+\.so(?:\.[\d.]+)?): cannot open shared object file")


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def version_mismatch(npu_version: str, torch_version: str, requires: Iterable[str]) -> str | None:
    """torch_npu's own torch requirement (its Requires-Dist) against the installed torch: the
    message when they do not match, None when they do or torch_npu names no torch version."""
    clause = _mismatch_clause(npu_version, torch_version, requires)
    return None if clause is None else f"device 'npu': torch_npu {npu_version} {clause}"


def _mismatch_clause(npu_version: str, torch_version: str, requires: Iterable[str]) -> str | None:
    """``is built for torch ==2.14.0.* but torch 2.13.0 is installed: install ...``, or None."""
    for line in requires:
        try:
            req = Requirement(line)
            release = Version(torch_version).base_version
        except (InvalidRequirement, InvalidVersion):
            continue
        if canonicalize_name(req.name) != "torch" or not req.specifier:
            continue
        if req.specifier.contains(torch_version, prereleases=True):
            return None
        return (
            f"is built for torch {req.specifier} but torch {torch_version} is installed: install the "
            f"torch-npu release for torch {release} (pip install 'torch-npu=={release}.*') or the torch "
            f"torch_npu {npu_version} needs"
        )
    return None


def load_error() -> str | None:
    """Why ``import torch_npu`` fails (a missing CANN library named), None when it loads."""
    try:
        importlib.import_module("torch_npu")
    except Exception as exc:  # noqa: BLE001 - any failure to load is reported, as one line
        return _why(exc)
    return None


def npu_problem() -> str | None:
    """The one message when device 'npu' cannot be used here, None when it can."""
    npu = installed_version("torch_npu")
    if npu is None and importlib.util.find_spec("torch_npu") is None:
        return NOT_INSTALLED
    torch_version = installed_version("torch")
    if npu is not None and torch_version is not None:
        mismatch = version_mismatch(npu, torch_version, metadata.requires("torch_npu") or ())
        if mismatch is not None:
            return mismatch
    error = load_error()
    if error is None:
        return None
    return f"device 'npu': torch_npu {npu or '(version unknown)'} is installed but cannot load: {error} — {CANN_HINT}"


def torch_problem() -> str | None:
    """The one message when an installed torch_npu that cannot load stops ``import torch``
    (torch imports installed device backends), for a run on another device; None otherwise."""
    npu = installed_version("torch_npu")
    if npu is None or "torch" in sys.modules or os.environ.get(AUTOLOAD, "1") == "0":
        return None
    try:
        importlib.import_module("torch")
    except Exception as exc:  # noqa: BLE001 - torch wraps the backend's failure in a RuntimeError
        torch_version = installed_version("torch")
        mismatch = _mismatch_clause(npu, torch_version or "", metadata.requires("torch_npu") or ())
        why = f"which {mismatch}" if mismatch else f"which cannot load: {_why(exc)} — {CANN_HINT}"
        return (
            f"torch {torch_version} cannot be imported: it loads the installed torch_npu {npu}, "
            f"{why}, or set {AUTOLOAD}=0 to run without the NPU"
        )
    return None


def _why(exc: BaseException) -> str:
    """The innermost cause, in a few words: ``libhccl.so not found``."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for error in reversed(chain):
        found = _SHARED_LIBRARY.search(str(error))
        if found:
            return f"{found.group(1)} not found"
    inner = chain[-1]
    text = " ".join(str(inner).split())
    return f"{type(inner).__name__}: {text}" if text else type(inner).__name__
