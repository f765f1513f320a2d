"""YAML reading with line numbers, and a strict reader that names file, line and key path.

Every config-like file (align config, mapping file, tolerance table) goes through ``Reader``,
so all of them produce the same kind of message:
``align.yaml:12: cases[0].baseline: unknown model 'x' (known: hf_eager, hf_sdpa)``.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar, overload

from .errors import ConfigError
from .untrusted import bounded_repr, open_regular

_Choice = TypeVar("_Choice", bound=str)

if TYPE_CHECKING:
    import yaml


class LineDict(dict[str, Any]):
    """A mapping loaded from YAML that remembers the line of each key (1-based)."""

    line: int
    key_lines: dict[str, int]


class LineList(list[Any]):
    """A sequence loaded from YAML that remembers the line of each item (1-based)."""

    line: int
    item_lines: list[int]


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int) -> None:
        super().__init__(key, line)
        self.key = key
        self.line = line


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> LineDict:
    out = LineDict()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    own = sum(1 for key_node, _ in node.value if key_node.tag != "tag:yaml.org,2002:merge")
    loader.flatten_mapping(node)  # YAML merge keys ("<<: *anchor") come first, then own keys
    merged = len(node.value) - own
    explicit: set[str] = set()
    for index, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            key = str(key)
        if index >= merged:  # a key given twice is an error; one overriding a merged key is not
            if key in explicit:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            explicit.add(key)
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: yaml.SafeLoader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


# YAML 1.2 floats: PyYAML follows YAML 1.1, where a float needs a dot, so ``atol: 1e-5`` would
# load as the string "1e-5". Also read ``1e-5``, ``1E-5``, ``-1e+3`` and ``.5e-3`` as numbers
# (``.inf``, ``-.inf`` and ``.nan`` already are).
_YAML12_FLOAT = re.compile(
    r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$",
)


@cache
def _line_loader() -> type[yaml.SafeLoader]:
    """The SafeLoader that keeps line numbers and reads YAML 1.2 floats; PyYAML is imported on
    first use (``precalign compare`` without a YAML file never needs it)."""
    import yaml

    class LineLoader(yaml.SafeLoader):
        pass

    LineLoader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789."))
    LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)
    return LineLoader


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML text; syntax errors become one ConfigError naming the file and line."""
    import yaml

    try:
        return yaml.load(text, Loader=_line_loader())  # noqa: S506 - SafeLoader subclass
    except _DuplicateKey as exc:
        raise ConfigError(
            f"{source}:{exc.line}: duplicate key {exc.key!r} (a key may appear only once in a mapping)"
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = exc.problem or exc.context or "invalid YAML"
        context = exc.context_mark
        if exc.problem and exc.context and context is not None and context is not mark:
            # e.g. an unclosed bracket: the problem is at the end, its cause where it opened
            problem += f" ({exc.context} started on line {context.line + 1})"
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: YAML syntax error: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply to be a config (thousands of levels)") from None


# A config, mapping or tolerance table is written by hand: far below this. A bigger or binary
# file is refused after its size and first bytes, before it is read whole (a 2 GB file once
# cost 16 s and 4.4 GB of memory to be rejected).
MAX_YAML_BYTES = 16 << 20
_SNIFF_BYTES = 8192


def read_text_file(path: Path, what: str = "a YAML file") -> str:
    """A hand-written text file's contents: one ConfigError naming the file when it is missing,
    a directory, unreadable, too big, binary or not UTF-8."""
    try:
        with open_regular(path, ConfigError, what) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_YAML_BYTES:
                raise ConfigError(
                    f"{path}: {size} bytes; expected {what} of at most {MAX_YAML_BYTES >> 20} MiB"
                )
            head = handle.read(_SNIFF_BYTES)
            if b"\0" in head:
                raise ConfigError(f"{path}: a binary file (NUL bytes); expected {what}")
            data = head + handle.read(MAX_YAML_BYTES + 1 - len(head))
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected {what}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_YAML_BYTES:  # grew while being read (a pipe, a growing file)
        raise ConfigError(f"{path}: larger than {MAX_YAML_BYTES >> 20} MiB; expected {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); expected {what}") from None


def read_yaml_file(path: Path) -> Any:
    """Read and parse a YAML file, with a clear error when it is missing or unreadable."""
    return load_yaml(read_text_file(path), str(path))


_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "a mapping",
    list: "a list",
}


class Reader:
    """Typed, strict access to one mapping of a YAML document.

    Each accessor names the key path on error; ``done()`` rejects keys nobody asked for,
    listing the allowed ones.
    """

    def __init__(self, data: Any, source: str, path: str, line: int | None = None) -> None:
        self.source = source
        self.path = path
        # The line of the key that names this mapping when known (``models:`` rather than
        # the first key inside it), else where the mapping itself starts.
        self.line = line if line is not None else getattr(data, "line", None)
        if not isinstance(data, dict):
            self.fail(f"expected a mapping, got {describe(data)}")
        self.data: dict[str, Any] = data
        self._seen: set[str] = set()

    # -- location helpers -------------------------------------------------------------
    def key_path(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def line_of(self, key: str) -> int | None:
        lines = getattr(self.data, "key_lines", None)
        if lines and key in lines:
            return int(lines[key])
        return self.line

    def where(self, key: str | None = None) -> str:
        line = self.line_of(key) if key is not None else self.line
        return f"{self.source}:{line}" if line else self.source

    def fail(self, message: str, key: str | None = None) -> NoReturn:
        path = self.key_path(key) if key is not None else self.path
        prefix = f"{self.where(key)}: {path}: " if path else f"{self.where(key)}: "
        raise ConfigError(prefix + message)

    # -- accessors --------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = None) -> Any:
        self._seen.add(key)
        return self.data.get(key, default)

    def require(self, key: str) -> Any:
        self._seen.add(key)
        if key not in self.data:
            self.fail(f"missing required key {key!r}")
        return self.data[key]

    def _typed(self, key: str, value: Any, kinds: tuple[type, ...]) -> Any:
        if isinstance(value, bool) and bool not in kinds:
            self.fail(f"expected {_expected(kinds)}, got {bounded_repr(value)}", key)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, kinds):
            self.fail(f"expected {_expected(kinds)}, got {describe(value)}", key)
        return value

    @overload
    def get_str(self, key: str, default: str, *, required: bool = False) -> str: ...
    @overload
    def get_str(self, key: str, default: None = None, *, required: Literal[True]) -> str: ...
    @overload
    def get_str(self, key: str, default: None = None, *, required: bool = False) -> str | None: ...
    def get_str(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        value = self.require(key) if required else self.raw(key, default)
        if value is None:
            return default
        return str(self._typed(key, value, (str,)))

    @overload
    def get_int(self, key: str, default: int, *, minimum: int | None = None) -> int: ...
    @overload
    def get_int(self, key: str, default: None = None, *, minimum: int | None = None) -> int | None: ...
    def get_int(self, key: str, default: int | None = None, *, minimum: int | None = None) -> int | None:
        value = self.raw(key, default)
        if value is None:
            return default
        number = int(self._typed(key, value, (int,)))
        if minimum is not None and number < minimum:
            self.fail(f"must be >= {minimum}, got {number}", key)
        return number

    @overload
    def get_float(self, key: str, default: float, *, non_negative: bool = False) -> float: ...
    @overload
    def get_float(self, key: str, default: None = None, *, non_negative: bool = False) -> float | None: ...
    def get_float(
        self, key: str, default: float | None = None, *, non_negative: bool = False
    ) -> float | None:
        value = self.raw(key, default)
        if value is None:
            return default
        number = float(self._typed(key, value, (float, int)))
        if math.isnan(number):
            self.fail("expected a number, got .nan", key)
        if non_negative and number < 0:
            self.fail(f"must be >= 0, got {number}", key)
        return number

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        return bool(self._typed(key, value, (bool,)))

    @overload
    def get_choice(self, key: str, allowed: tuple[_Choice, ...], default: _Choice) -> _Choice: ...
    @overload
    def get_choice(self, key: str, allowed: tuple[_Choice, ...], default: None = None) -> _Choice | None: ...
    def get_choice(
        self, key: str, allowed: tuple[_Choice, ...], default: _Choice | None = None
    ) -> _Choice | None:
        """One of ``allowed`` (typed as their ``Literal`` when ``allowed`` is, e.g. ``MODES``)."""
        value = self.get_str(key, default)
        if value is None:
            return None
        for choice in allowed:
            if value == choice:
                return choice
        self.fail(f"unknown value {bounded_repr(value)} (allowed: {', '.join(allowed)})", key)

    def get_mapping(self, key: str, *, required: bool = False) -> Reader | None:
        value = self.require(key) if required else self.raw(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            self.fail(f"expected a mapping, got {describe(value)}", key)
        return Reader(value, self.source, self.key_path(key), self.line_of(key))

    def get_list(self, key: str, *, required: bool = False) -> list[Any] | None:
        value = self.require(key) if required else self.raw(key)
        if value is None:
            return None
        if not isinstance(value, list):
            self.fail(f"expected a list, got {describe(value)}", key)
        return value

    def items(self, key: str) -> Iterator[tuple[int, Any, int | None]]:
        """Yield (index, item, line) of a list value."""
        values = self.get_list(key) or []
        lines = getattr(values, "item_lines", None)
        for i, item in enumerate(values):
            yield i, item, (lines[i] if lines else self.line_of(key))

    def child(self, key: str | int, value: Any, line: int | None = None) -> Reader:
        return Reader(value, self.source, self.key_path(key), line)

    def check_keys(self, allowed: Iterable[str]) -> None:
        """Reject the first key not in ``allowed`` before reading any (a typo is named as such,
        not reported as the missing key it was meant to be)."""
        names = set(allowed)
        for key in self.data:
            if key not in names:
                self._unknown(key, names)

    def done(self) -> None:
        unknown = [k for k in self.data if k not in self._seen]
        if unknown:
            self._unknown(unknown[0], self._seen)

    def _unknown(self, key: str, allowed: Iterable[str]) -> NoReturn:
        names = sorted(allowed)
        close = difflib.get_close_matches(key, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        self.fail(f"unknown key {key!r} ({hint}allowed: {', '.join(names)})", key)


def _expected(kinds: tuple[type, ...]) -> str:
    return " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds if k is not int or float not in kinds)


def describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return repr(value).lower()
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {bounded_repr(value)}"
