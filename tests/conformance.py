"""Runs the conformance vectors of docs/conformance/vectors.json through coinf's own decoders.

Every vector names a ``layer``: which receiver takes its bytes (docs/conformance/README.md).
:func:`outcome` feeds the bytes to the real decoder of that layer and returns what happened,
``{"ok": FIELDS}`` or ``{"error": "CODE_NAME"}`` (chunks: one entry per chunk). The generator
(``tests/conformance_vectors.py``) records these outcomes; ``tests/test_conformance.py`` checks
that the committed file still matches them, so a file that drifts from the code fails.
"""

from __future__ import annotations

import asyncio
import json
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from coinf.ble_protocol import codecs, media
from coinf.ble_protocol.chunks import Reassembler
from coinf.ble_protocol.ctrl_frames import Ctrl, check_hello, parse_ctrl
from coinf.ble_protocol.flow import CreditGate
from coinf.ble_protocol.gatt import GattLink
from coinf.ble_protocol.loopback import SocketLink
from coinf.ble_protocol.messages import ErrorCode, Message, ProtocolError, decode_error
from coinf.ble_protocol.negotiate import hello_decoders
from coinf.ble_protocol.packing import unpack
from coinf.ble_protocol.request import Kind, decode_request, decode_result
from coinf.ble_protocol.tensors import decode_tensors
from coinf.handheld.daemon import HandheldDaemon, check_session_hello
from coinf.handheld.forward import Forwarder, Peer

from coinf.bundle import Bundle, Candidate, TensorSpec
from coinf.jsonobject import decode_json

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "docs" / "conformance" / "vectors.json"
#: what a vector's receiver accepts unless its ``params`` say otherwise
DEFAULT_MAX_BYTES = 4096


def load(path: Path = VECTORS) -> dict[str, Any]:
    return json.loads(path.read_text())


def array_fields(arr: np.ndarray) -> dict[str, Any]:
    """A decoded tensor as the file records it: dtype name, shape, little-endian bytes."""
    le = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    return {"dtype": str(arr.dtype), "shape": list(arr.shape), "data": le.tobytes().hex()}


def _error(exc: ProtocolError) -> dict[str, Any]:
    return {"error": ErrorCode(exc.code).name}


def _guard(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return {"ok": fn()}
    except ProtocolError as exc:
        return _error(exc)


# --- §3 control frames -------------------------------------------------------------------------


def _ctrl_fields(frame: bytes) -> dict[str, Any]:
    kind, body = parse_ctrl(frame)
    out: dict[str, Any] = {"kind": kind.name}
    if kind in (Ctrl.HELLO, Ctrl.HELLO_ACK):
        out["json"] = body
    elif kind == Ctrl.CREDIT:
        CreditGate(0).grant(body)  # 1..1024, else ValueError (MALFORMED on a link)
        out["n"] = body
    elif kind == Ctrl.ERROR:
        out.update(code=ErrorCode(body.code).name, text=body.text.removeprefix("peer: "))
    elif kind in (Ctrl.PING, Ctrl.PONG):
        out["nonce"] = body
    elif kind == Ctrl.SYNC:
        out["chunks"] = body
    elif kind == Ctrl.NACK:
        out.update(type=body[0], request_id=body[1], ranges=[list(r) for r in body[2]])
    else:  # ABORT, SENT, ACK
        out.update(dict(zip(("type", "request_id", "chunks"), body, strict=False)))
    return out


async def _link_failure(frame: bytes, ack: bool) -> str | None:
    """The code a GattLink (both sides announced "ack", or not) fails with when ``frame``
    arrives after the handshake, or None if it stays open."""
    async def nothing(_: bytes) -> None:
        return None

    async def gone() -> None:
        return None

    link = GattLink(role="wearable", mtu=517, peer_window=128, peer_max_message_bytes=1 << 20,
                    write_data=nothing, write_control=nothing, disconnect=gone, ack=ack)
    link.feed_control(frame)
    try:
        if link.is_open:
            return None
        await asyncio.wait_for(link.receive(), 5)
    except ProtocolError as exc:
        return ErrorCode(exc.code).name
    finally:
        await link.close()
    return None


def control(v: dict[str, Any]) -> dict[str, Any]:
    frame = bytes.fromhex(v["hex"])
    code = asyncio.run(_link_failure(frame, v.get("params", {}).get("ack", True)))
    try:
        fields = _ctrl_fields(frame)
    except (ProtocolError, ValueError):
        fields = None
    if fields is not None and fields["kind"] == Ctrl.ERROR.name:
        return {"ok": fields}  # the peer's fatal ERROR: read, and the link closes with it
    if code is not None or fields is None:
        return {"error": code}
    return {"ok": fields}


def handshake(v: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    """The control HELLO as the wearable checks it (§3)."""
    def run() -> dict[str, Any]:
        frame = bytes.fromhex(v["hex"])
        kind, obj = parse_ctrl(frame)
        mtu, window, limit = check_hello(obj, ctx["identity"])
        caps = obj["capabilities"]
        return {"kind": kind.name, "frame_bytes": len(frame), "mtu": mtu, "window": window,
                "max_message_bytes": limit, "heartbeat": caps.get("heartbeat") is True,
                "ack": caps.get("ack") is True}
    return _guard(run)


# --- §4 data chunks and §6 socket frames ---------------------------------------------------


def chunks(v: dict[str, Any]) -> dict[str, Any]:
    params = v.get("params", {})
    limit = params.get("max_message_bytes", DEFAULT_MAX_BYTES)
    reasm = Reassembler(max_message_bytes=limit, budget_bytes=limit + 64 * 1024,
                        remember_failed=not params.get("ack", False))
    steps: list[Any] = []
    for hexed in v["chunks"]:
        try:
            msg = reasm.feed(bytes.fromhex(hexed))
        except ProtocolError as exc:
            steps.append(_error(exc))
            continue
        steps.append(None if msg is None else {"message": _message(msg)})
    return {"steps": steps}


def _message(msg: Message) -> dict[str, Any]:
    return {"type": msg.type.name, "request_id": msg.request_id, "payload": msg.payload.hex()}


async def _socket_receive(data: bytes, limit: int) -> dict[str, Any]:
    a, b = socket.socketpair()
    try:
        reader, writer = await asyncio.open_connection(sock=a)
        link = SocketLink(reader, writer, max_message_bytes=limit)
        b.sendall(data)
        b.shutdown(socket.SHUT_WR)
        try:
            msg = await asyncio.wait_for(link.receive(), 5)
        except ProtocolError as exc:
            return _error(exc)
        finally:
            await link.close()
        return {"ok": _message(msg)}
    finally:
        b.close()


def socket_frame(v: dict[str, Any]) -> dict[str, Any]:
    limit = v.get("params", {}).get("max_message_bytes", DEFAULT_MAX_BYTES)
    return asyncio.run(_socket_receive(bytes.fromhex(v["hex"]), limit))


# --- §6 messages -------------------------------------------------------------------------------


def error_payload(v: dict[str, Any]) -> dict[str, Any]:
    err = decode_error(bytes.fromhex(v["hex"]))
    return {"ok": {"code": ErrorCode(err.code).name, "hop": err.hop, "text": err.text}}


def session_hello(v: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    return _guard(lambda: (check_session_hello(bytes.fromhex(v["hex"]), ctx["identity"]),
                           {})[1])


def decoders(v: dict[str, Any]) -> dict[str, Any]:
    ack = decode_json(bytes.fromhex(v["hex"]))
    own = v.get("params", {}).get("priors")
    return {"ok": {"decoders": sorted(hello_decoders(ack, own))}}


def tensor_map(v: dict[str, Any]) -> dict[str, Any]:
    limit = v.get("params", {}).get("max_bytes", DEFAULT_MAX_BYTES)
    return _guard(lambda: {"tensors": {k: array_fields(a) for k, a in decode_tensors(
        bytes.fromhex(v["hex"]), max_bytes=limit).items()}})


def packed(v: dict[str, Any]) -> dict[str, Any]:
    limit = v.get("params", {}).get("max_bytes", DEFAULT_MAX_BYTES)
    return _guard(lambda: array_fields(unpack(bytes.fromhex(v["hex"]), max_bytes=limit)))


def request_fields(payload: bytes) -> dict[str, Any]:
    request, blob = decode_request(payload)
    out: dict[str, Any] = {"kind": request.kind.name, "nonce": request.nonce}
    if request.kind == Kind.STAGES:
        out["hops"] = [{"device": h.device, "from": h.start, "to": h.end, "gamma": h.gamma,
                        "packing": "" if h.packing == "raw" else h.packing}
                       for h in request.hops]
    elif request.kind == Kind.TILE:
        t = request.tile
        assert t is not None
        out["tile"] = [t.i0, t.i1, t.r0, t.r1, t.c0, t.c1]
    out["tensor_map"] = bytes(blob).hex()
    return out


def request_header(v: dict[str, Any]) -> dict[str, Any]:
    return _guard(lambda: request_fields(bytes.fromhex(v["hex"])))


def result(v: dict[str, Any]) -> dict[str, Any]:
    p = v["params"]

    def run() -> dict[str, Any]:
        stats, blob = decode_result(bytes.fromhex(v["hex"]), p["count"], p.get("nonce"))
        return {"hops": [[s.compute_us, s.send_us, s.nbytes] for s in stats],
                "tensor_map": bytes(blob).hex()}
    return _guard(run)


# --- §6.8 identity and §6.9-6.12 requests on the context bundle ----------------------------


def bundle_of(manifest: dict[str, Any]) -> Bundle:
    """A :class:`Bundle` of a manifest alone (no files: enough for identities and for every
    check a request passes before anything runs)."""
    model = manifest["model"]
    return Bundle(root=Path(tempfile.gettempdir()) / "coinf-conformance-bundle",
                  model_file=model["file"], model_sha256=model["sha256"],
                  inputs=tuple(TensorSpec.from_json(t) for t in model["inputs"]),
                  outputs=tuple(TensorSpec.from_json(t) for t in model["outputs"]),
                  candidates=tuple(Candidate.from_json(c) for c in manifest["candidates"]),
                  meta={k: w for k, w in manifest.items()
                        if k not in {"format", "version", "model", "candidates"}})


def identity(v: dict[str, Any]) -> dict[str, Any]:
    b = bundle_of(v["manifest"])
    return {"ok": {"identity": b.identity, "priors": b.priors_digest,
                   "cuts_json": json.dumps(b.identity_cuts(), sort_keys=True)}}


async def _request(payload: bytes, bundle: Bundle, params: dict[str, Any]) -> dict[str, Any]:
    pipe = params.get("pipeline")
    forward = None if pipe is None else Forwarder(
        bundle, pipe["name"], {n: Peer(n, "unix:/nonexistent") for n in pipe["peers"]})
    daemon = HandheldDaemon(bundle, max_request_bytes=params.get("max_request_bytes"),
                            forward=forward)
    try:
        request, blob = daemon.admit(payload)
        if request.kind == Kind.STAGES and len(request.hops) > 1:
            assert forward is not None
            await forward.handle(request, blob)  # vectors of several hops all fail first
            raise AssertionError("a pipeline vector passed every check")
        feeds = daemon.decode(request, blob)
        return {"ok": {"tensors": {k: array_fields(a) for k, a in feeds.items()}}}
    except ProtocolError as exc:
        return _error(exc)
    finally:
        await daemon.aclose()


def request(v: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    return asyncio.run(_request(bytes.fromhex(v["hex"]), bundle_of(ctx["bundle"]),
                                v.get("params", {})))


LAYERS: dict[str, Callable[..., dict[str, Any]]] = {
    "control": control, "handshake": handshake, "chunks": chunks, "socket": socket_frame,
    "error_payload": error_payload, "session_hello": session_hello, "decoders": decoders,
    "tensor_map": tensor_map, "packed": packed, "request_header": request_header,
    "result": result, "identity": identity, "request": request}
#: layers whose receiver needs the file's ``context``
WITH_CONTEXT = {"handshake", "session_hello", "request"}


def outcome(v: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    """What coinf's receiver makes of vector ``v``."""
    fn = LAYERS[v["layer"]]
    return fn(v, ctx) if v["layer"] in WITH_CONTEXT else fn(v)


def runnable(v: dict[str, Any]) -> bool:
    """False for a vector whose codec library is not installed here (Pillow, soundfile)."""
    need = v.get("needs")
    if need == "zstd":
        return codecs.AVAILABLE
    return need is None or need in media.available()
