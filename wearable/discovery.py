"""Finding Wi-Fi helpers without a config file (docs/PIPELINE.md, "Discovery").

Helpers announce themselves on DNS-SD (``coinf handheld --announce``: ``_coinf._tcp``, with
python-zeroconf, the ``discovery`` extra). :func:`discover_helpers` browses for a while and
returns those serving this bundle, as :class:`~coinf.wearable.pipeline_config.HelperConfig`
objects a Session takes like a config file's; ``PlacementOptions(helpers=Discover(...))`` does
it when the Session starts::

    from coinf import Discover, PlacementOptions

    PlacementOptions(helpers=Discover(timeout_s=2.0, allow=("phone", "192.168.1.30"),
                                      bundle_identity=Bundle.load(path).identity))

The records are untrusted (:mod:`coinf.ble_protocol.mdns` checks and bounds them, and drops
what does not serve this bundle and protocol). Only the helpers whose announced TLS
fingerprint is pinned in this device's trust store (paired: ``coinf wifi pair``) are used, and
the link to each one checks that the helper holds that certificate (docs/PROTOCOL.md §15); the
others are listed as unpaired. ``allow`` restricts the helpers further to names or addresses.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from coinf.ble_protocol.mdns import Announcement, Found, browse, check_allow, split_paired
from coinf.wearable.pipeline_config import HelperConfig

from coinf.errors import InputError

DEFAULT_TIMEOUT_S = 2.0
MAX_TIMEOUT_S = 60.0
#: a Session browses again at most this often (bounded: a browse costs multicast traffic)
DEFAULT_REBROWSE_S = 30.0
MIN_REBROWSE_S = 5.0
MAX_REBROWSE_S = 3600.0
T = TypeVar("T")


@dataclass(frozen=True)
class Discover:
    """"Find the helpers on the network when the Session starts" (``PlacementOptions.helpers``).

    timeout_s: how long to browse (0 < s <= 60).
    allow: names or addresses (IPv4, ``tcp:IP:PORT``) of the only helpers to use; empty: any
        that serves the bundle.
    interfaces: IPv4 addresses of this machine's interfaces to browse on; empty: all.
    bundle_identity: the bundle the helpers must serve, when the caller of
        :meth:`helper_configs` gives no bundle (``Bundle.load(path).identity``).
    rebrowse_s: a running Session browses again at most this often (in the background, as
        frames start), so helpers that arrive later join its plan; 0: only at start-up.
    """

    timeout_s: float = DEFAULT_TIMEOUT_S
    allow: Sequence[str] = ()
    interfaces: Sequence[str] = ()
    bundle_identity: str | None = None
    rebrowse_s: float = DEFAULT_REBROWSE_S

    def __post_init__(self) -> None:
        t = self.timeout_s
        if not (isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
                and 0 < t <= MAX_TIMEOUT_S):
            raise InputError(f"Discover.timeout_s must be a number of seconds in (0, "
                             f"{MAX_TIMEOUT_S:g}], got {t!r}")
        check_allow(self.allow)
        if isinstance(self.interfaces, str) or not all(isinstance(i, str)
                                                       for i in self.interfaces):
            raise InputError(f"Discover.interfaces must be IPv4 addresses, got "
                             f"{self.interfaces!r}")
        r = self.rebrowse_s
        if not (isinstance(r, int | float) and not isinstance(r, bool) and math.isfinite(r)
                and (r == 0 or MIN_REBROWSE_S <= r <= MAX_REBROWSE_S)):
            raise InputError(f"Discover.rebrowse_s must be 0 (never) or seconds in "
                             f"[{MIN_REBROWSE_S:g}, {MAX_REBROWSE_S:g}], got {r!r}")
        if self.bundle_identity is not None and not (isinstance(self.bundle_identity, str)
                                                     and self.bundle_identity):
            raise InputError(f"Discover.bundle_identity must be a bundle's identity or None, "
                             f"got {self.bundle_identity!r}")

    def helper_configs(self, bundle: Any = None) -> list[HelperConfig]:
        """Browse now: the helpers serving ``bundle`` (a Bundle; default: ``bundle_identity``)."""
        identity = bundle.identity if bundle is not None else self.bundle_identity
        if identity is None:
            raise InputError("Discover: which bundle must the helpers serve? pass the bundle "
                             "(PlacementOptions.helper_configs(bundle)) or "
                             "Discover(bundle_identity=Bundle.load(path).identity)")
        return discover_helpers(self.timeout_s, identity, self.allow, self.interfaces)

    async def abrowse(self, bundle: Any) -> list[HelperConfig]:
        """:meth:`helper_configs` from a running event loop (a Session's re-browse)."""
        found = await browse(self.timeout_s, bundle.identity, check_allow(self.allow),
                             self.interfaces)
        return [to_helper(a) for a in found.announcements]


def to_helper(a: Announcement) -> HelperConfig:
    """A checked record as the helper a Session takes (its speed as the planner's prior)."""
    return HelperConfig(a.name, a.address,
                        speed_flops=a.speed_gflops * 1e9 if a.speed_gflops else None,
                        fingerprint=a.fingerprint)


def discover(timeout_s: float = DEFAULT_TIMEOUT_S, bundle_identity: str | None = None,
             allow: Sequence[str] | None = None, interfaces: Sequence[str] | None = None
             ) -> Found:
    """Browse ``_coinf._tcp`` for ``timeout_s``: the usable (paired) records, the unpaired ones
    and the dropped ones with why (``bundle_identity`` None: any bundle, to list them). Blocks;
    from a running event loop it browses on a thread of its own (``await``
    :func:`coinf.ble_protocol.mdns.browse` instead). MissingDependency without zeroconf."""
    return split_paired(_run(browse(timeout_s, bundle_identity, check_allow(allow or ()),
                                    interfaces)))


def discover_helpers(timeout_s: float, bundle_identity: str,
                     allow: Sequence[str] | None = None,
                     interfaces: Sequence[str] | None = None) -> list[HelperConfig]:
    """The helpers serving ``bundle_identity`` found within ``timeout_s`` seconds, by name;
    ``allow``: only these names or addresses."""
    if not isinstance(bundle_identity, str) or not bundle_identity:
        raise InputError(f"discover_helpers needs the bundle's identity, got "
                         f"{bundle_identity!r}")
    found = discover(timeout_s, bundle_identity, allow, interfaces)
    return [to_helper(a) for a in found.announcements]


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to the end: here, or on a thread when this thread runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def main() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=main, name="coinf-discovery", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


__all__ = ["DEFAULT_TIMEOUT_S", "Discover", "discover", "discover_helpers", "to_helper"]
