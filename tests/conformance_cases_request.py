"""Conformance cases of whole REQUESTs on the context bundle (docs/PROTOCOL.md §6.9-6.12): the
handheld's checks, in order, before anything runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from coinf.ble_protocol.packing import pack
from coinf.ble_protocol.request import Hop, Request, encode_request
from coinf.ble_protocol.tensors import encode_tensors

LAST = "wearable-only"
PIPE = {"pipeline": {"name": "h1", "peers": ["h2"]}}
NONCE = 0x0A0B0C0D


def _case(cid: str, intent: str, note: str, payload: bytes, *, gaps: list[int] | None = None,
          params: dict[str, Any] | None = None, section: str = "§6.9") -> dict[str, Any]:
    out: dict[str, Any] = {"id": f"req-{cid}", "layer": "request", "section": section}
    if gaps:
        out["gaps"] = gaps
    out["note"] = note
    out["hex"] = payload.hex()
    if params:
        out["params"] = params
    out["intent"] = intent
    return out


def _f32(*shape: int) -> np.ndarray:
    return (np.arange(int(np.prod(shape)), dtype=np.float32) / 4).reshape(shape)


def split(start: str, end: str = LAST, gamma: int = 0, **tensors: np.ndarray) -> bytes:
    return encode_request(Request.split(start, end, gamma, NONCE), encode_tensors(tensors))


def route(hops: list[tuple[str, str, str]], blob: bytes, gamma2: int = 0) -> bytes:
    made = [Hop(a, b, dev) for dev, a, b in hops]
    if gamma2:
        made[1] = Hop(made[1].start, made[1].end, made[1].device, gamma=gamma2)
    return encode_request(Request.route(made, NONCE), blob)


def _splits() -> Iterator[dict[str, Any]]:
    relu = _f32(1, 4)
    yield _case("split-raw", "ok", "a split at c001, its crossing tensor RAW",
                split("c001", relu1_out=relu))
    yield _case("split-q8", "ok", "the same tensor PACKED q8", encode_request(
        Request.split("c001", LAST, nonce=NONCE), encode_tensors(
            {}, packed={"relu1_out": pack(relu, "q8")})))
    yield _case("split-code", "ok", "compressor g2's code at c001", split(
        "c001", gamma=2, code=np.array([[0.5, -0.5]], np.float32)), section="§6.12")
    yield _case("split-input", "ok", "handheld-only: the model's input crosses",
                split("handheld-only", image=_f32(1, 1, 4, 4)))
    order = [7]
    yield _case("too-large-first", "TOO_LARGE", "a payload over the handheld's request bound "
                "(here 40 B), even with a bad kind byte: the size first", b"\x09"
                + split("c001", relu1_out=relu)[1:], gaps=order, params={"max_request_bytes": 40})
    yield _case("header-before-cuts", "MALFORMED", "gamma 1 on an unknown cut: the header "
                "first", split("c999", relu1_out=relu).replace(b"only\x00", b"only\x01", 1),
                gaps=order)
    yield _case("unsupported-first", "UNSUPPORTED", "two hops to a handheld without the "
                "pipeline role, with a tensor map that is garbage: UNSUPPORTED before the "
                "tensors", route([("h1", "c001", "c002"), ("h2", "c002", LAST)], b"\xff"),
                gaps=order, section="§6.11")
    yield _case("to-not-last", "MALFORMED", "a one-hop request whose TO is not the last cut",
                split("c001", "c002", relu1_out=relu), gaps=order)
    yield _case("to-before-from", "MALFORMED", "TO unknown and FROM unknown: TO is checked "
                "first (it is not the last cut)", split("c888", "c999", relu1_out=relu),
                gaps=order)
    yield _case("from-unknown", "UNKNOWN_CANDIDATE", "FROM unknown, tensors garbage: the cut "
                "before the tensors", encode_request(Request.split("c009", LAST, nonce=NONCE),
                                                      b"\xff"), gaps=order)
    yield _case("gamma-unknown", "UNKNOWN_CANDIDATE", "no compressor g9 at c001",
                split("c001", gamma=9, code=np.zeros((1, 2), np.float32)), gaps=order,
                section="§6.12")
    yield _case("over-crossing", "TOO_LARGE", "relu1_out declared [1,8]: over the crossing "
                "set's 16 bytes, before its name or shape is compared",
                split("c001", relu1_out=_f32(1, 8)), gaps=order)
    yield _case("tensor-name", "MALFORMED", "a tensor the cut does not cross",
                split("c001", other=relu), gaps=order)
    yield _case("tensor-dtype", "MALFORMED", "relu1_out as float64 [1,2] (16 bytes, within "
                "the budget)", split("c001", relu1_out=np.zeros((1, 2), np.float64)))
    yield _case("tensor-shape", "MALFORMED", "relu1_out as [4,1]",
                split("c001", relu1_out=_f32(4, 1)))
    yield _case("code-shape", "MALFORMED", "g2's code as [1,1]", split(
        "c001", gamma=2, code=np.zeros((1, 1), np.float32)), section="§6.12")
    yield _case("tile-empty", "MALFORMED", "an empty TILE range: refused with the header",
                b"\x02" + NONCE.to_bytes(4, "little") + bytes.fromhex("0000030004000400"
                                                                      "04000c00") + b"\x00\x00",
                gaps=[6], section="§6.10")


def _pipeline() -> Iterator[dict[str, Any]]:
    s, order = "§6.11", [7]
    blob = encode_tensors({"relu1_out": _f32(1, 4)})
    yield _case("pipe-device-first", "MALFORMED", "the first hop names another device (h9) "
                "and an unknown cut: the device first", route(
                    [("h9", "c001", "c777"), ("h2", "c777", LAST)], blob),
                gaps=order, params=PIPE, section=s)
    yield _case("pipe-unknown-cut", "UNKNOWN_CANDIDATE", "TO is no cut of the bundle",
                route([("h1", "c001", "c777"), ("h2", "c777", LAST)], blob), gaps=order,
                params=PIPE, section=s)
    yield _case("pipe-from-after-to", "MALFORMED", "FROM c002 is not before TO c001", route(
        [("h1", "c002", "c001"), ("h2", "c001", LAST)], blob), gaps=order, params=PIPE,
        section=s)
    yield _case("pipe-ends-at-last", "MALFORMED", "a hop before the last ends at the last cut",
                route([("h1", "c001", LAST), ("h2", "c002", LAST)], blob), gaps=order,
                params=PIPE, section=s)
    yield _case("pipe-next-start", "MALFORMED", "the next hop does not start where this one "
                "ends", route([("", "c001", "c002"), ("h2", "c001", LAST)], blob), gaps=order,
                params=PIPE, section=s)
    yield _case("pipe-next-gamma", "UNKNOWN_CANDIDATE", "the next hop's gamma 9: no such "
                "compressor at c002", route([("h1", "c001", "c002"), ("h2", "c002", LAST)],
                                            blob, gamma2=9), gaps=order, params=PIPE,
                section=s)
    yield _case("pipe-next-device", "MALFORMED", "the next hop's device is not in this "
                "helper's pipeline configuration", route(
                    [("h1", "c001", "c002"), ("h3", "c002", LAST)], blob), gaps=order,
                params=PIPE, section=s)
    yield _case("pipe-crossing", "MALFORMED", "a valid route, but the tensors are not c001's "
                "crossing set", route([("h1", "c001", "c002"), ("h2", "c002", LAST)],
                                      encode_tensors({"x": _f32(1, 4)})), gaps=order,
                params=PIPE, section=s)


def request_cases() -> Iterator[dict[str, Any]]:
    yield from _splits()
    yield from _pipeline()
