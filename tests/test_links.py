"""The link as a decision: BLE and Wi-Fi priced with their own radios, the planner choosing the
link, and the emulated Wi-Fi channel (jitter keeps order, loss costs round trips)."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
from coinf.ble_protocol.loopback import InProcessLink
from coinf.ble_protocol.messages import Message, MsgType
from coinf.ble_protocol.shaped import Channel
from coinf.ble_protocol.throttle import ThrottledLink
from coinf.ble_protocol.wifi_preset import WifiError, wifi_preset
from coinf.device.profile import PI_ZERO_2W_POWER, PowerModel
from coinf.wearable.planner.adapt import LinkEstimate
from coinf.wearable.planner.links import decide_links, link_estimate, parse_links
from coinf.wearable.planner.planner import Planner
from coinf.wearable.policy import Policy

from coinf.bundle import Bundle
from coinf.cli import main
from coinf.errors import InputError
from tests.planner_bundle import make_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return make_bundle(tmp_path_factory.mktemp("links") / "b", hw=64)


def _planner(bundle: Bundle, objective: str, slowdown: float = 200.0) -> Planner:
    p = Planner(bundle, policy=Policy(objective=objective))
    p.wearable.slowdown = slowdown  # a wearable slow enough that sending can pay
    return p


def test_named_links_have_their_radio_and_figures() -> None:
    ble, wifi = link_estimate("ble"), link_estimate("wifi")
    assert ble.kind == "ble" and wifi.kind == "wifi"
    assert 15_000 < ble.up_bps < 30_000  # BLE 4.2 without DLE
    assert wifi.up_bps > 50 * ble.up_bps
    assert link_estimate("ble-2m").up_bps > link_estimate("ble-dle").up_bps > ble.up_bps
    assert list(parse_links("wifi, ble")) == ["wifi", "ble"]
    with pytest.raises(InputError, match="unknown link 'zigbee'; expected one of ble"):
        parse_links("ble,zigbee")
    with pytest.raises(InputError, match="expected link names"):
        parse_links(" , ")
    with pytest.raises(WifiError, match="unknown Wi-Fi parameter"):
        wifi_preset("pi-zero-2w-wifi", speed=3)
    with pytest.raises(ValueError, match="kind must be 'ble' or 'wifi'"):
        LinkEstimate(1e3, 1e3, kind="lora")


def test_each_link_is_priced_at_its_own_radio(bundle: Bundle) -> None:
    p = _planner(bundle, "energy")
    pw = p.wearable.power
    for name in ("ble", "wifi"):
        est = link_estimate(name)
        row = next(r for r in p.costs(est) if r.id == "c000")
        tx, rx, wake = pw.radio(est.kind)
        compute = row.head_ms * max(pw.cpu_active_w - pw.cpu_idle_w, 0)
        assert row.wearable_energy_mj == pytest.approx(
            compute + row.transfer_ms * tx + row.return_ms * rx + wake, rel=1e-9)
        local = next(r for r in p.costs(est) if r.id == "c003")
        assert local.transfer_ms == 0  # nothing sent, no radio energy and no wake-up
        assert local.wearable_energy_mj == pytest.approx(
            local.head_ms * max(pw.cpu_active_w - pw.cpu_idle_w, 0))
    assert pw.radio("wifi")[2] > 0 and pw.radio("ble")[2] == 0


def test_the_planner_picks_the_link_that_wins_the_objective(bundle: Bundle) -> None:
    p = _planner(bundle, "latency")
    links = parse_links("ble,wifi")
    choice = decide_links(p, links, "latency", 0, True)
    assert set(choice.per_link) == {"ble", "wifi"}
    lat = {n: d.row.latency_ms() for n, d in choice.per_link.items()}
    assert choice.link == min(lat, key=lat.__getitem__)
    assert choice.decision is choice.per_link[choice.link]
    assert choice.link in choice.why and choice.to_json()["link"] == choice.link

    # a fast local device: the frame stays on the wearable and no link is chosen
    local = decide_links(_planner(bundle, "latency", slowdown=0.01), links, "latency", 0, True)
    assert local.link is None and "runs on the wearable on every link" in local.why


def test_energy_weighs_the_wifi_wake_up(bundle: Bundle) -> None:
    """Wi-Fi's per-exchange wake-up makes small sends dearer than over BLE: with a wake-up
    large enough, the energy objective keeps BLE although Wi-Fi is faster."""
    p = _planner(bundle, "energy")
    cheap = decide_links(p, parse_links("ble,wifi"), "energy", None, True)
    costly = PowerModel(**{**PI_ZERO_2W_POWER.__dict__, "wifi_wake_mj": 1e4})
    p.wearable.power = costly
    dear = decide_links(p, parse_links("ble,wifi"), "energy", None, True)
    assert dear.link != "wifi"
    assert cheap.per_link["wifi"].row.wearable_energy_mj < \
        dear.per_link["wifi"].row.wearable_energy_mj


def test_old_profiles_without_wifi_figures_still_load() -> None:
    pm = PowerModel.from_json({"cpu_active_w": 2, "cpu_idle_w": 0.6, "ble_tx_w": 0.15,
                               "ble_rx_w": 0.12})
    assert pm.radio("wifi") == (PowerModel.wifi_tx_w, PowerModel.wifi_rx_w,
                                PowerModel.wifi_wake_mj)
    with pytest.raises(Exception, match="power model needs"):
        PowerModel.from_json({"cpu_active_w": 2})


def test_coinf_plan_chooses_the_link_and_shows_references_per_link(
        bundle: Bundle, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(bundle.root), "--links", "ble,wifi", "--objective", "latency",
                 "--wearable-slowdown", "200", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["per_link"]) == {"ble", "wifi"}
    assert out["link"]["link"] in ("ble", "wifi")
    for entry in out["per_link"].values():
        assert set(entry["reference"]) >= {"wearable_only", "handheld_raw", "best_split"}
    assert out["chosen"]["id"] == out["per_link"][out["link"]["link"]]["chosen"]["id"]
    assert main(["plan", str(bundle.root), "--links", "ble,carrier-pigeon"]) == 2
    assert "unknown link 'carrier-pigeon'" in capsys.readouterr().err


def test_wifi_jitter_keeps_order_and_loss_costs_round_trips() -> None:
    c = wifi_preset("pi-zero-2w-wifi", loss=0.2, jitter_ms=20.0).channel(seed=3)
    rng = random.Random(1)
    repairs = [c.repair_s(100 * c.segment_bytes, rng) for _ in range(200)]
    per_message = sum(repairs) / len(repairs) / (2 * c.latency_s)
    assert 15 < per_message < 25  # 100 segments x 20 % lost, one round trip each
    assert Channel(1e6).repair_s(10**6, rng) == 0.0

    async def go() -> list[int]:
        a, b = InProcessLink.pair(depth=64)
        shaped = ThrottledLink(a, wifi_preset("pi-zero-2w-wifi", jitter_ms=30.0,
                                              throughput_bps=1e8).channel())
        for i in range(40):
            await shaped.send(Message(MsgType.CANCEL, i, b""))
        got = [(await b.receive()).request_id for _ in range(40)]
        await shaped.close()
        return got

    assert asyncio.run(go()) == list(range(40))


def test_doctor_reports_the_links_this_device_has(tmp_path: Path) -> None:
    from coinf.cli.commands.doctor import links_check

    net = tmp_path / "net"
    for name, wireless, state in (("eth0", False, "up"), ("wlan0", True, "up"),
                                  ("wlan1", True, "down")):
        (net / name).mkdir(parents=True)
        (net / name / "operstate").write_text(state + "\n")
        if wireless:
            (net / name / "wireless").mkdir()
    ble = {"status": "ok", "present": True, "preset": "pi-zero-2w"}
    got = links_check(ble, net)
    assert got["status"] == "ok" and got["links"] == ["ble", "wifi"]
    assert "wifi (wlan0)" in got["summary"] and "wlan1 down" in got["summary"]
    assert "coinf plan --links ble,wifi" in got["summary"]
    none = links_check({"status": "warn", "present": False}, tmp_path / "nothing")
    assert none["status"] == "warn" and none["links"] == []
    assert "no link to a handheld" in none["summary"]


def test_the_emulated_wifi_air_relays_every_byte_in_order_both_ways() -> None:
    """A real TCP echo server behind the relay: what goes in comes back whole, in order,
    through the jittery lossy air."""
    from coinf.ble_protocol.wifi_air import WifiAir

    async def go() -> bytes:
        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(4096):
                w.write(data)
                await w.drain()
            w.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        air = WifiAir(wifi_preset("pi-zero-2w-wifi", loss=0.05, jitter_ms=5.0,
                                  throughput_bps=5e7).channel(), ("127.0.0.1", port))
        await air.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", air.port)
        payload = bytes(random.Random(7).randrange(256) for _ in range(300_000))
        for i in range(0, len(payload), 10_000):
            writer.write(payload[i:i + 10_000])
        await writer.drain()
        writer.write_eof()
        got = await asyncio.wait_for(reader.read(-1), 30)
        writer.close()
        await air.stop()
        server.close()
        await server.wait_closed()
        assert got == payload
        return got

    assert len(asyncio.run(go())) == 300_000


def test_coinf_radio_wifi_refuses_a_bad_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["radio", "--wifi", "pi-zero-2w-wifi", "--to", "unix:/tmp/x"]) == 2
    assert "--wifi needs --to tcp:HOST:PORT" in capsys.readouterr().err
    assert main(["radio", "--wifi", "nope", "--to", "tcp:127.0.0.1:1"]) == 2
    assert "unknown Wi-Fi preset 'nope'" in capsys.readouterr().err
