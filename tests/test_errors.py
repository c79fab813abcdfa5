"""Every error specledger raises on purpose shares one root, keeps its builtin base, and has its own name."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import specledger
from specledger.errors import SpecledgerError


def _error_classes() -> list[type[BaseException]]:
    """The exception classes each specledger module defines, sub-packages (analysis/, models/, render/) included,
    private ones too (none imports vLLM at load)."""
    found = []
    for info in pkgutil.walk_packages(specledger.__path__, "specledger."):
        module = importlib.import_module(info.name)
        found += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                  if issubclass(cls, BaseException) and cls.__module__ == module.__name__]
    return found


ERRORS = _error_classes()
PUBLIC = [cls for cls in ERRORS if not cls.__name__.startswith("_")]


def test_the_modules_define_errors_at_all():
    assert len(PUBLIC) >= 15  # a broken walk must not pass the tests below vacuously


@pytest.mark.parametrize("cls", PUBLIC, ids=lambda cls: f"{cls.__module__}.{cls.__name__}")
def test_a_public_error_is_a_specledger_error(cls):
    assert issubclass(cls, SpecledgerError)


@pytest.mark.parametrize("cls", [c for c in PUBLIC if c.__bases__ not in ((Exception,), (SpecledgerError,))],
                         ids=lambda cls: cls.__name__)
def test_an_error_keeps_its_builtin_base_so_existing_handlers_still_catch_it(cls):
    assert issubclass(cls, ValueError | RuntimeError)


def test_no_two_errors_share_a_name():
    names = [cls.__name__ for cls in ERRORS]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
