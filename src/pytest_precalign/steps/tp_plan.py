"""The DTensor tensor-parallel plan a model was given (``parallelize_module``), read back from the
model: the manifest's ``parallel.dtensors.tp_plan``, for the compare that merges the ranks.

    "tp_plan": {
      "model.layers.0.mlp.gate_proj": {"style": "ColwiseParallel", "input": ["replicate"],
          "output": [{"shard": -1}], "use_local_output": true, "mesh": [2], "group": [0, 1]},
      ...
    }

The user does not pass the plan: ``parallelize_module`` leaves it on each module it
parallelised as the forward hooks of ``distribute_module`` (a closure over
``functools.partial(Style._prepare_output_fn, output_layouts, use_local_output)`` and the
style's input function), read here. ``output`` is where the module's output lands
(``Shard(d)``, ``Replicate``); with ``use_local_output`` the next module (and the recorder's
hooks, registered after torch's) sees the rank's local tensor: a shard where ``output`` is
``{"shard": d}``. ``group`` is the global ranks of the module's TP mesh (this rank's TP group).
A module with DTensor parameters of its own whose hooks ``distribute_module`` made from other
functions (a custom ``ParallelStyle``, another torch) gets ``{"style": <the class its hook
functions are defined in>, "unread": true, "mesh", "group"}``: how its output is split is not
known, so its records and those its parent's ranks recorded differently are listed as not
merged (``parallel/dtensor_rules.py``), never taken for replicated ones.

``PrepareModuleInput`` / ``PrepareModuleOutput`` / ``PrepareModuleInputOutput`` (torchtitan's
plans give them to the attention and feed-forward modules) leave lambdas over the style object
itself; read from it, their entry says where the module's inputs and outputs land after the
hooks (the desired layout, else the given one; ``null``: an argument the style leaves as it is)
and whether they are handed on as local tensors:

    "model.layers.0.mlp": {"style": "PrepareModuleInputOutput", "input": ["replicate"],
        "input_kwargs": {}, "use_local_input": false, "output": [{"shard": 1}],
        "use_local_output": true, "mesh": [2], "group": [0, 1]}
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

# The styles whose hooks are read (torch.distributed.tensor.parallel.style); their argument
# order in the ``partial``s torch builds: (input_layouts, desired_input_layouts) and
# (output_layouts, use_local_output); SequenceParallel's output function: (use_local_output,).
_STYLES = ("ColwiseParallel", "RowwiseParallel", "SequenceParallel")


def _placement(p: Any) -> Any:
    if getattr(p, "is_shard", lambda: False)():
        return {"shard": int(p.dim)}
    if getattr(p, "is_replicate", lambda: False)():
        return "replicate"
    if getattr(p, "is_partial", lambda: False)():
        return "partial"
    return str(p)


def _placements(value: Any) -> list[Any]:
    items = value if isinstance(value, (tuple, list)) else (value,)
    return [_placement(p) for p in items]


def _partials(hook: Any) -> list[functools.partial[Any]]:
    cells = getattr(hook, "__closure__", None) or ()
    out = []
    for cell in cells:
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, functools.partial):
            out.append(value)
    return out


def _mesh_of(hook: Any) -> Any:
    for cell in getattr(hook, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if type(value).__name__ == "DeviceMesh":
            return value
    return None


_PREPARE = ("PrepareModuleInput", "PrepareModuleOutput")


def _layouts(given: Any, desired: Any) -> list[Any]:
    """Where each argument lands: its desired layout, else the given one; None: left as it is."""
    given = tuple(given or ())
    desired = tuple(desired or (None,) * len(given))
    return [
        None if g is None else _placement(d if d is not None else g)
        for g, d in zip(given, desired, strict=True)
    ]


def _prepared(hooks: Sequence[Any]) -> dict[str, Any]:
    """The entry of the ``PrepareModule*`` styles whose hooks are among ``hooks`` (module doc)."""
    entry: dict[str, Any] = {}
    for hook in hooks:
        for cell in getattr(hook, "__closure__", None) or ():
            style: Any = cell.cell_contents if _full(cell) else None
            kind = type(style).__name__
            if kind not in _PREPARE:
                continue
            if kind == "PrepareModuleInput":
                entry["input"] = _layouts(style.input_layouts, style.desired_input_layouts)
                entry["input_kwargs"] = {
                    str(k): _layouts((v,), (style.desired_input_kwarg_layouts.get(k),))[0]
                    for k, v in style.input_kwarg_layouts.items()
                }
                entry["use_local_input"] = bool(style.use_local_output)
            else:
                entry["output"] = _layouts(style.output_layouts, style.desired_output_layouts)
                entry["use_local_output"] = bool(style.use_local_output)
            mesh = _mesh_of(hook)
            if mesh is not None:
                entry["mesh"] = list(mesh.shape)
                entry["group"] = [int(r) for r in mesh.mesh.flatten().tolist()]
    if entry:
        both = "input" in entry and "output" in entry
        entry["style"] = "PrepareModuleInputOutput" if both else _PREPARE["input" not in entry]
    return entry


def _entry(module: torch.nn.Module) -> dict[str, Any] | None:
    """The plan entry torch's style hooks on ``module`` say; None when there is none."""
    hooks = [*module._forward_pre_hooks.values(), *module._forward_hooks.values()]
    entry: dict[str, Any] = _prepared(hooks)
    if entry:
        return entry
    for hook in hooks:
        for part in _partials(hook):
            owner, _, fn = getattr(part.func, "__qualname__", "").rpartition(".")
            if owner not in _STYLES:
                continue
            entry["style"] = owner
            mesh = _mesh_of(hook)
            if mesh is not None:
                entry["mesh"] = list(mesh.shape)
                entry["group"] = [int(r) for r in mesh.mesh.flatten().tolist()]
            if fn == "_prepare_output_fn" and owner == "SequenceParallel" and part.args:
                entry["use_local_output"] = bool(part.args[0])
            elif fn == "_prepare_output_fn" and len(part.args) >= 2:
                entry["output"] = _placements(part.args[0])
                entry["use_local_output"] = bool(part.args[1])
            elif fn == "_prepare_input_fn" and owner != "SequenceParallel" and part.args:
                entry["input"] = _placements(part.args[0])
    return entry or _unread(module, hooks)


def _unread(module: torch.nn.Module, hooks: Sequence[Any]) -> dict[str, Any] | None:
    """The entry of a module another style distributed (module doc), or None."""
    if not any(type(p).__name__ == "DTensor" for p in module.parameters(recurse=False)):
        return None
    for hook in hooks:
        mesh = _mesh_of(hook)
        if mesh is None:
            continue
        named = [getattr(c.cell_contents, "__qualname__", "") for c in hook.__closure__ or () if _full(c)]
        owner = next((q.split(".")[0] for q in named if "." in q), "unknown")
        group = [int(r) for r in mesh.mesh.flatten().tolist()]
        return {"style": owner, "unread": True, "mesh": list(mesh.shape), "group": group}
    return None


def _full(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell
        return False
    return True


def output_hook_id(module: torch.nn.Module) -> int | None:
    """The id (in ``module._forward_hooks``) of the output hook a ``RowwiseParallel`` style
    left on ``module``, or None."""
    for key, hook in module._forward_hooks.items():
        for part in _partials(hook):
            if getattr(part.func, "__qualname__", "") == "RowwiseParallel._prepare_output_fn":
                return int(key)
    return None


def tp_plan(chunks: Sequence[torch.nn.Module], prefixes: Sequence[str] = ()) -> dict[str, Any]:
    """Module name (as the recorder names it) -> its plan entry, for every module of ``chunks``
    that ``parallelize_module`` gave a style torch's hooks say."""
    plan: dict[str, Any] = {}
    for i, chunk in enumerate(chunks):
        prefix = prefixes[i] if i < len(prefixes) else ""
        for name, module in chunk.named_modules():
            entry = _entry(module)
            if entry is not None:
                plan[f"{prefix}{name}"] = entry
    return plan
