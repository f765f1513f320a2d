"""Names of op records (record level op/mix), without torch: the msprobe writer and the
pairing stage read them. See ``ops.py`` for how op calls are recorded."""

from __future__ import annotations

PER_MODULE_CALL = 1000  # op call index = module call * 1000 + n (as fuzzy.py)
API_PREFIXES = ("Functional", "Torch", "Tensor")
API_CLASS = "api"  # module_class of op records (as the msprobe reader's API records)


def split_op_name(name: str) -> tuple[str, str]:
    """(module path, api) of an op record's name: ``model.layers.0.mlp.Functional.silu`` ->
    (``model.layers.0.mlp``, ``Functional.silu``); ("", name) for an op at the top level."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in API_PREFIXES and i + 1 < len(parts):
            return ".".join(parts[:i]), ".".join(parts[i:])
    return "", name
