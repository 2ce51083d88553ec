"""``coinf bench fuzz``: generated hostile inputs against every wire decoder.

For each decoder: valid encodings as seeds, then mutants (bit flips, truncation, insertions,
boundary integers spliced over length fields, duplication) and random bytes. Every input must end
in the decoder's documented error (a ProtocolError; a ProfileError for profiles) or a value; any
other exception is counted and the first few are shown. Per input the peak of Python-tracked
memory (numpy included) and the time are recorded.
"""

from __future__ import annotations

import argparse
import random
import struct
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from coinf.ble_protocol import gatt, packing
from coinf.ble_protocol.frames import Reassembler, encode_chunks
from coinf.ble_protocol.messages import (
    Message,
    MsgType,
    decode_error,
    decode_json,
    decode_request,
    decode_result,
    encode_error,
    encode_json,
    encode_request,
    encode_result,
)
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from coinf.cli.bench import emit, progress
from coinf.device.profile import DeviceProfile, ProfileError
from coinf.device.status import DeviceStatus, decode_status_reply
from coinf.errors import ErrorCode, ProtocolError

#: Decoders whose output is tensors: bounded by the receiver's signature budget, not the input
#: size (a valid compressed body is meant to expand).
TENSOR_DECODERS = ("tensor_map", "packed_tensor", "request", "result", "reassembly")
BOUNDARY = [0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000,
            0xFFFFFFFF]


def _tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "a": rng.standard_normal((1, 16, 16, 16)).astype(np.float32),  # 16 KB: a real cut
        "b": np.arange(5, dtype=np.int64),
        "s": np.array(3.5, np.float32),
        "e": np.zeros((0, 3), np.float32),
    }


BUDGET = sum(a.nbytes for a in _tensors(np.random.default_rng(0)).values())


def seeds(rng: np.random.Generator) -> dict[str, tuple[list[bytes], Callable[[bytes], Any]]]:
    """decoder name -> (valid inputs, decode function). Budgets are what the receiver knows
    from the model's signature: the seeds' decoded size, never what a header declares."""
    t = _tensors(rng)
    budget = BUDGET
    packed = {n: packing.pack(a, s) for (n, a), s in zip(t.items(), ["q4", "f32", "q8", "f16"],
                                                          strict=True)}
    blob_raw = encode_tensors(t)
    blob_packed = encode_tensors({}, packed=packed)
    hello = gatt.make_hello("model-1234", 247, role="handheld")
    message = Message(MsgType.REQUEST, 7, encode_request("c001", blob_raw))
    chunks = list(encode_chunks(message, 244))[:40] + list(encode_chunks(message, 244))[-2:]
    status = encode_json({"device": DeviceStatus(cpu_load=0.3, battery_pct=80.0).to_json(),
                          "role": "handheld", "requests": 3})

    def reassemble(data: bytes) -> Any:
        r = Reassembler(max_message_bytes=len(message.payload) + 64)
        out = None
        for chunk in _split(data):
            out = r.feed(chunk) or out
        return out

    def hello_check(data: bytes) -> Any:
        kind, body = gatt.parse_ctrl(data)
        if kind in (gatt.Ctrl.HELLO, gatt.Ctrl.HELLO_ACK):
            return gatt.check_hello(body, "model-1234")
        return body

    def decode_err(data: bytes) -> Any:
        err = decode_error(data)
        assert isinstance(err, ProtocolError)
        return err

    def profile(data: bytes) -> Any:
        try:
            return DeviceProfile.from_bytes(data)
        except ProfileError as exc:  # the profile decoder's documented error
            raise ProtocolError(ErrorCode.MALFORMED, str(exc)) from None

    return {
        "frames": ([bytes(c) for c in chunks], lambda d: Reassembler().feed(d)),
        "reassembly": ([_join(chunks), _join(chunks[::-1])], reassemble),
        "tensor_map": ([blob_raw, blob_packed], lambda d: decode_tensors(d, max_bytes=budget)),
        "packed_tensor": ([*packed.values(), *(packing.pack(a, "qz3") for a in t.values())],
                          lambda d: packing.unpack(d, max_bytes=budget)),
        "control_frame": ([gatt.ctrl_json(gatt.Ctrl.HELLO, hello), gatt.ctrl_credit(12),
                           gatt.ctrl_abort(3, 9), gatt.ctrl_error(ErrorCode.BUSY, "busy")],
                          hello_check),
        "json_hello": ([encode_json(hello)], decode_json),
        "status_reply": ([status], decode_status_reply),
        "profile_reply": ([encode_json(DeviceProfile.default("handheld").to_json())], profile),
        "request": ([encode_request("c001", blob_raw)], lambda d: decode_tensors(
            decode_request(d)[1], max_bytes=budget)),
        "result": ([encode_result(1234, blob_packed)], lambda d: decode_tensors(
            decode_result(d)[1], max_bytes=budget)),
        "error": ([encode_error(ErrorCode.TAIL_FAILED, "tail failed")], decode_err),
    }


def _join(chunks: list[bytes]) -> bytes:
    """Several chunks as one input: u16 length before each."""
    return b"".join(struct.pack("<H", len(c)) + c for c in chunks)


def _split(data: bytes) -> list[bytes]:
    out: list[bytes] = []
    pos = 0
    while pos + 2 <= len(data) and len(out) < 64:
        (n,) = struct.unpack_from("<H", data, pos)
        out.append(data[pos + 2: pos + 2 + n])
        pos += 2 + n
    return out


def mutate(rng: random.Random, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        if op == 0 and data:  # flip bits
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif op == 1 and data:  # truncate
            del data[rng.randrange(len(data)):]
        elif op == 2:  # insert random bytes
            at = rng.randrange(len(data) + 1)
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        elif op == 3 and len(data) >= 4:  # a boundary integer over a (likely) length field
            at = rng.randrange(len(data) - 3)
            fmt = rng.choice(["<I", "<H", "<B"])
            value = rng.choice(BOUNDARY) & {"<I": 0xFFFFFFFF, "<H": 0xFFFF, "<B": 0xFF}[fmt]
            struct.pack_into(fmt, data, at, value)
        elif op == 4 and data:  # duplicate a slice
            a = rng.randrange(len(data))
            b = min(len(data), a + rng.randint(1, 64))
            data[b:b] = data[a:b]
        elif op == 5:  # extend with zeros
            data += bytes(rng.randint(1, 32))
        elif op == 6 and data:  # overwrite a byte with 0x00/0xFF
            data[rng.randrange(len(data))] = rng.choice([0, 0xFF])
    return bytes(data)


def fuzz_one(name: str, valid: list[bytes], decode: Callable[[bytes], Any], n: int,
             rng: random.Random, budget: int | None = None) -> dict[str, Any]:
    stats: dict[str, Any] = {"inputs": 0, "protocol_errors": 0, "decoded": 0,
                             "other_exceptions": 0, "peak_bytes": 0, "max_ms": 0.0,
                             "largest_input": 0, "examples": []}
    for i in range(n):
        if i < len(valid):
            data = valid[i]
        elif rng.random() < 0.1:
            data = rng.randbytes(rng.randint(0, 300))
        else:
            data = mutate(rng, rng.choice(valid))
        stats["largest_input"] = max(stats["largest_input"], len(data))
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        try:
            decode(data)
            stats["decoded"] += 1
        except ProtocolError:
            stats["protocol_errors"] += 1
        except Exception as exc:
            stats["other_exceptions"] += 1
            if len(stats["examples"]) < 3:
                stats["examples"].append(f"{type(exc).__name__}: {exc} <- {data[:48].hex()}")
        ms = (time.perf_counter() - t0) * 1e3
        stats["max_ms"] = max(stats["max_ms"], round(ms, 3))
        stats["peak_bytes"] = max(stats["peak_bytes"], tracemalloc.get_traced_memory()[1] - base)
        stats["inputs"] += 1
        if (i + 1) % 20_000 == 0:
            progress(f"{name}: {i + 1}/{n}")
    stats["peak_over_largest_input"] = round(stats["peak_bytes"] / max(stats["largest_input"], 1),
                                             2)
    if budget is not None:  # decoders of tensors may expand (compression) up to the signature
        stats["budget_bytes"] = budget
        stats["peak_over_budget"] = round(stats["peak_bytes"] / budget, 2)
    if not stats["examples"]:
        del stats["examples"]
    return stats


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    table = seeds(np.random.default_rng(args.seed))
    chosen = args.decoders or list(table)
    unknown = sorted(set(chosen) - set(table))
    if unknown:
        from coinf.errors import UserError

        raise UserError(f"unknown decoder {unknown[0]!r}; expected some of {', '.join(table)}")
    tracemalloc.start()
    out: dict[str, Any] = {}
    try:
        for name in chosen:
            valid, decode = table[name]
            out[name] = fuzz_one(name, valid, decode, args.inputs, rng,
                                 BUDGET if name in TENSOR_DECODERS else None)
    finally:
        tracemalloc.stop()
    emit({
        "inputs_per_decoder": args.inputs,
        "seed": args.seed,
        "decoders": out,
        "other_exceptions": sum(d["other_exceptions"] for d in out.values()),
        "worst_peak_over_largest_input": max(d["peak_over_largest_input"] for d in out.values()),
        "worst_peak_over_budget": max(d.get("peak_over_budget", 0) for d in out.values()),
        "worst_max_ms": max(d["max_ms"] for d in out.values()),
        "targets": {"other_exceptions": 0, "peak_over_largest_input": 4, "max_ms": 100},
    })
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs per decoder")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--decoders", nargs="*", help="only these decoders")
    parser.add_argument("--json", action="store_true", help="(always JSON)")
    parser.set_defaults(func=run)
