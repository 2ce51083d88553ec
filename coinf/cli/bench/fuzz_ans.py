"""The ``ansN`` decoder (codec ANS: ble_protocol/entropy.py and priors.py) under ``coinf bench
fuzz``: valid bodies of a patchy ReLU-like map, a linear map whose range moves and a dense vector
at 2, 4 and 8 bits (tables fitted here on other samples, as calibration fits them, and
registered in this process), crafted bodies (a table of another width or channel count, an
unknown key, impossible lane counts, a lane state below 2**16, missing or extra words, escape
bytes past the end, a header over the budget) and mutations. Only ProtocolError, or an array of
exactly the declared shape and dtype, may come out; every crafted body must be refused."""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from coinf.ble_protocol import entropy, packing, priors
from coinf.ble_protocol.packing import PackSpec
from coinf.cli.bench.fuzz_codecs import codec_mutator

SHAPES = ((1, 16, 32, 32), (1, 8, 12, 12), (1, 64))
BITS = (2, 4, 8)
FIT_SAMPLES = 12


def patchy(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A ReLU map: a smooth random field, thresholded (zeros in patches)."""
    x = rng.standard_normal(shape).cumsum(axis=-1)
    if len(shape) == 4:
        x = x.cumsum(axis=-2)
    return np.maximum(x / 4 - 0.3, 0).astype(np.float32)


def moving(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values around 0 whose extremes (and so the level of 0) move from input to input."""
    x = rng.standard_normal(shape).reshape(-1)
    x[:2] = -rng.uniform(2, 8), rng.uniform(2, 8)
    return x.reshape(shape).astype(np.float32)


def _table(rng: np.random.Generator, shape: tuple[int, ...], bits: int,
           make: Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]
           ) -> priors.TensorPriors:
    from coinf.bundle import Candidate, Part, TensorSpec
    from coinf.convert.entropy_cal import PriorFit

    t = TensorSpec("x", shape, "float32", 4 * math.prod(shape))
    fit = PriorFit(Candidate("fuzz", "fuzz", (t,), Part(None, 0, 0, ()),
                             Part("t.onnx", 0, 0, ())), [bits])
    for i in range(FIT_SAMPLES):
        fit.add(i, {"x": make(rng, shape)})
    fit.fit()
    return fit.tables[("x", bits)][-1]


def _split(body: bytes) -> tuple[bytes, bytes]:
    at = packing.read_header(body).payload_offset
    return body[:at], body[at:]


def _stream(payload: bytes) -> tuple[bytes, int, int, bytes]:
    mv = memoryview(payload)
    lanes, pos = entropy._read_varint(mv, entropy.KEY_SIZE, "lanes")
    esc, pos = entropy._read_varint(mv, pos, "escapes")
    return payload[:entropy.KEY_SIZE], lanes, esc, payload[pos:]


def _join(key: bytes, lanes: int, esc: int, rest: bytes) -> bytes:
    return key + entropy._varint(lanes) + entropy._varint(esc) + rest


def _crafted(bodies: dict[tuple[tuple[int, ...], int], bytes],
             budget: int) -> dict[str, bytes]:
    """what -> a body that must be refused."""
    big = bodies[(SHAPES[0], 4)]
    head, payload = _split(big)
    h = packing.read_header(big)
    key, lanes, esc, rest = _stream(payload)
    states, words = rest[:4 * lanes], rest[4 * lanes:]
    small_head = _split(bodies[(SHAPES[1], 4)])[0]
    out = {
        "a 2-bit table under a 4-bit header": head + _split(bodies[(SHAPES[0], 2)])[1],
        "an 8-channel table under a 16-channel header": head + _split(bodies[(SHAPES[1], 4)])[1],
        "a 16-channel table under an 8-channel header": small_head + payload,
        "an unknown table key": head + bytes(4) + payload[4:],
        "no lanes": head + _join(key, 0, esc, rest),
        "more lanes than symbols": head + _join(key, h.count + 1, esc, rest),
        f"one lane: over {entropy.MAX_STEPS} steps": head + _join(key, 1, esc, rest),
        "escape bytes past the end": head + _join(key, lanes, 2**32 - 1, rest),
        "a lane state below 2**16": head + _join(key, lanes, esc,
                                                 struct.pack("<I", 0xFFFF) + rest[4:]),
        "an extra word": head + _join(key, lanes, esc, rest + b"\0\0"),
        "a word too few": head + _join(key, lanes, esc, states + words[:-2]),
        "an odd word byte": head + payload + b"\0",
        "a header over the budget": packing._header(
            packing.ANS, 0, 4, 1, (1, 16, 32, budget // 4 // 512 + 1), h.scale, h.offset)
        + payload,
        "no elements": packing._header(packing.ANS, 0, 4, 1, (1, 16, 0, 32), h.scale, h.offset)
        + payload,
        "9 bits": head[:5] + bytes([9]) + head[6:] + payload,
    }
    return out


def ans_case(rng: np.random.Generator) -> dict[str, Any]:
    """The ``packed_ans`` case of ``bench fuzz`` (the keys :func:`fuzz_codecs.fuzz_codec`
    reads); its tables are registered in this process."""
    bodies: dict[tuple[tuple[int, ...], int], bytes] = {}
    for shape in SHAPES:
        for bits in BITS:
            make = patchy if shape == SHAPES[0] else moving
            tp = _table(rng, shape, bits, make)
            priors.register(tp)
            bodies[(shape, bits)] = packing.pack(make(rng, shape), PackSpec("ans", bits,
                                                                              priors=tp))
    budget = max(4 * math.prod(s) for s in SHAPES)
    crafted = _crafted(bodies, budget)
    pool = [_split(b)[1] for b in bodies.values()]
    pool += [bytes(rng.integers(0, 256, k, dtype=np.uint8)) for k in (0, 3, 64, 2048)]
    tally: dict[str, Any] = {"reached_codec": 0, "codec_decoded": 0, "codec_refused": 0,
                             "warnings": 0, "crafted": dict.fromkeys(crafted, "not fed")}
    return {"valid": list(bodies.values()), "crafted": list(crafted.values()),
            "budget": budget, "decode": _decoder(budget, {b: w for w, b in crafted.items()},
                                                 tally),
            "mutator": codec_mutator(pool), "tally": tally}


def _decoder(budget: int, crafted: dict[bytes, str],
             tally: dict[str, Any]) -> Callable[[bytes], np.ndarray]:
    """``packing.unpack`` under ``budget``, checked: exactly the declared shape and dtype, and
    no crafted body accepted."""

    from coinf.cli.bench.fuzz_codecs import checked_unpack

    must_refuse: dict[bytes, tuple[str | None, bool]] = {
        body: (what, True) for body, what in crafted.items()}

    def decode(data: bytes) -> np.ndarray:
        return checked_unpack(data, budget, packing.ANS, "ans", must_refuse, tally)

    return decode


def fuzz_ans(case: dict[str, Any], n: int, seed: int) -> dict[str, Any]:
    """A short run (tests): :func:`fuzz_codecs.fuzz_codec` of the case."""
    from coinf.cli.bench.fuzz_codecs import fuzz_codec

    return fuzz_codec("packed_ans", case, n, random.Random(seed))
