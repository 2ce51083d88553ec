"""A shared check for the synthetic-network caches of :mod:`coinf.research.context_data`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def check_planted_fresh_corrupt(cache: Path, key: str, read: Callable[..., list[Any]],
                                count: int) -> None:
    """A value planted in a valid ``cache`` (under ``key``) is what a plain ``read()`` returns;
    ``read(fresh=True)`` measures anew and replaces it; a cache that does not parse is
    measured again. ``count``: how many samples a measurement gives."""
    obj = json.loads(cache.read_text())
    obj[key][0]["ms"] = 123.0
    cache.write_text(json.dumps(obj))
    assert max(s.ms for s in read()) == 123.0
    fresh = read(fresh=True)
    # measured anew: the planted value is gone (a measurement is no particular time)
    assert len(fresh) == count and 123.0 not in [s.ms for s in fresh]
    assert [s.ms for s in read()] == [s.ms for s in fresh]
    cache.write_text("{not json")
    assert len(read()) == count
