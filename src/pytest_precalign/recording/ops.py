"""Op-level recording (msprobe's L1/mix): torch functions and tensor methods called inside
modules, seen through a ``TorchFunctionMode``.

An op call is named like msprobe names its APIs -- ``Functional.softmax`` (``torch.nn.functional``),
``Torch.matmul`` (``torch.*``), ``Tensor.__add__`` (tensor methods) -- and recorded under the
module it ran in: record name ``<module path>.<api>`` (``model.layers.0.self_attn.Functional.softmax``),
call ``module call * 1000 + n`` where n counts that api's calls inside that module call (the
convention of ``fuzzy.py``, so live traces and fuzzy-matched msprobe dumps line up). The
manifest's ``parents`` links each op call (``name#call``) to its module call.

Views and metadata (``view``, ``reshape``, ``transpose``, ``size``, ``__getitem__``, ...) are
not recorded: they move no numbers, and skipping them keeps the cost per forward low.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..trace.op_names import PER_MODULE_CALL, split_op_name
from ..vocabulary import LEVELS

__all__ = ["LEVELS", "PER_MODULE_CALL", "OpMode", "api_name", "split_op_name"]


# Ops that only reinterpret or inspect a tensor: no new values, nothing to compare.
SKIPPED = frozenset(
    {
        "__get__",
        "__set__",
        "__getitem__",
        "__setitem__",
        "__len__",
        "__iter__",
        "__format__",
        "__repr__",
        "__bool__",
        "__index__",
        "__contains__",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "transpose",
        "permute",
        "contiguous",
        "expand",
        "expand_as",
        "unsqueeze",
        "squeeze",
        "flatten",
        "unflatten",
        "narrow",
        "select",
        "split",
        "chunk",
        "unbind",
        "movedim",
        "t",
        "detach",
        "requires_grad_",
        "size",
        "dim",
        "numel",
        "stride",
        "storage_offset",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "data_ptr",
        "element_size",
        "item",
        "tolist",
        "get_device",
        "untyped_storage",
        "_is_view",
        "__torch_function__",
        "__reduce_ex__",
        "__deepcopy__",
        "__array__",
        "numpy",
    }
)

_names: dict[Any, str | None] = {}


def api_name(func: Callable[..., Any]) -> str | None:
    """msprobe's name of a torch API (``Functional.linear``), None for an op not recorded."""
    try:
        return _names[func]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable: not an API we name
        return None
    name = getattr(func, "__name__", None)
    found: str | None = None
    if isinstance(name, str) and name not in SKIPPED:
        if getattr(torch.nn.functional, name, None) is func:
            found = f"Functional.{name}"
        elif (
            getattr(torch.Tensor, name, None) is func
            or getattr(torch._C.TensorBase, name, None) is func
            or str(getattr(func, "__qualname__", "")).startswith(("TensorBase.", "Tensor."))
        ):
            found = f"Tensor.{name}"
        else:
            found = f"Torch.{name}"
    _names[func] = found
    return found


class OpMode(TorchFunctionMode):
    """Hands every torch call to ``on_call(func, args, kwargs, output)`` after running it
    unchanged (the mode is off inside its own handler, so nested calls are not seen twice)."""

    def __init__(self, on_call: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any], Any], None]):
        super().__init__()
        self.on_call = on_call

    def start(self) -> None:
        super().__enter__()  # type: ignore[no-untyped-call]

    def stop(self) -> None:
        super().__exit__(None, None, None)  # type: ignore[no-untyped-call]

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.on_call(func, args, kwargs, out)
        return out
