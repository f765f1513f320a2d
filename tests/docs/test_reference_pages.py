"""The reference pages say what the parsers say: docs/reference/cli.md holds every
``precalign`` subcommand's real ``--help``, docs/reference/pytest_options.md every option and
ini key the plugin's ``pytest_addoption`` declares (both written by docs/make_reference.py)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_precalign.cli import _parser
from pytest_precalign.plugin import pytest_addoption

REPO = Path(__file__).resolve().parents[2]


def _make_reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_reference", REPO / "docs" / "make_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


make_reference = _make_reference()


def _cli_flags() -> set[str]:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {
        f"`precalign {name}`" if flag is None else flag
        for name, command in sub.choices.items()
        for action in command._actions
        for flag in [None, *action.option_strings]
    }


@pytest.mark.parametrize("page", ["cli.md", "pytest_options.md"])
def test_the_page_is_what_the_parser_says(page: str) -> None:
    path = REPO / "docs" / "reference" / page
    expected = make_reference.expected_pages()[path]
    assert path.read_text(encoding="utf-8") == expected, "run: python docs/make_reference.py"


def test_every_subcommand_and_flag_of_the_cli_is_on_its_page() -> None:
    page = (REPO / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert "--trust-checkpoint" in _cli_flags()
    assert sorted(flag for flag in _cli_flags() if flag not in page) == []


def test_every_option_and_ini_key_of_the_plugin_is_on_its_page() -> None:
    page = (REPO / "docs" / "reference" / "pytest_options.md").read_text(encoding="utf-8")
    declared = make_reference.RecordingParser()
    pytest_addoption(declared)
    names = [name for names, _ in declared.options for name in names] + [ini for ini, *_ in declared.inis]
    assert "--align-trust-checkpoint" in names and "align_config" in names
    assert [f"`{name}" for name in names if f"`{name}" not in page] == []


def test_an_option_added_without_its_page_is_caught() -> None:
    def with_one_more(parser: Any) -> None:
        pytest_addoption(parser)
        parser.addoption("--align-new-thing", dest="align_new_thing", metavar="N", help="a new option")

    text = make_reference.options_markdown(with_one_more)
    assert "| `--align-new-thing N` | a new option |" in text
    assert text != make_reference.options_markdown()


def test_a_page_without_its_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="page.md: needs one"):
        make_reference.with_generated("# a page\n", "text", "page.md")
    page = f"head\n{make_reference.START}\nold\n{make_reference.END}\ntail\n"
    assert make_reference.with_generated(page, "new\n") == (
        f"head\n{make_reference.START}\n\nnew\n\n{make_reference.END}\ntail\n"
    )
