"""Every repository path and every ``precalign`` / ``pytest`` command that README.md and the
pages under docs/ name exists: a path in backticks or a Markdown link, a ``precalign``
subcommand, a test file a ``pytest`` command runs."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from pytest_precalign.cli import _parser

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "pytest_precalign"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_TOP = {p.name for p in REPO.iterdir() if p.name not in (".git",)}
_SUBPACKAGES = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
_SPAN = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_PATHLIKE = re.compile(r"^[\w.\-/]+$")


def _subcommands() -> set[str]:
    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


def _path_problem(text: str) -> str | None:
    """Why ``text`` (a span in backticks) names no existing file; None when it does or is no path."""
    text = text.split("::")[0].rstrip(":,.")
    text = re.sub(r":\d+(-\d+)?$", "", text)
    if not _PATHLIKE.match(text) or text.startswith(("/", ".venv", "-")) or ".." in text:
        return None
    head = text.split("/")[0]
    if "/" in text and head in _TOP or text in _TOP or re.match(r"^[A-Z]+\.md$", text):
        where = REPO / text
    elif "/" in text and head in _SUBPACKAGES:
        where = PACKAGE / text
    else:
        return None
    return None if where.exists() else f"{text}: no such file or folder"


def _command_problems(line: str, subcommands: set[str]) -> list[str]:
    words = line.strip().lstrip("$ ").split()
    named = words[1] if len(words) >= 2 and words[0] == "precalign" else "-"
    if not named.startswith("-") and named not in subcommands:
        return [f"{line.strip()!r}: precalign has no subcommand {words[1]!r}"]
    if words and words[0] in ("pytest", "precalign"):
        return [p for w in words[1:] if (p := _path_problem(w.strip("\"'"))) is not None]
    return []


def _problems(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    subcommands = _subcommands()
    found = []
    for span in _SPAN.findall(text):
        found += [p for p in [_path_problem(span)] if p] + _command_problems(span, subcommands)
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            found += _command_problems(line, subcommands)
    for target in _LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        if not (page.parent / target.split("#")[0]).exists():
            found.append(f"link {target}: no such file")
    return found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_path_and_command_named_exists(page: Path) -> None:
    assert _problems(page) == []


def test_the_readme_is_short() -> None:
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


def test_the_check_catches_what_is_missing(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Run `tests/no_such_test.py` and `precalign frobnicate x`, see [this](nowhere.md);\n"
        "```\npytest tests/integration/gone.py\n```\n`src/pytest_precalign/cli.py` exists.\n",
        encoding="utf-8",
    )
    assert _problems(page) == [
        "tests/no_such_test.py: no such file or folder",
        "'precalign frobnicate x': precalign has no subcommand 'frobnicate'",
        "tests/integration/gone.py: no such file or folder",
        "link nowhere.md: no such file",
    ]
