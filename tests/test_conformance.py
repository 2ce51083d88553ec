"""The conformance vectors (docs/conformance/vectors.json) against coinf's own receivers and
encoders: every vector decodes to its recorded fields or its one error, every valid vector coinf
can make re-encodes to the same bytes, and the file is exactly what its generator writes."""

from __future__ import annotations

import copy
import hashlib
import struct
import zlib
from typing import Any

import numpy as np
import pytest
from coinf.ble_protocol import arq
from coinf.ble_protocol.chunks import encode_chunks
from coinf.ble_protocol.ctrl_frames import (
    Ctrl,
    ctrl_abort,
    ctrl_credit,
    ctrl_error,
    ctrl_json,
    ctrl_ping,
    parse_ctrl,
)
from coinf.ble_protocol.loopback import frame_header
from coinf.ble_protocol.messages import ErrorCode, Message, MsgType, encode_error
from coinf.ble_protocol.packing import pack
from coinf.ble_protocol.request import Hop, HopStats, Kind, Request, encode_request, encode_result
from coinf.ble_protocol.tensors import encode_tensors

from coinf.tile import Tile
from tests import conformance

DATA = conformance.load()
VECTORS = DATA["vectors"]
CTX = DATA["context"]


def test_the_file_is_small_versioned_and_covers_the_spec() -> None:
    assert DATA["format"] == "coinf-conformance-vectors" and DATA["version"] == 1
    assert conformance.VECTORS.stat().st_size < 200_000
    ids = [v["id"] for v in VECTORS]
    assert len(ids) == len(set(ids)) and len(ids) >= 60
    layers = {v["layer"] for v in VECTORS}
    assert layers == set(conformance.LAYERS)
    # issue 52's gaps that are about bytes or the order of checks each have a vector
    covered = {g for v in VECTORS for g in v.get("gaps", [])}
    assert set(range(1, 12)) <= covered
    for v in VECTORS:
        assert v["section"].startswith("§") and v["note"]
    spec = (conformance.ROOT / "docs" / "PROTOCOL.md").read_text()
    assert f"holds {len(VECTORS)} byte-exact vectors" in spec  # §14 states the current count


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_coinf_decodes_every_vector_as_recorded(vector: dict[str, Any]) -> None:
    if not conformance.runnable(vector):
        pytest.skip(f"{vector['needs']} is not installed")
    assert conformance.outcome(vector, CTX) == vector["expect"]


def test_a_changed_expectation_is_caught() -> None:
    """The comparison above can fail: a vector whose recorded error is another code, or whose
    decoded bytes differ by one bit, no longer matches what coinf does."""
    bad = copy.deepcopy(next(v for v in VECTORS if v["id"] == "ctrl-credit-0"))
    bad["expect"] = {"error": "TRUNCATED"}
    assert conformance.outcome(bad, CTX) != bad["expect"]
    flipped = copy.deepcopy(next(v for v in VECTORS if v["id"] == "packed-q3"))
    data = bytearray(bytes.fromhex(flipped["expect"]["ok"]["data"]))
    data[0] ^= 1
    flipped["expect"]["ok"]["data"] = data.hex()
    assert conformance.outcome(flipped, CTX) != flipped["expect"]


def _array(fields: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(fields["dtype"]).newbyteorder("<")
    return np.frombuffer(bytes.fromhex(fields["data"]), dtype=dtype).reshape(fields["shape"])


def _control(ok: dict[str, Any], raw: bytes) -> bytes:
    kind = Ctrl[ok["kind"]]
    if kind == Ctrl.CREDIT:
        return ctrl_credit(ok["n"])
    if kind in (Ctrl.PING, Ctrl.PONG):
        return ctrl_ping(ok["nonce"], pong=kind == Ctrl.PONG)
    if kind == Ctrl.ABORT:
        return ctrl_abort(ok["type"], ok["request_id"])
    if kind == Ctrl.ERROR:
        return ctrl_error(ErrorCode[ok["code"]], ok["text"])
    body = {Ctrl.SENT: lambda: arq.sent_body(ok["type"], ok["request_id"], ok["chunks"]),
            Ctrl.ACK: lambda: arq.ack_body(ok["type"], ok["request_id"]),
            Ctrl.NACK: lambda: arq.nack_body(ok["type"], ok["request_id"],
                                             [tuple(r) for r in ok["ranges"]]),
            Ctrl.SYNC: lambda: arq.sync_body(ok["chunks"])}[kind]()
    return bytes([kind]) + body


def _request(ok: dict[str, Any]) -> bytes:
    kind = Kind[ok["kind"]]
    if kind == Kind.STAGES:
        hops = [Hop(h["from"], h["to"], h["device"], h["gamma"], h["packing"] or "raw")
                for h in ok["hops"]]
        request = Request.route(hops, ok["nonce"])
    elif kind == Kind.TILE:
        request = Request.for_tile(Tile(*ok["tile"]), ok["nonce"])
    else:
        request = Request(Kind.REST, nonce=ok["nonce"])
    return encode_request(request, bytes.fromhex(ok["tensor_map"]))


def reencoded(v: dict[str, Any]) -> bytes | list[bytes]:
    """The bytes coinf's encoder makes from the vector's decoded fields."""
    ok = v["expect"].get("ok")
    raw = bytes.fromhex(v.get("hex", ""))
    layer = v["layer"]
    if layer == "control":
        return _control(ok, raw)
    if layer == "handshake":
        return ctrl_json(Ctrl.HELLO, parse_ctrl(raw)[1])
    if layer == "chunks":
        msg = v["expect"]["steps"][-1]["message"]
        message = Message(MsgType[msg["type"]], msg["request_id"], bytes.fromhex(msg["payload"]))
        return list(encode_chunks(message, v["reencode"]["chunk_size"]))
    if layer == "socket":
        head = frame_header(MsgType[ok["type"]], ok["request_id"], len(ok["payload"]) // 2)
        frame = head + bytes.fromhex(ok["payload"])
        return frame + struct.pack("<I", zlib.crc32(frame))
    if layer == "error_payload":
        return encode_error(ErrorCode[ok["code"]], ok["text"], ok["hop"])
    if layer == "tensor_map":
        return encode_tensors({k: _array(t) for k, t in ok["tensors"].items()})
    if layer == "packed":
        return pack(_array(ok), v["reencode"]["spec"])
    if layer == "request_header":
        return _request(ok)
    if layer == "result":
        return encode_result([HopStats(*h) for h in ok["hops"]],
                             bytes.fromhex(ok["tensor_map"]), v["params"]["nonce"])
    raise AssertionError(f"no encoder for layer {layer}")


ENCODED = [v for v in VECTORS if v.get("reencode")]


@pytest.mark.parametrize("vector", ENCODED, ids=[v["id"] for v in ENCODED])
def test_every_valid_vector_coinf_makes_reencodes_to_its_bytes(vector: dict[str, Any]) -> None:
    got = reencoded(vector)
    if vector["layer"] == "chunks":
        assert [c.hex() for c in got] == vector["chunks"]
    else:
        assert isinstance(got, bytes) and got.hex() == vector["hex"]


def test_identity_vectors_hash_their_recorded_text() -> None:
    """A stranger can check each step: cuts_json is the exact text hashed (§6.8)."""
    for v in (v for v in VECTORS if v["layer"] == "identity"):
        ok = v["expect"]["ok"]
        digest = hashlib.sha256(ok["cuts_json"].encode("ascii")).hexdigest()
        assert ok["identity"] == v["manifest"]["model"]["sha256"][:16] + "-" + digest[:8]
    example = next(v for v in VECTORS if v["id"] == "identity-example")
    assert example["expect"]["ok"]["identity"] == "820344ba8a4f649c-aef22ec8"  # §6.8's text


def test_the_file_is_what_the_generator_writes() -> None:
    """Cases, code and the committed file agree: regenerate with
    ``python -m tests.conformance_vectors`` after changing either."""
    from tests.conformance_vectors import build, text

    if not all(conformance.runnable(v) for v in VECTORS):
        pytest.skip("a codec library of the vectors is not installed: the generator needs all")
    assert conformance.VECTORS.read_text() == text(build())
