"""What differs between the environments two runs were recorded in (msprobe's config_check,
for our manifests): Python and package versions, device and dtype, thread counts, determinism
settings, the environment variables that change numerics, the config digest and the case's
settings, the initial weights' and the inputs' checksums. Read from manifest.json; torch-free."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import TraceError
from ..untrusted import bounded_repr, read_json

# Beside an msprobe rank folder's dump.json, written by our ``Recorder`` only: its trace
# manifest (the step's scalars, the run's settings, initial parameters, the rank's ``parallel``
# block, the environment), which msprobe's files have no place for. msprobe's own tools ignore
# it. (Read here for the environment, and by ``native_io`` / ``msprobe.layout``.)
MSPROBE_MANIFEST = "precalign_manifest.json"

# Versions first, in this order; any other package a manifest names follows, sorted.
VERSION_ORDER = (
    "python",
    "torch",
    "torch_npu",
    "transformers",
    "megatron-core",
    "safetensors",
    # the training frameworks a user's run goes through (recorded where installed)
    "accelerate",
    "trl",
    "peft",
    "lightning",
    "deepspeed",
)

# Top-level manifest keys compared as plain values, with how a line names them.
_PLAIN = (
    ("platform", "platform"),
    ("device", "device"),
    ("dtype", "dtype"),
    ("seed", "seed"),
    ("torch_threads", "torch threads"),
)


# Blocks of a manifest that are read as objects (a list there once crashed compare).
_OBJECTS = ("versions", "determinism", "numerics", "case_settings", "weights")


def check_environment(manifest: Mapping[str, Any], file: str | Path) -> None:
    """Refuse a manifest whose environment blocks have the wrong type: one ``TraceError``
    naming the file, the key and what is allowed (``versions: [1, 2]`` once crashed
    ``compare`` and ``env-diff``)."""
    for key in _OBJECTS:
        value = manifest.get(key)
        if value is not None and not isinstance(value, dict):
            raise TraceError(f"{file}: {key!r} must be an object, got {bounded_repr(value)}")
    for name, version in (manifest.get("versions") or {}).items():
        if not isinstance(version, (str, type(None))):
            raise TraceError(
                f"{file}: versions.{bounded_repr(name)} must be a version string or null, got {bounded_repr(version)}"
            )
    weights = manifest.get("weights") or {}
    if not isinstance(weights.get("sha256"), (str, type(None))) or not isinstance(
        weights.get("params"), (dict, type(None))
    ):
        raise TraceError(
            f"{file}: 'weights' must be {{sha256: string, params: {{name: checksum}}}}, got {bounded_repr(weights)}"
        )


def environment_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Every environment difference between two manifests, one ``what a → b`` line each; empty
    when they were recorded alike. Weights are :func:`weights_diff`'s."""
    out = _versions(a.get("versions") or {}, b.get("versions") or {})
    for key, label in _PLAIN:
        if a.get(key) != b.get(key):
            out.append(f"{label} {_show(a.get(key))} → {_show(b.get(key))}")
    out += _nested("determinism", a.get("determinism") or {}, b.get("determinism") or {})
    out += _nested("numerics", a.get("numerics") or {}, b.get("numerics") or {})
    out += _nested("case settings", a.get("case_settings") or {}, b.get("case_settings") or {})
    for key, label in (("config_digest", "config digest"), ("inputs_digest", "inputs digest")):
        if a.get(key) != b.get(key):
            out.append(f"{label} {_short(a.get(key))} → {_short(b.get(key))}")
    return out


# Each recorded distribution's top-level module (what a model imports when it uses it).
MODULE_OF = {
    "torch": "torch",
    "transformers": "transformers",
    "megatron-core": "megatron",
    "safetensors": "safetensors",
    "accelerate": "accelerate",
    "trl": "trl",
    "peft": "peft",
    "lightning": "lightning",
    "deepspeed": "deepspeed",
    "torch_npu": "torch_npu",
    "torch-npu": "torch_npu",
}


def summary_changes(changes: Sequence[str], loaded: Collection[str]) -> list[str]:
    """The environment changes a one-line summary gives, most telling first: the config and
    inputs digests, then the versions of packages whose module is ``loaded`` (imported in this
    run: the model could have used them), then the rest but versions of packages never imported."""
    digests = [c for c in changes if c.startswith(("config digest", "inputs digest"))]
    used, rest = [], []
    for change in changes:
        if change in digests:
            continue
        module = MODULE_OF.get(change.split(" ", 1)[0])
        if module is None:
            rest.append(change)
        elif module in loaded:
            used.append(change)
    return digests + used + rest


def weights_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Parameters whose initial values differ between two manifests (empty when the same or
    when the first has no weights checksum)."""
    sw, cw = a.get("weights") or {}, b.get("weights") or {}
    if not sw or sw.get("sha256") == cw.get("sha256"):
        return []
    sp, cp = sw.get("params") or {}, cw.get("params") or {}
    changed = [n for n in sp if n in cp and sp[n] != cp[n]]
    missing = [n for n in sp if n not in cp]
    new = [n for n in cp if n not in sp]
    out = []
    if changed:
        out.append(f"{len(changed)} of {len(sp)} parameters differ: {_names(changed)}")
    if missing:
        out.append(f"{len(missing)} baseline parameters absent from the candidate: {_names(missing)}")
    if new:
        out.append(f"{len(new)} candidate parameters absent from the baseline: {_names(new)}")
    return out or ["the weights checksum differs"]


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of a recorded run: a trace or baseline folder, or its manifest.json, or a
    ``Recorder`` root (``step<N>/rank<R>/``, or a step folder): its first step's rank 0 (the
    lowest rank). ``TraceError`` naming the path when there is none (an msprobe dump carries
    no manifest) or when it is malformed."""
    return _read_manifest_file(_manifest_file(Path(path)))


def _manifest_file(root: Path) -> Path:
    file = root / "manifest.json" if root.is_dir() else root
    if root.is_dir() and not file.is_file():
        file = _first_rank_manifest(root) or file
    if not file.is_file():
        if root.is_dir() and _looks_like_msprobe(root):
            raise TraceError(f"{root}: an msprobe dump carries no manifest: its environment was not recorded")
        raise TraceError(f"{root}: no recorded run there (expected a trace folder or its manifest.json)")
    return file


def _read_manifest_file(file: Path) -> dict[str, Any]:
    data = _environment_of(file)
    if data is None:
        raise TraceError(f"{file}: not a pytest-precalign manifest (no 'versions')")
    return data


def _environment_of(file: Path) -> dict[str, Any] | None:
    """The manifest, None when it records no environment (a Recorder's scalars-only step);
    ``TraceError`` when it is unreadable or its environment blocks have the wrong type."""
    data = read_json(file, TraceError, what="a manifest", bad="not a readable manifest")
    if not isinstance(data, dict) or "versions" not in data:
        return None
    check_environment(data, file)
    return data


def _first_rank_manifest(root: Path) -> Path | None:
    """``step<N>/rank<R>/manifest.json`` (or ``rank<R>/manifest.json``, or the manifest our
    ``Recorder`` keeps beside an msprobe dump.json) with the lowest N, R that records the
    environment (a step recorded as scalars only does not), else the first of them."""

    def number(p: Path, prefix: str) -> int:
        tail = p.name.removeprefix(prefix)
        return int(tail) if p.name.startswith(prefix) and tail.isdigit() else -1

    def manifest(rank: Path) -> Path | None:
        return next((f for f in (rank / "manifest.json", rank / MSPROBE_MANIFEST) if f.is_file()), None)

    first: Path | None = None
    steps = sorted((s for s in root.iterdir() if number(s, "step") >= 0), key=lambda s: number(s, "step"))
    for folder in steps or [root]:
        ranks = sorted(
            (r for r in folder.iterdir() if number(r, "rank") >= 0), key=lambda r: number(r, "rank")
        )
        found = next((f for r in ranks if (f := manifest(r)) is not None), None)
        if found is None:
            continue
        first = first or found
        try:
            data = read_json(found, TraceError, what="a manifest")
        except TraceError:
            return found  # read_manifest says what is wrong with it
        if isinstance(data, dict) and "versions" in data:
            return found
    return first


def _looks_like_msprobe(root: Path) -> bool:
    return (root / "dump.json").is_file() or any(root.glob("step*")) or any(root.glob("rank*"))


def _versions(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    others = sorted((set(a) | set(b)) - set(VERSION_ORDER))
    return [
        f"{key} {a.get(key) or 'absent'} → {b.get(key) or 'absent'}"
        for key in (*VERSION_ORDER, *others)
        if a.get(key) != b.get(key)
    ]


def _nested(prefix: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """``prefix.key a → b`` for each differing key, one level of dicts flattened (env vars)."""
    out = []
    for key in sorted(set(a) | set(b), key=str):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) or isinstance(y, dict):
            out += _nested(
                f"{prefix}.{key}", x if isinstance(x, dict) else {}, y if isinstance(y, dict) else {}
            )
        elif x != y:
            out.append(f"{prefix}.{key} {_show(x)} → {_show(y)}")
    return out


def _show(value: Any) -> str:
    return "unset" if value is None else str(value)


def _short(value: Any) -> str:
    return "absent" if value is None else str(value)[:12]


def _names(names: list[str], limit: int = 5) -> str:
    head = ", ".join(names[:limit])
    return head + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def diff_lines(a: Mapping[str, Any], b: Mapping[str, Any], first: str, second: str) -> tuple[list[str], bool]:
    """``precalign env-diff``'s report and whether anything differs: a heading, then the
    environment's and the initial weights' differences, one indented line each; a single line
    when there are none."""
    env, weights = environment_diff(a, b), weights_diff(a, b)
    if not env and not weights:
        versions = a.get("versions") or {}
        shown = ", ".join(f"{k} {versions[k]}" for k in VERSION_ORDER if versions.get(k))
        return [f"environment: the same in {first} and {second} ({shown})"], False
    out = [f"environment: {len(env) + len(weights)} difference(s) from {first} to {second}"]
    out += [f"  {line}" for line in env]
    out += [f"  weights: {line}" for line in weights]
    return out, True


def compare_heading(first: str | Path, second: str | Path) -> list[str]:
    """The environment lines that head ``precalign compare``: the diff of the two sides'
    manifests, or why there is none (an msprobe dump, a rank folder); ``TraceError`` when
    a manifest is there but malformed."""
    try:
        files = _manifest_file(Path(first)), _manifest_file(Path(second))
    except TraceError as exc:
        return [f"environment: not compared ({str(exc).partition(': ')[2] or exc})"]
    a, b = (_environment_of(file) for file in files)  # a malformed manifest is refused
    if a is None or b is None:
        file = files[0] if a is None else files[1]
        return [f"environment: not compared ({file}: not a pytest-precalign manifest (no 'versions'))"]
    joined = [
        _joined(Path(side), data, file) for side, data, file in ((first, a, files[0]), (second, b, files[1]))
    ]
    return diff_lines(a, b, str(first), str(second))[0] + [line for line in joined if line]


def _joined(root: Path, manifest: Mapping[str, Any], file: Path) -> str | None:
    """The line saying a side is a run joined from its parts (``run_parts``), or None."""
    from .run_parts import read_pointer

    pointer = read_pointer(manifest, str(file))
    if pointer is None or file.parent.parent.parent != root:  # a step folder is compared alone
        return None
    return (
        f"{root}: one run joined from its parts: steps up to {pointer.step} from {pointer.place(root)} "
        f"(the part before it), the rest from {root}"
    )
