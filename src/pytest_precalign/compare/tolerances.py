"""Tolerance tables: ordered rules (first match wins) over per-dtype defaults like torch.testing's.

A rule selects records by canonical-name glob, kind, phase, dtype and step, and gives
``atol``/``rtol`` (an allclose check, always together) and/or bounds on named metrics.
No torch import here: the table is data, the metrics live in ``metrics.py``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..untrusted import bounded_repr
from ..vocabulary import KINDS, PHASES
from ..yaml_reader import Reader, describe, read_yaml_file

# Metric bounds a rule may set: name -> True when the value must stay <= the bound,
# False when it must stay >= the bound (similarities and "fraction within" ratios).
BOUND_METRICS: dict[str, bool] = {
    "max_abs": True,
    "max_rel": True,
    "mean_abs": True,
    "euclidean": True,
    "cosine": False,
    "one_thousandth": False,
    "five_thousandth": False,
}

# Record dtypes are torch dtype names without "torch." (recorder.dtype_name). A rule's dtype
# must look like one, so that an alias ("fp32", "half", "torch.float32") cannot silently
# match nothing.
DTYPE_ALIASES: dict[str, str] = {
    "fp32": "float32",
    "float": "float32",
    "single": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp64": "float64",
    "double": "float64",
    "long": "int64",
    "int": "int64",
}
_DTYPE_NAME = re.compile(r"^(bool|(q?u?int|b?float|complex|bits)\d[a-z0-9_]*)$")

# torch.testing.assert_close defaults, by dtype name: (rtol, atol).
DTYPE_DEFAULTS: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
    "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
}


@dataclass(frozen=True)
class ToleranceRule:
    """One row of a tolerance table."""

    match: str = "*"
    kind: tuple[str, ...] = ()
    phase: tuple[str, ...] = ()
    dtype: tuple[str, ...] = ()
    step: tuple[int, ...] = ()
    atol: float | None = None
    rtol: float | None = None
    bounds: tuple[tuple[str, float], ...] = ()
    why: str = ""
    where: str = ""
    # NaN/Inf at the same place on both sides passes, with a stated warning (torch.testing's
    # equal_nan); off by default: a run that is NaN on both sides is not green.
    equal_nan: bool = False

    def applies(self, name: str, kind: str, phase: str, dtype: str, step: int) -> bool:
        return (
            fnmatch.fnmatchcase(name, self.match)
            and (not self.kind or kind in self.kind)
            and (not self.phase or phase in self.phase)
            and (not self.dtype or dtype in self.dtype)
            and (not self.step or step in self.step)
        )

    def describe(self) -> str:
        parts = [f"match={self.match!r}"]
        for label, values in (("kind", self.kind), ("phase", self.phase), ("dtype", self.dtype)):
            if values:
                parts.append(f"{label}={'|'.join(values)}")
        if self.step:
            parts.append(f"step={'|'.join(map(str, self.step))}")
        text = "rule " + " ".join(parts)
        if self.where:
            text += f" ({self.where})"
        if self.why:
            text += f": {self.why}"
        return text


@dataclass(frozen=True)
class Tolerance:
    """The bounds that apply to one record pair, and where they came from."""

    atol: float
    rtol: float
    bounds: tuple[tuple[str, float], ...]
    rule: ToleranceRule | None
    source: str

    @property
    def why(self) -> str:
        return self.rule.why if self.rule is not None else self.source

    @property
    def equal_nan(self) -> bool:
        """The rule accepts the same NaN/Inf on both sides (``equal_nan: true``)."""
        return self.rule is not None and self.rule.equal_nan


@dataclass(frozen=True)
class ToleranceTable:
    name: str
    rules: tuple[ToleranceRule, ...] = field(default_factory=tuple)

    def lookup(self, name: str, kind: str, phase: str, dtype: str, step: int) -> Tolerance:
        """First matching rule wins; atol/rtol it leaves unset come from the dtype default."""
        rtol_default, atol_default = DTYPE_DEFAULTS.get(dtype, (0.0, 0.0))
        for rule in self.rules:
            if rule.applies(name, kind, phase, dtype, step):
                atol = rule.atol if rule.atol is not None else atol_default
                rtol = rule.rtol if rule.rtol is not None else rtol_default
                if rule.atol is None and rule.bounds:
                    # A rule with only metric bounds does not also impose the allclose check.
                    atol, rtol = float("inf"), float("inf")
                return Tolerance(atol, rtol, rule.bounds, rule, f"table {self.name!r}")
        source = f"torch.testing default for {dtype}" if dtype in DTYPE_DEFAULTS else "exact"
        return Tolerance(atol_default, rtol_default, (), None, source)


def default_table() -> ToleranceTable:
    return ToleranceTable(name="default")


def _as_tuple(reader: Reader, key: str, allowed: tuple[str, ...] | None) -> tuple[str, ...]:
    value = reader.raw(key)
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    out = []
    for item in values:
        if not isinstance(item, str):
            reader.fail(f"expected a string or a list of strings, got {bounded_repr(item)}", key)
        if allowed is not None and item not in allowed:
            reader.fail(f"unknown value {bounded_repr(item)} (allowed: {', '.join(allowed)})", key)
        out.append(item)
    return tuple(out)


RULE_KEYS = ("match", "kind", "phase", "dtype", "step", "atol", "rtol", *BOUND_METRICS, "equal_nan", "why")


def parse_rule(reader: Reader) -> ToleranceRule:
    reader.check_keys(RULE_KEYS)
    match = reader.get_str("match", "*")
    kind = _as_tuple(reader, "kind", KINDS)
    phase = _as_tuple(reader, "phase", PHASES)
    dtype = _as_tuple(reader, "dtype", None)
    for name in dtype:
        if not _DTYPE_NAME.match(name):
            base = name.removeprefix("torch.")
            guess = DTYPE_ALIASES.get(base, base if _DTYPE_NAME.match(base) else None)
            hint = f"; did you mean {guess!r}?" if guess else ""
            reader.fail(
                f"unknown dtype {bounded_repr(name)} (a torch dtype name such as "
                f"{', '.join(DTYPE_DEFAULTS)}, int64, bool{hint})",
                "dtype",
            )
    raw_step = reader.raw("step")
    steps: tuple[int, ...] = ()
    if raw_step is not None:
        values = raw_step if isinstance(raw_step, list) else [raw_step]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            reader.fail(f"expected a step number or a list of them, got {bounded_repr(raw_step)}", "step")
        steps = tuple(values)
    atol = reader.get_float("atol", non_negative=True)
    rtol = reader.get_float("rtol", non_negative=True)
    if (atol is None) != (rtol is None):
        missing = "rtol" if rtol is None else "atol"
        reader.fail(f"atol and rtol must be given together (missing {missing!r})")
    bounds = []
    for metric, upper in BOUND_METRICS.items():
        value = reader.get_float(metric, non_negative=True)
        if value is None:
            continue
        if not upper and value > 1:
            reader.fail(f"must be between 0 and 1, got {value}", metric)
        bounds.append((metric, value))
    why = reader.get_str("why", "")
    equal_nan = reader.get_bool("equal_nan", False)
    if atol is None and not bounds and not equal_nan:
        allowed = ", ".join(["atol+rtol", *BOUND_METRICS, "equal_nan"])
        reader.fail(f"a rule must set at least one bound ({allowed})")
    reader.done()
    return ToleranceRule(
        match=match,
        kind=kind,
        phase=phase,
        dtype=dtype,
        step=steps,
        atol=atol,
        rtol=rtol,
        bounds=tuple(bounds),
        why=why,
        where=reader.where(),
        equal_nan=equal_nan,
    )


def parse_table(
    name: str, value: Any, source: str, path: str, base_dir: Path, *, line: int | None = None
) -> ToleranceTable:
    """A table is a list of rules, ``{rules: [...]}``, or the path of a YAML file with either.

    ``line`` is where the table is named, for errors about a value that is none of these.
    """
    line = line if line is not None else getattr(value, "line", None)
    if isinstance(value, str):
        file = (base_dir / value).resolve()
        value, source, path, line = read_yaml_file(file), str(file), "", 1
    if isinstance(value, dict):
        reader = Reader(value, source, path, line)
        reader.check_keys(("rules",))
        value = reader.get_list("rules", required=True)
        reader.done()
        path = reader.key_path("rules")
    if not isinstance(value, list):
        Reader({}, source, path, line).fail(
            f"expected a list of rules, {{rules: [...]}}, or the path of a YAML file, got {describe(value)}"
        )
    lines = getattr(value, "item_lines", None)
    rules = []
    for i, item in enumerate(value):
        item_line = lines[i] if lines else line
        rules.append(parse_rule(Reader(item, source, f"{path}[{i}]", item_line)))
    return ToleranceTable(name=name, rules=tuple(rules))


def load_table(
    value: Any,
    where: str,
    base_dir: Path = Path(),
    named: Mapping[str, ToleranceTable] | None = None,
    config_name: str = "",
) -> ToleranceTable:
    """THE loader of a tolerance table given as an argument (``--tolerances``, the marker's
    ``tolerances=``, ``Recorder(tolerances=)``): None (the defaults), a ``ToleranceTable``, a
    YAML file (relative to ``base_dir``; named by its stem), a list of rules, or -- with
    ``named``, the tables of a config called ``config_name`` -- a table's name.
    ``ConfigError`` starting with ``where`` otherwise."""
    if value is None:
        return default_table()
    if isinstance(value, ToleranceTable):
        return value
    if isinstance(value, Path) or (isinstance(value, str) and value.endswith((".yaml", ".yml"))):
        file = (base_dir / value).resolve()
        if not file.is_file():
            raise ConfigError(f"{where}: file not found: {file}")
        return parse_table(file.stem, read_yaml_file(file), str(file), "", file.parent)
    if isinstance(value, str):
        if named is None:
            raise ConfigError(
                f"{where}: a table name needs --align-config (the config whose tolerances: defines it); "
                "or give a tolerance YAML file or a list of rules"
            )
        if value not in named:
            raise ConfigError(
                f"{where}: unknown table (known in {config_name}: {', '.join(named) or 'none'}; "
                "or a tolerance YAML file or a list of rules)"
            )
        return named[value]
    if isinstance(value, list):
        rules = tuple(parse_rule(Reader(r, where, f"tolerances[{i}]")) for i, r in enumerate(value))
        return ToleranceTable(name="rules", rules=rules)
    raise ConfigError(
        f"{where}: expected a table name, a tolerance YAML file or a list of rules, got {describe(value)}"
    )
