"""TLS on the tcp: links between devices (docs/PROTOCOL.md §15): real sockets, real ``ssl``, a
real daemon. Paired devices are served; an unpaired client, one without a certificate and a
plain one get no byte; a squatter on a helper's address gets no byte of the wearable's and the
frame finishes locally; TLS-stalling connections are dropped at the deadline and cannot lock
out a paired device; the stores stay private. Assertions are on states and counters."""

from __future__ import annotations

import asyncio
import os
import ssl
import stat
from pathlib import Path

import numpy as np
import pytest
from coinf.ble_protocol.link import Link
from coinf.ble_protocol.listen import open_listener
from coinf.ble_protocol.loopback import connect_socket
from coinf.ble_protocol.messages import Message, MsgType
from coinf.ble_protocol.rpc import RpcClient
from coinf.ble_protocol.rpc import serve as rpc_serve
from coinf.ble_protocol.socket_listener import SocketListener
from coinf.ble_protocol.tls import client_context
from coinf.ble_protocol.tls_store import (
    TlsStore,
    TlsStoreError,
    default_store,
    parse_fingerprint,
)
from coinf.ble_protocol.transport import open_connector
from coinf.handheld.daemon import HandheldDaemon
from coinf.wearable.options import LinkOptions
from coinf.wearable.session import AsyncSession

from coinf.cli.bench.attack import attacker_requests
from coinf.errors import InputError, LinkClosed, ProtocolError, UntrustedPeer
from tests.bundles import fixed, make_tiny_bundle, reference
from tests.test_listen import infer
from tests.tls_keys import make_store

X = np.random.default_rng(3).standard_normal((1, 16)).astype(np.float32)


async def bytes_back(reader: asyncio.StreamReader) -> int:
    """Every byte the server sends until it closes (an error ends it too), within 10 s."""
    got = 0
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 10):
            got += len(chunk)
    except (ConnectionError, ssl.SSLError, TimeoutError):
        pass
    return got


async def until(check, what: str) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def host_port(listener: SocketListener) -> tuple[str, int]:
    host, port = listener.address.split(":")[1:]
    return host, int(port)


def test_stores_are_private(tmp_path: Path) -> None:
    store = make_store(tmp_path / "tls")
    assert stat.S_IMODE(os.stat(store.directory).st_mode) == 0o700
    for file in (store.identity_file, store.peers_file):
        assert stat.S_IMODE(os.stat(file).st_mode) == 0o600
    assert store.pinned(store.fingerprint) is not None
    os.chmod(store.peers_file, 0o644)  # loosened by hand: tightened on the next read
    TlsStore(store.directory).peers()
    assert stat.S_IMODE(os.stat(store.peers_file).st_mode) == 0o600
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    with pytest.raises(TlsStoreError, match="chmod 700"):
        TlsStore(shared).ensure_identity()
    assert not (shared / "identity.pem").exists()
    assert TlsStore(store.directory).fingerprint == store.fingerprint  # the same key, kept
    assert store.revoke("self") and store.pinned(store.fingerprint) is None
    assert parse_fingerprint(store.fingerprint.upper().replace("SHA256:", "")) == \
        store.fingerprint
    with pytest.raises(InputError, match="64 hex"):
        parse_fingerprint("sha256:abcd")


def test_an_unpaired_client_gets_no_byte(tmp_path: Path) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    stranger = make_store(tmp_path / "stranger")  # trusts itself; the helper does not know it
    stranger.pin("helper", default_store().certificate_der())

    async def main() -> None:
        async with HandheldDaemon(bundle) as daemon, \
                open_listener("tcp:127.0.0.1:0") as listener:
            assert isinstance(listener, SocketListener)
            serving = asyncio.ensure_future(daemon.serve_listener(listener))
            host, port = host_port(listener)
            paired = RpcClient(await connect_socket(listener.address))
            np.testing.assert_allclose(await infer(paired, bundle, X), reference(bundle, X),
                                       rtol=1e-5, atol=1e-6)
            bare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            bare.check_hostname, bare.verify_mode = False, ssl.CERT_NONE
            attempts = [("unpaired", client_context(stranger)), ("no certificate", bare),
                        ("plain", None)]
            for _what, ctx in attempts:
                reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
                for data in attacker_requests(bundle):  # HELLO, STATUS, PROFILE, REQUEST
                    writer.write(data)
                assert await bytes_back(reader) == 0
                writer.close()
            await until(lambda: listener.tls_refused == 3, "three refusals counted")
            assert daemon.connections == 1 and daemon.requests == 1  # the paired one only
            # through the library: a clear refusal once the server's alert arrives
            link = await connect_socket(listener.address, tls=stranger)
            with pytest.raises(LinkClosed, match="does it trust this device"):
                await asyncio.wait_for(link.receive(), 10)
            await paired.close()
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)

    asyncio.run(main())


def test_a_squatter_gets_nothing_and_the_frame_finishes_locally(tmp_path: Path) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    squatter = make_store(tmp_path / "squatter")
    squatter.pin("victim", default_store().certificate_der())  # it would serve the wearable
    seen: list[Message] = []

    async def record(msg: Message) -> Message:
        seen.append(msg)
        return Message(MsgType.HELLO_ACK, msg.request_id, b"{}")

    async def serve(link: Link) -> None:
        try:
            await rpc_serve(link, record)
        finally:
            await link.close()

    async def main() -> None:
        async with open_listener("tcp:127.0.0.1:0", tls=squatter) as listener:
            assert isinstance(listener, SocketListener)

            served: set[asyncio.Task[None]] = set()

            async def loop() -> None:
                async for link in listener:
                    served.add(asyncio.ensure_future(serve(link)))

            accepting = asyncio.ensure_future(loop())
            # not paired with the wearable: refused before a byte of the wearable's is sent
            with pytest.raises(UntrustedPeer, match="not paired with this device"):
                await open_connector(listener.address).connect(5)
            # pinned to the real helper's fingerprint: a clear mismatch
            real = default_store().fingerprint
            with pytest.raises(UntrustedPeer, match="is not the pinned helper"):
                await open_connector(listener.address, fingerprint=real).connect(5)
            opts = fixed("c000", link=LinkOptions(transport=listener.address, timeout=5.0))
            async with AsyncSession(bundle, opts) as sess:
                for _ in range(2):
                    (y,) = await asyncio.wait_for(sess.run(None, {"x": X}), 60)
                    np.testing.assert_allclose(y, reference(bundle, X), rtol=1e-5, atol=1e-6)
                    assert sess.last_run is not None and sess.last_run.local
                assert "not paired" in (sess.last_run.fallback or "") or \
                    "retry in" in (sess.last_run.fallback or "")
            accepting.cancel()
            await asyncio.gather(accepting, return_exceptions=True)
        assert seen == []  # no HELLO, no request, no activation ever reached it

    asyncio.run(main())


def test_tls_stalling_connections_are_dropped_and_do_not_lock_out_a_paired_client(
        tmp_path: Path) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")

    async def main() -> None:
        async with HandheldDaemon(bundle) as daemon, open_listener(
                "tcp:127.0.0.1:0", handshake_timeout=1.0, max_links=8,
                max_links_per_peer=4) as listener:
            assert isinstance(listener, SocketListener)
            serving = asyncio.ensure_future(daemon.serve_listener(listener))
            host, port = host_port(listener)
            flood = []
            for i in range(40):  # another device: half a ClientHello, then silence
                reader, writer = await asyncio.open_connection(
                    host, port, local_addr=(f"127.0.0.{2 + i % 3}", 0))
                writer.write(b"\x16\x03\x01\x02\x00\x01")
                flood.append((reader, writer))
            assert listener.open_links <= 8
            paired = RpcClient(await connect_socket(listener.address))
            np.testing.assert_allclose(await infer(paired, bundle, X), reference(bundle, X),
                                       rtol=1e-5, atol=1e-6)
            for reader, _ in flood:  # each one closed: evicted, refused or timed out
                assert await bytes_back(reader) == 0
            await until(lambda: listener.tls_timeouts + listener.evicted
                        + listener.refused_peer + listener.refused == 40, "all 40 dropped")
            assert listener.tls_timeouts >= 1 and listener.tls_refused == 0
            await until(lambda: listener.open_links == 1, "the flood's slots freed")
            assert daemon.connections == 1
            for _, writer in flood:
                writer.close()
            await paired.close()
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)

    asyncio.run(main())


def test_plain_links_are_an_explicit_opt_out(tmp_path: Path) -> None:
    async def main() -> None:
        async with open_listener("tcp+insecure:127.0.0.1:0", allow_insecure=True) as plain:
            address = plain.address  # type: ignore[attr-defined]
            assert address.startswith("tcp+insecure:")
            tls_address = address.replace("tcp+insecure:", "tcp:")
            with pytest.raises(LinkClosed, match="TLS handshake"):  # tcp: never goes plain
                await connect_socket(tls_address, 1)
            tried = await asyncio.wait_for(plain.accept(), 10)
            with pytest.raises(ProtocolError, match="magic"):  # its ClientHello, as a frame
                await asyncio.wait_for(tried.receive(), 10)
            link = await connect_socket(address, 5, allow_insecure=True)
            served = await asyncio.wait_for(plain.accept(), 10)
            await link.send(Message(MsgType.PROBE, 1, b"hi"))
            assert (await asyncio.wait_for(served.receive(), 10)).payload == b"hi"
            await link.close()

    asyncio.run(main())
    with pytest.raises(InputError, match="plain link"):
        open_listener("unix:/tmp/x.sock", tls=True)
    with pytest.raises(InputError, match="TLS links"):
        open_connector("tcp+insecure:127.0.0.1:9", fingerprint="sha256:" + "0" * 64,
                       allow_insecure=True)


def test_a_pipeline_config_pins_a_helper_fingerprint(tmp_path: Path) -> None:
    from coinf.wearable.connection import helper_connection
    from coinf.wearable.pipeline_config import load_helpers

    fp = default_store().fingerprint
    (helper,) = load_helpers({"helpers": [{"name": "h1", "address": "tcp:127.0.0.1:9",
                                           "fingerprint": fp.upper().replace("SHA256:", "")}]})
    assert helper.fingerprint == fp
    with pytest.raises(InputError, match=r"helpers\[0\]\.fingerprint"):
        load_helpers({"helpers": [{"name": "h1", "address": "tcp:127.0.0.1:9",
                                   "fingerprint": "sha256:12"}]})
    conn = helper_connection(helper, make_tiny_bundle(tmp_path / "b"), connect_timeout=1.0,
                             request_timeout=1.0, max_backoff_s=1.0)
    assert conn.connector.fingerprint == fp  # type: ignore[attr-defined]
