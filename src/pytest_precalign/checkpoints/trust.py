"""What a checkpoint may hold when the user has not said to trust it.

Unpickling runs whatever the file names: a ``model_optim_rng.pt`` or a ``.metadata`` from
elsewhere could run code the moment it is read. So, unless the user says
``--trust-checkpoint`` (CLI), ``weights: {trust: true}`` (config) or
``--align-trust-checkpoint`` (pytest):

* a legacy Megatron ``model_optim_rng.pt`` is read with ``torch.load(weights_only=True)``,
  allowing besides torch's own safe types only the classes Megatron checkpoints hold (the
  ``args`` Namespace, numpy RNG state, megatron-core's enums and configs, ...); its globals are
  listed from the pickle's opcodes first, without running it, so that what is refused is
  named;
* a ``torch_dist`` ``.metadata`` is read by an unpickler that finds only the
  ``torch.distributed.checkpoint`` metadata classes, torch dtypes and sizes.

Anything else is refused with one message that says how to trust the file.
"""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SourceError
from ..untrusted import bounded_repr, check_regular, plain_name

if TYPE_CHECKING:
    from torch.distributed.checkpoint.filesystem import FileSystemReader

HOW_TO_TRUST = (
    "loading it could run code from the file; if you trust where it came from, say so: "
    "precalign check-weights --trust-checkpoint, precalign run --trust-checkpoint, "
    "pytest --align-trust-checkpoint, or weights: {load: ..., format: ..., trust: true} in the config"
)

# What megatron-core's own checkpoints pickle besides tensors and plain containers (module ->
# names). A name not installed here (an older numpy, no megatron-core) is simply not found.
MEGATRON_GLOBALS: dict[str, tuple[str, ...]] = {
    "argparse": ("Namespace",),
    "types": ("SimpleNamespace",),
    "pathlib": ("PosixPath",),
    "_io": ("BytesIO",),
    "io": ("BytesIO",),
    "signal": ("Signals",),
    "numpy": ("ndarray", "dtype"),
    "numpy.dtypes": ("UInt32DType", "Float64DType", "Int64DType"),
    "numpy.core.multiarray": ("_reconstruct", "scalar"),
    "numpy._core.multiarray": ("_reconstruct", "scalar"),
    "megatron.core.enums": ("ModelType", "Fp8Recipe", "Fp4Recipe"),
    "megatron.core.transformer.enums": (
        "AttnBackend",
        "AttnMaskType",
        "AttnType",
        "CudaGraphScope",
        "LayerType",
    ),
    "megatron.core.optimizer.optimizer_config": ("OptimizerConfig",),
    "megatron.core.optimizer": ("OptimizerConfig",),
    "megatron.core.rerun_state_machine": ("RerunDiagnostic", "RerunMode", "RerunState"),
}

# What torch.distributed.checkpoint's FileSystemWriter pickles into ``.metadata``.
_DCP = "torch.distributed.checkpoint."
METADATA_GLOBALS: dict[str, tuple[str, ...]] = {
    _DCP + "metadata": (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "ChunkStorageMetadata",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    ),
    _DCP + "planner": (
        "SavePlan",
        "WriteItem",
        "WriteItemType",
        "TensorWriteData",
        "BytesIOWriteData",
        "LoadPlan",
        "ReadItem",
        "LoadItemType",
    ),
    _DCP + "filesystem": ("_StorageInfo",),
    "torch": ("Size",),
    "torch.serialization": ("_get_layout",),
    "collections": ("OrderedDict",),
}


def _split(name: str) -> tuple[str, str]:
    module, _, attr = name.rpartition(".")
    return module, attr


def _megatron_global(name: str) -> Any:
    """The object an allowed dotted name stands for, or None (not allowed, or not installed)."""
    module, attr = _split(name)
    if attr not in MEGATRON_GLOBALS.get(module, ()):
        return None
    try:
        return getattr(importlib.import_module(module), attr, None)
    except ImportError:
        return None


class CheckpointRefused(SourceError):
    """A checkpoint not loaded because loading it could run code from it."""


def refused(file: Path, what: str) -> CheckpointRefused:
    return CheckpointRefused(
        f"{file}: not loaded: it holds {what}, which is not known to be safe; {HOW_TO_TRUST}"
    )


def allowed_globals(file: Path) -> dict[str, Any]:
    """The classes a ``torch.save`` file names, each known to be safe; ``refused`` when one is
    not. Read from the pickle's opcodes: nothing in the file runs."""
    from torch.serialization import get_unsafe_globals_in_checkpoint

    names = get_unsafe_globals_in_checkpoint(file)
    allowed = {name: _megatron_global(name) for name in names}
    unknown = [name for name, obj in allowed.items() if obj is None]
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise refused(file, f"{bounded_repr(unknown[0])}{more}")
    return allowed


def load_pt(file: Path, trust: bool) -> Any:
    """``torch.load`` of a Megatron ``model_optim_rng.pt``: everything when trusted, else only
    tensors, plain containers and the classes Megatron checkpoints hold. A file that is not a
    torch.save archive raises what torch raises (the caller names the file)."""
    import torch
    from torch.serialization import safe_globals

    if trust:
        return torch.load(file, map_location="cpu", weights_only=False)
    allowed = allowed_globals(file)
    try:
        with safe_globals(list(allowed.values())):
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()
        reason = next((line for line in first if "Unsupported" in line or "GLOBAL" in line), "")
        raise refused(file, reason.strip()[:200] or "objects weights_only loading refuses") from None


class _MetadataUnpickler(pickle.Unpickler):
    """Finds only the classes a torch_dist ``.metadata`` holds, and torch dtypes."""

    def find_class(self, module: str, name: str) -> Any:
        import torch

        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if name in METADATA_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def metadata_reader(folder: Path, trust: bool) -> FileSystemReader:
    """A ``FileSystemReader`` of ``folder`` whose ``.metadata`` is read by the restricted
    unpickler unless the checkpoint is trusted."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            metadata = self._read(kwargs.get("rank"), *args, **kwargs)
            where = f"{folder / '.metadata'}: storage file"
            storage = metadata.storage_data if isinstance(metadata.storage_data, dict) else {}
            for info in storage.values():  # the files torch will open: plain names, regular files
                name = getattr(info, "relative_path", None)
                if not isinstance(name, str):
                    raise SourceError(f"{where}: expected a file name, got {bounded_repr(name)}")
                check_regular(plain_name(name, folder, where, SourceError), SourceError, "a .distcp file")
            return metadata

        def _read(self, rank: int | None, *args: Any, **kwargs: Any) -> Metadata:
            if trust:
                return super().read_metadata(*args, **kwargs)
            file = folder / (".metadata" if rank is None else f"__{rank}.metadata")
            try:
                with file.open("rb") as handle:
                    metadata = _MetadataUnpickler(handle).load()
            except pickle.UnpicklingError as exc:
                raise refused(file, bounded_repr(str(exc))) from None
            except (OSError, EOFError, ValueError, TypeError, AttributeError) as exc:
                raise SourceError(f"{file}: not a torch_dist checkpoint's metadata ({exc})") from None
            if not isinstance(metadata, Metadata):
                raise SourceError(f"{file}: holds a {type(metadata).__name__}, expected torch_dist Metadata")
            storage = metadata.storage_meta or StorageMeta()
            storage.load_id = self.load_id
            metadata.storage_meta = storage
            return metadata

    return Reader(str(folder))
