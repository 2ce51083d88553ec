"""The conformance vectors' inputs (``tests/conformance_vectors.py`` writes them out with
coinf's outcomes). Each case: ``id``, ``layer`` (the receiver, tests/conformance.py),
``section`` of docs/PROTOCOL.md, ``gaps`` (issue 52's spec gaps it pins), ``note``, the bytes
(``hex``; ``chunks``: a list; ``manifest``: identity), optional ``params`` and ``reencode``
(how coinf's encoder makes the same bytes), and ``intent``: "ok" or the one error code."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
from coinf.ble_protocol import arq
from coinf.ble_protocol.chunks import encode_chunks
from coinf.ble_protocol.ctrl_frames import (
    Ctrl,
    ctrl_abort,
    ctrl_credit,
    ctrl_error,
    ctrl_json,
    ctrl_ping,
    make_hello,
)
from coinf.ble_protocol.loopback import frame_header
from coinf.ble_protocol.messages import ErrorCode, Message, MsgType, encode_error, encode_json
from coinf.ble_protocol.packing import pack
from coinf.ble_protocol.request import Hop, HopStats, Kind, Request, encode_request, encode_result
from coinf.ble_protocol.tensors import encode_tensors

from coinf.tile import Tile
from tests.conformance_cases_packed import packed_cases

MODEL_SHA = "820344ba8a4f649c5dab62fa804da6fe0817fa94f0926d40f372766bbccb93b6"
NONCE = 0x11223344


def case(cid: str, layer: str, section: str, intent: str, note: str, *,
         gaps: list[int] | None = None, **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"id": cid, "layer": layer, "section": section}
    if gaps:
        out["gaps"] = gaps
    out["note"] = note
    for key, value in fields.items():
        out[key] = value.hex() if isinstance(value, bytes) else value
    out["intent"] = intent
    return out


# --- the context bundle (request vectors) ---------------------------------------------------


def _tensor(name: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "shape": shape, "dtype": "float32", "nbytes": 4 * int(np.prod(shape))}


def _cand(cid: str, crossing: list[dict[str, Any]], head: list[str], head_file: bool,
          tail_file: bool, sha: str | None) -> dict[str, Any]:
    def part(has: bool, side: str) -> dict[str, Any]:
        out: dict[str, Any] = {"file": f"{cid}/{side}.onnx" if has else None, "flops": 0,
                               "param_bytes": 0, "nodes": head if side == "head" else []}
        if has and sha is not None:
            out["sha256"] = hashlib.sha256(f"{cid} {side}".encode()).hexdigest()
        return out
    return {"id": cid, "label": cid, "crossing": crossing, "head": part(head_file, "head"),
            "tail": part(tail_file, "tail")}


def bundle_manifest() -> dict[str, Any]:
    """Four cuts (handheld-only, c001, c002, wearable-only) and one compressor g2 at c001."""
    nodes = ["conv1", "relu1", "fc1", "fc2"]
    cands = [_cand("handheld-only", [_tensor("image", [1, 1, 4, 4])], [], False, True, "y"),
             _cand("c001", [_tensor("relu1_out", [1, 4])], nodes[:2], True, True, "y"),
             _cand("c002", [_tensor("fc1_out", [1, 3])], nodes[:3], True, True, "y"),
             _cand("wearable-only", [_tensor("logits", [1, 3])], nodes, True, False, "y")]
    comp = {"candidate": "c001", "gamma": 2, "encoder": "compressors/c001-g2.encoder.onnx",
            "decoder": "compressors/c001-g2.decoder.onnx", "code": _tensor("code", [1, 2]),
            "flops": 0, "accuracy": {"raw": 1.0}, "code_bytes": {"raw": 8},
            "sha256": hashlib.sha256(b"c001 g2").hexdigest()}
    return {"format": "coinf-bundle", "version": 1,
            "model": {"file": "model.onnx", "sha256": MODEL_SHA,
                      "inputs": [_tensor("image", [1, 1, 4, 4])],
                      "outputs": [_tensor("logits", [1, 3])]},
            "candidates": cands,
            "compressors": {"base_accuracy": {"raw": 1.0}, "entries": [comp]}}


def context_identity() -> str:
    from tests.conformance import bundle_of

    return bundle_of(bundle_manifest()).identity


# --- §3 control frames ---------------------------------------------------------------------


def control_cases() -> Iterator[dict[str, Any]]:
    c = "control"
    ok = [("credit-32", ctrl_credit(32), "CREDIT 32"),
          ("abort", ctrl_abort(3, 5), "ABORT of REQUEST 5"),
          ("ping", ctrl_ping(1), "PING nonce 1"), ("pong", ctrl_ping(1, pong=True), "its PONG"),
          ("sent", bytes([Ctrl.SENT]) + arq.sent_body(3, 5, 12), "SENT after 12 chunks"),
          ("ack", bytes([Ctrl.ACK]) + arq.ack_body(3, 5), "ACK of REQUEST 5"),
          ("nack", bytes([Ctrl.NACK]) + arq.nack_body(3, 5, [(496, 992)]), "NACK 496..992"),
          ("nack-all", bytes([Ctrl.NACK]) + arq.nack_body(3, 5, []), "n = 0: the whole message"),
          ("sync", bytes([Ctrl.SYNC]) + arq.sync_body(40), "SYNC 40"),
          ("error", ctrl_error(ErrorCode.BUNDLE_MISMATCH, "other bundle"),
           "the peer's fatal ERROR: read, then the link closes with its code")]
    for name, frame, note in ok:
        yield case(f"ctrl-{name}", c, "§3", "ok", note, hex=frame, reencode=True)
    yield case("ctrl-sent-without-ack", c, "§3", "ok", "SENT on a link where not both sides "
               "announced ack: ignored, the link stays up", hex=ok[4][1],
               params={"ack": False}, reencode=True)
    bad = [("empty", b"", "TRUNCATED", "an empty frame"),
           ("kind-12", b"\x0c\x00", "UNKNOWN_TYPE", "kind 12 is not defined"),
           ("credit-0", ctrl_credit(0), "MALFORMED", "CREDIT n must be 1..1024"),
           ("credit-1025", ctrl_credit(1025), "MALFORMED", "CREDIT n must be 1..1024"),
           ("credit-3-bytes", ctrl_credit(32) + b"\x00", "MALFORMED", "CREDIT body is 2 bytes"),
           ("error-short", b"\x04\x07", "TRUNCATED", "an ERROR body under 2 bytes"),
           ("ping-short", b"\x06\x01\x00\x00", "MALFORMED", "PING body is 4 bytes"),
           ("abort-long", ctrl_abort(3, 5) + b"\x00", "MALFORMED", "ABORT body is 5 bytes"),
           ("nack-empty-range", bytes([Ctrl.NACK]) + arq.ack_body(3, 5) + b"\x01"
            + struct.pack("<II", 8, 8), "MALFORMED", "a NACK range needs start < end"),
           ("nack-33", bytes([Ctrl.NACK]) + arq.ack_body(3, 5) + b"\x21"
            + struct.pack("<II", 0, 1) * 33, "MALFORMED", "at most 32 NACK ranges"),
           ("hello-after-handshake", ctrl_json(Ctrl.HELLO, {"protocol": 2}), "MALFORMED",
            "HELLO after the handshake is fatal")]
    for name, frame, code, note in bad:
        yield case(f"ctrl-{name}", c, "§3", code, note, hex=frame)


def _hello(**caps: Any) -> dict[str, Any]:
    obj = make_hello(IDENTITY_CTX[0], 517)
    mtu = caps.pop("mtu", None)
    if mtu is not None:
        obj["mtu"] = mtu
    for key, value in caps.items():
        if value is None:
            obj["capabilities"].pop(key, None)
        else:
            obj["capabilities"][key] = value
    return obj


def handshake_cases() -> Iterator[dict[str, Any]]:
    h, s = "handshake", "§3"

    def hello(cid: str, intent: str, note: str, obj: Any, gaps: list[int] | None = None,
              raw: bytes | None = None) -> dict[str, Any]:
        frame = raw if raw is not None else ctrl_json(Ctrl.HELLO, obj)
        return case(f"hello-{cid}", h, s, intent, note, gaps=gaps, hex=frame,
                    reencode=raw is None)
    yield hello("default", "ok", "coinf's HELLO at MTU 517: 180 bytes", _hello(), [11])
    yield hello("no-ack", "ok", "without \"ack\": 169 bytes (the MTU arithmetic of §3)",
                _hello(ack=None), [11])
    yield hello("longest", "ok", "window 1024 and a 10-digit limit: 183 bytes, the longest "
                "with coinf's keys", _hello(window=1024, max_message_bytes=4294967295), [11])
    yield hello("heartbeat-string", "ok", "only JSON true counts as true",
                _hello(heartbeat="true"))
    wrong = dict(_hello(), protocol=3, bundle="0000000000000000-00000000")
    yield hello("order-version", "BAD_VERSION", "protocol and bundle both wrong: protocol "
                "is checked first", wrong, [10])
    nomtu = dict(_hello(), bundle="0000000000000000-00000000")
    del nomtu["mtu"]
    yield hello("order-bundle", "BUNDLE_MISMATCH", "bundle wrong and mtu missing: bundle "
                "first", nomtu, [10])
    nocaps = _hello()
    del nocaps["capabilities"]
    yield hello("no-capabilities", "MALFORMED", "capabilities missing (row 3)", nocaps, [10])
    yield hello("mtu-22", "MALFORMED", "mtu below 23 (row 4)", _hello(mtu=22), [10])
    yield hello("window-0", "MALFORMED", "window 0 (row 5)", _hello(window=0), [10])
    yield hello("window-1025", "MALFORMED", "window over 1024", _hello(window=1025))
    yield hello("limit-0", "MALFORMED", "max_message_bytes 0 (row 6)",
                _hello(max_message_bytes=0), [10])
    yield hello("array", "MALFORMED", "the body must be a JSON object", None,
                raw=b"\x01[2]")
    yield hello("nan", "MALFORMED", "NaN is not JSON", None,
                raw=b'\x01{"protocol":NaN}')
    yield hello("over-4096", "TOO_LARGE", "a body over 4096 bytes", None,
                raw=b'\x01{"x":"' + b"a" * 4096 + b'"}')


# --- §4 chunks, §6 socket frames and ERROR payloads ---------------------------------------------


def _chunks(msg: Message, size: int) -> list[str]:
    return [c.hex() for c in encode_chunks(msg, size)]


def _chunk(mtype: int, rid: int, total: int, offset: int, data: bytes, version: int = 2
           ) -> str:
    return (struct.pack("<BBIII", version, mtype, rid, total, offset) + data).hex()


def chunk_cases() -> Iterator[dict[str, Any]]:
    k, s = "chunks", "§4"
    probe2, probe3 = Message(MsgType.PROBE, 2, bytes(16)), Message(MsgType.PROBE, 3, bytes(16))
    one = _chunks(probe2, 512)
    four = _chunks(probe3, 20)
    yield case("chunk-probe", k, s, "ok", "§4's example: one 34-byte chunk", chunks=one,
               reencode={"chunk_size": 512})
    yield case("chunk-probe-4", k, s, "ok", "the same payload in 4 chunks of 20 bytes",
               chunks=four, reencode={"chunk_size": 20})
    yield case("chunk-reordered", k, s, "ok", "chunks in any order; a duplicate is ignored",
               chunks=[four[2], four[0], four[0], four[3], four[1]])
    yield case("chunk-after-complete", k, s, "ok", "a chunk of a completed (type, id) is "
               "ignored (rule 4)", chunks=[*one, one[0]])
    yield case("chunk-short", k, s, "TRUNCATED", "13 bytes: shorter than the header (rule 1)",
               chunks=[one[0][:26]])
    yield case("chunk-version-1", k, s, "BAD_VERSION", "version 1 (rule 2)",
               chunks=[_chunk(6, 2, 16, 0, b"\x00", version=1)])
    yield case("chunk-type-10", k, s, "UNKNOWN_TYPE", "type 10, and too large: the type is "
               "checked first (rules 3, 5)", chunks=[_chunk(10, 2, 1 << 20, 0, b"\x00")])
    yield case("chunk-too-large", k, s, "TOO_LARGE", "total_length over the receiver's 4096 "
               "(rule 5)", chunks=[_chunk(6, 2, 5000, 0, b"\x00")])
    yield case("chunk-past-end", k, s, "MALFORMED", "offset + data past total_length + 4 "
               "(rule 6)", chunks=[_chunk(6, 2, 4, 6, b"\x00\x00\x00")])
    yield case("chunk-empty-data", k, s, "MALFORMED", "a chunk without data (rule 6)",
               chunks=[_chunk(6, 2, 4, 0, b"")])
    yield case("chunk-length-changed", k, s, "MALFORMED", "total_length differs from the "
               "first chunk's (rule 9)", chunks=[four[0], _chunk(6, 3, 17, 6, bytes(6))])
    bad_crc = [*four[:3], four[3][:-2] + "00"]
    yield case("chunk-bad-crc", k, s, "BAD_CRC", "the last byte arrives, the CRC fails "
               "(rule 11, without ack)", chunks=bad_crc)


def _frame(mtype: int, rid: int, payload: bytes, *, magic: bytes = b"CF", version: int = 2,
           crc_xor: int = 0) -> bytes:
    head = struct.pack("<2sBBII", magic, version, mtype, rid, len(payload))
    crc = zlib.crc32(payload, zlib.crc32(head)) ^ crc_xor
    return head + payload + struct.pack("<I", crc)


def socket_cases() -> Iterator[dict[str, Any]]:
    k, s = "socket", "§6"
    probe = frame_header(6, 2, 16) + bytes(16)
    probe += struct.pack("<I", zlib.crc32(probe))
    yield case("socket-probe", k, s, "ok", "§6's PROBE example", hex=probe, reencode=True)
    yield case("socket-cancel", k, s, "ok", "§6's CANCEL example", hex=_frame(8, 7, b""),
               reencode=True)
    yield case("socket-magic", k, s, "MALFORMED", "bad magic", hex=_frame(6, 2, b"", magic=b"CG"))
    yield case("socket-version", k, s, "BAD_VERSION", "version 1; magic before version",
               hex=_frame(6, 2, b"", version=1))
    yield case("socket-too-large", k, s, "TOO_LARGE", "payload_len over the receiver's 4096, "
               "refused at the header", hex=_frame(6, 2, b"")[:8] + struct.pack("<I", 5000))
    yield case("socket-crc", k, s, "BAD_CRC", "a CRC mismatch",
               hex=_frame(6, 2, b"ab", crc_xor=1))
    yield case("socket-type-10", k, s, "UNKNOWN_TYPE", "type 10 with a good CRC",
               hex=_frame(10, 2, b""))
    yield case("socket-type-10-bad-crc", k, s, "BAD_CRC", "type 10 and a bad CRC: the CRC is "
               "checked before the type", hex=_frame(10, 2, b"", crc_xor=1))


def error_cases() -> Iterator[dict[str, Any]]:
    k, s = "error_payload", "§6"
    yield case("error-busy", k, s, "ok", "ERROR BUSY, not about one hop (255)",
               hex=encode_error(ErrorCode.BUSY, "busy"), reencode=True)
    yield case("error-hop-1", k, s, "ok", "ERROR DISCONNECTED at the route's hop 1",
               hex=encode_error(ErrorCode.DISCONNECTED, "next hop left", hop=1), reencode=True)
    yield case("error-unknown-code", k, s, "ok", "an unknown code reads as MALFORMED",
               hex=struct.pack("<HB", 99, 255) + b"x")
    yield case("error-short", k, s, "ok", "a payload under 3 bytes reads as MALFORMED",
               hex=b"\x0a\x00")


# --- §6.5 session handshake and decoders -----------------------------------------------------


def session_cases() -> Iterator[dict[str, Any]]:
    k, s = "session_hello", "§6.5"
    example = {"bundle": "", "capabilities": ["raw", "packed"], "decoders": ["f16", "f32", "q"],
               "protocol": 2, "role": "wearable"}

    def hello(**kw: Any) -> bytes:
        return encode_json({**example, "bundle": IDENTITY_CTX[0], **kw})
    yield case("session-hello", k, s, "ok", "a wearable's HELLO", hex=hello())
    yield case("session-capabilities-ignored", k, s, "ok", "capabilities and decoders are not "
               "checked: anything goes", gaps=[3],
               hex=hello(capabilities={"x": 1}, decoders=7, role=None))
    yield case("session-order", k, s, "BAD_VERSION", "protocol 1 and another bundle: protocol "
               "first", gaps=[7], hex=hello(protocol=1, bundle="x"))
    yield case("session-bundle", k, s, "BUNDLE_MISMATCH", "another bundle", hex=hello(bundle="x"))
    yield case("session-not-object", k, s, "MALFORMED", "a JSON array", hex=b"[1]")
    yield case("session-over-4096", k, s, "TOO_LARGE", "over 4096 bytes",
               hex=b'{"x":"' + b"a" * 4100 + b'"}')


IDENTITY_CTX: list[str] = [""]


def decoder_cases() -> Iterator[dict[str, Any]]:
    k, s = "decoders", "§6.5"
    digest = "d" * 64

    def ack(**kw: Any) -> bytes:
        return json.dumps({"protocol": 2, **kw}, separators=(",", ":"), sort_keys=True).encode()
    yield case("decoders-mandatory-added", k, s, "ok", "a list without the mandatory names: "
               "they are added", gaps=[5], hex=ack(decoders=["png"]))
    yield case("decoders-absent", k, s, "ok", "no decoders list: the legacy set", gaps=[5],
               hex=ack())
    yield case("decoders-qz-means-zstd", k, s, "ok", "qz without zstd reads as both; "
               "non-strings are ignored", hex=ack(decoders=["qz", 4, None]))
    yield case("decoders-ans-same-priors", k, s, "ok", "ans counts when priors equal the "
               "receiver's own digest", gaps=[4], hex=ack(decoders=["ans"], priors=digest),
               params={"priors": digest})
    yield case("decoders-ans-other-priors", k, s, "ok", "ans is dropped for another digest",
               gaps=[4], hex=ack(decoders=["ans"], priors="e" * 64), params={"priors": digest})


# --- §6.1 tensor maps, §6.9 headers and results ------------------------------------------------


def _entry(name: bytes, codec: int, body: bytes) -> bytes:
    return struct.pack("<H", len(name)) + name + struct.pack("<BI", codec, len(body)) + body


def tensor_cases() -> Iterator[dict[str, Any]]:
    k, s = "tensor_map", "§6.1"
    f = np.array([[1.5, -2.0], [0.25, 3.0]], np.float32)
    two = encode_tensors({"h": f, "ids": np.array([7, -1], np.int64)})
    yield case("tmap-raw", k, s, "ok", "two RAW tensors", hex=two, reencode=True)
    yield case("tmap-empty", k, s, "ok", "no tensors", hex=encode_tensors({}), reencode=True)
    yield case("tmap-packed", k, s, "ok", "one PACKED tensor (q3 of §6.7)",
               hex=encode_tensors({}, packed={"h": pack(np.array([[0, .25, 1], [-.5, .7, .1]],
                                                                 np.float32), "q3")}))
    raw = bytes.fromhex(two.hex())
    yield case("tmap-count", k, s, "MALFORMED", "count 1025", hex=struct.pack("<H", 1025))
    yield case("tmap-name-513", k, s, "TRUNCATED", "a name_len over 512",
               hex=b"\x01\x00" + _entry(b"n" * 513, 0, b""))
    yield case("tmap-duplicate", k, s, "MALFORMED", "a name twice",
               hex=b"\x02\x00" + _entry(b"h", 0, b"\x01\x00") * 2)
    yield case("tmap-codec-2", k, s, "MALFORMED", "codec 2", hex=b"\x01\x00" + _entry(b"h", 2,
                                                                                     b"\x01\x00"))
    yield case("tmap-raw-short", k, s, "MALFORMED", "RAW data shorter than its shape: "
               "MALFORMED, not TRUNCATED", hex=b"\x01\x00" + _entry(
                   b"h", 0, b"\x01\x01" + struct.pack("<I", 4) + bytes(12)))
    yield case("tmap-raw-dims-cut", k, s, "TRUNCATED", "a dims list cut short",
               hex=b"\x01\x00" + _entry(b"h", 0, b"\x01\x02" + struct.pack("<I", 4)))
    yield case("tmap-over-budget", k, s, "TOO_LARGE", "a declared size over the 4096-byte "
               "budget, checked before the data length", hex=b"\x01\x00" + _entry(
                   b"h", 0, b"\x01\x01" + struct.pack("<I", 2000)))
    yield case("tmap-trailing", k, s, "MALFORMED", "a byte after the last tensor",
               hex=raw + b"\x00")


def header_cases() -> Iterator[dict[str, Any]]:
    k, s = "request_header", "§6.9"
    blob = encode_tensors({"h": np.zeros(1, np.float32)})
    split = encode_request(Request.split("c003", "c008", nonce=NONCE), blob)
    pipe = encode_request(Request.route([Hop("c001", "c004", "phone", packing="q8"),
                                         Hop("c004", "c008", "laptop", gamma=4)], NONCE), blob)
    tile = encode_request(Request.for_tile(Tile(0, 3, 0, 8, 4, 12), NONCE), blob)
    rest = encode_request(Request(Kind.REST, nonce=NONCE), blob)
    for cid, data, note in (("split", split, "§6.9's split at c003 (last cut c008)"),
                            ("pipeline", pipe, "two hops: q8 on to the laptop, which gets g4's "
                             "code"), ("tile", tile, "TILE layers 0..3, rows 0..8, cols 4..12"),
                            ("rest", rest, "REST")):
        yield case(f"header-{cid}", k, s, "ok", note, hex=data, reencode=True)
    bad = [("kind-4", b"\x04" + split[1:], "kind 4"),
           ("nonce-cut", split[:3], "TRUNCATED: the nonce is cut"),
           ("hops-0", split[:5] + b"\x00", "a hop count of 0"),
           ("hops-17", split[:5] + b"\x11" + split[6:], "a hop count of 17"),
           ("gamma-1", split.replace(b"c008\x00", b"c008\x01", 1), "gamma 1"),
           ("bad-name", split.replace(b"c003", b"c 03", 1), "a cut id with a space"),
           ("name-33", split[:6] + b"\x00\x21" + b"c" * 33, "a cut id of 33 bytes"),
           ("packing-uppercase", pipe.replace(b"\x02q8", b"\x02Q8", 1),
            "packing Q8: names are spelled exactly as §6.7 lists them"),
           ("packing-alias", pipe.replace(b"\x02q8", b"\x08lossless", 1),
            "packing lossless: the wire name is f32"),
           ("packing-q17", pipe.replace(b"\x02q8", b"\x03q17", 1), "packing q17"),
           ("packing-last-hop", split.replace(b"c008\x00\x00", b"c008\x00\x02q8", 1),
            "a packing on the last hop"),
           ("tile-empty", tile[:5] + struct.pack("<6H", 0, 3, 4, 4, 4, 12) + blob,
            "an empty TILE range (R0 = R1)"),
           ("tile-cut", tile[:9], "TRUNCATED: the TILE fields are cut")]
    for cid, data, note in bad:
        intent = "TRUNCATED" if note.startswith("TRUNCATED") else "MALFORMED"
        gaps = [9] if "packing" in cid and cid != "packing-last-hop" else [6] if cid == \
            "tile-empty" else None
        yield case(f"header-{cid}", k, s, intent, note, gaps=gaps, hex=data)


def result_cases() -> Iterator[dict[str, Any]]:
    k, s = "result", "§6.9"
    blob = encode_tensors({"logits": np.array([[1, 2, 3]], np.float32)})
    one = encode_result([HopStats(1500, 0, 0)], blob, NONCE)
    two = encode_result([HopStats(900, 300, 44), HopStats(700)], blob, NONCE)
    yield case("result-one-hop", k, s, "ok", "a split's RESULT", hex=one,
               params={"count": 1, "nonce": NONCE}, reencode=True)
    yield case("result-two-hops", k, s, "ok", "a pipeline's RESULT", hex=two,
               params={"count": 2, "nonce": NONCE}, reencode=True)
    yield case("result-count", k, s, "MALFORMED", "one record for a request of two hops",
               hex=one, params={"count": 2, "nonce": NONCE})
    yield case("result-nonce", k, s, "MALFORMED", "another request's nonce", hex=one,
               params={"count": 1, "nonce": NONCE + 1})
    yield case("result-short", k, s, "TRUNCATED", "shorter than nonce and count", hex=one[:4],
               params={"count": 1})


# --- §6.8 identity ------------------------------------------------------------------------


def identity_cases() -> Iterator[dict[str, Any]]:
    k, s = "identity", "§6.8"

    def example(extra: dict[str, Any] | None = None) -> dict[str, Any]:
        cands = [_cand("handheld-only", [_tensor("image", [1, 1, 4, 4])], [], False, True, None),
                 _cand("c001", [_tensor("relu1_out", [1, 4])], ["conv1", "relu1"], True, True,
                       None),
                 _cand("wearable-only", [_tensor("logits", [1, 3])], ["conv1", "relu1", "fc"],
                       True, False, None)]
        man = {"model": {"file": "model.onnx", "sha256": MODEL_SHA, "inputs": [],
                         "outputs": []}, "candidates": cands}
        return {**man, **(extra or {})}
    yield case("identity-example", k, s, "ok", "§6.8's example: no slice hashes recorded",
               manifest=example())
    some = example()
    some["candidates"][1]["tail"]["sha256"] = "ab" * 32
    yield case("identity-some-slices", k, s, "ok", "only c001's tail records a sha256: the "
               "slices entry lists every candidate, null where none is recorded; dtype is the "
               "manifest's numpy name, shape a list of integers", gaps=[1, 2], manifest=some)
    uni = example()
    uni["candidates"][1]["id"] = "c\u00e9"
    yield case("identity-non-ascii", k, s, "ok", "candidate id c\u00e9 is hashed as "
               "\"c\\u00e9\"", manifest=uni)
    yield case("identity-priors", k, s, "ok", "entropy priors do not enter the identity; "
               "their digest is the manifest's entropy_priors.sha256", gaps=[4],
               manifest=example({"entropy_priors": {"index": "priors.json", "data":
                                                    "priors.bin", "tables": 1,
                                                    "sha256": "5e" * 32}}))


def every_case() -> Iterator[dict[str, Any]]:
    IDENTITY_CTX[0] = context_identity()
    from tests.conformance_cases_request import request_cases

    for cases in (control_cases, handshake_cases, chunk_cases, socket_cases, error_cases,
                  session_cases, decoder_cases, tensor_cases, packed_cases, header_cases,
                  request_cases, result_cases, identity_cases):
        yield from cases()
