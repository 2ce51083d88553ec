"""Recorded instrument notes with known pitch, read out of a SoundFont 2 file.

A SoundFont (``.sf2``, RIFF) holds recordings of real instruments, each mapped by an instrument
zone to the MIDI key it sounds at (its root key) and a tuning in cents. A sample played at its
root key sounds at that key's equal-tempered pitch, so the recording itself has the pitch
``440 * 2**((root - 69) / 12) * 2**(-tune / 1200)``, with ``tune`` the zone's coarse and fine
tune plus the sample's own correction (SoundFont 2.04, sections 7.10 and 8.1.2). That is a
pitch label per recording, set by the font's author for every sample of every melodic
instrument; percussion (bank 128) and the General MIDI programs from 112 on (percussive
instruments and sound effects) carry none and are left out.

Only the file's structure is read: ``phdr``/``pbag``/``pgen`` (which instruments the melodic
presets use), ``inst``/``ibag``/``igen`` (each zone's sample, root key and tuning), ``shdr``
(where a sample lies, its rate and loop) and the 16-bit ``smpl`` data, every offset and count
bounds-checked: a damaged file is one :class:`~coinf.errors.InputError` naming what is wrong.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coinf.errors import InputError

#: generators (SoundFont 2.04 section 8.1.2) read here
INSTRUMENT, COARSE_TUNE, FINE_TUNE, SAMPLE_ID, ROOT_KEY = 41, 51, 52, 53, 58
#: General MIDI programs from here on are percussive instruments and sound effects
FIRST_UNPITCHED_PROGRAM = 112
PERCUSSION_BANK = 128
RIGHT, ROM = 2, 0x8000  # sample types: the right channel of a stereo pair, a ROM sample


@dataclass(frozen=True)
class Note:
    """One recording: its name, mono 16-bit samples, their rate and loop (offsets into
    ``data``), the pitch it was recorded at (Hz) and the General MIDI program using it."""

    name: str
    data: np.ndarray
    rate: int
    loop: tuple[int, int]
    f0: float
    program: int


def _chunks(data: bytes, start: int, end: int, what: str) -> dict[bytes, tuple[int, int]]:
    """Sub-chunks between ``start`` and ``end``: id -> (offset of the body, size)."""
    out: dict[bytes, tuple[int, int]] = {}
    pos = start
    while pos + 8 <= end:
        cid, size = struct.unpack_from("<4sI", data, pos)
        if pos + 8 + size > end:
            raise InputError(f"{what}: chunk {cid!r} of {size} bytes runs past the end of its "
                             f"list")
        key = data[pos + 8:pos + 12] if cid == b"LIST" else cid
        out[key] = (pos + 12, size - 4) if cid == b"LIST" else (pos + 8, size)
        pos += 8 + size + (size & 1)
    return out


def _records(data: bytes, where: tuple[int, int], fmt: str, what: str) -> list[tuple]:
    """The fixed-size records of a ``pdta`` sub-chunk (the last, a terminal record, dropped)."""
    off, size = where
    width = struct.calcsize(fmt)
    if size % width or size < 2 * width:
        raise InputError(f"{what}: a record list of {size} bytes is not whole {width}-byte "
                         f"records")
    return [struct.unpack_from(fmt, data, off + i * width) for i in range(size // width)]


def _zones(bags: list[tuple], gens: list[tuple], first: int, last: int, what: str
           ) -> list[dict[int, int]]:
    """The generators of bags ``first .. last - 1``: per zone, generator -> raw 16-bit amount."""
    if not 0 <= first <= last < len(bags):
        raise InputError(f"{what}: zone index {first}..{last} out of range")
    zones = []
    for b in range(first, last):
        g0, g1 = bags[b][0], bags[b + 1][0]
        if not 0 <= g0 <= g1 <= len(gens):
            raise InputError(f"{what}: generator index {g0}..{g1} out of range")
        zones.append({int(gens[g][0]): int(gens[g][1]) for g in range(g0, g1)})
    return zones


def _signed(amount: int) -> int:
    return amount - 0x10000 if amount >= 0x8000 else amount


def notes(path: str | Path) -> list[Note]:
    """Every mono or left-channel recording a melodic preset of the font at ``path`` plays,
    with its recorded pitch; each recording once (its first melodic use)."""
    what = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"{what}: cannot read the SoundFont ({exc.strerror})") from None
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"sfbk":
        raise InputError(f"{what}: not a SoundFont 2 file (no RIFF 'sfbk' header)")
    top = _chunks(data, 12, min(len(data), 8 + struct.unpack_from("<I", data, 4)[0]), what)
    if b"sdta" not in top or b"pdta" not in top:
        raise InputError(f"{what}: the SoundFont has no {'sdta' if b'sdta' not in top else 'pdta'}"
                         f" list")
    sdta = _chunks(data, top[b"sdta"][0], sum(top[b"sdta"]), what)
    pdta = _chunks(data, top[b"pdta"][0], sum(top[b"pdta"]), what)
    need = [b"phdr", b"pbag", b"pgen", b"inst", b"ibag", b"igen", b"shdr"]
    missing = [n.decode() for n in need if n not in pdta]
    if b"smpl" not in sdta or missing:
        raise InputError(f"{what}: the SoundFont lacks {', '.join(missing or ['smpl'])}")
    off, size = sdta[b"smpl"]
    pcm = np.frombuffer(data, "<i2", size // 2, off)
    presets = _records(data, pdta[b"phdr"], "<20sHHHIII", what)
    pbags = _records(data, pdta[b"pbag"], "<HH", what)
    pgens = _records(data, pdta[b"pgen"], "<HH", what)
    insts = _records(data, pdta[b"inst"], "<20sH", what)
    ibags = _records(data, pdta[b"ibag"], "<HH", what)
    igens = _records(data, pdta[b"igen"], "<HH", what)
    headers = _records(data, pdta[b"shdr"], "<20sIIIIIBbHH", what)[:-1]
    program_of: dict[int, int] = {}  # instrument -> the melodic program that first plays it
    for p, row in enumerate(presets[:-1]):
        program, bank = int(row[1]), int(row[2])
        if bank == PERCUSSION_BANK or program >= FIRST_UNPITCHED_PROGRAM:
            continue
        for zone in _zones(pbags, pgens, int(row[3]), int(presets[p + 1][3]), what):
            if INSTRUMENT in zone:
                program_of.setdefault(zone[INSTRUMENT], program)
    out: list[Note] = []
    seen: set[int] = set()
    for i in sorted(program_of):
        if not 0 <= i < len(insts) - 1:
            raise InputError(f"{what}: a preset names instrument {i}; the font has "
                             f"{len(insts) - 1}")
        zones = _zones(ibags, igens, int(insts[i][1]), int(insts[i + 1][1]), what)
        for zone in zones:
            sid = zone.get(SAMPLE_ID)
            if sid is None or sid in seen:
                continue
            if not 0 <= sid < len(headers):
                raise InputError(f"{what}: a zone names sample {sid}; the font has "
                                 f"{len(headers)}")
            seen.add(sid)
            name, start, end, loop0, loop1, rate, pitch, corr, _, kind = headers[sid]
            if kind & (RIGHT | ROM) or not 0 <= start < end <= len(pcm) or rate <= 0:
                continue
            root = zone.get(ROOT_KEY, pitch)
            if not 0 <= root <= 127:
                continue
            tune = 100 * _signed(zone.get(COARSE_TUNE, 0)) + _signed(zone.get(FINE_TUNE, 0)) \
                + int(corr)
            f0 = 440.0 * 2.0 ** ((root - 69) / 12) * 2.0 ** (-tune / 1200)
            loop = (int(loop0) - start, int(loop1) - start) \
                if start <= loop0 < loop1 <= end else (0, end - start)
            out.append(Note(name.split(b"\0")[0].decode("latin-1"), pcm[start:end], int(rate),
                            loop, f0, program_of[i]))
    return out


__all__ = ["Note", "notes"]
