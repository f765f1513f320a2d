"""Every module is named in its package's face: the docstring of the package's
``__init__.py`` names each module file (and each subpackage) of the package in double
backticks, with what it holds, so a reader finds a module from its package's docstring."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "pytest_precalign"
PACKAGES = sorted(init.parent for init in PACKAGE.rglob("__init__.py"))


def unnamed(package: Path) -> list[str]:
    """The modules and subpackages of ``package`` its ``__init__.py`` docstring does not name."""
    face = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    named = {token.removesuffix(".py") for token in re.findall(r"``([\w.]+)``", face)}
    members = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
    members += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    return sorted(m for m in members if m not in named)


@pytest.mark.parametrize("package", PACKAGES, ids=[str(p.relative_to(PACKAGE.parent)) for p in PACKAGES])
def test_every_module_is_named_in_its_package_face(package: Path) -> None:
    assert unnamed(package) == []


def test_a_module_left_out_of_the_face_is_caught(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text('"""A face: ``named`` (what it holds), ``parts.py``."""\n')
    for name in ("named", "parts", "forgotten"):
        (tmp_path / f"{name}.py").write_text("")
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "__init__.py").write_text("")
    assert unnamed(tmp_path) == ["forgotten", "inner"]
