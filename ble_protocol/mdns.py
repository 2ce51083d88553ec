"""Wi-Fi helpers on DNS-SD (docs/PIPELINE.md, "Discovery"): the ``_coinf._tcp`` record a helper
announces, and a reading of it that trusts nothing.

A helper (``coinf handheld --announce``, :mod:`coinf.handheld.announce`) registers
``INSTANCE._coinf._tcp.local.`` with its TCP port, its IPv4 addresses and a TXT record::

    name=h1  bundle=<bundle identity>  proto=<PROTOCOL_VERSION>  [gflops=12.5]  [fp=<64 hex>]

``fp`` is the SHA-256 of the helper's TLS certificate (docs/PROTOCOL.md §15): a record is only
used when that fingerprint is pinned in this device's trust store (paired); the others are
listed as unpaired (:func:`split_paired`) and never connected to.

Everything a record carries is untrusted input. :func:`parse_announcement` decodes the raw TXT
bytes itself, bounds their size, checks the name (1-32 of ``[A-Za-z0-9_-]``, not a reserved
device name), the protocol version, the bundle identity and the addresses, and raises
:class:`~coinf.errors.ProtocolError` saying why a record is dropped. A record authenticates
nothing by itself: any device can announce any name. What it claims is checked on the link:
its ``fp`` must be pinned here, and the TLS handshake proves the helper holds that key; the
HELLO checks the bundle again.

:class:`Browser` follows the records on one zeroconf instance (continuously: a helper's peers);
:func:`browse` collects them for a while (the wearable before a Session). Both need
``zeroconf`` (python-zeroconf, LGPL-2.1-or-later, the ``discovery`` extra), imported on first
use. IPv4 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coinf.ble_protocol.messages import PROTOCOL_VERSION
from coinf.ble_protocol.request import valid_name

from coinf.deps import require
from coinf.errors import ErrorCode, InputError, ProtocolError

log = logging.getLogger(__name__)

SERVICE_TYPE = "_coinf._tcp.local."
EXTRA = "discovery"
#: names a plan gives devices of its own: never a helper's
RESERVED_NAMES = ("wearable", "handheld")
MAX_TXT_BYTES = 512  # the whole TXT record (RFC 6763 §6.2 asks for < 200 bytes; ours is ~70)
MAX_VALUE_BYTES = 64  # one value of a key coinf reads
MAX_ADDRESSES = 16  # addresses of one record looked at
MAX_SERVICES = 64  # records followed at once; more are dropped
MAX_GFLOPS = 1e6
RESOLVE_TIMEOUT_MS = 3000


@dataclass(frozen=True)
class Announcement:
    """One helper as its record describes it (checked, still unauthenticated)."""

    instance: str
    name: str
    address: str  # tcp:IP:PORT
    bundle: str
    protocol: int
    speed_gflops: float | None = None
    #: the announced TLS certificate fingerprint (``sha256:...``), None if not announced
    fingerprint: str | None = None

    @property
    def ip(self) -> str:
        return self.address.split(":")[1]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "address": self.address}
        if self.speed_gflops is not None:
            out["speed_gflops"] = self.speed_gflops
        if self.fingerprint is not None:
            out["fingerprint"] = self.fingerprint
        return out


@dataclass
class Found:
    """What a browse found: the usable records (by name), the dropped ones with why, and (after
    :func:`split_paired`) the ones whose certificate is not pinned here."""

    announcements: list[Announcement] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (instance, reason)
    unpaired: list[Announcement] = field(default_factory=list)


def split_paired(found: Found, store: Any = None) -> Found:
    """``found`` with the records whose fingerprint is not pinned in ``store`` (default: this
    device's trust store) moved to ``unpaired``: they are never used."""
    from coinf.ble_protocol.tls_store import default_store

    store = store if store is not None else default_store()
    paired = [a for a in found.announcements
              if a.fingerprint is not None and store.trusts(a.fingerprint)]
    rest = [a for a in found.announcements if a not in paired]
    return Found(paired, list(found.dropped), [*found.unpaired, *rest])


def txt_record(name: str, bundle_identity: str, speed_gflops: float | None = None,
               fingerprint: str | None = None) -> dict[str, str]:
    """The TXT record a helper announces (the checks :func:`parse_announcement` makes)."""
    if not valid_name(name) or name in RESERVED_NAMES:
        raise InputError(f"a helper's name must be 1-32 of [A-Za-z0-9_-] and not "
                         f"{' or '.join(RESERVED_NAMES)}, got {name!r}")
    if not 0 < len(bundle_identity.encode()) <= MAX_VALUE_BYTES:
        raise InputError(f"bundle identity {bundle_identity!r} is not 1-{MAX_VALUE_BYTES} bytes")
    txt = {"name": name, "bundle": bundle_identity, "proto": str(PROTOCOL_VERSION)}
    if speed_gflops is not None:
        if not (math.isfinite(speed_gflops) and 0 < speed_gflops <= MAX_GFLOPS):
            raise InputError(f"speed must be in (0, {MAX_GFLOPS:g}] GFLOP/s, got {speed_gflops}")
        txt["gflops"] = f"{speed_gflops:g}"
    if fingerprint is not None:
        from coinf.ble_protocol.tls_store import PREFIX, parse_fingerprint

        txt["fp"] = parse_fingerprint(fingerprint)[len(PREFIX):]
    return txt


def _drop(code: ErrorCode, text: str) -> ProtocolError:
    return ProtocolError(code, text)


def txt_pairs(text: bytes) -> dict[str, bytes]:
    """The raw TXT record (length-prefixed strings) as ``key -> value``: keys lower-cased
    (RFC 6763 §6.4), a key without ``=`` is a flag (empty value). A record over
    :data:`MAX_TXT_BYTES`, a string running past the end, a non-ASCII key or a key coinf reads
    given twice is refused."""
    if len(text) > MAX_TXT_BYTES:
        raise _drop(ErrorCode.TOO_LARGE, f"TXT record of {len(text)} bytes (at most "
                                         f"{MAX_TXT_BYTES})")
    pairs: dict[str, bytes] = {}
    i = 0
    while i < len(text):
        n = text[i]
        item = text[i + 1:i + 1 + n]
        if len(item) != n:
            raise _drop(ErrorCode.TRUNCATED, "TXT string runs past the record's end")
        i += 1 + n
        if not item:
            continue
        raw_key, _, value = item.partition(b"=")
        try:
            key = raw_key.decode("ascii").lower()
        except UnicodeDecodeError:
            raise _drop(ErrorCode.MALFORMED, "TXT key is not ASCII") from None
        if key in pairs and key in _KEYS:
            raise _drop(ErrorCode.MALFORMED, f"TXT key {key!r} given twice")
        pairs.setdefault(key, value)
    return pairs


_KEYS = ("name", "bundle", "proto", "gflops", "fp")


def _ascii(pairs: Mapping[str, bytes], key: str, *, required: bool = True) -> str | None:
    value = pairs.get(key)
    if value is None:
        if required:
            raise _drop(ErrorCode.MALFORMED, f"TXT has no {key!r}")
        return None
    if len(value) > MAX_VALUE_BYTES:
        raise _drop(ErrorCode.TOO_LARGE, f"TXT {key!r} of {len(value)} bytes (at most "
                                         f"{MAX_VALUE_BYTES})")
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        raise _drop(ErrorCode.MALFORMED, f"TXT {key!r} is not ASCII") from None
    if not text.isprintable():
        raise _drop(ErrorCode.MALFORMED, f"TXT {key!r} has control characters")
    return text


def pick_address(addresses: Sequence[str]) -> str:
    """The IPv4 address to reach a record at: a routable one first, then link-local, then
    loopback (the helper is on this machine); ties by value. Unusable addresses (unspecified,
    multicast, broadcast, reserved, not IPv4) are skipped; none left is a ProtocolError."""
    usable = []
    for text in list(addresses)[:MAX_ADDRESSES]:
        try:
            ip = ipaddress.IPv4Address(text)
        except ValueError:
            continue
        if ip.is_unspecified or ip.is_multicast or ip.is_reserved or \
                ip == ipaddress.IPv4Address("255.255.255.255"):
            continue
        rank = 2 if ip.is_loopback else 1 if ip.is_link_local else 0
        usable.append((rank, int(ip), str(ip)))
    if not usable:
        raise _drop(ErrorCode.MALFORMED, "no usable IPv4 address")
    return min(usable)[2]


def parse_announcement(instance: str, text: bytes, addresses: Sequence[str], port: Any,
                       bundle_identity: str | None = None) -> Announcement:
    """A resolved record, checked (module docstring); ``bundle_identity``: the bundle it must
    serve (None: any, for listing only). Raises ProtocolError saying why it is dropped."""
    pairs = txt_pairs(text)
    name = _ascii(pairs, "name")
    assert name is not None
    if not valid_name(name) or name in RESERVED_NAMES:
        raise _drop(ErrorCode.MALFORMED, f"name {name!r} is not 1-32 of [A-Za-z0-9_-] (nor "
                                         f"{' or '.join(RESERVED_NAMES)})")
    proto = _ascii(pairs, "proto")
    if proto != str(PROTOCOL_VERSION):
        raise _drop(ErrorCode.BAD_VERSION, f"{name} speaks protocol {proto}, this side "
                                           f"{PROTOCOL_VERSION}")
    bundle = _ascii(pairs, "bundle")
    assert bundle is not None
    if bundle_identity is not None and bundle != bundle_identity:
        raise _drop(ErrorCode.BUNDLE_MISMATCH, f"{name} serves bundle {bundle}, not "
                                               f"{bundle_identity}")
    gflops_text = _ascii(pairs, "gflops", required=False)
    gflops = None
    if gflops_text is not None:
        try:
            gflops = float(gflops_text)
        except ValueError:
            gflops = math.nan
        if not (math.isfinite(gflops) and 0 < gflops <= MAX_GFLOPS):
            raise _drop(ErrorCode.MALFORMED, f"{name}: gflops {gflops_text!r} is not a speed "
                                             f"in (0, {MAX_GFLOPS:g}]")
    fp_text = _ascii(pairs, "fp", required=False)
    fp = None
    if fp_text is not None:
        from coinf.ble_protocol.tls_store import parse_fingerprint

        try:
            fp = parse_fingerprint(fp_text)
        except InputError:
            raise _drop(ErrorCode.MALFORMED, f"{name}: fp is not 64 hex digits") from None
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise _drop(ErrorCode.MALFORMED, f"{name}: port {port!r} is not 1..65535")
    address = f"tcp:{pick_address(addresses)}:{port}"
    return Announcement(instance, name, address, bundle, PROTOCOL_VERSION, gflops, fp)


def check_allow(entries: Sequence[str]) -> tuple[str, ...]:
    """An allow-list as given (names, IPv4 addresses or ``tcp:IP:PORT``), each checked; an
    entry that is none of these is an :class:`InputError`."""
    if isinstance(entries, str):
        raise InputError(f"an allow-list is a sequence of names or addresses, got {entries!r}")
    for entry in entries:
        if not isinstance(entry, str) or not (valid_name(entry) or _is_address(entry)):
            raise InputError(f"allow-list entry {entry!r} is not a helper name (1-32 of "
                             f"[A-Za-z0-9_-]), an IPv4 address or tcp:IP:PORT")
    return tuple(entries)


def _is_address(entry: str) -> bool:
    scheme, _, rest = entry.partition(":")
    ip, port = (rest.rpartition(":")[0], rest.rpartition(":")[2]) if scheme == "tcp" \
        else (entry, "1")
    try:
        ipaddress.IPv4Address(ip)
    except ValueError:
        return False
    return port.isdigit() and 0 < int(port) < 65536


def allowed(a: Announcement, allow: Sequence[str]) -> bool:
    """Whether the allow-list (empty: everything) names this record's name, IP or address."""
    return not allow or a.name in allow or a.ip in allow or a.address in allow


def settle(records: Sequence[Announcement], allow: Sequence[str] = ()
           ) -> tuple[list[Announcement], list[tuple[str, str]]]:
    """The usable records, sorted by name, and the dropped ones: not on the allow-list, or a
    name claimed by records at different addresses (all of them: which is the real one cannot
    be told). One helper announced twice at one address counts once."""
    kept: list[Announcement] = []
    dropped: list[tuple[str, str]] = []
    by_name: dict[str, list[Announcement]] = {}
    for a in records:
        if not allowed(a, allow):
            dropped.append((a.instance, f"{a.name} at {a.address} is not on the allow-list"))
        else:
            by_name.setdefault(a.name, []).append(a)
    for name in sorted(by_name):
        group = sorted(by_name[name], key=lambda a: (a.address, a.instance))
        where = sorted({a.address for a in group})
        if len(where) > 1:
            dropped.extend((a.instance, f"name {name} is claimed at {len(where)} addresses "
                                        f"({', '.join(where)})") for a in group)
        else:
            kept.append(group[0])
    return kept, sorted(dropped)


def printable(text: str, limit: int = 80) -> str:
    """An untrusted string made safe to print: control characters as ``?``, at most ``limit``
    characters."""
    clean = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return clean + ("..." if len(text) > limit else "")


def zeroconf_module(what: str) -> Any:
    """``zeroconf.asyncio`` (python-zeroconf), or MissingDependency naming the extra."""
    require("zeroconf", EXTRA, what)
    import zeroconf.asyncio

    return zeroconf.asyncio


def open_zeroconf(interfaces: Sequence[str] | None = None, what: str = "discovery") -> Any:
    """An ``AsyncZeroconf`` on these IPv4 interface addresses (None or empty: every interface);
    call it from a running event loop. A bad address is an InputError."""
    zc = zeroconf_module(what)
    import zeroconf

    for ip in interfaces or ():
        try:
            ipaddress.IPv4Address(ip)
        except ValueError:
            raise InputError(f"an mDNS interface is an IPv4 address of this machine, got "
                             f"{ip!r}") from None
    try:
        return zc.AsyncZeroconf(interfaces=list(interfaces) if interfaces
                                else zeroconf.InterfaceChoice.All,
                                ip_version=zeroconf.IPVersion.V4Only)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot start mDNS on {', '.join(interfaces or ['every interface'])}"
                         f": {exc}") from None


class Browser:
    """Follows the ``_coinf._tcp`` records on an ``AsyncZeroconf``: each added or updated one is
    resolved and checked (:func:`parse_announcement` against ``bundle_identity``), a removed
    one forgotten. :meth:`found` says what is usable now (:func:`settle` with ``allow``);
    ``on_change(found)`` is called after every change. At most :data:`MAX_SERVICES` records are
    followed."""

    def __init__(self, aiozc: Any, bundle_identity: str | None, allow: Sequence[str] = (),
                 on_change: Callable[[Found], None] | None = None,
                 resolve_timeout_ms: int = RESOLVE_TIMEOUT_MS) -> None:
        self.aiozc = aiozc
        self.bundle_identity = bundle_identity
        self.allow = check_allow(allow)
        self.on_change = on_change
        self.resolve_timeout_ms = resolve_timeout_ms
        self._records: dict[str, Announcement | str] = {}  # instance -> record or why dropped
        self._resolving: dict[str, asyncio.Task[None]] = {}
        self._overflow: set[str] = set()  # records not followed (bounded: what is shown)
        self._browser: Any = None

    async def start(self) -> Browser:
        zc = zeroconf_module("discovering helpers")
        import zeroconf

        # QM questions only: the unicast answer to a QU question goes to whichever socket of
        # this machine holds port 5353 (avahi's, another coinf process's), maybe not this one
        self._browser = zc.AsyncServiceBrowser(self.aiozc.zeroconf, SERVICE_TYPE,
                                               handlers=[self._on_state],
                                               question_type=zeroconf.DNSQuestionType.QM)
        return self

    async def aclose(self) -> None:
        if self._browser is not None:
            browser, self._browser = self._browser, None
            await browser.async_cancel()
        tasks = list(self._resolving.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> Browser:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def found(self) -> Found:
        records = [r for r in self._records.values() if isinstance(r, Announcement)]
        kept, dropped = settle(records, self.allow)
        dropped += [(i, r) for i, r in self._records.items() if isinstance(r, str)]
        dropped += [(i, "not resolved yet") for i in self._resolving if i not in self._records]
        if self._overflow:
            dropped.append(("", f"{len(self._overflow)} more records ignored (at most "
                                f"{MAX_SERVICES} are followed)"))
        return Found(kept, sorted((printable(i), printable(r, 200)) for i, r in dropped))

    def _on_state(self, zeroconf: Any, service_type: str, name: str, state_change: Any
                  ) -> None:
        kind = getattr(state_change, "name", str(state_change))
        if kind == "Removed":
            task = self._resolving.pop(name, None)
            if task is not None:
                task.cancel()
            if self._records.pop(name, None) is not None:
                self._changed()
            return
        if name not in self._records and name not in self._resolving and \
                len(self._records) + len(self._resolving) >= MAX_SERVICES:
            if len(self._overflow) < 16 * MAX_SERVICES:
                self._overflow.add(name)
            return
        old = self._resolving.pop(name, None)
        if old is not None:
            old.cancel()
        self._resolving[name] = asyncio.ensure_future(self._resolve(name))

    async def _resolve(self, name: str) -> None:
        zc = zeroconf_module("discovering helpers")
        import zeroconf

        try:
            info = zc.AsyncServiceInfo(SERVICE_TYPE, name)
            ok = await info.async_request(self.aiozc.zeroconf, self.resolve_timeout_ms,
                                          question_type=zeroconf.DNSQuestionType.QM)
            if not ok:
                record: Announcement | str = "did not resolve (no SRV/TXT answer)"
            else:
                record = parse_announcement(name, info.text or b"",
                                            info.parsed_addresses(zeroconf.IPVersion.V4Only),
                                            info.port, self.bundle_identity)
        except ProtocolError as exc:
            record = exc.text
        except Exception as exc:  # zeroconf refused what it received (a bad name...)
            record = f"unreadable record: {type(exc).__name__}: {exc}"
        finally:
            if self._resolving.get(name) is asyncio.current_task():
                del self._resolving[name]
        if isinstance(record, str):
            log.info("discovery: dropped %s: %s", printable(name), printable(record, 200))
        self._records[name] = record
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change(self.found())
            except Exception:  # a listener's bug must not stop the browse
                log.exception("discovery: on_change failed")


async def browse(timeout_s: float, bundle_identity: str | None = None,
                 allow: Sequence[str] = (), interfaces: Sequence[str] | None = None) -> Found:
    """Browse ``_coinf._tcp`` for ``timeout_s`` seconds: the usable records (sorted by name)
    and the dropped ones with why. Records still resolving at the end are left out."""
    if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
        raise InputError(f"a discovery timeout is a number of seconds > 0, got {timeout_s!r}")
    aiozc = open_zeroconf(interfaces)
    try:
        browser = Browser(aiozc, bundle_identity, allow,
                          resolve_timeout_ms=max(1, int(timeout_s * 1000)))
        async with browser:
            await asyncio.sleep(timeout_s)
            return browser.found()
    finally:
        with contextlib.suppress(Exception):
            await aiozc.async_close()


__all__ = [
    "EXTRA", "MAX_SERVICES", "MAX_TXT_BYTES", "MAX_VALUE_BYTES", "RESERVED_NAMES", "SERVICE_TYPE",
    "Announcement", "Browser", "Found", "allowed", "browse", "check_allow", "open_zeroconf",
    "parse_announcement", "pick_address", "printable", "settle", "split_paired", "txt_pairs",
    "txt_record",
]
