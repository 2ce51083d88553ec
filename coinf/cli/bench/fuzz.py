"""``coinf bench fuzz``: generated hostile inputs against every wire decoder.

For each decoder: valid encodings as seeds, then mutants (bit flips, truncation, insertions,
boundary integers spliced over length fields, duplication) and random bytes. Every input must end
in the decoder's documented error (a ProtocolError; a ProfileError for profiles) or a value; any
other exception is counted and the first few are shown. Per input the peak of Python-tracked
memory (numpy included) and the time are recorded.

The standard codecs (``codec_jpeg``, ``codec_webp``, ``codec_png``, ``codec_pcm16``,
``codec_flac``; those :func:`media.available` lacks are skipped and listed) get their own seeds:
packed bodies of a photo-like image ``[1,3,H,W]``, a grey one ``[1,1,H,W]``, one channels-last,
and speech-like waveforms ``[1,N]``. Mutants also keep a header and swap its payload (for
another codec's, another size's, random bytes) or mutate only the payload or only the header.
Crafted bodies are fed first; most must be refused: a valid image or stream of another size
under a header, decompression bombs (a tiny PNG whose IHDR claims 20000x20000 or 10000x10000,
a JPEG/WebP/FLAC whose own header claims a huge size), a header declaring more than the budget.
A few may decode, to the declared shape (an image of the other channel count, which JPEG and
WebP convert; a PNG whose IDAT inflates to 16 MB; a FLAC holding one sample more than it and
the header claim). Beyond the exception check, a codec decoder fails when it returns anything
but an array of exactly the shape and dtype the input's header declares, or accepts a crafted
body that must be refused. Pillow's, libjpeg's and libsndfile's buffers are invisible to
tracemalloc, so the run also records each input's growth of the peak RSS (Linux VmHWM, reset
per input, after a warm-up) against the receiver's byte budget.

``packed_ans`` (:mod:`coinf.cli.bench.fuzz_ans`) runs the same way on the ``ansN`` decoder
(the rANS coder under calibrated priors): bodies coded with tables fitted here, crafted bodies
(another table's width or channels, an unknown key, impossible lane counts, missing or extra
words, ...) that must all be refused, and mutants; its peak memory per input is tracemalloc's
(numpy only).

``control_line`` is one line of the wearable service's control socket
(:func:`coinf.wearable.control.parse_request`) and ``txt_record`` a helper's DNS-SD TXT record
(:func:`coinf.ble_protocol.mdns.parse_announcement`): both arrive from outside the process.
"""

from __future__ import annotations

import argparse
import random
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from coinf.ble_protocol import arq, gatt, latent, negotiate, packing
from coinf.ble_protocol.chunks import Reassembler, encode_chunks
from coinf.ble_protocol.mdns import parse_announcement, txt_record
from coinf.ble_protocol.messages import (
    Message,
    MsgType,
    decode_error,
    decode_json,
    encode_error,
    encode_json,
)
from coinf.ble_protocol.packing import PackSpec
from coinf.ble_protocol.request import (
    REST,
    Hop,
    HopStats,
    Request,
    Tile,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from coinf.cli import argtypes
from coinf.cli.bench import emit, options
from coinf.cli.bench.fuzz_ans import ans_case
from coinf.cli.bench.fuzz_codecs import CODEC_INPUTS, codec_seeds, fuzz_codec
from coinf.cli.bench.fuzz_engine import fuzz_one, join_chunks, rss_resettable, split_chunks
from coinf.device.profile import DeviceProfile, ProfileError
from coinf.device.status import DeviceStatus, decode_status_reply
from coinf.errors import ErrorCode, ProtocolError
from coinf.wearable.control import parse_request
from coinf.wearable.planner.codec_costs import peer_compressors, peer_decoders

#: Decoders whose output is tensors: bounded by the receiver's signature budget, not the input
#: size (a valid compressed body is meant to expand).
TENSOR_DECODERS = ("tensor_map", "packed_tensor", "packed_latent", "request", "result",
                   "reassembly")


def _tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "a": rng.standard_normal((1, 16, 16, 16)).astype(np.float32),  # 16 KB: a real cut
        "b": np.arange(5, dtype=np.int64),
        "s": np.array(3.5, np.float32),
        "e": np.zeros((0, 3), np.float32),
    }


BUDGET = sum(a.nbytes for a in _tensors(np.random.default_rng(0)).values())


def _txt_bytes(pairs: dict[str, str]) -> bytes:
    """A TXT record on the wire (RFC 6763: length-prefixed ``key=value`` strings)."""
    items = [f"{k}={v}".encode() for k, v in pairs.items()]
    return b"".join(bytes([len(i)]) + i for i in items)


def _latent_codes(rng: np.random.Generator) -> tuple[list[np.ndarray], Any]:
    """Learned-bottleneck-like codes (integers around 0, 8 channels) and a registered table
    fitted to them (``latent`` packing, ble_protocol/latent.py)."""
    codes = [np.clip(np.rint(rng.laplace(0, s, (1, 8, 6, 6))), -20, 20).astype(np.float32)
             for s in (0.5, 2.0, 6.0)]
    counts = np.stack([np.bincount((np.concatenate([c[0, ch].ravel() for c in codes]) + 20)
                                   .astype(np.int64), minlength=41) + 1 for ch in range(8)])
    table = latent.table([-20] * 8, counts.astype(np.int64).tolist(), 12, "fuzz")
    latent.register(table)
    return codes, table


def _pairing_cases() -> dict[str, tuple[list[bytes], Callable[[bytes], Any]]]:
    """Wi-Fi pairing's START and REPLY bodies (ble_protocol/wifi_pair.py), with a real
    certificate made for the run: what a pairing window reads from a stranger."""
    import tempfile

    from coinf.ble_protocol import wifi_pair as wp
    from coinf.ble_protocol.tls_store import TlsStore

    with tempfile.TemporaryDirectory(prefix="coinf-fuzz-") as tmp:
        cert = TlsStore(f"{tmp}/tls").certificate_der()
    w = wp.code_scalar("123456")
    _, x = wp._share(w, wp.M)
    named = wp._name_cert_bytes("pi", cert)
    start = bytes([wp.VERSION]) + named + x
    reply = named + x + bytes(32)

    def checked(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
        def decode(data: bytes) -> Any:
            try:
                return parse(data)
            except ValueError as exc:  # wifi_pair's _Malformed: the documented refusal
                raise ProtocolError(ErrorCode.MALFORMED, str(exc)) from None
        return decode

    return {"wifi_pair_start": ([start], checked(wp.parse_start)),
            "wifi_pair_reply": ([reply], checked(wp.parse_reply))}


_BUNDLE_ID = "model-1234"
_PRIORS = "ab" * 32


def _reassembler(max_message_bytes: int) -> Callable[[bytes], Any]:
    """Decode a byte string of joined chunks as one receiver reassembling them."""
    def reassemble(data: bytes) -> Any:
        r = Reassembler(max_message_bytes=max_message_bytes)
        out = None
        for chunk in split_chunks(data):
            out = r.feed(chunk) or out
        return out

    return reassemble


def _hello_check(data: bytes) -> Any:
    """A control frame; a HELLO or HELLO_ACK is also checked against the bundle."""
    kind, body = gatt.parse_ctrl(data)
    if kind in (gatt.Ctrl.HELLO, gatt.Ctrl.HELLO_ACK):
        return gatt.check_hello(body, _BUNDLE_ID)
    return body


def _decode_err(data: bytes) -> Any:
    err = decode_error(data)
    assert isinstance(err, ProtocolError)
    return err


def _session_hello(data: bytes) -> Any:
    """A session HELLO / HELLO_ACK as the wearable reads it: the JSON, then what the peer
    decodes, its compressors, and each packing fitted to them (codec negotiation)."""
    ack = decode_json(data)
    names = peer_decoders(ack, _PRIORS)
    comps = peer_compressors(ack)
    fitted = [negotiate.fit(PackSpec.parse(s), names) for s in ("ans4", "qz4", "jpeg-q90")]
    return names, comps, fitted, [negotiate.missing(f, names) for f, _ in fitted]


def _profile(data: bytes) -> Any:
    try:
        return DeviceProfile.from_bytes(data)
    except ProfileError as exc:  # the profile decoder's documented error
        raise ProtocolError(ErrorCode.MALFORMED, str(exc)) from None


def _chunk_cases(message: Message) -> dict[str, tuple[list[bytes], Callable[[bytes], Any]]]:
    """A message's chunks one by one, and all of them joined (in order and reversed)."""
    chunks = list(encode_chunks(message, 244))[:40] + list(encode_chunks(message, 244))[-2:]
    return {
        "frames": ([bytes(c) for c in chunks], lambda d: Reassembler().feed(d)),
        "reassembly": ([join_chunks(chunks), join_chunks(chunks[::-1])],
                       _reassembler(len(message.payload) + 64)),
    }


def _control_cases() -> dict[str, tuple[list[bytes], Callable[[bytes], Any]]]:
    """Control frames and the JSON bodies of the session's handshake and status replies."""
    hello = gatt.make_hello(_BUNDLE_ID, 247, role="handheld")
    session_ack = {"bundle": _BUNDLE_ID, "capabilities": ["raw", "packed", "stages", "tile"],
                   "compressors": [{"cut": "c001", "gamma": 4}, {"cut": "c002", "gamma": 8}],
                   "decoders": negotiate.decodable(),
                   "priors": _PRIORS, "protocol": 2, "role": "handheld"}
    status = encode_json({"device": DeviceStatus(cpu_load=0.3, battery_pct=80.0).to_json(),
                          "role": "handheld", "requests": 3})
    return {
        "control_frame": ([gatt.ctrl_json(gatt.Ctrl.HELLO, hello), gatt.ctrl_credit(12),
                           gatt.ctrl_abort(3, 9), gatt.ctrl_error(ErrorCode.BUSY, "busy"),
                           bytes([gatt.Ctrl.SENT]) + arq.sent_body(3, 9, 40),
                           bytes([gatt.Ctrl.NACK]) + arq.nack_body(3, 9, [(0, 498), (996, 1400)]),
                           bytes([gatt.Ctrl.SYNC]) + arq.sync_body(40)],
                          _hello_check),
        "json_hello": ([encode_json(hello)], decode_json),
        "session_hello": ([encode_json(session_ack), encode_json(
            {**session_ack, "role": "wearable", "decoders": ["f16", "q", "qz", 7, None]}),
            encode_json({"bundle": _BUNDLE_ID, "protocol": 2})], _session_hello),
        "status_reply": ([status], decode_status_reply),
        "profile_reply": ([encode_json(DeviceProfile.default("handheld").to_json())], _profile),
    }


def _request_cases(split: bytes, blob_raw: bytes, blob_packed: bytes, budget: int
                   ) -> dict[str, tuple[list[bytes], Callable[[bytes], Any]]]:
    """Requests (a split, a route, a tile, the rest), results and errors."""
    requests = [split, encode_request(Request.route([
        Hop("c001", "c002", "phone", packing="q8"), Hop("c002", "c003", "laptop", gamma=4)]),
        blob_packed), encode_request(Request.for_tile(Tile(0, 2, 0, 8, 4, 12)), blob_raw),
        encode_request(REST, blob_raw)]
    return {
        "request": (requests, lambda d: decode_tensors(decode_request(d)[1], max_bytes=budget)),
        "result": ([encode_result([HopStats(1234)], blob_packed)],
                   lambda d: decode_tensors(decode_result(d, 1)[1], max_bytes=budget)),
        "route_result": ([encode_result([HopStats(1, 2, 3), HopStats(4)], blob_raw)],
                         lambda d: decode_tensors(decode_result(d, 2)[1], max_bytes=budget)),
        "error": ([encode_error(ErrorCode.TAIL_FAILED, "tail failed")], _decode_err),
    }


def seeds(rng: np.random.Generator) -> dict[str, tuple[list[bytes], Callable[[bytes], Any]]]:
    """decoder name -> (valid inputs, decode function). Budgets are what the receiver knows
    from the model's signature: the seeds' decoded size, never what a header declares."""
    t = _tensors(rng)
    budget = BUDGET
    packed = {n: packing.pack(a, s) for (n, a), s in zip(t.items(), ["q4", "f32", "q8", "f16"],
                                                          strict=True)}
    blob_raw = encode_tensors(t)
    blob_packed = encode_tensors({}, packed=packed)
    split = encode_request(Request.split("c001", "c003"), blob_raw)
    txt = _txt_bytes(txt_record("phone", _BUNDLE_ID, 12.5))
    control = _control_cases()
    codes, table = _latent_codes(rng)
    return {
        **_chunk_cases(Message(MsgType.REQUEST, 7, split)),
        "tensor_map": ([blob_raw, blob_packed], lambda d: decode_tensors(d, max_bytes=budget)),
        "packed_tensor": ([*packed.values(), *(packing.pack(a, "qz3") for a in t.values())],
                          lambda d: packing.unpack(d, max_bytes=budget)),
        **control,
        **_request_cases(split, blob_raw, blob_packed, budget),
        "packed_latent": ([packing.pack(c, PackSpec("latent", priors=table)) for c in codes],
                          lambda d: packing.unpack(d, max_bytes=budget)),
        **_pairing_cases(),
        "control_line": ([b'{"op": "reload"}\n', b'{"op": "status"}'], parse_request),
        "txt_record": ([txt], lambda d: parse_announcement("helper._coinf._tcp.local.", d,
                                                           ["127.0.0.1"], 7878, _BUNDLE_ID)),
    }


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    table = seeds(np.random.default_rng(args.seed))
    codecs, skipped = codec_seeds(np.random.default_rng(args.seed))
    codecs["packed_ans"] = ans_case(np.random.default_rng(args.seed))
    names = [*table, *codecs]
    skipped_names = [f"codec_{c}" for c in skipped]
    chosen = args.decoders or names
    unknown = sorted(set(chosen) - set(names) - set(skipped_names))
    if unknown:
        from coinf.errors import UserError

        raise UserError(f"unknown decoder {unknown[0]!r}; expected some of {', '.join(names)}")
    codec_inputs = min(args.inputs, args.codec_inputs)
    tracemalloc.start()
    out: dict[str, Any] = {}
    try:
        for name in chosen:
            if name in codecs:
                out[name] = fuzz_codec(name, codecs[name], codec_inputs, rng, rss=True)
            elif name in table:
                valid, decode = table[name]
                out[name] = fuzz_one(name, valid, decode, args.inputs, rng,
                                     BUDGET if name in TENSOR_DECODERS else None)
    finally:
        tracemalloc.stop()
    run_codecs = [n for n in out if n in codecs]
    emit({
        "inputs_per_decoder": args.inputs,
        "inputs_per_codec_decoder": codec_inputs,
        "seed": args.seed,
        "codecs": {"fuzzed": [n.removeprefix("codec_") for n in run_codecs
                              if n.startswith("codec_")],
                   "skipped": skipped},
        "decoders": out,
        "other_exceptions": sum(d["other_exceptions"] for d in out.values()),
        "wrong_results": sum(d["wrong_results"] for d in out.values()),
        "failures": sum(d["other_exceptions"] + d["wrong_results"] for d in out.values()),
        "worst_peak_over_largest_input": max(
            (d["peak_over_largest_input"] for d in out.values()), default=0),
        "worst_peak_over_budget": max((d.get("peak_over_budget", 0) for d in out.values()),
                                      default=0),
        "codec_peak_rss_measured": rss_resettable() if run_codecs else None,
        "worst_codec_peak_rss_growth_over_budget": max(
            (out[n].get("peak_rss_growth_over_budget", 0) for n in run_codecs), default=None),
        "worst_max_ms": max((d["max_ms"] for d in out.values()), default=0),
        "targets": {"other_exceptions": 0, "wrong_results": 0, "peak_over_largest_input": 4,
                    "max_ms": 100},
    })
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inputs", type=argtypes.positive_int, default=100_000,
                        help="inputs per decoder")
    parser.add_argument("--codec-inputs", type=argtypes.count, default=CODEC_INPUTS,
                        help="inputs per standard-codec decoder (codec_*), at most --inputs")
    options.add_seed(parser, 1)
    parser.add_argument("--decoders", nargs="*", help="only these decoders")
    options.add_json(parser)
    parser.set_defaults(func=run)
