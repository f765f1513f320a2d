"""Import user code named in a config (``module:function``) with one clear error, and put
exceptions on one line: shared by the sources, the inputs factory and the tensor-parallel ranks."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import PrecalignError, SourceError


@contextmanager
def importable_from(base_dir: Path) -> Iterator[None]:
    """Let 'module:function' paths resolve from the config's folder as well as sys.path."""
    entry = str(base_dir)
    added = entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        if added and entry in sys.path:
            sys.path.remove(entry)


def import_object(path: str, base_dir: Path, what: str) -> Any:
    """Import ``module:attr`` (or ``module.attr``), with one clear error on failure."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise SourceError(f"{what}: expected 'module:function', got {path!r}")
    with importable_from(base_dir):
        _forget_shadowed(module_name, base_dir)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                raise SourceError(
                    f"{what}: cannot import module {module_name!r} from {path!r} "
                    f"(looked in {base_dir} and sys.path)"
                ) from None
            raise SourceError(f"{what}: importing {module_name!r} failed: {one_line(exc)}") from None
        except PrecalignError:
            raise
        except Exception as exc:
            raise SourceError(
                f"{what}: importing {module_name!r} raised {type(exc).__name__}: {one_line(exc)}"
            ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SourceError(f"{what}: module {module_name!r} has no attribute {attr!r}") from None


def _forget_shadowed(module_name: str, base_dir: Path) -> None:
    """A module of the config's folder beats a same-named one imported earlier from elsewhere
    (two suites' ``faults.py`` in one session): the other is dropped from ``sys.modules``."""
    top = module_name.split(".")[0]
    existing = sys.modules.get(top)
    local = {p.resolve() for p in (base_dir / f"{top}.py", base_dir / top / "__init__.py") if p.is_file()}
    where = getattr(existing, "__file__", None)
    if existing is None or not local or (where is not None and Path(where).resolve() in local):
        return
    for name in [n for n in sys.modules if n == top or n.startswith(f"{top}.")]:
        del sys.modules[name]


def one_line(exc: BaseException) -> str:
    """An exception's text on one line (user code may raise multi-line messages)."""
    return " ".join(str(exc).split())
