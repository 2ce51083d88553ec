"""Issue 41, part 3: ``coinf handheld``'s flags set the socket listener's limits."""

from __future__ import annotations

import argparse

import pytest
from coinf.ble_protocol.listen import open_listener
from coinf.ble_protocol.socket_listener import SocketListener

from coinf.cli.commands import handheld
from coinf.errors import UserError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    handheld.register(parser)
    return parser.parse_args(["--bundle", "b", *argv])


def test_the_flags_reach_the_socket_listener() -> None:
    args = parse("--max-links", "3", "--max-links-per-peer", "1", "--hello-timeout", "0.5",
                 "--idle-timeout", "30")
    limits = handheld.socket_limits(args, "tcp:127.0.0.1:7878")
    assert limits == {"max_links": 3, "max_links_per_peer": 1, "handshake_timeout": 0.5,
                      "idle_timeout": 30.0}
    listener = open_listener("tcp:127.0.0.1:7878", **limits)
    assert isinstance(listener, SocketListener)
    assert (listener.max_links, listener.max_links_per_peer, listener.handshake_timeout,
            listener.idle_timeout) == (3, 1, 0.5, 30.0)
    assert handheld.socket_limits(parse(), "ble") == {}  # nothing given: the defaults
    # a pipeline helper's peers listen on a socket even when the wearable comes over BLE
    assert handheld.socket_limits(args, "ble:x", "tcp:127.0.0.1:7000") == limits
    with pytest.raises(UserError, match="--max-links limits a socket listener"):
        handheld.socket_limits(args, "ble:tcp-client:127.0.0.1:1")
