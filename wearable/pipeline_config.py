"""The pipeline config (docs/PIPELINE.md): the helpers, how to reach them, the planner's priors.

    {"helpers": [{"name": "phone", "address": "tcp:192.168.1.20:7878",
                  "fingerprint": "sha256:...",
                  "wearable_link": "ble:hci-socket:0", "bandwidth_kbps": 20}, ...]}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coinf.ble_protocol.request import valid_name
from coinf.ble_protocol.shaped import Channel
from coinf.ble_protocol.tls_store import parse_fingerprint
from coinf.wearable.plan import WEARABLE

from coinf.errors import InputError

DEFAULT_BANDWIDTH_BPS = 1e6  # prior for a link to a helper nothing is known about (B/s)


@dataclass(frozen=True)
class HelperConfig:
    """A helper device: its name, how to reach it, and priors for the planner. ``bandwidth_bps``
    and ``latency_s`` are also the emulated shape of links into it (``shape=True``)."""

    name: str
    address: str
    bandwidth_bps: float | None = None
    latency_s: float = 0.0
    speed_flops: float | None = None
    shape: bool = False
    #: how the *wearable* reaches this helper when it is the first of a plan, if not at
    #: ``address`` (e.g. ``ble:tcp-client:127.0.0.1:PORT``: this wearable's controller)
    wearable_link: str | None = None
    #: the pinned certificate of its TLS listener (``sha256:...``); None: any paired peer's
    fingerprint: str | None = None
    #: a ``tcp+insecure:`` address or wearable_link is allowed (the config's
    #: ``"allow_insecure": true``; plain TCP is refused without it)
    allow_insecure: bool = False

    def connector_options(self, spec: str) -> dict[str, Any]:
        """The options a connector to ``spec`` (this helper's) needs beyond the spec."""
        if spec.startswith("tcp+insecure:"):
            return {"allow_insecure": self.allow_insecure}
        return {}

    @property
    def channel(self) -> Channel | None:
        if not self.shape or self.bandwidth_bps is None:
            return None
        return Channel(self.bandwidth_bps, self.latency_s, overhead_bytes=16)

    @property
    def wearable_spec(self) -> str:
        """The spec the wearable opens to reach this helper."""
        return self.wearable_link or self.address

    @property
    def over_ble(self) -> bool:
        """The wearable reaches this helper over BLE (its GATT server; the radio shapes it)."""
        return self.wearable_spec.partition(":")[0] == "ble"


def load_helpers(source: str | Path | Mapping[str, Any]) -> list[HelperConfig]:
    """Helpers from a pipeline config (a JSON file or its object)::

        {"helpers": [{"name": "h1", "address": "tcp:192.168.1.5:7878",
                      "wearable_link": "ble:hci-socket:0",
                      "bandwidth_kbps": 250, "latency_ms": 5, "speed_gflops": 2.0,
                      "shape": false, "fingerprint": "sha256:..."}, ...]}

    ``fingerprint`` (optional): the SHA-256 of the helper's TLS certificate (``coinf wifi id``
    on it): a ``tcp:`` link to it is refused unless it presents exactly that certificate
    (without one, any paired peer's certificate is accepted; docs/PROTOCOL.md §15).

    ``wearable_link`` (optional): how the wearable reaches that helper instead of ``address``
    (which the helpers use among themselves); ``ble:HCI`` is this wearable's GATT server on
    that controller, which serves one helper at a time, so no two helpers share one.

    Raises :class:`InputError` naming the bad field."""
    where = str(source) if not isinstance(source, Mapping) else "pipeline config"
    if isinstance(source, Mapping):
        obj: Any = source
    else:
        try:
            obj = json.loads(Path(source).read_text())
        except OSError as exc:
            raise InputError(f"cannot read pipeline config {where}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise InputError(f"pipeline config {where} is not JSON: {exc}") from None
    entries = obj.get("helpers") if isinstance(obj, Mapping) else None
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{where}: expected {{\"helpers\": [{{\"name\", \"address\"}}, ...]}}")
    helpers: list[HelperConfig] = []
    for i, e in enumerate(entries):
        if not isinstance(e, Mapping):
            raise InputError(f"{where}: helpers[{i}] must be an object")
        name, address = e.get("name"), e.get("address")
        if not isinstance(name, str) or not valid_name(name) or name == WEARABLE:
            raise InputError(f"{where}: helpers[{i}].name must be 1-32 of [A-Za-z0-9_-] and "
                             f"not {WEARABLE!r}, got {name!r}")
        if not isinstance(address, str) or ":" not in address:
            raise InputError(f"{where}: helpers[{i}].address must be a transport spec like "
                             f"tcp:HOST:PORT, got {address!r}")
        nums = {}
        for key in ("bandwidth_kbps", "latency_ms", "speed_gflops"):
            v = e.get(key)
            if v is not None and (not isinstance(v, int | float) or isinstance(v, bool)
                                  or not v >= 0 or (key != "latency_ms" and v == 0)):
                raise InputError(f"{where}: helpers[{i}].{key} must be a number > 0, got {v!r}")
            nums[key] = v
        fp = e.get("fingerprint")
        if fp is not None:
            try:
                fp = parse_fingerprint(fp)
            except InputError as exc:
                raise InputError(f"{where}: helpers[{i}].fingerprint: {exc}") from None
        helpers.append(HelperConfig(
            name, address,
            bandwidth_bps=nums["bandwidth_kbps"] * 1000 if nums["bandwidth_kbps"] else None,
            latency_s=(nums["latency_ms"] or 0) / 1000,
            speed_flops=nums["speed_gflops"] * 1e9 if nums["speed_gflops"] else None,
            shape=bool(e.get("shape", False)),
            wearable_link=_wearable_link(e.get("wearable_link"), f"{where}: helpers[{i}]"),
            fingerprint=fp, allow_insecure=_allow_insecure(e, f"{where}: helpers[{i}]")))
    names = [h.name for h in helpers]
    if len(set(names)) != len(names):
        raise InputError(f"{where}: helper names must be unique, got {names}")
    ble = [h.wearable_spec for h in helpers if h.over_ble]
    if len(set(ble)) != len(ble):
        shared = next(s for s in ble if ble.count(s) > 1)
        who = ", ".join(h.name for h in helpers if h.wearable_spec == shared)
        raise InputError(f"{where}: {who} share the wearable_link {shared!r}: the wearable's "
                         f"GATT server on one controller serves one helper at a time")
    return helpers


WEARABLE_LINK_SCHEMES = ("tcp", "tcp+insecure", "unix", "ble")


def _allow_insecure(entry: Mapping[str, Any], where: str) -> bool:
    """A helper entry's ``allow_insecure`` (default false): required for a ``tcp+insecure:``
    address or wearable_link (plain TCP stays opt-in, docs/SECURITY.md)."""
    insecure = entry.get("allow_insecure", False)
    if not isinstance(insecure, bool):
        raise InputError(f"{where}.allow_insecure must be true or false, got {insecure!r}")
    plain = [a for a in (entry.get("address"), entry.get("wearable_link"))
             if isinstance(a, str) and a.startswith("tcp+insecure:")]
    if plain and not insecure:
        raise InputError(f"{where} {plain[0]} is plain TCP (no encryption, no authentication): "
                         f"add \"allow_insecure\": true to that helper to run it anyway, or use "
                         f"tcp:HOST:PORT (TLS)")
    return insecure


def _wearable_link(value: Any, where: str) -> str | None:
    """A helper's ``wearable_link``: ``None``, or a tcp/unix/ble:HCI spec (checked here, so a
    typo fails when the config loads, not at the first frame)."""
    if value is None:
        return None
    scheme, _, rest = value.partition(":") if isinstance(value, str) else ("", "", "")
    if scheme not in WEARABLE_LINK_SCHEMES or not rest:
        raise InputError(f"{where}.wearable_link must be ble:HCI (e.g. ble:hci-socket:0, "
                         f"ble:tcp-client:HOST:PORT of coinf radio), tcp:HOST:PORT, "
                         f"tcp+insecure:HOST:PORT or unix:/path, got {value!r}")
    if scheme != "ble":
        from coinf.ble_protocol.loopback import parse_address

        try:
            parse_address(value)
        except ValueError as exc:
            raise InputError(f"{where}.wearable_link: {exc}") from None
    return value


__all__ = ["WEARABLE_LINK_SCHEMES", "HelperConfig", "load_helpers"]
