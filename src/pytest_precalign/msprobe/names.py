"""msprobe record names -> our (name, module_class, direction, call).

msprobe names modules ``Module.<path>.<Class>.<direction>.<n>`` (direction: forward, backward,
parameters_grad) and APIs ``<Prefix>.<api>.<n>.<direction>`` (``Functional.linear.13.forward``,
``Tensor.__mul__.4.backward``; aten names may hold dots: ``Aten.add.Tensor.0.forward``).
MindSpore's cells (``Cell.``) follow the module pattern.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TraceError

MODULE_PREFIXES = ("Module", "Cell")
MODULE_DIRECTIONS = ("forward", "backward", "parameters_grad")
API_DIRECTIONS = ("forward", "backward")
API_CLASS = "api"  # module_class of API records: they have no class of their own


@dataclass(frozen=True)
class ParsedName:
    name: str  # module path ("model.layers.0.mlp") or API name ("Functional.linear")
    module_class: str
    direction: str  # forward | backward | parameters_grad
    call: int
    is_module: bool

    @property
    def key(self) -> str:
        """``name#call``: how the manifest's ``parents`` refer to one call."""
        return f"{self.name}#{self.call}"


def parse_name(raw: str) -> ParsedName:
    """Raises TraceError for a name that is neither a module nor an API record."""
    parts = raw.split(".")
    if parts[0] in MODULE_PREFIXES and len(parts) >= 4 and parts[-2] in MODULE_DIRECTIONS:
        call = _int(parts[-1])
        if call is not None:
            # The root module passed to start() is never recorded, but a path-less name
            # would be it: fall back to its class so the name is never empty.
            path = ".".join(parts[1:-3]) or parts[-3]
            return ParsedName(path, parts[-3], parts[-2], call, True)
    if len(parts) >= 4 and parts[-1] in API_DIRECTIONS:
        call = _int(parts[-2])
        if call is not None:
            return ParsedName(".".join(parts[:-2]), API_CLASS, parts[-1], call, False)
    raise TraceError(
        f"record name {raw!r} is neither Module.<path>.<Class>.<forward|backward|parameters_grad>.<n> "
        "nor <Prefix>.<api>.<n>.<forward|backward>"
    )


def forward_name(raw: str) -> str:
    """The forward record of a backward name (msprobe's backward parents are unreliable)."""
    parts = raw.split(".")
    if parts[-2:-1] == ["backward"]:
        parts[-2] = "forward"
    elif parts[-1] == "backward":
        parts[-1] = "forward"
    return ".".join(parts)


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None
