"""Several links to one handheld at run time (issue 49, "The link is a decision"): a Session
with a BLE link (bumble on the emulated radio of a ``coinf radio`` process) and a Wi-Fi link
(TLS over a real TCP socket, shaped by the Pi Zero 2 W Wi-Fi preset) to one handheld daemon.
The planner chooses link x cut x packing per frame (as ``decide_links`` does); a frame whose
link dies is re-sent on the other; a link that connects but cannot carry a frame is refused and
reported once."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from coinf.ble_protocol.link import Link
from coinf.ble_protocol.listen import HeldLink, Listener, open_listener
from coinf.ble_protocol.messages import Message, MsgType
from coinf.ble_protocol.radio import spawn
from coinf.ble_protocol.wifi_preset import wifi_preset
from coinf.device.profile import PI_ZERO_2W_POWER, DeviceProfile, PowerModel
from coinf.handheld.daemon import HandheldDaemon
from coinf.wearable.planner.links import decide_links

from coinf import AlternateLink, AsyncSession, LinkOptions, PlannerOptions, SessionOptions
from coinf.bundle import Bundle
from coinf.errors import InputError, LinkClosed
from tests.ble_servers import HANDHELD_PAIRING, WEARABLE_PAIRING
from tests.planner_bundle import make_bundle

# time beyond the suite's 30 s a test: moves frames between two emulated links (up to 25 s alone)
pytestmark = pytest.mark.timeout(180)

LOG = "coinf.wearable.links_runtime"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return make_bundle(tmp_path_factory.mktemp("multilink") / "b", hw=32)


def _feeds(n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [{"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(n)]


def _reference(bundle: Bundle, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    sess = ort.InferenceSession(str(bundle.model_path), providers=["CPUExecutionProvider"])
    return [sess.run(None, f)[0] for f in feeds]


def _slow_wearable(**power: float) -> DeviceProfile:
    """A wearable far slower than the handheld: sending the input pays, over either radio."""
    return DeviceProfile("slow-wearable", "wearable",
                         PowerModel(**{**PI_ZERO_2W_POWER.__dict__, **power}), gflops=0.001)


class CutAfter(HeldLink):
    """A Wi-Fi link of the handheld that dies when its handheld's ``cut_at``-th REQUEST
    arrives over Wi-Fi: the request is never answered, the socket closes and the handheld stops
    listening on Wi-Fi (it left the network)."""

    def __init__(self, inner: Link, handheld: TwoLinkHandheld) -> None:
        super().__init__(inner)
        self.handheld = handheld

    async def receive(self) -> Message:
        msg = await super().receive()
        hh = self.handheld
        if msg.type == MsgType.REQUEST:
            hh.wifi_requests += 1
            if hh.wifi_requests == hh.cut_at:
                await self.close()
                hh.closing = asyncio.get_running_loop().create_task(hh.close_wifi())
                raise LinkClosed("the handheld left the Wi-Fi network")
        return msg


class TwoLinkHandheld:
    """One handheld daemon in its own thread and event loop, serving the wearable over BLE (the
    emulated radio, as a bumble central) and over Wi-Fi (TLS on a TCP port); the Wi-Fi side can
    die under a request (``cut_at``) and come back on the same port (``wifi_up``)."""

    def __init__(self, bundle: Bundle, hci: str) -> None:
        self.bundle, self.hci = bundle, hci
        self.port = 0
        self.cut_at = 0
        self.wifi_requests = 0
        self.closing: asyncio.Task[None] | None = None
        self.errors: list[BaseException] = []
        self._wifi: Listener | None = None
        self._wifi_task: asyncio.Task[None] | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.daemon: HandheldDaemon | None = None
        self._stop: asyncio.Event | None = None

    @property
    def wifi(self) -> str:
        return f"tcp:127.0.0.1:{self.port}"

    def __enter__(self) -> TwoLinkHandheld:
        self._thread.start()
        assert self._ready.wait(30), "the handheld did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        assert not self.errors, self.errors

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by __exit__
            self.errors.append(exc)
            self._ready.set()

    async def _serve(self) -> None:
        self.loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with HandheldDaemon(self.bundle) as daemon, open_listener(
                f"ble:{self.hci}", bundle_identity=self.bundle.identity,
                **HANDHELD_PAIRING) as ble:
            self.daemon = daemon
            serving = asyncio.create_task(daemon.serve_listener(ble))
            await self.open_wifi()
            self._ready.set()
            await self._stop.wait()
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            await self.close_wifi()

    async def open_wifi(self) -> None:
        wifi = open_listener(self.wifi)
        await wifi.start()
        self.port = int(wifi.address.rsplit(":", 1)[1])  # type: ignore[attr-defined]
        self._wifi = wifi

        async def serve() -> None:
            assert self.daemon is not None
            async for link in wifi:
                self.daemon.start(CutAfter(link, self))

        self._wifi_task = asyncio.create_task(serve())

    async def close_wifi(self) -> None:
        task, wifi, self._wifi_task, self._wifi = self._wifi_task, self._wifi, None, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if wifi is not None:
            await wifi.aclose()

    def wifi_up(self) -> None:
        assert self.loop is not None
        asyncio.run_coroutine_threadsafe(self.open_wifi(), self.loop).result(10)

    @property
    def wifi_is_up(self) -> bool:
        return self._wifi is not None


@pytest.fixture(scope="module")
def radio() -> Iterator[tuple[str, str]]:
    wspec, hspec, stop = spawn("pi-zero-2w", overrides=["time_scale=0.5"])
    try:
        yield wspec, hspec
    finally:
        stop()


def _options(wspec: str, wifi: str, objective: str, profile: DeviceProfile,
             **link: Any) -> SessionOptions:
    return SessionOptions(
        link=LinkOptions(transport=f"ble:{wspec}", transport_options=WEARABLE_PAIRING,
                         alternates={"wifi": AlternateLink(
                             transport=wifi, channel=wifi_preset("pi-zero-2w-wifi").channel())},
                         timeout=30.0, connect_timeout=30.0, **link),
        planner=PlannerOptions(objective=objective, wearable_profile=profile))


def _expected(sess: AsyncSession) -> Any:
    """What decide_links chooses over the session's links now (their live estimates)."""
    auto = sess.autoplan
    assert auto is not None
    ad = auto.adaptive
    return decide_links(ad.planner, {n: auto.estimator(n).estimate() for n in ("ble", "wifi")},
                        ad.objective, None, False, wearable_status=ad.wearable_status,
                        handheld_status=ad.handheld_status, load_factor=ad.load.value)


def test_the_planner_chooses_the_link_per_frame(bundle: Bundle, radio: tuple[str, str]) -> None:
    """Latency: the 12 kB input goes over Wi-Fi (about 5 ms there, 0.6 s over BLE). Energy,
    with a Wi-Fi wake-up dearer than the BLE transfer: over BLE. Each time what decide_links
    chooses over the session's own estimates, and the frame's outputs are the model's."""
    wspec, hspec = radio
    feeds = _feeds(2)
    ref = _reference(bundle, feeds)

    async def one(objective: str, profile: DeviceProfile, wifi: str) -> tuple[Any, Any, Any]:
        async with AsyncSession(bundle, _options(wspec, wifi, objective, profile)) as sess:
            await sess.connect()
            assert {n: s["state"] for n, s in sess.links.items()} == {"ble": "up", "wifi": "up"}
            assert sess.links["wifi"]["kind"] == "wifi" and sess.links["ble"]["kind"] == "ble"
            want = _expected(sess)
            (y,) = await sess.run(None, feeds[0])
            np.testing.assert_allclose(y, ref[0], rtol=1e-4, atol=1e-5)
            explain = sess.plan().explain()
            return want, sess.last_run, explain

    with TwoLinkHandheld(bundle, hspec) as hh:
        want, stats, explain = asyncio.run(one("latency", _slow_wearable(), hh.wifi))
        assert want.link == "wifi" and stats.link == "wifi"
        assert stats.candidate == want.decision.winner.split("~")[0] == bundle.candidates[0].id
        assert "link: wifi carries" in explain
        want, stats, _ = asyncio.run(one("energy", _slow_wearable(wifi_wake_mj=1e4), hh.wifi))
        assert want.link == "ble" and stats.link == "ble"
        assert stats.candidate == want.decision.winner.split("~")[0]
        assert not stats.local and stats.bytes_up > 0


def test_frames_move_to_ble_when_wifi_dies_and_back_when_it_returns(
        bundle: Bundle, radio: tuple[str, str], caplog: pytest.LogCaptureFixture) -> None:
    """Wi-Fi dies under a request of a stream, with frames in flight: each of those is
    re-sent over BLE; every frame comes back once, in order, right; the next frames go over BLE
    while Wi-Fi is away, and over Wi-Fi again once it is back."""
    wspec, hspec = radio
    pool = _feeds(4)
    ref = _reference(bundle, pool)
    caplog.set_level(logging.INFO, LOG)

    async def main(hh: TwoLinkHandheld) -> tuple[list[Any], list[Any], dict[str, Any]]:
        hh.cut_at = 4  # the 2nd request of the stream
        opts = _options(wspec, hh.wifi, "latency", _slow_wearable(), max_backoff_s=1.0)
        async with AsyncSession(bundle, opts) as sess:
            for i in range(2):  # one at a time: over Wi-Fi
                (y,) = await sess.run(None, pool[i])
                np.testing.assert_allclose(y, ref[i], rtol=1e-4, atol=1e-5)
                assert sess.last_run is not None and sess.last_run.link == "wifi"

            async def feeds() -> AsyncIterator[dict[str, np.ndarray]]:
                for i in range(10):
                    yield pool[i % len(pool)]

            results = [r async for r in sess.astream(feeds(), depth=3)]
            assert not hh.wifi_is_up and sess.links["wifi"]["state"] in ("down", "probing")
            after = []
            await asyncio.get_running_loop().run_in_executor(None, hh.wifi_up)
            while not after or after[-1].link != "wifi":  # until the planner offers it again
                (y,) = await sess.run(None, pool[len(after) % len(pool)])
                np.testing.assert_allclose(y, ref[len(after) % len(pool)], rtol=1e-4,
                                           atol=1e-5)
                assert sess.last_run is not None
                after.append(sess.last_run)
            return results, after, sess.links

    with TwoLinkHandheld(bundle, hspec) as hh:
        results, after, links = asyncio.run(asyncio.wait_for(main(hh), 120))
    assert [r.index for r in results] == list(range(10))  # every frame once, in order
    for r in results:
        np.testing.assert_allclose(r.value()[0], ref[r.index % len(pool)], rtol=1e-4,
                                   atol=1e-5)
    stats = [r.stats for r in results]
    moved = [s for s in stats if s.failover is not None]
    assert moved and all(s.link == "ble" and s.failover.startswith("wifi: ") for s in moved)
    assert not any(s.local for s in stats)  # none had to finish on the wearable
    cut = stats.index(moved[0])
    assert all(s.link == "wifi" for s in stats[:cut])
    assert all(s.link == "ble" for s in stats[cut:])  # Wi-Fi is left out while it is away
    assert after[-1].link == "wifi" and links["wifi"]["state"] == "up"
    assert links["ble"]["frames"] >= len(stats) - cut
    failed = [r for r in caplog.records if r.levelno == logging.WARNING
              and r.getMessage().startswith("link wifi")]
    assert len(failed) == 1, [r.getMessage() for r in failed]  # reported once per outage


def test_a_multi_link_session_needs_at_least_the_options_right(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="'ble' is the name of the transport's own link"):
        LinkOptions(transport="ble:hci-socket:0", alternates={"ble": "tcp:10.0.0.2:7878"})
    with pytest.raises(InputError, match="link name 'Wi Fi' must be lower case"):
        LinkOptions(alternates={"Wi Fi": "tcp:10.0.0.2:7878"})
    with pytest.raises(InputError, match=r"alternates\['wifi'\] must be a spec string"):
        LinkOptions(alternates={"wifi": 7878})
    with pytest.raises(InputError, match=r"AlternateLink\.kind must be 'ble', 'wifi'"):
        AlternateLink(transport="tcp:10.0.0.2:7878", kind="lora")
    with pytest.raises(InputError, match=r"AlternateLink\.channel must be"):
        AlternateLink(transport="tcp:10.0.0.2:7878", channel=5)
    link = LinkOptions(transport="ble:hci-socket:0", alternates={"wifi": "tcp:10.0.0.2:7878"})
    assert dataclasses.asdict(link.alternates["wifi"])["kind"] == "wifi"
    assert (link.link_name, link.link_kind) == ("ble", "ble")
    assert AlternateLink(transport="ble:usb:0").kind == "ble"


def _warnings(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.getMessage().startswith(f"link {name} ")]


def _local_options(wifi: str) -> SessionOptions:
    """The handheld in-process (the transport's link, named ``handheld``) and a second link
    ``wifi`` at ``wifi``; a handshake is waited 0.5 s."""
    alt = (AlternateLink(transport=wifi, transport_options={"allow_insecure": True})
           if wifi.startswith("tcp+insecure:") else wifi)
    return SessionOptions(
        link=LinkOptions(alternates={"wifi": alt}, timeout=10.0, connect_timeout=0.5,
                         max_backoff_s=0.5),
        planner=PlannerOptions(objective="latency", wearable_profile=_slow_wearable()))


def test_a_link_that_connects_and_never_answers_is_left_out_and_reported_once(
        bundle: Bundle, caplog: pytest.LogCaptureFixture) -> None:
    """A listener that accepts the connection and never says a word: the link's first probe
    fails, it is not offered to the planner, it is reported once (one warning; its state in
    ``links`` and in ``plan().explain()``) and probed again only after its backoff, never per
    frame; every frame goes over the other link, right."""
    feeds = _feeds(3)
    ref = _reference(bundle, feeds)
    caplog.set_level(logging.INFO, LOG)

    async def main() -> tuple[int, int, dict[str, Any], str]:
        held: list[asyncio.StreamWriter] = []

        async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)  # accepted, never answered

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with AsyncSession(bundle, _local_options(f"tcp+insecure:127.0.0.1:{port}")
                                    ) as sess:
                wifi = sess.handheld_links.get("wifi").conn
                frames = 0
                while wifi.links_opened < 2 or frames < 10:  # until it was probed again
                    (y,) = await sess.run(None, feeds[frames % 3])
                    np.testing.assert_allclose(y, ref[frames % 3], rtol=1e-4, atol=1e-5)
                    assert sess.last_run is not None and sess.last_run.link == "handheld"
                    frames += 1
                    await asyncio.sleep(0.02)
                return frames, wifi.links_opened, sess.links, sess.plan().explain()
        finally:
            for w in held:
                w.close()
            server.close()

    frames, probes, links, explain = asyncio.run(asyncio.wait_for(main(), 60))
    assert probes < frames / 2  # probed after its backoff, not once per frame
    assert links["wifi"]["state"] in ("down", "probing") and links["handheld"]["state"] == "up"
    assert "handshake" in str(links["wifi"]["why"])
    assert links["handheld"]["frames"] == frames and links["wifi"]["frames"] == 0
    assert "note: link wifi down (tcp+insecure:127.0.0.1:" in explain
    warned = _warnings(caplog, "wifi")
    assert len(warned) == 1 and "cannot carry frames" in warned[0], warned


def test_a_peer_serving_another_bundle_is_refused_for_good(
        bundle: Bundle, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The Wi-Fi peer answers, but serves another model: its link is refused at the handshake
    (a fault retrying cannot mend), reported once, and never probed again; the frames go over
    the other link."""
    other = make_bundle(tmp_path / "other", hw=16)
    assert other.identity != bundle.identity
    feeds = _feeds(1)
    ref = _reference(bundle, feeds)
    caplog.set_level(logging.INFO, LOG)

    async def main() -> tuple[int, dict[str, Any], str]:
        async with HandheldDaemon(other) as daemon, open_listener("tcp:127.0.0.1:0") as lst:
            serving = asyncio.create_task(daemon.serve_listener(lst))
            try:
                async with AsyncSession(bundle, _local_options(lst.address)) as sess:  # type: ignore[attr-defined]
                    for i in range(12):
                        if i == 6:
                            await asyncio.sleep(0.6)  # past the backoff of a transient fault
                        (y,) = await sess.run(None, feeds[0])
                        np.testing.assert_allclose(y, ref[0], rtol=1e-4, atol=1e-5)
                        assert sess.last_run is not None and sess.last_run.link == "handheld"
                    wifi = sess.handheld_links.get("wifi").conn
                    return wifi.links_opened, sess.links, sess.plan().explain()
            finally:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)

    probes, links, explain = asyncio.run(asyncio.wait_for(main(), 60))
    assert probes == 1  # never probed again
    assert links["wifi"]["state"] == "refused" and "bundle" in str(links["wifi"]["why"])
    assert "note: link wifi refused (tcp:127.0.0.1:" in explain
    warned = _warnings(caplog, "wifi")
    assert len(warned) == 1 and "refused" in warned[0], warned


def test_coinf_run_takes_the_wifi_link_beside_ble(
        bundle: Bundle, radio: tuple[str, str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``coinf run --transport ble --hci SPEC --wifi tcp:HOST:PORT --wifi-emulate PRESET``:
    the split fixed at the input goes over the link predicted fastest for it, Wi-Fi, and the
    rows say so; the outputs match the model."""
    import json

    from coinf.cli import main
    from tests.ble_servers import cli_pairing

    wspec, hspec = radio
    with TwoLinkHandheld(bundle, hspec) as hh:
        code = main(["run", str(bundle.root), "--split", bundle.candidates[0].id,
                     "--transport", "ble", "--hci", wspec, "--wifi", hh.wifi,
                     "--wifi-emulate", "pi-zero-2w-wifi", "--repeat", "2", "--json",
                     *cli_pairing(tmp_path, "wearable")])
    out = capsys.readouterr().out
    assert code == 0, out
    (row,) = json.loads(out)["rows"]
    assert row["match"] and row["links"] == {"wifi": 2} and row["fallbacks"] == 0
