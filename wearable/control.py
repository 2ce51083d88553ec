"""The wearable service's control socket: ``coinf push`` tells a running service to reload.

A unix socket (0660: the service's user and group, which provisioning gives the admin user;
default ``$COINF_CONTROL`` or ``/run/coinf/control.sock``, the systemd unit's ``RuntimeDirectory``)
carrying one JSON object per line each way, one request per connection:

    -> {"op": "reload"}           <- {"ok": true, "identity": "<bundle identity>", "previous": ...}
    -> {"op": "status"}           <- {"ok": true, "identity": ..., "bundle": "/path", "since": t}
    anything else                 <- {"ok": false, "error": "..."}

``reload`` re-reads the bundle directory the service was started with (``coinf push`` has just
swapped it in): a bundle that does not load leaves the old one serving and answers ``ok: false``
with the reason. Requests are bounded (:data:`MAX_REQUEST_BYTES`, nested at most
``MAX_JSON_DEPTH`` deep: :func:`coinf.ble_protocol.messages.decode_json`) and must arrive within
:data:`READ_TIMEOUT_S`; only the service's user and group can reach the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coinf.ble_protocol.messages import MAX_JSON_DEPTH, decode_json

from coinf.errors import BundleError, ErrorCode, ProtocolError, UserError

MAX_REQUEST_BYTES = 4096
MAX_REPLY_BYTES = 65536
READ_TIMEOUT_S = 5.0
DEFAULT_CONTROL = "/run/coinf/control.sock"


def default_control_path() -> str:
    return os.environ.get("COINF_CONTROL") or DEFAULT_CONTROL


class ControlError(UserError):
    """The service's control socket is missing, or the service refused the request."""


class BundleHolder:
    """The bundle a service serves, reloadable in place. ``on_change(identity)`` is called after
    a successful reload (e.g. to set ``WearableServer.bundle_identity``)."""

    def __init__(self, path: str | Path, on_change: Callable[[str], None] | None = None) -> None:
        from coinf.bundle import Bundle

        self.path = Path(path)
        self.bundle = Bundle.load(self.path)
        self.on_change = on_change
        self.since = time.time()

    @property
    def identity(self) -> str:
        return str(self.bundle.identity)

    def reload(self) -> dict[str, Any]:
        from coinf.bundle import Bundle

        previous = self.identity
        try:
            fresh = Bundle.load(self.path)
        except BundleError as exc:
            return {"ok": False, "error": f"bundle at {self.path} does not load: {exc}",
                    "identity": previous}
        self.bundle, self.since = fresh, time.time()
        if self.on_change:
            self.on_change(self.identity)
        return {"ok": True, "identity": self.identity, "previous": previous}

    def status(self) -> dict[str, Any]:
        return {"ok": True, "identity": self.identity, "bundle": str(self.path),
                "since": round(self.since, 3)}

    def handle(self, request: Any) -> dict[str, Any]:
        op = request.get("op") if isinstance(request, dict) else None
        if op == "reload":
            return self.reload()
        if op == "status":
            return self.status()
        return {"ok": False, "error": f"unknown op {op!r}; expected 'reload' or 'status'"}


def parse_request(line: bytes) -> dict[str, Any]:
    """One request line (its newline stripped or not), checked: a JSON object of at most
    :data:`MAX_REQUEST_BYTES`, nested at most ``MAX_JSON_DEPTH`` deep (a deep one raised
    RecursionError here once), whose ``op`` is ``"reload"`` or ``"status"``. Raises
    :class:`ProtocolError` saying what is wrong."""
    request = decode_json(line.rstrip(b"\r\n"), MAX_REQUEST_BYTES, "control request")
    if not isinstance(request, dict):
        raise ProtocolError(ErrorCode.MALFORMED, "a control request must be a JSON object")
    op = request.get("op")
    if op not in ("reload", "status"):
        shown = repr(op)[:40] if isinstance(op, str | int | float | bool | None) else (
            type(op).__name__)
        raise ProtocolError(ErrorCode.MALFORMED,
                            f"unknown op {shown}; expected 'reload' or 'status'")
    return request


async def _serve_one(holder: BundleHolder, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
    try:
        try:
            line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
        except (TimeoutError, ValueError):  # too slow, or a line beyond the stream's limit
            line = b""
        try:
            reply = holder.handle(parse_request(line))
        except ProtocolError as exc:
            reply = {"ok": False, "error": f"{exc.text}; expected one JSON object per line "
                                           f"(<= {MAX_REQUEST_BYTES} B, nested at most "
                                           f"{MAX_JSON_DEPTH} deep)"}
        writer.write(json.dumps(reply).encode() + b"\n")
        await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


async def start_control(holder: BundleHolder, path: str | Path) -> asyncio.AbstractServer:
    """Listen on ``path`` (replacing a stale socket); the socket file is 0660 (owner, group)."""
    sock = Path(path)
    sock.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    old = os.umask(0o117)
    try:
        server = await asyncio.start_unix_server(
            lambda r, w: _serve_one(holder, r, w), str(sock), limit=MAX_REQUEST_BYTES + 2)
    finally:
        os.umask(old)
    return server


def control_request(path: str | Path, request: dict[str, Any],
                    timeout: float = 10.0) -> dict[str, Any]:
    """Send one request to the service at ``path`` and return its reply (a client for
    ``coinf wearable reload``); :class:`ControlError` when nothing answers."""
    import socket

    if not Path(path).exists():
        raise ControlError(f"no wearable service control socket at {path} (is the service "
                           f"running? `systemctl status coinf-wearable`)")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(path))
            s.sendall(json.dumps(request).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n") and len(data) <= MAX_REPLY_BYTES:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError as exc:
            raise ControlError(f"control socket {path}: {exc}") from None
    try:
        return decode_json(data, MAX_REPLY_BYTES, "reply")
    except ProtocolError as exc:
        raise ControlError(f"control socket {path} answered {data[:80]!r}: {exc.text}") \
            from None


__all__ = ["BundleHolder", "ControlError", "control_request",
           "default_control_path", "start_control"]
