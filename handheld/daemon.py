"""The handheld daemon: answers a wearable's handshake, runs tails, returns results.

One daemon serves one bundle. It is transport-agnostic: give :meth:`HandheldDaemon.serve` any
:class:`~ble_protocol.link.Link` (socket, in-process, BLE).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import numpy as np
from coinf.ble_protocol import rpc
from coinf.ble_protocol.link import Link
from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    ErrorCode,
    Message,
    MsgType,
    ProtocolError,
    decode_json,
    decode_request,
    encode_json,
    encode_result,
)
from coinf.ble_protocol.packing import LOSSLESS_SPEC, pack
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from coinf.convert.bundle import Bundle
from coinf.device.emulation import DeviceEmulation
from coinf.device.profile import DeviceProfile
from coinf.device.runtime import TailRunner
from coinf.device.status import read_status

log = logging.getLogger(__name__)

CAPABILITIES = ["raw", "packed"]


def encode_results(outputs: dict[str, np.ndarray]) -> bytes:
    """Results travel losslessly: each tensor raw or shuffled + LZ4, whichever is smaller."""
    packed = {}
    for name, arr in outputs.items():
        body = pack(arr, LOSSLESS_SPEC)
        if len(body) < arr.nbytes:
            packed[name] = body
    return encode_tensors({k: v for k, v in outputs.items() if k not in packed}, packed=packed)


class HandheldDaemon:
    """Tail side of coinf. ``handle`` is the RPC handler; ``serve`` runs it over a link."""

    def __init__(
        self,
        bundle: Bundle,
        emulation: DeviceEmulation | None = None,
        lru: int = 4,
        max_request_bytes: int = 64 * 1024 * 1024,
        profile: DeviceProfile | None = None,
    ) -> None:
        self.bundle = bundle
        self.profile = profile
        self.tails = TailRunner(bundle, emulation, capacity=lru)
        self.max_request_bytes = max_request_bytes
        self.requests = 0
        self.started = time.monotonic()

    def hello_payload(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL_VERSION,
            "bundle": self.bundle.identity,
            "role": "handheld",
            "capabilities": CAPABILITIES,
        }

    def status(self) -> dict[str, Any]:
        """``device`` is a :class:`~device.status.DeviceStatus` (load, clock, battery)."""
        try:
            device = read_status().to_json()
        except ImportError:  # psutil not installed: no device figures
            device = {}
        return {
            "device": device,
            "role": "handheld",
            "requests": self.requests,
            "uptime_s": round(time.monotonic() - self.started, 1),
            "tails_loaded": self.tails.loaded,
        }

    async def handle(self, msg: Message) -> Message | None:
        if msg.type == MsgType.HELLO:
            hello = decode_json(msg.payload)
            if hello.get("protocol") != PROTOCOL_VERSION:
                raise ProtocolError(
                    ErrorCode.BAD_VERSION,
                    f"wearable speaks protocol {hello.get('protocol')}, "
                    f"handheld speaks {PROTOCOL_VERSION}",
                )
            if hello.get("bundle") != self.bundle.identity:
                raise ProtocolError(
                    ErrorCode.BUNDLE_MISMATCH,
                    f"wearable has bundle {hello.get('bundle')}, handheld has "
                    f"{self.bundle.identity}: split the same model on both sides",
                )
            return Message(MsgType.HELLO_ACK, msg.request_id, encode_json(self.hello_payload()))
        if msg.type == MsgType.STATUS:
            return Message(MsgType.STATUS, msg.request_id, encode_json(self.status()))
        if msg.type == MsgType.PROFILE:
            if self.profile is None:
                raise ProtocolError(ErrorCode.MALFORMED, "this handheld has no device profile")
            payload = json.dumps(self.profile.to_json(), separators=(",", ":")).encode()
            return Message(MsgType.PROFILE, msg.request_id, payload)
        if msg.type == MsgType.REQUEST:
            if len(msg.payload) > self.max_request_bytes:
                raise ProtocolError(ErrorCode.TOO_LARGE, "request exceeds the daemon's limit")
            cid, blob = decode_request(msg.payload)
            feeds = decode_tensors(blob, max_bytes=self.max_request_bytes)
            outputs, elapsed = await asyncio.get_running_loop().run_in_executor(
                None, self.tails.run, cid, feeds
            )
            self.requests += 1
            payload = encode_result(int(elapsed * 1e6), encode_results(outputs))
            return Message(MsgType.RESULT, msg.request_id, payload)
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"handheld does not accept {msg.type.name}")

    async def serve(self, link: Link) -> None:
        """Serve one connected wearable until the link closes."""
        log.info("wearable connected over %s", link.description)
        await rpc.serve(link, self.handle)
        log.info("wearable on %s went away", link.description)
