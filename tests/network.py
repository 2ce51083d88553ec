"""Tests that reach the network (the package index, apt) run only on request.

``make test`` must pass with the network cut off, so such a test is marked ``network`` and
skipped unless ``COINF_TEST_NETWORK=1`` is set; ``make test-arm`` (the CI step that needs the
index anyway, for the aarch64 wheels) sets it and runs ``pytest -m network``. With the variable
set, an unreachable index fails the test instead of skipping it: CI asked for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import pytest

ENV = "COINF_TEST_NETWORK"
F = TypeVar("F", bound=Callable[..., object])


def allowed() -> bool:
    """Whether tests may reach the package index and apt (``COINF_TEST_NETWORK=1``)."""
    return os.environ.get(ENV) == "1"


def reason(what: str) -> str:
    return f"{what} needs the network: set {ENV}=1 to run it (make test-arm does)"


def needs_network(what: str) -> Callable[[F], F]:
    """Mark a test ``network`` and skip it unless ``COINF_TEST_NETWORK=1``."""

    def mark(fn: F) -> F:
        marked: F = pytest.mark.network(pytest.mark.skipif(not allowed(), reason=reason(what))(fn))
        return marked

    return mark
