"""Discovery (docs/PIPELINE.md, "Discovery"): helpers announce themselves on DNS-SD
(``_coinf._tcp``) and the wearable finds those serving its bundle, with python-zeroconf.

The records are untrusted: hostile TXT records (oversized, bad names, another bundle, another
protocol) are dropped, saying why, and the allow-list is respected. The network tests use real
zeroconf announcers and browsers in this process (and one ``coinf handheld --announce``
process), on the loopback interface only (``127.0.0.1``: mDNS multicast never leaves the
machine); they are skipped, saying why, where multicast on loopback is not delivered.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from coinf.ble_protocol.listen import Listener, open_listener
from coinf.ble_protocol.mdns import (
    SERVICE_TYPE,
    Announcement,
    Browser,
    Found,
    check_allow,
    open_zeroconf,
    parse_announcement,
    pick_address,
    settle,
    txt_record,
)
from coinf.ble_protocol.messages import PROTOCOL_VERSION
from coinf.convert.split import split_model
from coinf.device.emulation import DeviceEmulation
from coinf.handheld.announce import Announcer
from coinf.handheld.daemon import HandheldDaemon
from coinf.handheld.forward import Forwarder
from coinf.wearable.discovery import Discover, discover, discover_helpers
from coinf.wearable.plan import Plan
from zeroconf import ServiceInfo
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from coinf import PlacementOptions, Session, SessionOptions
from coinf.errors import ErrorCode, InputError, MissingDependency, ProtocolError
from tests.procs import ROOT, coinf_cmd
from tests.test_pipeline_run import LENET, frames, reference
from tests.test_plan_executor import three_stages

# time beyond the suite's 30 s a test: helper daemons found over DNS-SD (up to 11 s alone)
pytestmark = pytest.mark.timeout(120)

LO = "127.0.0.1"  # the only interface these tests put mDNS on
ID = "0123456789abcdef-01234567"
OTHER = "fedcba9876543210-76543210"


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every zeroconf instance these tests open is on 127.0.0.1 only: nothing is multicast on
    the machine's other interfaces (a test that forgot ``interfaces`` fails here instead)."""
    import zeroconf

    real = zeroconf.Zeroconf.__init__

    def guarded(self: Any, interfaces: Any = zeroconf.InterfaceChoice.All, *args: Any,
                **kwargs: Any) -> None:
        assert isinstance(interfaces, list) and interfaces == [LO], \
            f"mDNS on {interfaces!r}: these tests use {LO} only"
        real(self, interfaces, *args, **kwargs)

    monkeypatch.setattr(zeroconf.Zeroconf, "__init__", guarded)


def _txt(**pairs: str | bytes) -> bytes:
    """A raw TXT record: length-prefixed ``key=value`` strings."""
    out = b""
    for key, value in pairs.items():
        item = key.encode() + b"=" + (value if isinstance(value, bytes) else value.encode())
        out += bytes([len(item)]) + item
    return out


def _good(**changes: str | bytes) -> bytes:
    return _txt(**{"name": "h1", "bundle": ID, "proto": str(PROTOCOL_VERSION), **changes})


# -- the record, offline ------------------------------------------------------------------------

def test_a_txt_record_round_trips_through_zeroconfs_own_encoding() -> None:
    info = ServiceInfo(SERVICE_TYPE, f"h1.{SERVICE_TYPE}", port=7878,
                       addresses=[socket.inet_aton("10.1.2.3")],
                       properties=txt_record("h1", ID, speed_gflops=12.5),
                       server="coinf-h1.local.")
    got = parse_announcement(info.name, info.text, info.parsed_addresses(), info.port, ID)
    assert got == Announcement(info.name, "h1", "tcp:10.1.2.3:7878", ID, PROTOCOL_VERSION, 12.5)
    assert got.to_json() == {"name": "h1", "address": "tcp:10.1.2.3:7878", "speed_gflops": 12.5}
    # any bundle, to list them; no speed announced
    plain = parse_announcement("x", _good(), ["10.1.2.3"], 1, None)
    assert plain.speed_gflops is None and plain.bundle == ID and plain.fingerprint is None
    fp = "sha256:" + "0f" * 32  # the helper's TLS certificate, announced as 64 hex digits
    signed = parse_announcement("x", _txt(**txt_record("h1", ID, None, fp)), ["10.1.2.3"], 1, ID)
    assert signed.fingerprint == fp and signed.to_json()["fingerprint"] == fp
    for bad in (dict(name="wearable"), dict(name="a b"), dict(speed_gflops=float("inf"))):
        with pytest.raises(InputError):
            txt_record(**{"name": "h1", "bundle_identity": ID, **bad})  # type: ignore[arg-type]


HOSTILE_TXT = [
    (_good() + _txt(**{f"pad{i}": "x" * 60 for i in range(8)}), [LO], 1, ErrorCode.TOO_LARGE,
     "TXT record of"),
    (_good(name=b"h" * 65), [LO], 1, ErrorCode.TOO_LARGE, "'name' of 65 bytes"),
    (_good(name="a" * 33), [LO], 1, ErrorCode.MALFORMED, "is not 1-32"),
    (_good(name="bad name"), [LO], 1, ErrorCode.MALFORMED, "is not 1-32"),
    (_good(name="../etc"), [LO], 1, ErrorCode.MALFORMED, "is not 1-32"),
    (_good(name="wearable"), [LO], 1, ErrorCode.MALFORMED, "wearable or handheld"),
    (_good(name="handheld"), [LO], 1, ErrorCode.MALFORMED, "wearable or handheld"),
    (_good(name=b"h\xc3\xa9"), [LO], 1, ErrorCode.MALFORMED, "not ASCII"),
    (_good(name="h1\x1b[2J"), [LO], 1, ErrorCode.MALFORMED, "control characters"),
    (_good(bundle=OTHER), [LO], 1, ErrorCode.BUNDLE_MISMATCH, f"serves bundle {OTHER}"),
    (_good(proto=str(PROTOCOL_VERSION + 1)), [LO], 1, ErrorCode.BAD_VERSION, "speaks protocol"),
    (_good(proto="two"), [LO], 1, ErrorCode.BAD_VERSION, "speaks protocol"),
    (_txt(bundle=ID, proto="2"), [LO], 1, ErrorCode.MALFORMED, "no 'name'"),
    (_txt(name="h1", bundle=ID), [LO], 1, ErrorCode.MALFORMED, "no 'proto'"),
    (_good() + _txt(name="h2"), [LO], 1, ErrorCode.MALFORMED, "given twice"),
    (_good()[:-3], [LO], 1, ErrorCode.TRUNCATED, "past the record's end"),
    (b"\x05nam\xffe=h1" + _good()[8:], [LO], 1, ErrorCode.MALFORMED, "key is not ASCII"),
    *[(_good(gflops=g), [LO], 1, ErrorCode.MALFORMED, "gflops")
      for g in ("nan", "inf", "-1", "0", "fast", "1e7")],
    *[(_good(), [LO], p, ErrorCode.MALFORMED, "port") for p in (0, 65536, None, "80", True)],
    *[(_good(fp=f), [LO], 1, ErrorCode.MALFORMED, "fp is not 64 hex")
      for f in ("ab" * 31, "zz" * 32, "sha256")],
    (_good(fp="ab" * 33), [LO], 1, ErrorCode.TOO_LARGE, "'fp' of 66 bytes"),
    *[(_good(), a, 1, ErrorCode.MALFORMED, "no usable IPv4")
      for a in ([], ["0.0.0.0"], ["224.0.0.251"], ["255.255.255.255"], ["::1"], ["x"])],
]


@pytest.mark.parametrize("text, addresses, port, code, words", HOSTILE_TXT,
                         ids=[c[-1] for c in HOSTILE_TXT])
def test_a_hostile_record_is_dropped_saying_why(text: bytes, addresses: list[str], port: Any,
                                                code: ErrorCode, words: str) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_announcement("evil", text, addresses, port, ID)
    assert err.value.code == code and words in err.value.text, err.value.text


def test_a_record_is_reached_at_a_routable_address_first() -> None:
    assert pick_address([LO, "169.254.1.1", "10.0.0.9", "10.0.0.2"]) == "10.0.0.2"
    assert pick_address(["169.254.1.1", LO]) == "169.254.1.1"
    assert pick_address(["224.0.0.1", LO]) == LO
    keys = {"name": "h1", "bundle": ID, "proto": "2", "KEY": "flag"}
    upper = _txt(**{k.upper(): v for k, v in keys.items()})  # keys are case-insensitive
    assert parse_announcement("x", upper, [LO], 5, ID).name == "h1"


def _a(name: str, address: str) -> Announcement:
    return Announcement(f"{name}-{address}", name, address, ID, PROTOCOL_VERSION)


def test_the_allow_list_and_a_name_claimed_twice() -> None:
    h1, h2, h3 = _a("h1", "tcp:10.0.0.1:7"), _a("h2", "tcp:10.0.0.2:7"), _a("h3", "tcp:10.0.0.3:9")
    kept, dropped = settle([h3, h1, h2])
    assert kept == [h1, h2, h3] and not dropped  # sorted by name
    for allow, names in ((["h2"], ["h2"]), (["10.0.0.1"], ["h1"]),
                         (["tcp:10.0.0.3:9"], ["h3"]), (["tcp:10.0.0.3:8"], []),
                         (["h1", "10.0.0.3"], ["h1", "h3"])):
        kept, dropped = settle([h1, h2, h3], allow)
        assert [a.name for a in kept] == names
        assert len(dropped) == 3 - len(names) and all("allow-list" in r for _, r in dropped)
    # one name at two addresses: which is the real one cannot be told, so neither is used
    twin = _a("h1", "tcp:10.0.0.9:7")
    kept, dropped = settle([h1, twin, h2])
    assert kept == [h2] and len(dropped) == 2 and all("claimed at 2" in r for _, r in dropped)
    assert settle([twin, h1, h2], ["10.0.0.1"])[0] == [h1]  # pinned by address: no clash
    again = Announcement("other-instance", "h1", h1.address, ID, PROTOCOL_VERSION)
    assert settle([h1, again])[0] == [h1]  # announced twice at one address: once
    for bad in ("bad name", "10.0.0", "tcp:10.0.0.1", "tcp:10.0.0.1:0", "tcp:host:7"):
        with pytest.raises(InputError, match="allow-list entry"):
            check_allow([bad])
    with pytest.raises(InputError, match="sequence"):
        check_allow("h1")


def test_discover_options_are_checked_and_left_as_given() -> None:
    d = Discover(timeout_s=1.5, allow=("h1", "10.0.0.2"), interfaces=(LO,))
    opts = PlacementOptions(helpers=d)
    assert opts.helpers is d and PlacementOptions(helpers=Discover()).helpers == Discover()
    for bad, words in ((dict(timeout_s=0), "timeout_s"), (dict(timeout_s=61), "timeout_s"),
                       (dict(timeout_s=float("nan")), "timeout_s"),
                       (dict(timeout_s=True), "timeout_s"),
                       (dict(allow=("bad name",)), "allow-list entry"),
                       (dict(allow="h1"), "sequence"), (dict(interfaces=LO), "interfaces"),
                       (dict(bundle_identity=""), "bundle_identity")):
        with pytest.raises(InputError, match=words) as err:
            Discover(**bad)  # type: ignore[arg-type]
        assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="which bundle"):
        opts.helper_configs()  # no bundle and no identity: nothing to check the records by
    with pytest.raises(InputError, match="Discover"):
        PlacementOptions(helpers=[d])
    with pytest.raises(InputError, match="identity"):
        discover_helpers(1.0, "")
    with pytest.raises(InputError, match="IPv4"):
        discover(1.0, ID, interfaces=["eth0"])


def test_without_zeroconf_discovery_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from coinf.cli import main

    for name in [m for m in sys.modules if m == "zeroconf" or m.startswith("zeroconf.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "zeroconf", None)  # as if it were not installed
    with pytest.raises(MissingDependency, match=r"'zeroconf'.*coinf\[discovery\]"):
        discover_helpers(1.0, ID)
    with pytest.raises(MissingDependency, match=r"coinf\[discovery\]"):
        PlacementOptions(helpers=Discover(bundle_identity=ID)).helper_configs()
    for argv in (["discover", "--timeout", "1"],
                 ["handheld", "--bundle", "b", "--announce", "--name", "h1"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"coinf {argv[0]}: error:") and "coinf[discovery]" in err, err
        assert "\n" not in err


def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from coinf.cli import main
    from tests.bundles import make_tiny_bundle

    b = str(make_tiny_bundle(tmp_path / "b").root)
    config = tmp_path / "p.json"
    config.write_text(json.dumps({"helpers": [{"name": "h1", "address": "tcp:127.0.0.1:9"}]}))
    cases = [
        (["run", b, "--discover", "0"], "--discover must be in (0, 60], got 0"),
        (["run", b, "--discover", "soon"], "--discover must be a number of seconds"),
        (["run", b, "--discover", "--helpers", str(config)], "not both"),
        (["run", b, "--discover", "--split", "c001"], "not with --split/--all"),
        (["run", b, "--allow", "h1"], "give --discover too"),
        (["run", b, "--discover", "--allow", "bad name"], "allow-list entry"),
        (["run", b, "--discover", "--mdns-interface", "eth0"], "IPv4 address"),
        (["plan", b, "--discover", "--helpers", str(config)], "not both"),
        (["plan", b, "--mdns-interface", LO], "give --discover too"),
        (["discover", "--timeout", "-1"], "--timeout must be"),
        (["handheld", "--bundle", b, "--announce"], "--announce needs --name"),
        (["handheld", "--bundle", b, "--speed-gflops", "5"], "--speed-gflops is for --announce"),
        (["handheld", "--bundle", b, "--announce", "--name", "h1", "--listen",
          f"unix:{tmp_path}/h.sock"], "needs a TCP listener"),
        (["handheld", "--bundle", b, "--announce", "--name", "wearable"], "not wearable"),
        (["handheld", "--bundle", b, "--pipeline", str(config), "--name", "h1", "--announce",
          "--allow", "h2"], "the peers are the config's"),
    ]
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert words in err and "\n" not in err, (argv, err)


# -- on the network (loopback only) -----------------------------------------------------------

@pytest.fixture(scope="module")
def multicast() -> None:
    """Skip the network tests, saying why, where mDNS on 127.0.0.1 does not work (probed with
    zeroconf's own API, none of coinf's)."""

    async def probe() -> bool:
        server = AsyncZeroconf(interfaces=[LO])
        client = AsyncZeroconf(interfaces=[LO])
        seen = asyncio.Event()
        info = AsyncServiceInfo("_coinfprobe._tcp.local.",
                                f"p{os.getpid()}._coinfprobe._tcp.local.", port=9,
                                addresses=[socket.inet_aton(LO)], server="probe.local.")
        try:
            await (await server.async_register_service(info))
            browser = AsyncServiceBrowser(client.zeroconf, "_coinfprobe._tcp.local.",
                                          handlers=[lambda **_: seen.set()])
            try:
                await asyncio.wait_for(seen.wait(), 10)
                return True
            except TimeoutError:
                return False
            finally:
                await browser.async_cancel()
        finally:
            await client.async_close()
            await server.async_close()

    try:
        ok = asyncio.run(probe())
    except OSError as exc:
        pytest.skip(f"mDNS sockets cannot be opened on {LO} here ({exc}): discovery is tested "
                    "offline only")
    if not ok:
        pytest.skip(f"multicast to 224.0.0.251 is not delivered on the loopback interface here "
                    f"(a zeroconf service registered on {LO} was not seen by a browser on "
                    f"{LO} within 10 s): discovery is tested offline only")


class LoopThread:
    """An event loop on a thread of its own: the helpers answer mDNS and requests while the
    test's code (a Session, the CLI) blocks."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class Helper:
    name: str
    address: str
    forwarder: Forwarder
    daemon: HandheldDaemon
    listener: Listener
    announcer: Announcer

    async def stop(self) -> None:
        await self.announcer.__aexit__(None, None, None)
        await self.listener.aclose()
        await self.daemon.aclose()


async def start_helper(bundle: Any, name: str, speed: float | None = None) -> Helper:
    """A real helper: daemon with the forward role behind a TCP listener, announced, its peers
    the other helpers it discovers (as ``coinf handheld --announce --name NAME``)."""
    listener = open_listener(f"tcp:{LO}:0")
    await listener.start()
    emulation = DeviceEmulation(1.0, 1)
    forwarder = Forwarder(bundle, name, {}, emulation=emulation)
    daemon = HandheldDaemon(bundle, emulation, max_pending=16, forward=forwarder)
    daemon.spawn(daemon.serve_listener(listener))
    announcer = Announcer(name, bundle.identity, listener.address, interfaces=[LO],
                          speed_gflops=speed, forwarder=forwarder,
                          fingerprint=listener.store.fingerprint)
    await announcer.__aenter__()
    return Helper(name, listener.address, forwarder, daemon, listener, announcer)


#: records nobody should use: (instance, TXT properties) registered beside the helpers
HOSTILE: dict[str, dict[str, str]] = {
    "x-other": {"name": "other", "bundle": OTHER, "proto": str(PROTOCOL_VERSION)},
    "x-old": {"name": "old", "bundle": "{id}", "proto": str(PROTOCOL_VERSION - 1)},
    "x-name": {"name": "bad name!", "bundle": "{id}", "proto": str(PROTOCOL_VERSION)},
    "x-wearable": {"name": "wearable", "bundle": "{id}", "proto": str(PROTOCOL_VERSION)},
    "x-big": {"name": "big", "bundle": "{id}", "proto": str(PROTOCOL_VERSION),
              **{f"pad{i}": "x" * 200 for i in range(3)}},
    "x-fast": {"name": "fast", "bundle": "{id}", "proto": str(PROTOCOL_VERSION),
               "gflops": "inf"},
    # well formed, serving this bundle, but its certificate is not pinned here: unpaired
    "x-stranger": {"name": "stranger", "bundle": "{id}", "proto": str(PROTOCOL_VERSION),
                   "fp": "ab" * 32},
}
UNPAIRED = ("x-stranger",)


async def register(aiozc: AsyncZeroconf, instance: str, properties: dict[str, str],
                   port: int) -> AsyncServiceInfo:
    info = AsyncServiceInfo(SERVICE_TYPE, f"{instance}.{SERVICE_TYPE}", port=port,
                            addresses=[socket.inet_aton(LO)], properties=properties,
                            server=f"{instance}.local.")
    await (await aiozc.async_register_service(info))
    return info


async def until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not check():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {timeout:g} s: {what}") from None


@dataclass
class Network:
    bundle: Any
    helpers: dict[str, Helper]
    host: LoopThread
    hostile: AsyncZeroconf
    twin: Any = None


@pytest.fixture(scope="module")
def network(multicast: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """Helpers h1 (announcing 12.5 GFLOP/s) and h2, each finding the other, and the hostile
    records, all on 127.0.0.1, served from a thread of their own."""
    bundle = split_model(LENET, tmp_path_factory.mktemp("disc") / "lenet")
    host = LoopThread()

    async def up() -> Network:
        helpers = await asyncio.gather(start_helper(bundle, "h1", 12.5),
                                       start_helper(bundle, "h2"))
        hostile = open_zeroconf([LO])
        await asyncio.gather(*(register(hostile, inst, {k: v.format(id=bundle.identity)
                                                        for k, v in props.items()}, 9)
                               for inst, props in HOSTILE.items()))
        h1, h2 = helpers
        await until(lambda: set(h1.forwarder.peers) == {"h2"} and
                    set(h2.forwarder.peers) == {"h1"}, "h1 and h2 find each other")
        return Network(bundle, {h.name: h for h in helpers}, host, hostile)

    net = host.call(up(), timeout=60)
    try:
        yield net
    finally:
        async def down() -> None:
            for h in net.helpers.values():
                await h.stop()
            await net.hostile.async_close()

        host.call(down(), timeout=30)
        host.close()


def test_helpers_are_found_and_hostile_records_dropped(network: Network) -> None:
    h1, h2 = network.helpers["h1"], network.helpers["h2"]
    assert h1.forwarder.peers["h2"].address == h2.address  # helpers found each other
    found = discover(2.0, network.bundle.identity, interfaces=[LO])
    assert [(a.name, a.address, a.speed_gflops) for a in found.announcements] == [
        ("h1", h1.address, 12.5), ("h2", h2.address, None)]
    why = dict(found.dropped)
    want = {"x-other": "serves bundle", "x-old": "speaks protocol", "x-name": "is not 1-32",
            "x-wearable": "wearable or handheld", "x-big": "TXT record of",
            "x-fast": "gflops"}
    for instance, words in want.items():
        assert words in why.get(f"{instance}.{SERVICE_TYPE}", ""), (instance, found.dropped)
    # announced and well formed, but not paired: listed as such, never used
    assert [(a.name, a.fingerprint) for a in found.unpaired] == [("stranger", "sha256:" +
                                                                  "ab" * 32)]
    assert [a.name for a in found.announcements] == ["h1", "h2"]
    helpers = discover_helpers(2.0, network.bundle.identity, interfaces=[LO])
    assert [(h.name, h.address, h.speed_flops, h.wearable_link) for h in helpers] == [
        ("h1", h1.address, 12.5e9, None), ("h2", h2.address, None, None)]
    # listing every bundle: the other bundle's helper shows, with its identity
    listed = discover(2.0, None, interfaces=[LO])
    assert {a.name: a.bundle for a in listed.announcements} == {
        "h1": network.bundle.identity, "h2": network.bundle.identity}
    assert {a.name: a.bundle for a in listed.unpaired} == {  # "other" announces no fp
        "other": OTHER, "stranger": network.bundle.identity}


def test_the_allow_list_is_respected(network: Network) -> None:
    h1 = network.helpers["h1"]
    ident = network.bundle.identity
    assert [h.name for h in discover_helpers(2.0, ident, ["h2"], [LO])] == ["h2"]
    assert [h.name for h in discover_helpers(2.0, ident, [h1.address], [LO])] == ["h1"]
    assert discover_helpers(2.0, ident, ["nobody"], [LO]) == []


def test_a_session_runs_a_pipeline_through_discovered_helpers(network: Network) -> None:
    bundle = network.bundle
    feeds = frames(bundle, 2)
    plan = Plan.build(bundle, three_stages(bundle))  # wearable -> h1 -> h2, as h1 knows h2
    place = PlacementOptions(plan=plan, helpers=Discover(
        timeout_s=2.0, interfaces=(LO,), bundle_identity=bundle.identity))
    assert [h.name for h in place.helper_configs(bundle)] == ["h1", "h2"]
    with Session(bundle, SessionOptions(placement=place)) as sess:
        for feed, want in zip(feeds, reference(bundle, feeds), strict=True):
            (out,) = sess.run(None, feed)
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
            stats = sess.last_run
            assert stats is not None and stats.strategy == "pipeline" and not stats.local
            assert [h["device"] for h in stats.hops] == ["h1", "h2"]
    assert network.helpers["h1"].forwarder.stages == 2


def test_a_helper_announced_later_joins_a_running_sessions_choice(network: Network) -> None:
    """A Session browsing with ``Discover`` starts with no helper (h3 is not up yet), runs
    locally, browses again in the background as frames start, and h3 joins its choice."""
    bundle = network.bundle
    feeds = frames(bundle, 1)
    want = reference(bundle, feeds)[0]
    place = PlacementOptions(helpers=Discover(timeout_s=1.0, allow=("h3",), interfaces=(LO,),
                                              bundle_identity=bundle.identity, rebrowse_s=5))
    with Session(bundle, SessionOptions(placement=place)) as sess:
        info = sess.strategies
        assert info is not None and info["helpers"] == [] and info["chosen"] == "local"
        h3 = network.host.call(start_helper(bundle, "h3", 500.0))
        try:
            sess.core._next_browse = 0.0  # the rebrowse_s bound has passed (no waiting here)
            for _ in range(400):
                (out,) = sess.run(None, feeds[0])
                np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
                if sess.strategies["helpers"] == ["h3"]:  # type: ignore[index]
                    break
                network.host.call(asyncio.sleep(0.02))
            info = sess.strategies
            assert info is not None and info["helpers"] == ["h3"]
            split = next(o for o in info["options"] if o["strategy"] == "depth split")
            assert split["devices"] == ["wearable", "h3"]
        finally:
            network.host.call(h3.stop())
    with pytest.raises(InputError, match="rebrowse_s"):
        Discover(rebrowse_s=1)


def test_a_name_claimed_twice_is_not_used(network: Network) -> None:
    ident = network.bundle.identity

    async def twin(up: bool) -> None:
        if up:
            network.twin = await register(network.hostile, "twin", txt_record("h1", ident), 9)
        else:
            await network.hostile.async_unregister_service(network.twin)

    network.host.call(twin(True))
    try:
        found = discover(2.0, ident, interfaces=[LO])
        assert [a.name for a in found.announcements] == ["h2"]
        claims = [r for _, r in found.dropped if "name h1 is claimed at 2 addresses" in r]
        assert len(claims) == 2, found.dropped
        # pinned by its address, the real h1 is still used
        assert [h.name for h in discover_helpers(2.0, ident, [network.helpers["h1"].address],
                                                 [LO])] == ["h1"]
    finally:
        network.host.call(twin(False))


def test_coinf_discover_run_and_plan(network: Network, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from coinf.cli import main

    bundle = network.bundle
    b, lo = str(bundle.root), ["--mdns-interface", LO]
    assert main(["discover", b, "--json", *lo]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [h["name"] for h in out["helpers"]] == ["h1", "h2"]
    assert len(out["dropped"]) >= len(HOSTILE) - len(UNPAIRED)  # each hostile one, saying why
    assert [h["name"] for h in out["unpaired"]] == ["stranger"]
    config = tmp_path / "found.json"  # the output is a pipeline config
    config.write_text(json.dumps(out))
    from coinf.wearable.pipeline_config import load_helpers

    assert [h.address for h in load_helpers(config)] == [h["address"] for h in out["helpers"]]
    assert main(["discover", b, *lo, "--allow", "h2"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["name", "address", "GFLOP/s", "bundle", "trust"]
    assert table[1].split()[:2] == ["h2", network.helpers["h2"].address]
    assert table[1].split()[-1] == "paired"
    assert main(["discover", b, *lo]) == 0
    listing = capsys.readouterr().out
    assert any(line.startswith("stranger") and line.endswith("unpaired")
               for line in listing.splitlines()), listing
    assert any("h1" in line and "allow-list" in line for line in table)

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(Plan.build(bundle, three_stages(bundle)).to_json()))
    assert main(["run", b, "--discover", "2", *lo, "--plan", str(plan), "--repeat", "1",
                 "--json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)["rows"]
    assert [r["strategy"] for r in rows] == ["pipeline"] and rows[0]["match"]
    assert rows[0]["fallbacks"] == 0
    assert "discovery (2 s): h1 at tcp:" in captured.err

    assert main(["plan", b, "--discover", "2", *lo, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any(n.startswith("h1 at tcp:127.0.0.1:") and "12.5 GFLOP/s" in n
               for n in out["notes"]), out["notes"]
    assert out["strategy"] in ("local", "split", "pipeline")
    # nobody allowed: a plan over no helper is refused, saying so
    assert main(["plan", b, "--discover", "1", *lo, "--allow", "nobody"]) == 2
    assert "found no helper" in capsys.readouterr().err


def test_the_announcement_is_withdrawn_on_ctrl_c(multicast: None, tmp_path: Path) -> None:
    """``coinf handheld --announce``: a browser sees it come, and go at SIGINT (its goodbye:
    the records would otherwise stay for their TTL)."""
    from tests.bundles import make_tiny_bundle

    bundle = make_tiny_bundle(tmp_path / "b")
    proc = subprocess.Popen(
        coinf_cmd("handheld", "--bundle", str(bundle.root), "--listen", f"tcp:{LO}:0",
                  "--announce", "--name", "hx", "--mdns-interface", LO),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "announced as hx on _coinf._tcp.local at 127.0.0.1" in line, line

        async def watch() -> None:
            aiozc = open_zeroconf([LO])
            seen: list[Found] = []
            browser = Browser(aiozc, bundle.identity, on_change=seen.append)
            try:
                await browser.start()

                def names() -> list[str]:
                    return [a.name for a in browser.found().announcements]

                await until(lambda: names() == ["hx"], "the browser sees hx")
                proc.send_signal(signal.SIGINT)
                await until(lambda: names() == [], "hx withdrawn after SIGINT")
            finally:
                await browser.aclose()
                await aiozc.async_close()

        asyncio.run(watch())
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_helper_lying_about_its_bundle_is_refused_at_hello(network: Network,
                                                            tmp_path: Path) -> None:
    """The record is not the check: a helper announcing this bundle while serving another
    fails the HELLO of the link to it."""
    from coinf.wearable.plan import Stage

    from coinf.errors import LinkError
    from tests.bundles import make_tiny_bundle

    bundle, other = network.bundle, make_tiny_bundle(tmp_path / "other")

    async def up() -> Helper:
        helper = await start_helper(other, "liar")
        await helper.announcer.__aexit__(None, None, None)  # re-announced with a false bundle
        helper.announcer = Announcer("liar", bundle.identity, helper.address, interfaces=[LO],
                                     fingerprint=helper.listener.store.fingerprint)
        await helper.announcer.__aenter__()
        return helper

    liar = network.host.call(up())
    try:
        ids = [c.id for c in bundle.candidates]
        mid = ids[len(ids) // 2]
        plan = Plan.build(bundle, [Stage("wearable", ids[0], mid), Stage("liar", mid, ids[-1])])
        place = PlacementOptions(plan=plan, helpers=Discover(
            allow=("liar",), interfaces=(LO,), bundle_identity=bundle.identity))
        with Session(bundle, SessionOptions(placement=place)) as sess, \
                pytest.raises(LinkError, match="bundle_mismatch"):
            sess.run(None, frames(bundle, 1)[0])
    finally:
        network.host.call(liar.stop())
