"""Handheld listeners (tcp, unix, ble over the emulated radio) serving a real daemon, and the
BumbleHost that the ble listener's central runs on."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from bleak import BleakClient
from bleak.exc import BleakError
from coinf.ble_protocol.bleak_bumble import BumbleBleakClient, BumbleHost
from coinf.ble_protocol.central import Central
from coinf.ble_protocol.central_listener import CentralListener
from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.listen import open_listener
from coinf.ble_protocol.loopback import connect_socket
from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    ErrorCode,
    Message,
    MsgType,
    ProtocolError,
    encode_json,
)
from coinf.ble_protocol.peripheral import WearableServer
from coinf.ble_protocol.radio import EmulatedRadio
from coinf.ble_protocol.rpc import RpcClient
from coinf.ble_protocol.rpc import serve as rpc_serve
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from coinf.handheld.daemon import HandheldDaemon

from coinf.errors import InputError
from tests.ble_servers import HANDHELD_PAIRING, WEARABLE_PAIRING
from tests.bundles import make_tiny_bundle, reference
from tests.wire import result_blob, tail_request

WEARABLE_ADDR = "C0:F1:00:00:00:01"


async def infer(client: RpcClient, bundle, x: np.ndarray) -> np.ndarray:
    """HELLO, then one REQUEST for the handheld-only candidate, as a wearable would."""
    hello = {"protocol": PROTOCOL_VERSION, "bundle": bundle.identity}
    await client.request(MsgType.HELLO, encode_json(hello), 30)
    reply = await client.request(
        MsgType.REQUEST, tail_request(bundle, "c000", encode_tensors({"x": x})), 60
    )
    return decode_tensors(result_blob(reply.payload))["y"]


def test_unknown_specs_and_options_are_input_errors() -> None:
    for bad in ["udp:1.2.3.4:5", "", "bluetooth", "TCP:1.2.3.4:5"]:
        with pytest.raises(InputError, match=r"tcp:HOST:PORT, tcp\+insecure:HOST:PORT, "
                                             r"unix:/path, ble or ble:HCI"):
            open_listener(bad)
    for bad in ["tcp", "tcp:localhost", "unix:"]:
        with pytest.raises(InputError, match="expected unix:"):
            open_listener(bad)
    with pytest.raises(InputError, match="unknown option 'bundle_identity'"):
        open_listener("tcp:127.0.0.1:0", bundle_identity="b")
    with pytest.raises(InputError, match="max_links"):
        open_listener("unix:/tmp/x.sock", max_links=0)
    with pytest.raises(InputError, match="bundle_identity"):
        open_listener("ble:tcp-client:127.0.0.1:1")
    with pytest.raises(InputError, match="unknown ble listener option 'colour'"):
        open_listener("ble", bundle_identity="b", colour="red")
    os_stack = open_listener("ble", bundle_identity="b", name="my-wearable", attempts=1)
    assert isinstance(os_stack, CentralListener) and os_stack.spec == "ble"
    assert os_stack.central.hci is None and os_stack.central.target == "my-wearable"
    bumble = open_listener("ble:tcp-client:127.0.0.1:9", bundle_identity="b")
    assert bumble.spec == "ble:tcp-client:127.0.0.1:9"
    assert isinstance(bumble, CentralListener) and bumble.central.hci == "tcp-client:127.0.0.1:9"


def test_socket_listeners_do_not_import_the_ble_stack() -> None:
    code = (
        "import sys\n"
        "from coinf.ble_protocol.listen import open_listener\n"
        "open_listener('tcp:127.0.0.1:0'); open_listener('unix:/tmp/x.sock')\n"
        "print(sorted(m for m in ('bleak', 'bumble', 'coinf.ble_protocol.central')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_socket_listener_serves_a_real_daemon(tmp_path, kind: str) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    x = np.random.default_rng(5).standard_normal((1, 16)).astype(np.float32)
    path = tmp_path / "hh.sock"
    if kind == "unix":  # a stale socket file, as a killed daemon leaves it
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(path))
        stale.close()
    spec = "tcp:127.0.0.1:0" if kind == "tcp" else f"unix:{path}"

    async def main() -> None:
        async with HandheldDaemon(bundle) as daemon, open_listener(spec) as listener:
            address = listener.address  # type: ignore[attr-defined]
            serving = asyncio.create_task(daemon.serve_listener(listener))
            first = RpcClient(await connect_socket(address))
            second = RpcClient(await connect_socket(address))  # two wearables at once
            for client in (first, second):
                y = await infer(client, bundle, x)
                np.testing.assert_allclose(y, reference(bundle, x), rtol=1e-5, atol=1e-6)
            await first.close()
            # the daemon noticed and closed its end; the other wearable is still served
            y = await infer(second, bundle, x)
            np.testing.assert_allclose(y, reference(bundle, x), rtol=1e-5, atol=1e-6)
            assert daemon.connections == 2 and daemon.requests == 3
            assert not serving.done()
        # leaving the listener closed the link it handed out
        with pytest.raises(LinkClosed):
            await second.request(MsgType.PROBE, b"anyone?", 10)
        await second.close()
        await asyncio.wait_for(serving, 10)  # the listener ended: so did the loop

    asyncio.run(main())
    if kind == "unix":
        assert not path.exists()  # the listener removed its socket file


def test_socket_listener_bounds_the_links_it_hands_out(tmp_path) -> None:
    async def main() -> None:
        async with open_listener("tcp:127.0.0.1:0", max_links=1) as listener:
            address = listener.address  # type: ignore[attr-defined]
            first = await connect_socket(address)
            served = await asyncio.wait_for(listener.accept(), 10)
            # handshaken (a link that is not yet would give its slot to the next connection)
            await first.send(Message(MsgType.HELLO, 1, b"{}"))
            await served.send(Message(MsgType.HELLO_ACK, (await served.receive()).request_id,
                                      b"{}"))
            assert (await asyncio.wait_for(first.receive(), 10)).type == MsgType.HELLO_ACK
            with pytest.raises(LinkClosed):  # closed by the listener: one link is out
                second = await connect_socket(address)  # (TLS: during the handshake)
                await asyncio.wait_for(second.receive(), 10)
            assert listener.refused == 1  # type: ignore[attr-defined]
            await served.close()  # released: the next connection is taken
            with pytest.raises(LinkClosed):
                await asyncio.wait_for(first.receive(), 10)
            third = await connect_socket(address)
            link = await asyncio.wait_for(listener.accept(), 10)
            await third.send(Message(MsgType.PROBE, 1, b"hi"))
            assert (await asyncio.wait_for(link.receive(), 10)).payload == b"hi"
            for end in (first, third):
                await end.close()

    asyncio.run(main())


def test_listener_that_cannot_bind_says_so(tmp_path) -> None:
    regular = tmp_path / "not-a-socket"
    regular.write_text("keep me")

    async def main() -> None:
        with pytest.raises(InputError, match="cannot listen on"):
            async with open_listener(f"unix:{regular}"):
                pass

    asyncio.run(main())
    assert regular.read_text() == "keep me"  # only a stale socket is ever replaced


def test_ble_listener_serves_a_daemon_and_reconnects(tmp_path) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    x = np.random.default_rng(6).standard_normal((1, 16)).astype(np.float32)

    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio:
            wspec, hspec = radio.specs
            server = WearableServer(wspec, bundle_identity=bundle.identity, **WEARABLE_PAIRING)
            await server.start()
            try:
                async with HandheldDaemon(bundle) as daemon, open_listener(
                    f"ble:{hspec}", bundle_identity=bundle.identity, timeout=10, backoff=0.1,
                    **HANDHELD_PAIRING,
                ) as listener:
                    serving = asyncio.create_task(daemon.serve_listener(listener))
                    for _ in range(2):  # the second time, after the wearable dropped the link
                        client = RpcClient(await server.accept(60))
                        y = await infer(client, bundle, x)
                        np.testing.assert_allclose(y, reference(bundle, x), rtol=1e-5, atol=1e-6)
                        await client.close()
                    assert daemon.connections == 2 and daemon.requests == 2
                    assert not serving.done()
                await asyncio.wait_for(serving, 10)  # the listener ended: so did the loop
            finally:
                await server.close()

    asyncio.run(main())


def test_ble_listener_stops_on_a_bundle_mismatch(tmp_path) -> None:
    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio:
            wspec, hspec = radio.specs
            server = WearableServer(wspec, bundle_identity="model-A", **WEARABLE_PAIRING)
            await server.start()
            try:
                async with open_listener(
                    f"ble:{hspec}", bundle_identity="model-B", timeout=10, **HANDHELD_PAIRING
                ) as listener:
                    with pytest.raises(ProtocolError) as info:
                        await asyncio.wait_for(listener.accept(), 60)
                    assert info.value.code == ErrorCode.BUNDLE_MISMATCH
                    with pytest.raises(ProtocolError):  # and stays stopped
                        await listener.accept()
            finally:
                await server.close()

    asyncio.run(main())


def test_central_serves_with_reconnect_until_stopped() -> None:
    async def echo(msg: Message) -> Message:
        return Message(MsgType.RESULT, msg.request_id, msg.payload[::-1])

    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio:
            wspec, hspec = radio.specs
            server = WearableServer(wspec, bundle_identity="b", **WEARABLE_PAIRING)
            await server.start()
            try:
                served: list[Link] = []

                async def serve_link(link: Link) -> None:
                    served.append(link)
                    await rpc_serve(link, echo)

                stop = asyncio.Event()
                async with Central(
                    "coinf-wearable", bundle_identity="b", hci=hspec, timeout=10, backoff=0.1,
                    **HANDHELD_PAIRING,
                ) as central:
                    task = asyncio.create_task(central.serve_with_reconnect(serve_link, stop=stop))
                    for _ in range(2):
                        client = RpcClient(await server.accept(60))
                        reply = await client.request(MsgType.REQUEST, b"abc", 30)
                        assert reply.payload == b"cba"
                        await client.close()  # the wearable drops the link: the central is back
                    stop.set()  # most likely while it reconnects: that attempt is cancelled
                    await asyncio.wait_for(task, 10)
                assert len(served) == 2 and not any(link.is_open for link in served)
            finally:
                await server.close()

    asyncio.run(main())


def test_bumble_host_closes_its_device_and_connections() -> None:
    async def main() -> None:
        async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio:
            wspec, hspec = radio.specs
            server = WearableServer(wspec, bundle_identity="b", **WEARABLE_PAIRING)
            await server.start()
            try:
                host = BumbleHost(hspec, **HANDHELD_PAIRING)
                with pytest.raises(BleakError, match="not open"):
                    _ = host.device
                async with host:
                    device = host.device
                    accept = asyncio.ensure_future(server.accept(30))
                    central = Central(WEARABLE_ADDR, bundle_identity="b", host=host, timeout=10)
                    hl = await central.connect()
                    wl = await accept
                    assert device.connections
                # leaving the host dropped its connection: the wearable's link fails
                with pytest.raises(LinkClosed):
                    await asyncio.wait_for(wl.receive(), 10)
                assert not device.powered_on and not device.connections
                assert not hl.is_open
                with pytest.raises(BleakError, match="closed"):
                    _ = host.device
                with pytest.raises(BleakError, match="closed"):
                    await host.open()
                await central.aclose()
                # the bleak backend refuses to run without an open host
                with pytest.raises(BleakError, match="host="):
                    BleakClient(WEARABLE_ADDR, backend=BumbleBleakClient)
                # and the radio takes a new host on the same transport
                async with BumbleHost(hspec, **HANDHELD_PAIRING) as again, Central(
                    WEARABLE_ADDR, bundle_identity="b", host=again, timeout=10
                ) as central2:
                    accept = asyncio.ensure_future(server.accept(30))
                    await central2.connect()
                    await accept
            finally:
                await server.close()

    asyncio.run(main())


def test_coinf_handheld_listens_where_told(tmp_path) -> None:
    """The command line: --listen unix:..., and the older --transport ble --hci spelling."""
    from tests.procs import handheld_daemon

    bundle = make_tiny_bundle(tmp_path / "b")
    x = np.ones((1, 16), np.float32)
    sock = tmp_path / "hh.sock"

    async def over_socket() -> np.ndarray:
        client = RpcClient(await connect_socket(f"unix:{sock}"))
        try:
            return await infer(client, bundle, x)
        finally:
            await client.close()

    with handheld_daemon(bundle.root, f"unix:{sock}") as proc:
        y = asyncio.run(over_socket())
        np.testing.assert_allclose(y, reference(bundle, x), rtol=1e-5, atol=1e-6)
        assert proc.poll() is None
    from coinf.cli import main

    assert main(["handheld", "--bundle", str(bundle.root), "--listen", "carrier-pigeon"]) == 2
    assert main(["handheld", "--bundle", str(bundle.root), "--listen", "tcp:127.0.0.1:0",
                 "--hci", "tcp-client:127.0.0.1:1"]) == 2
    assert os.path.exists(bundle.root)
