"""A frozen dataclass as the JSON object whose keys are its fields, in their order: the one
``as_dict`` of every class that writes itself key per field (a record and its statistics, a
plan, an adapter, a step's scalars, a note block, the weight sync's report). No torch import."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import fields, is_dataclass
from functools import cache
from operator import attrgetter
from typing import Any


def field_dict(obj: Any, *, omit: Collection[str] = (), omit_empty: Collection[str] = ()) -> dict[str, Any]:
    """``obj``'s fields, each as plain JSON (``plain``), but ``omit`` and the fields of
    ``omit_empty`` that are empty (the key is written only when the field holds something)."""
    names, values = _fields_of(obj.__class__)
    out = dict(zip(names, values(obj), strict=True))
    for name, value in out.items():
        if type(value) not in _AS_IS:
            out[name] = plain(value)
    for name in omit:
        del out[name]
    for name in omit_empty:
        if not out[name]:
            del out[name]
    return out


def plain(value: Any) -> Any:
    """``value`` as JSON holds it: a tuple as a list (nested ones too), a mapping as a dict, a
    dataclass as its ``field_dict``; anything else as it is."""
    if type(value) in _AS_IS:
        return value
    if isinstance(value, (tuple, list)):
        return [v if type(v) in _AS_IS else plain(v) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        return field_dict(value)
    return {k: plain(v) for k, v in value.items()} if isinstance(value, Mapping) else value


_AS_IS = frozenset({str, int, float, bool, type(None)})  # the types JSON holds as they are


@cache
def _fields_of(cls: type) -> tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]:
    """``cls``'s field names, and a function that reads their values (in one C call)."""
    names = tuple(f.name for f in fields(cls))
    return names, attrgetter(*names) if len(names) > 1 else lambda obj: (getattr(obj, names[0]),)
