"""Plain TCP stays opt-in and visibly so (docs/SECURITY.md, PROTOCOL.md §15): ``tcp+insecure:``
and ``tls=False`` need ``allow_insecure=True`` (``--insecure-plaintext``), log a WARNING at every
start, and an unauthenticated client learns at most the HELLO_ACK that §6.5 lists, only by
presenting the bundle identity, and holds no slot past the handshake deadline."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from coinf.ble_protocol.listen import open_listener
from coinf.ble_protocol.loopback import connect_socket
from coinf.ble_protocol.messages import PROTOCOL_VERSION, MsgType, decode_json, encode_json
from coinf.ble_protocol.rpc import RpcClient
from coinf.ble_protocol.socket_listener import SocketListener
from coinf.ble_protocol.transport import open_connector
from coinf.handheld.daemon import HandheldDaemon
from coinf.wearable.pipeline_config import load_helpers

from coinf.cli import main
from coinf.errors import ErrorCode, InputError, LinkClosed, ProtocolError
from tests.bundles import make_tiny_bundle, reference
from tests.test_listen import infer

PLAIN = "tcp+insecure:127.0.0.1:0"
#: the keys docs/PROTOCOL.md §6.5 lists for the handheld's HELLO_ACK
HELLO_ACK_KEYS = {"bundle", "capabilities", "compressors", "decoders", "priors", "protocol",
                  "role"}
X = np.random.default_rng(9).standard_normal((1, 16)).astype(np.float32)


def test_plain_tcp_needs_the_flag_and_warns_each_start(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    for make in (lambda: open_listener(PLAIN), lambda: open_connector("tcp+insecure:1.2.3.4:5"),
                 lambda: open_connector("tcp:1.2.3.4:5", tls=False),
                 lambda: open_listener("tcp:127.0.0.1:0", tls=False)):
        with pytest.raises(InputError, match=r"plain TCP .* allow_insecure=True "
                                             r"\(--insecure-plaintext"):
            make()
    with pytest.raises(InputError, match="allow_insecure=True"):
        asyncio.run(connect_socket("tcp+insecure:127.0.0.1:9", 1))
    with pytest.raises(InputError, match="allow_insecure must be True or False"):
        open_listener(PLAIN, allow_insecure="yes")
    open_connector("unix:/tmp/none.sock")  # unix: stays plain without a flag

    async def twice() -> None:
        for _ in range(2):
            async with open_listener(PLAIN, allow_insecure=True):
                pass

    caplog.set_level(logging.WARNING)
    asyncio.run(twice())
    open_connector("tcp+insecure:1.2.3.4:5", allow_insecure=True)
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("INSECURE")]
    assert len(warned) == 3 and "listener on tcp+insecure:127.0.0.1:0" in warned[0]
    assert "connector to tcp+insecure:1.2.3.4:5" in warned[2]


def test_the_command_line_refuses_plain_tcp_without_the_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    for argv in (["handheld", "--bundle", str(bundle.root), "--listen", PLAIN],
                 ["run", str(bundle.root), "--transport", "socket", "--handheld",
                  "tcp+insecure:127.0.0.1:9", "--split", "c000"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "--insecure-plaintext" in lines[0], err
        assert "Traceback" not in err


def test_a_pipeline_config_must_allow_plain_helpers() -> None:
    entry: dict[str, Any] = {"name": "h1", "address": "tcp+insecure:127.0.0.1:7878"}
    with pytest.raises(InputError, match=r'helpers\[0\] tcp\+insecure:.*"allow_insecure": true'):
        load_helpers({"helpers": [entry]})
    with pytest.raises(InputError, match="allow_insecure must be true or false"):
        load_helpers({"helpers": [{**entry, "allow_insecure": 1}]})
    (helper,) = load_helpers({"helpers": [{**entry, "allow_insecure": True}]})
    assert helper.allow_insecure
    assert helper.connector_options(helper.address) == {"allow_insecure": True}
    tls = {"name": "h2", "address": "tcp:127.0.0.1:7879"}
    assert not load_helpers({"helpers": [tls]})[0].connector_options(tls["address"])


async def _error(client: RpcClient, mtype: MsgType, payload: bytes = b"") -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        await client.request(mtype, payload, 10)
    return caught.value


def test_an_unauthenticated_client_learns_only_the_hello_ack(tmp_path: Path) -> None:
    """Before a HELLO, a plain link is served nothing (UNSUPPORTED); a HELLO naming another
    bundle is refused without naming this one; a HELLO with the identity gets exactly the
    HELLO_ACK of §6.5, then the link is served like any."""
    bundle = make_tiny_bundle(tmp_path / "b")

    async def main_() -> None:
        async with HandheldDaemon(bundle) as daemon, \
                open_listener(PLAIN, allow_insecure=True) as listener:
            daemon.spawn(daemon.serve_listener(listener))
            client = RpcClient(await connect_socket(listener.address,  # type: ignore[attr-defined]
                                                    allow_insecure=True))
            for mtype, payload in ((MsgType.STATUS, b""), (MsgType.PROFILE, b""),
                                   (MsgType.REQUEST, b"\x00" * 64)):
                err = await _error(client, mtype, payload)
                assert err.code == ErrorCode.UNSUPPORTED and "HELLO first" in str(err)
            wrong = {"protocol": PROTOCOL_VERSION, "bundle": "0" * 16 + "-" + "0" * 8}
            err = await _error(client, MsgType.HELLO, encode_json(wrong))
            assert err.code == ErrorCode.BUNDLE_MISMATCH
            assert bundle.identity not in str(err)
            assert (await _error(client, MsgType.STATUS)).code == ErrorCode.UNSUPPORTED
            hello = {"protocol": PROTOCOL_VERSION, "bundle": bundle.identity}
            ack = await client.request(MsgType.HELLO, encode_json(hello), 10)
            assert ack.type == MsgType.HELLO_ACK
            assert set(decode_json(ack.payload)) <= HELLO_ACK_KEYS
            assert set(decode_json(ack.payload)) >= HELLO_ACK_KEYS - {"compressors"}
            status = await client.request(MsgType.STATUS, b"", 10)
            assert status.type == MsgType.STATUS
            np.testing.assert_allclose(await infer(client, bundle, X), reference(bundle, X),
                                       rtol=1e-5, atol=1e-6)
            assert daemon.requests == 1
            await client.close()

    asyncio.run(main_())


def test_a_chatty_client_without_hello_holds_no_slot_past_the_deadline(tmp_path: Path) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")

    async def main_() -> None:
        async with HandheldDaemon(bundle) as daemon, \
                open_listener(PLAIN, allow_insecure=True, handshake_timeout=0.5) as listener:
            assert isinstance(listener, SocketListener)
            daemon.spawn(daemon.serve_listener(listener))
            client = RpcClient(await connect_socket(listener.address, allow_insecure=True))
            refused, last = 0, None
            for _ in range(400):  # STATUS every 50 ms, never a HELLO, until the link closes
                last = await _error(client, MsgType.STATUS)
                if last.code != ErrorCode.UNSUPPORTED:
                    break
                refused += 1
                await asyncio.sleep(0.05)
            assert refused >= 1 and isinstance(last, LinkClosed) and not client.link.is_open
            assert listener.handshake_timeouts == 1
            assert listener.open_links == 0 and daemon.requests == 0

    asyncio.run(main_())
