"""Registers ACME's in-house training loop (``company_loop.py``) as a precalign case trainer,
from outside the package: a case's ``training: company_loop`` then trains its sides with it."""

from __future__ import annotations

from pytest_precalign.steps.trainer_registry import TrainerInfo


def pytest_precalign_trainers():
    # name (the value of ``training:``), how messages name it, the model sources it trains,
    # the module whose ``TRAINER`` drives it (this folder is on sys.path: conftest's rootdir).
    return [TrainerInfo("company_loop", "ACME's in-house loop", ("factory",), "company_loop")]
