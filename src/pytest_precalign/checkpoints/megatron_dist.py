"""Read a megatron-core ``torch_dist`` checkpoint (``dist_checkpointing.save``: ``metadata.json``,
``.metadata``, ``__*.distcp``, ``common.pt``) into one full state dict, on the CPU, in this
process, without torch.distributed.

The tensors are read with ``torch.distributed.checkpoint.load(no_dist=True)`` into tensors of
the global shapes the checkpoint's metadata gives (the global tensors are whole whatever TP/PP
wrote them). Then megatron-core's layout is undone:

* the transformer layers are stacked: ``decoder.layers.<param>`` has the layer on dim 0 ->
  ``decoder.layers.<N>.<param>``;
* the local spec saves its norms under the TE spec's names (the local layer spec's
  ``sharded_state_dict_keys_map``): ``self_attention.linear_qkv.layer_norm_*`` ->
  ``input_layernorm.*``, ``mlp.linear_fc1.layer_norm_*`` -> ``pre_mlp_layernorm.*``.

``_extra_state`` (bytes) and ``common.pt`` (non-tensor state) are not tensors: left out.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SourceError
from ..untrusted import bounded_repr, check_regular, read_json
from .trust import CheckpointRefused, metadata_reader

if TYPE_CHECKING:
    import torch

META = "metadata.json"
_STACKED = re.compile(r"^(.*decoder\.layers)\.([A-Za-z_].*)$")
# The GPT local spec's sharded_state_dict_keys_map, inverted (TE name -> local name).
_LOCAL_NAMES = (
    (".self_attention.linear_qkv.layer_norm_", ".input_layernorm."),
    (".mlp.linear_fc1.layer_norm_", ".pre_mlp_layernorm."),
)


def _check_folder(folder: Path) -> None:
    if not folder.is_dir():
        raise SourceError(f"{folder}: no such checkpoint folder (format: megatron-dist)")
    meta = folder / META
    data = read_json(meta, SourceError, what=f"{META} of a megatron-core dist checkpoint")
    backend = data.get("sharded_backend") if isinstance(data, dict) else None
    if backend is None:
        raise SourceError(
            f"{meta}: not a megatron-core dist checkpoint; expected {META} with "
            "'sharded_backend' (format: megatron-dist)"
        )
    for file in folder.glob("*"):  # torch opens them by name: a FIFO would hang it
        if file.name == ".metadata" or file.suffix == ".distcp":
            check_regular(file, SourceError, "a torch_dist checkpoint file")
    if backend != "torch_dist":
        raise SourceError(
            f"{meta}: sharded_backend {bounded_repr(backend)} is not supported (allowed: torch_dist; format: megatron-dist)"
        )


def _local_name(name: str) -> str:
    for te, local in _LOCAL_NAMES:
        if te in name:
            return name.replace(te, local)
    return name


def check_dist_metadata(folder: Path) -> None:
    """``refused`` (a SourceError) when ``.metadata`` names a class not known to be safe."""
    _check_folder(folder)
    try:
        metadata_reader(folder, False).read_metadata()
    except CheckpointRefused:
        raise
    except Exception:  # noqa: BLE001 - an unreadable checkpoint: the load names it
        return


def load_megatron_dist(folder: Path, trust: bool = False) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint by their TP=1 GPTModel (local spec) names; ``.metadata``
    is fully unpickled only when ``trust`` (see ``trust.metadata_reader``)."""
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load

    _check_folder(folder)
    try:
        reader = metadata_reader(folder, trust)
        meta = reader.read_metadata()
        state = {
            key: torch.empty(tuple(m.size), dtype=m.properties.dtype)
            for key, m in meta.state_dict_metadata.items()
            if isinstance(m, TensorStorageMetadata)
        }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load(state, storage_reader=reader, no_dist=True)
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken checkpoint is bad input, not a crash
        raise SourceError(
            f"{folder}: not a readable torch_dist checkpoint ({exc}) (format: megatron-dist)"
        ) from None
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        m = _STACKED.match(key)
        if m:
            for i, layer in enumerate(tensor.unbind(0)):
                out[_local_name(f"{m.group(1)}.{i}.{m.group(2)}")] = layer.contiguous()
        else:
            out[_local_name(key)] = tensor
    return out
