"""Cross-process: `coinf radio` hosts the link; the handheld runs in another process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from coinf.ble_protocol.messages import MsgType
from coinf.ble_protocol.radio import RadioError, preset, spawn
from coinf.ble_protocol.rpc import RpcClient

from tests.ble_servers import accept_link, close_servers

ROOT = Path(__file__).resolve().parents[1]

HANDHELD = textwrap.dedent(
    """
    import asyncio, sys
    from coinf.ble_protocol.central import Central
    from coinf.ble_protocol.messages import Message, MsgType
    from coinf.ble_protocol.rpc import serve

    async def echo(msg):
        return Message(MsgType.RESULT, msg.request_id, msg.payload[::-1])

    async def main():
        async with Central("coinf-wearable", bundle_identity="xp", hci=sys.argv[1],
                           passkey=123456) as central:
            await central.serve_with_reconnect(lambda link: serve(link, echo))

    asyncio.run(main())
    """
)


def test_wearable_and_handheld_in_separate_processes_over_radio_process() -> None:
    wspec, hspec, stop = spawn("ble5-2m", overrides=["time_scale=0.5"])
    env = dict(os.environ)
    handheld = subprocess.Popen([sys.executable, "-c", HANDHELD, hspec], env=env)
    try:

        async def main() -> None:
            link = await accept_link(wspec, bundle_identity="xp", timeout=60, mtu=247)
            client = RpcClient(link)
            payload = os.urandom(20_000)
            reply = await client.request(MsgType.REQUEST, payload, timeout=60)
            assert reply.type == MsgType.RESULT and reply.payload == payload[::-1]
            await client.close()
            await close_servers()

        asyncio.run(main())
    finally:
        handheld.kill()
        handheld.wait()
        stop()


def test_radio_parameters_are_validated() -> None:
    with pytest.raises(RadioError, match="unknown radio preset"):
        preset("ble6")
    with pytest.raises(RadioError, match="ll_payload"):
        preset("pi-zero-2w", ll_payload=300)
    with pytest.raises(RadioError, match="unknown radio parameter"):
        preset("pi-zero-2w", warp=9)
    p = preset("pi-zero-2w", interval_ms=15.0)
    assert p.capacity_bps() < preset("pi-zero-2w").capacity_bps()
    # 2M halves air time: more exchanges fit an event than at 1M with the same payload
    assert preset("ble5-2m").exchanges_per_event() > preset("ble42-dle").exchanges_per_event()


def test_radio_cli_describe_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from coinf.cli import main

    assert main(["radio", "--preset", "ble5-2m", "--set", "interval_ms=15", "--describe"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["interval_ms"] == 15.0 and out["capacity_bps"] == pytest.approx(
        preset("ble5-2m", interval_ms=15.0).capacity_bps(), abs=0.1
    )
    assert main(["radio", "--set", "warp=9", "--describe"]) == 2
    assert "bad radio override 'warp=9'" in capsys.readouterr().err
    assert main(["radio", "--set", "interval_ms=fast", "--describe"]) == 2
    assert "is not a float" in capsys.readouterr().err
    assert main(["wearable", "--bundle", "/nonexistent/bundle", "--hci", "tcp-client:x:1"]) == 2
    assert "error" in capsys.readouterr().err


def test_radio_sockets_disable_nagle() -> None:
    """HCI packets are tiny: with Nagle on, a packet written right after another waited for the
    host's delayed ACK (~40 ms per round trip in the emulation). Accepted sockets must have
    TCP_NODELAY."""
    import socket

    from coinf.ble_protocol.radio import EmulatedRadio

    async def main() -> list[int]:
        async with EmulatedRadio("pi-zero-2w") as radio:
            flags = []
            for port in radio.ports:
                _, writer = await asyncio.open_connection(radio.host, port)
                for _ in range(100):  # wait for the radio's side to accept
                    t = radio._transports[radio.ports.index(port)].sink.transport
                    if t is not None:
                        break
                    await asyncio.sleep(0.01)
                assert t is not None
                sock = t.get_extra_info("socket")
                flags.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                writer.close()
            return flags

    assert all(asyncio.run(main()))


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        # the process dies without a word: its controller falls silent, and the wearable's
        # controller reports the link lost after the LL supervision timeout (supervision_ms)
        ("kill", "CONNECTION_TIMEOUT"),
        # SIGSTOP: the controllers keep the connection up but the host stops answering; the
        # wearable PINGs a silent peer on the control characteristic and gives up after
        # SILENCE_LIMIT_S
        ("stop", "silent"),
    ],
)
def test_a_dead_or_stopped_handheld_is_detected(fault: str, reason: str) -> None:
    """Without these, the wearable would wait out the 60 s request timeout (the hang guard)."""
    import signal

    from coinf.errors import LinkClosed

    wspec, hspec, stop = spawn("ble5-2m", overrides=["time_scale=0.5", "supervision_ms=1000"])
    handheld = subprocess.Popen([sys.executable, "-c", HANDHELD, hspec])
    try:

        async def main() -> None:
            link = await accept_link(wspec, bundle_identity="xp", timeout=60, mtu=247)
            client = RpcClient(link)
            reply = await client.request(MsgType.REQUEST, b"alive", timeout=60)
            assert reply.payload == b"evila"
            if fault == "kill":
                handheld.kill()  # SIGKILL: no disconnect is ever sent
            else:
                handheld.send_signal(signal.SIGSTOP)
            with pytest.raises(LinkClosed, match=reason):
                await client.request(MsgType.REQUEST, b"anyone?", timeout=60)
            await client.close()
            await close_servers()

        asyncio.run(main())
    finally:
        handheld.send_signal(signal.SIGCONT)
        handheld.kill()
        handheld.wait()
        stop()
