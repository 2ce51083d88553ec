"""A pipeline whose first link is BLE (issue 13): the wearable (this process, its GATT server on
the emulated radio of a `coinf radio` process) --BLE--> h1 --TCP--> h2, each helper a real
`coinf handheld --pipeline` process; h1 listens both as a BLE central (for the wearable) and on
its TCP address (for its peers)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from coinf.ble_protocol.radio import spawn
from coinf.convert.split import split_model
from coinf.wearable.pipeline_config import load_helpers

from coinf.errors import InputError
from tests.ble_servers import WEARABLE_PAIRING, cli_pairing
from tests.procs import handheld_daemon
from tests.test_pipeline_run import frames, pipeline_session, reference
from tests.test_pipeline_slices import LENET

# time beyond the suite's 30 s a test: pipelines over the emulated BLE radio (up to 15 s alone;
# 33 s in a fresh clone sharing the machine with a training run)
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory):
    return split_model(LENET, tmp_path_factory.mktemp("pble") / "lenet")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def ble_pipeline(bundle, tmp: Path) -> Iterator[tuple[Path, dict[str, subprocess.Popen]]]:
    """The radio process, h1 (BLE to the wearable + TCP for peers) and h2 (TCP); yields the
    config and the helper processes (``procs["restart h1"]()`` starts h1 again)."""
    whole = float(bundle.candidates[-1].head.flops) * 1000 / 1e9  # the model in 1 ms
    with ExitStack() as stack:
        wspec, hspec, stop_radio = spawn("pi-zero-2w", overrides=["time_scale=0.5"])
        stack.callback(stop_radio)
        config = tmp / "pipeline.json"
        config.write_text(json.dumps({"helpers": [
            {"name": "h1", "address": f"tcp:127.0.0.1:{free_port()}",
             "wearable_link": f"ble:{wspec}", "speed_gflops": whole, "bandwidth_kbps": 20},
            {"name": "h2", "address": f"tcp:127.0.0.1:{free_port()}", "speed_gflops": whole,
             "bandwidth_kbps": 1000}]}))
        common = ("--pipeline", str(config), "--threads", "1")

        def h1() -> subprocess.Popen:
            return stack.enter_context(handheld_daemon(
                bundle.root, f"ble:{hspec}", *common, "--name", "h1",
                *cli_pairing(tmp, "handheld")))

        procs: dict[str, Any] = {"h1": h1(), "h2": stack.enter_context(handheld_daemon(
            bundle.root, json.loads(config.read_text())["helpers"][1]["address"], *common,
            "--name", "h2")), "restart h1": h1}
        yield config, procs


def session(bundle, config: Path, max_backoff_s: float = 30.0) -> Any:
    """A Session given the config's helpers over every device (LeNet's last slices are tiny:
    over BLE two devices would be faster, but these tests are about three)."""
    return pipeline_session(bundle, load_helpers(config), timeout=20.0, connect_timeout=20.0,
                            helper_ble_options=WEARABLE_PAIRING, max_backoff_s=max_backoff_s)


def test_ble_first_link_equals_the_whole_model_and_survives_h2_dying(bundle, tmp_path) -> None:
    feeds = frames(bundle, 16)
    ref = reference(bundle, feeds)

    async def main(procs: dict[str, subprocess.Popen]) -> tuple[list, list]:
        async with session(bundle, config) as sess:
            sess.replanner.adaptive = False
            plan = sess.replanner.plan
            assert tuple(st.device for st in plan.stages) == ("wearable", "h1", "h2")
            got, seen = [], []
            async for frame in sess.astream(feeds, depth=4):
                got.append(frame.value()[0])
                seen.append(frame.stats)
                if len(got) == 6:
                    procs["h2"].kill()  # h2 vanishes with frames in flight
            return got, seen

    with ble_pipeline(bundle, tmp_path) as (config, procs):
        got, seen = asyncio.run(asyncio.wait_for(main(procs), 60))
    assert len(got) == len(feeds)  # nothing lost
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
    assert seen[0].devices == ("wearable", "h1", "h2")
    assert seen[-1].devices == ("wearable", "h1")  # re-planned onto the remaining devices
    sent = [s for s in seen if s.fallback is None]
    assert sent and all(s.link.startswith("ble:tcp-client:") for s in sent)
    assert any(s.fallback is not None for s in seen)  # a frame in flight finished here


def test_when_the_ble_helper_dies_the_wearable_reaches_the_next_over_tcp_and_comes_back(
        bundle, tmp_path) -> None:
    feeds = frames(bundle, 12)
    ref = reference(bundle, feeds)

    async def main(procs: dict[str, Any]) -> tuple[list, Any]:
        async with session(bundle, config, max_backoff_s=2.0) as sess:
            sess.replanner.adaptive = False
            got = []
            async for frame in sess.astream(feeds, depth=3):
                got.append((frame.value()[0], frame.stats))
                if len(got) == 4:
                    procs["h1"].kill()  # the BLE helper vanishes (no disconnect is sent)
            # h1 comes back: once its backoff is over, a probe reaches it over BLE again and
            # the next frames use it
            await asyncio.to_thread(procs["restart h1"])
            for _ in range(60):
                (out,) = await sess.run(None, feeds[0])
                np.testing.assert_allclose(out, ref[0], rtol=1e-4, atol=1e-5)
                if "h1" in sess.last_run.devices and sess.last_run.fallback is None:
                    break
                await asyncio.sleep(0.5)
            return got, sess.last_run

    with ble_pipeline(bundle, tmp_path) as (config, procs):
        got, back = asyncio.run(asyncio.wait_for(main(procs), 90))
        h2_address = load_helpers(config)[1].address
    assert len(got) == len(feeds)
    for (g, _), r in zip(got, ref, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
    first, last = got[0][1], got[-1][1]
    assert first.devices == ("wearable", "h1", "h2") and first.link.startswith("ble:")
    assert last.devices == ("wearable", "h2") and last.link == h2_address
    assert back.devices == ("wearable", "h1", "h2") and back.link.startswith("ble:")


def test_wearable_link_is_validated(tmp_path) -> None:
    base = {"name": "h1", "address": "tcp:127.0.0.1:7878"}
    ok = load_helpers({"helpers": [{**base, "wearable_link": "ble:hci-socket:0"},
                                   {"name": "h2", "address": "tcp:127.0.0.1:7879"}]})
    assert ok[0].over_ble and ok[0].wearable_spec == "ble:hci-socket:0"
    assert not ok[1].over_ble and ok[1].wearable_spec == "tcp:127.0.0.1:7879"
    for bad, match in [("ble:", "wearable_link must be ble:HCI"),
                       ("bt:hci0", "wearable_link must be ble:HCI"),
                       (7, "wearable_link must be ble:HCI"),
                       ("tcp:nohost", r"helpers\[0\].wearable_link")]:
        with pytest.raises(InputError, match=match):
            load_helpers({"helpers": [{**base, "wearable_link": bad}]})
    with pytest.raises(InputError, match="h1, h2 share the wearable_link"):
        load_helpers({"helpers": [
            {**base, "wearable_link": "ble:hci-socket:0"},
            {"name": "h2", "address": "tcp:127.0.0.1:7879", "wearable_link": "ble:hci-socket:0"}]})


def test_a_ble_helper_started_without_a_ble_listener_is_refused(bundle, tmp_path,
                                                                capsys) -> None:
    from coinf.cli import main

    config = tmp_path / "pipeline.json"
    config.write_text(json.dumps({"helpers": [
        {"name": "h1", "address": "tcp:127.0.0.1:7878", "wearable_link": "ble:hci-socket:0"}]}))
    assert main(["handheld", "--bundle", str(bundle.root), "--pipeline", str(config),
                 "--name", "h1"]) == 2
    assert "give --listen ble:HCI" in capsys.readouterr().err


def test_bench_pipeline_first_link_ble(capsys) -> None:
    from coinf.cli import main

    assert main(["bench", "pipeline", "--first-link", "ble", "--in-process"]) == 2
    assert "drop --in-process" in capsys.readouterr().err
    assert main(["bench", "pipeline", "--first-link", "ble", "--devices", "3", "--frames", "6",
                 "--repeats", "1", "--warmup", "4", "--slowdown", "10", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["first_link"] == "ble" and out["radio"]["preset"] == "pi-zero-2w"
    assert out["model"] == "lenet_digits" and out["stages"][1].endswith("@h1(onnxruntime)")
    assert out["throughput_fps"] > 0 and len(out["stage_ms"]) == 5
    assert out["planner"]["devices"] in (1, 2, 3) and out["planner"]["why"]


def test_bench_pipeline_plays_device_profiles(capsys, tmp_path) -> None:
    """``--profiles``: each device's slowdown is its profile's (the Pi Zero 2 W's is never
    below a laptop's), and the planner's own choice is measured beside K and 2 devices."""
    from coinf.cli import main

    assert main(["bench", "pipeline", "--devices", "3", "--profiles", "pi-zero-2w,laptop"]) == 2
    assert "2 names for --devices 3" in capsys.readouterr().err
    assert main(["bench", "pipeline", "--devices", "3", "--profiles", "pi-zero-2w,laptop,laptop",
                 "--bandwidth-kbps-schedule", "10,1"]) == 2
    assert "--profiles applies to" in capsys.readouterr().err
    assert main(["bench", "pipeline", "--devices", "3", "--profiles", "pi-zero-2w,laptop,laptop",
                 "--in-process", "--hop-bandwidth-kbps", "5000", "--bandwidth-kbps", "20",
                 "--frames", "4", "--repeats", "1", "--warmup", "3", "--json",
                 "--png", str(tmp_path / "p.png")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["profiles"] == ["pi-zero-2w", "laptop", "laptop"]
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG" and out["png"]
    slow = out["slowdowns"]
    assert len(slow) == 3 and slow[0] >= slow[1] >= 1 and slow[0] > 1
    assert out["settings"]["hop_bandwidth_kbps"] == 5000
    planner = out["planner"]
    assert planner["devices"] in (1, 2, 3) and planner["fps"] > 0 and planner["why"]
    assert set(planner["predicted_fps"]) <= {"2", "3"}


def test_a_gatt_link_knows_when_a_message_is_on_the_air() -> None:
    """The wearable's GATT server takes a message into bumble's queues before the radio carries
    it; ``Link.delivered`` waits for the controller's completions (the pipeline times its BLE
    link with it)."""
    import os

    from coinf.ble_protocol.messages import Message, MsgType

    from tests.test_ble_link import radio_pair

    async def main() -> tuple[int, int, int]:
        async with radio_pair("pi-zero-2w", 0.5) as (radio, wl, hl):
            payload = os.urandom(4000)
            s0 = radio.link.stats()["payload_bytes"]
            await wl.send(Message(MsgType.REQUEST, 1, payload))
            s1 = radio.link.stats()["payload_bytes"]
            await wl.delivered()
            s2 = radio.link.stats()["payload_bytes"]
            got = await asyncio.wait_for(hl.receive(), 30)
            assert got.payload == payload
            return s1 - s0, s2 - s0, len(payload)

    taken, delivered, size = asyncio.run(asyncio.wait_for(main(), 60))
    assert taken < delivered and delivered >= size  # send returned before the air carried it


def test_max_devices_limits_a_session_and_frozen_splits_are_kept_per_device_set(bundle) -> None:
    """The bench's BLE mode runs its 2-device batches on the K-device session (one GATT link):
    ``limit(max_devices)`` limits the plan, and with ``adaptive`` off each device set keeps its
    split."""
    from coinf.handheld.pipeline_host import local_helpers
    from coinf.wearable.pipeline_config import HelperConfig

    whole = float(bundle.candidates[-1].head.flops) * 1000
    feeds = frames(bundle, 4)
    ref = reference(bundle, feeds)

    def devices(plan: Any) -> tuple[str, ...]:
        return tuple(st.device for st in plan.stages)

    async def main() -> None:
        async with local_helpers(bundle, ["h1", "h2"]) as hosts:
            helpers = [HelperConfig(h.name, h.address, 1e9, speed_flops=whole) for h in hosts]
            async with pipeline_session(bundle, helpers) as sess:
                rp = sess.replanner
                full = rp.plan
                assert devices(full) == ("wearable", "h1", "h2")
                two = rp.limit(max_devices=2, all_devices=True)
                assert devices(two) == ("wearable", "h1")
                (out,) = await sess.run(None, feeds[0])
                assert sess.last_run is not None and sess.last_run.devices == ("wearable", "h1")
                np.testing.assert_allclose(out, ref[0], rtol=1e-4, atol=1e-5)
                rp.adaptive = False
                rp.measured["h1"] = (99, whole / 100)  # h1 measured 100x slower: ignored
                assert rp.limit(None, all_devices=True) == full  # the frozen split is kept
                assert rp.limit(max_devices=2, all_devices=True) == two
                assert rp.limit(max_devices=1).local  # the wearable alone
                rp.adaptive = True
                assert rp.limit(None, all_devices=True) != full  # measured: made anew

    asyncio.run(asyncio.wait_for(main(), 60))
