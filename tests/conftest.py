"""Markers shared by the whole suite; the trained zoo models built ahead (tests/zoo_cache.py)."""

from __future__ import annotations

import subprocess

import pytest

_PREBUILD: pytest.StashKey[subprocess.Popen[bytes] | None] = pytest.StashKey()
_TLS: pytest.StashKey[str | None] = pytest.StashKey()


def pytest_configure(config: pytest.Config) -> None:
    from tests.tls_keys import install_session_store

    # every tcp: link of the suite runs TLS with this session's paired identity (tests/tls_keys)
    config.stash[_TLS] = install_session_store()
    config.addinivalue_line(
        "markers", "network: reaches the package index or apt; skipped unless "
        "COINF_TEST_NETWORK=1 (tests/network.py; `make test-arm` runs them)")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the trained zoo models when the rebuild tests will want them and the
    cache (tests/zoo_cache.py) lacks them, so no test waits the whole training time."""
    if any("rebuilt" in getattr(item, "fixturenames", ()) for item in session.items):
        from tests import zoo_cache
        from tests.test_models import TRAINED_NAMES

        session.config.stash[_PREBUILD] = zoo_cache.prebuild_in_background(TRAINED_NAMES[::-1])


def pytest_unconfigure(config: pytest.Config) -> None:
    from tests.tls_keys import remove_session_store

    remove_session_store(config.stash.get(_TLS, None))


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests import zoo_cache

    zoo_cache.stop(session.config.stash.get(_PREBUILD, None))
