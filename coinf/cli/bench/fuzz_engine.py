"""The fuzzing engine of ``coinf bench fuzz``: mutations of valid inputs and the run of one
decoder over them (only ProtocolError allowed; memory and time per input measured)."""

from __future__ import annotations

import random
import struct
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from coinf.cli.bench import progress
from coinf.errors import ProtocolError

BOUNDARY = [0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000,
            0xFFFFFFFF]


def join_chunks(chunks: list[bytes]) -> bytes:
    """Several chunks as one input: u16 length before each."""
    return b"".join(struct.pack("<H", len(c)) + c for c in chunks)


def split_chunks(data: bytes) -> list[bytes]:
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


class WrongResult(Exception):
    """A decoder returned something other than what its input declares (shape, dtype), or
    accepted a crafted input that must be refused: a failure, counted apart from foreign
    exceptions."""


def fuzz_one(name: str, valid: list[bytes], decode: Callable[[bytes], Any], n: int,
             rng: random.Random, budget: int | None = None,
             mutator: Callable[[random.Random, bytes], bytes] = mutate,
             rss: bool = False) -> dict[str, Any]:
    """``n`` inputs: ``valid`` first, then mutants of them (``mutator``) and random bytes.
    ``rss``: also the growth of the peak RSS per input (resets this process's VmHWM)."""
    stats: dict[str, Any] = {"inputs": 0, "protocol_errors": 0, "decoded": 0,
                             "other_exceptions": 0, "wrong_results": 0, "peak_bytes": 0,
                             "max_ms": 0.0, "largest_input": 0, "examples": []}
    rss = rss and rss_resettable()
    if rss:
        stats["peak_rss_growth_bytes"] = 0
    for i in range(n):
        if i < len(valid):
            data = valid[i]
        elif rng.random() < 0.1:
            data = rng.randbytes(rng.randint(0, 300))
        else:
            data = mutator(rng, rng.choice(valid))
        stats["largest_input"] = max(stats["largest_input"], len(data))
        if rss:
            rss_before = reset_rss_peak()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        try:
            decode(data)
            stats["decoded"] += 1
        except ProtocolError:
            stats["protocol_errors"] += 1
        except WrongResult as exc:
            stats["wrong_results"] += 1
            if len(stats["examples"]) < 3:
                stats["examples"].append(f"wrong result: {exc} <- {data[:48].hex()}")
        except Exception as exc:
            stats["other_exceptions"] += 1
            if len(stats["examples"]) < 3:
                stats["examples"].append(f"{type(exc).__name__}: {exc} <- {data[:48].hex()}")
        ms = (time.perf_counter() - t0) * 1e3
        stats["max_ms"] = max(stats["max_ms"], round(ms, 3))
        stats["peak_bytes"] = max(stats["peak_bytes"], tracemalloc.get_traced_memory()[1] - base)
        if rss:
            stats["peak_rss_growth_bytes"] = max(stats["peak_rss_growth_bytes"],
                                                 status_kb("VmHWM") * 1024 - rss_before)
        stats["inputs"] += 1
        if (i + 1) % 20_000 == 0:
            progress(f"{name}: {i + 1}/{n}")
    stats["peak_over_largest_input"] = round(stats["peak_bytes"] / max(stats["largest_input"], 1),
                                             2)
    if budget is not None:  # decoders of tensors may expand (compression) up to the signature
        stats["budget_bytes"] = budget
        stats["peak_over_budget"] = round(stats["peak_bytes"] / budget, 2)
        if rss:
            stats["peak_rss_growth_over_budget"] = round(
                stats["peak_rss_growth_bytes"] / budget, 2)
    if not stats["examples"]:
        del stats["examples"]
    return stats


# --- peak RSS per input (Linux) --------------------------------------------------------------


def status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def reset_rss_peak() -> int:
    """Reset VmHWM to the current RSS (``clear_refs`` 5); return that RSS in bytes."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
    return status_kb("VmRSS") * 1024


def rss_resettable() -> bool:
    try:
        reset_rss_peak()
        status_kb("VmHWM")
    except (OSError, ValueError):
        return False
    return True
