"""The sides' values a fact states, ``a`` the baseline's and ``b`` the candidate's: on their own
(``Values``), at an optimizer step (``StepValues``) or of a named scalar, parameter, setting or
argument (``NamedValues``). The facts of ``contract_evidence``, ``scalar_evidence`` and
``run_evidence`` that state such a pair derive from these and add what else they state. No torch
import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Values(Generic[T]):
    a: T  # the baseline's
    b: T  # the candidate's


@dataclass(frozen=True)
class StepValues(Generic[T]):
    step: int
    a: T
    b: T


@dataclass(frozen=True)
class NamedValues(Generic[T]):
    name: str
    a: T
    b: T
