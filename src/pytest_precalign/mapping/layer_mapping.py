"""msprobe's ``layer_mapping`` YAML (seeds 000 and 001): module renames keyed by class name.

    TopLayer:                 # the top level: candidate child path -> baseline child path
      0.module: module
    GPTModel:                 # inside any candidate module of this class
      embedding.word_embeddings: embed_tokens
      decoder.layers: layers  # dotted paths cross levels

Keys are the candidate's (msprobe's "NPU" side) class names, values map a candidate child
path, relative to a module of that class, to the baseline's ("bench") child path. A name is
translated from the top down: at each module, the longest matching key of its class consumes
path segments; segments no key covers are kept as they are.

An entry that renames nothing in a case is an error (``mapping.usage``) unless its target ends in
``(optional)``, an annotation msprobe drops like its ``(Linear)``: ``0.module: module(optional)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..yaml_reader import Reader, read_yaml_file

TOP = "TopLayer"
OPTIONAL = "(optional)"

# A mapping rule: its section ("renames", "tensors", "layouts", "slots", "layer_mapping") and
# its place there (the index in the list; for a layer_mapping "Class: child.path").
RuleKey = tuple[str, str]


@dataclass(frozen=True)
class LayerMapping:
    # class name -> ((candidate path segments, baseline path), ...), longest paths first
    rules: Mapping[str, tuple[tuple[tuple[str, ...], str], ...]]
    where: str = ""
    # entry key -> "file:line" of the entry; entries that may rename nothing
    lines: Mapping[RuleKey, str] = field(default_factory=dict)
    optional: frozenset[RuleKey] = frozenset()

    def to_baseline(
        self, name: str, class_of: Callable[[str], str | None], applied: set[RuleKey] | None = None
    ) -> str:
        """Translate a candidate module (or parameter) name; ``class_of`` gives the class of
        a candidate module path ("" for the top level). Entries used are added to ``applied``."""
        parts = name.split(".") if name else []
        cand: list[str] = []
        base: list[str] = []
        i = 0
        while i < len(parts):
            cls = TOP if not cand else class_of(".".join(cand))
            step = self._match(cls, parts[i:]) if cls is not None else None
            if step is None:
                cand.append(parts[i])
                base.append(parts[i])
                i += 1
                continue
            consumed, target = step
            if applied is not None and cls is not None:
                applied.add(entry_key(cls, parts[i : i + consumed]))
            cand.extend(parts[i : i + consumed])
            base.extend(target.split(".") if target else [])
            i += consumed
        return ".".join(base)

    def _match(self, cls: str, rest: list[str]) -> tuple[int, str] | None:
        for segments, target in self.rules.get(cls, ()):
            if tuple(rest[: len(segments)]) == segments:
                return len(segments), target
        return None


def entry_key(cls: str, segments: list[str] | tuple[str, ...]) -> RuleKey:
    return ("layer_mapping", f"{cls}: {'.'.join(segments)}")


def parse_layer_mapping(reader: Reader) -> LayerMapping:
    rules: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {}
    lines: dict[RuleKey, str] = {}
    optional: set[RuleKey] = set()
    for cls, value in reader.data.items():
        reader.raw(cls)
        child = reader.child(cls, value, reader.line_of(cls))
        entries = []
        for key, target in child.data.items():
            child.raw(key)
            if not isinstance(key, str) or not key or not isinstance(target, str) or not target:
                child.fail(f"expected 'child.path: baseline.path' strings, got {key!r}: {target!r}", str(key))
            lines[entry_key(str(cls), key.split("."))] = child.where(key)
            if target.replace(" ", "").endswith(OPTIONAL):
                optional.add(entry_key(str(cls), key.split(".")))
            # msprobe ignores an annotation in parentheses after the target ("mlp.0(Linear)").
            entries.append((tuple(key.split(".")), target.split("(")[0].strip()))
        child.done()
        # Longest candidate paths first, so 'module.output_layer' wins over 'module'.
        rules[str(cls)] = tuple(sorted(entries, key=lambda e: -len(e[0])))
    reader.done()
    return LayerMapping(rules=rules, where=reader.where(), lines=lines, optional=frozenset(optional))


def read_layer_mapping(path: Path) -> LayerMapping:
    data = read_yaml_file(path.resolve())
    return parse_layer_mapping(Reader(data, str(path.resolve()), "", 1))
