"""Seeds, deterministic algorithms, TF32 off, and the environment facts a manifest records.

``deterministic(...)`` is a context manager: it sets the flags and the environment variables
the seeds list, and restores all of them on exit, so a case cannot leak global state into
the rest of a pytest session.
"""

from __future__ import annotations

import functools
import os
import platform
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import Any

import torch

from ..errors import SourceError
from .native_kernels import kernel_state
from .npu_backend import npu_problem

DETERMINISM_ENV = {
    "NVIDIA_TF32_OVERRIDE": "0",  # no TF32 in cuBLAS/cuDNN whatever the code asks
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",  # required for deterministic cuBLAS
    "HCCL_DETERMINISTIC": "true",  # Ascend collective communication
}

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise SourceError(f"unknown dtype {name!r} (allowed: {', '.join(_DTYPES)})") from None


def resolve_device(name: str) -> torch.device:
    """The torch device for a config's device name, with a clear error when it is absent."""
    if name == "npu":
        problem = npu_problem()  # not installed, built for another torch, or no CANN
        if problem is not None:
            raise SourceError(problem)
        return torch.device("npu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SourceError(
            f"device 'cuda' requested but torch {torch.__version__} sees no CUDA device; "
            "use device: cpu or run on a GPU machine"
        )
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass
    torch.manual_seed(seed)


@contextmanager
def deterministic(enabled: bool) -> Iterator[dict[str, Any]]:
    """Deterministic algorithms and no TF32 while inside; yields the flags for the manifest."""
    saved_env = {k: os.environ.get(k) for k in DETERMINISM_ENV}
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    try:
        if enabled:
            os.environ.update(DETERMINISM_ENV)
            torch.use_deterministic_algorithms(True)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
        yield determinism_flags(enabled)
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cuda.matmul.allow_tf32 = saved[2]
        torch.backends.cudnn.allow_tf32 = saved[3]
        torch.backends.cudnn.deterministic = saved[4]
        torch.backends.cudnn.benchmark = saved[5]


def determinism_flags(enabled: bool) -> dict[str, Any]:
    return {
        "requested": enabled,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "env": {k: os.environ.get(k) for k in DETERMINISM_ENV},
    }


# The distributions whose versions every manifest records (None: not installed).
VERSIONED = (
    "transformers",
    "megatron-core",
    "torch_npu",
    "safetensors",
    "trl",
    "peft",
    "accelerate",
    "lightning",
    "deepspeed",
    "pytest-precalign",
)


def package_versions() -> dict[str, str | None]:
    return {"python": platform.python_version(), "torch": torch.__version__, **_distribution_versions()}


@functools.cache
def _distribution_versions() -> dict[str, str | None]:
    """The installed versions of ``VERSIONED``, read from their metadata once per process (a
    ``Recorder`` started every step would otherwise parse 10 metadata files each time, ~3 ms)."""
    out: dict[str, str | None] = {}
    for dist in VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


# Environment variables that change numerics (or the threads a reduction is split over) without
# a line of the user's code changing: recorded in every manifest, compared by ``env-diff``.
NUMERICS_ENV = (
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUBLASLT_WORKSPACE_SIZE",
    "CUDA_LAUNCH_BLOCKING",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "HCCL_DETERMINISTIC",
    "ASCEND_LAUNCH_BLOCKING",
    "ASCEND_RT_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TORCH_CUDNN_V8_API_ENABLED",
    "PRECALIGN_FUSED_STATS",
)


def numerics() -> dict[str, Any]:
    """Settings outside the determinism flags that change results: matmul precision (TF32 on
    Ampere and later), the numerics environment variables, and what computes a CPU tensor's
    statistics (``native_kernels.kernel_state``: the C kernels' sums are not torch's bits)."""
    return {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "env": {k: os.environ.get(k) for k in NUMERICS_ENV},
        "stats_kernel": kernel_state(),
    }


def environment(device: str, dtype: str, seed: int, flags: dict[str, Any]) -> dict[str, Any]:
    return {
        "versions": package_versions(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "device": device,
        "dtype": dtype,
        "seed": seed,
        "determinism": flags,
        "numerics": numerics(),
        "torch_threads": torch.get_num_threads(),
    }
