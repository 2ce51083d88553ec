"""Labelled pitch data from a SoundFont (models/soundfont.py, models/notes.py), on a small font
written here: the pitch each recording was made at, melodic presets only, checked by an
independent estimate, and one clear error for a damaged file."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from coinf.models import notes, soundfont

from coinf.errors import InputError

RATE = 32000
TUNE = 30  # cents the zone tunes sample 0 up: it was recorded 30 cents flat of A4


def _chunk(cid: bytes, body: bytes) -> bytes:
    return struct.pack("<4sI", cid, len(body)) + body + (b"\0" if len(body) & 1 else b"")


def _list(kind: bytes, *chunks: bytes) -> bytes:
    return _chunk(b"LIST", kind + b"".join(chunks))


def _tone(f: float, seconds: float = 0.5) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (12000 * np.sin(2 * np.pi * f * t)).astype("<i2")


def write_font(path: Path) -> float:
    """Three recordings: a tone played by program 0 (root A4, tuned +30 cents), noise played
    by the percussion bank, and a tone an octave above the key its zone gives it (also program
    0). Returns the first's recorded pitch."""
    f0 = 440.0 * 2 ** (-TUNE / 1200)
    waves = [_tone(f0), np.random.default_rng(0).integers(-9000, 9000, RATE // 4).astype("<i2"),
             _tone(2 * 330.0)]
    smpl, headers, pos = b"", b"", 0
    for k, (name, w) in enumerate(zip((b"tone", b"drum", b"octave"), waves, strict=True)):
        n = len(w)
        loop = (pos + n // 2, pos + n - 8) if k != 1 else (pos, pos + n)
        headers += struct.pack("<20sIIIIIBbHH", name, pos, pos + n, *loop, RATE, 60, 0, 0, 1)
        smpl += w.tobytes() + b"\0\0" * 46  # the spec's 46 zero samples after each
        pos += n + 46
    headers += struct.pack("<20sIIIIIBbHH", b"EOS", 0, 0, 0, 0, 0, 0, 0, 0, 0)
    # instrument 0: zone (sample 0, root 69, fine +30), zone (sample 2, root 64 = E4 330 Hz);
    # instrument 1: zone (sample 1)
    igen = [(58, 69), (52, TUNE), (53, 0), (58, 64), (53, 2), (53, 1)]
    ibag = [(0, 0), (3, 0), (5, 0), (6, 0)]
    inst = [(b"melodic", 0), (b"kit", 2), (b"EOI", 3)]
    pgen = [(41, 0), (41, 1)]
    pbag = [(0, 0), (1, 0), (2, 0)]
    phdr = [(b"piano", 0, 0, 0), (b"drums", 0, 128, 1), (b"EOP", 0, 0, 2)]
    pdta = _list(
        b"pdta",
        _chunk(b"phdr", b"".join(struct.pack("<20sHHHIII", n, p, b, i, 0, 0, 0)
                                 for n, p, b, i in phdr)),
        _chunk(b"pbag", b"".join(struct.pack("<HH", *r) for r in pbag)),
        _chunk(b"pgen", b"".join(struct.pack("<HH", *r) for r in pgen) + b"\0" * 4),
        _chunk(b"inst", b"".join(struct.pack("<20sH", *r) for r in inst)),
        _chunk(b"ibag", b"".join(struct.pack("<HH", *r) for r in ibag)),
        _chunk(b"igen", b"".join(struct.pack("<HH", *r) for r in igen) + b"\0" * 4),
        _chunk(b"shdr", headers))
    body = b"sfbk" + _list(b"INFO", _chunk(b"ifil", struct.pack("<HH", 2, 1))) \
        + _list(b"sdta", _chunk(b"smpl", smpl)) + pdta
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return f0


def test_a_recording_is_labelled_with_the_pitch_it_was_made_at(tmp_path: Path) -> None:
    f0 = write_font(tmp_path / "f.sf2")
    got = {n.name: n for n in soundfont.notes(tmp_path / "f.sf2")}
    assert set(got) == {"tone", "octave"}  # the percussion bank's recording has no pitch
    tone = got["tone"]
    assert tone.f0 == pytest.approx(f0, rel=1e-9) and tone.rate == RATE and tone.program == 0
    assert tone.loop[0] < tone.loop[1] <= len(tone.data)
    assert got["octave"].f0 == pytest.approx(440 * 2 ** (-5 / 12), rel=1e-9)  # E4, as mapped
    # the independent estimate confirms the tone and refuses the octave-off mapping
    assert notes.yin(tone.data[:RATE // 5], RATE) == pytest.approx(f0, rel=0.003)
    assert [n.name for n in notes.checked(tmp_path / "f.sf2", 40, 2200)] == ["tone"]


def test_a_note_set_is_clips_at_the_model_rate_with_exactly_shifted_labels(
        tmp_path: Path) -> None:
    f0 = write_font(tmp_path / "f.sf2")
    x, labels, sources = notes.note_set(4, 0, 16000, 46.875, 2093.75, tmp_path / "f.sf2")
    assert x.shape == (4, 16000) and x.dtype == np.float32 and labels.dtype == np.float32
    assert sources == 1 and labels[0] == pytest.approx(f0, rel=1e-6)
    assert np.all(np.abs(12 * np.log2(labels / f0)) <= notes.MAX_SHIFT + 1e-6)
    assert len(set(np.round(labels[1:], 3))) == 3  # the repeats are shifted, each differently
    for clip, want in zip(x, labels, strict=True):
        assert 0.09 <= np.abs(clip).max() <= 0.91
        assert notes.yin(clip[4000:8000], 16000) == pytest.approx(float(want), rel=0.006)


def test_a_damaged_font_is_one_error_naming_it(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    write_font(tmp_path / "f.sf2")
    data = (tmp_path / "f.sf2").read_bytes()
    (tmp_path / "short.sf2").write_bytes(data[:len(data) - 40])
    with pytest.raises(InputError, match=r"short\.sf2: chunk .* runs past the end"):
        soundfont.notes(tmp_path / "short.sf2")
    (tmp_path / "wav.sf2").write_bytes(b"RIFF\0\0\0\0WAVE")
    with pytest.raises(InputError, match=r"wav\.sf2: not a SoundFont 2 file"):
        soundfont.notes(tmp_path / "wav.sf2")
    with pytest.raises(InputError, match="cannot read the SoundFont"):
        soundfont.notes(tmp_path / "none.sf2")
    monkeypatch.setenv("COINF_SOUNDFONT", str(tmp_path / "none.sf2"))
    with pytest.raises(InputError, match=r"COINF_SOUNDFONT=.*none\.sf2: no such file"):
        notes.font_path()
    monkeypatch.setenv("COINF_SOUNDFONT", str(tmp_path / "f.sf2"))
    assert notes.font_path() == tmp_path / "f.sf2"


def test_the_pitch_model_is_fed_labelled_notes_when_a_font_is_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from coinf.models import realdata

    f0 = write_font(tmp_path / "f.sf2")
    monkeypatch.setenv("COINF_SOUNDFONT", str(tmp_path / "f.sf2"))
    feeds, source = realdata.dataset("swift_f0", 3)
    assert feeds["audio"].shape == (3, 16000) and feeds["labels"].shape == (3,)
    assert feeds["labels"][0] == pytest.approx(f0, rel=1e-6) and "f.sf2" in source
    # a cache made without labels is never taken for one with them
    assert realdata.data_file("swift_f0", 3) == "swift_f0-3-d2.npz"
    monkeypatch.setenv("COINF_SOUNDFONT", "")
    monkeypatch.setattr(notes, "DEFAULT_FONT", tmp_path / "none.sf2")
    assert realdata.data_file("swift_f0", 3) == "swift_f0-3.npz"
