"""The rANS coder (ble_protocol/entropy.py), the ansN tables (ble_protocol/priors.py), the ansN
packing and its calibration: exact round trips, escapes, hostile streams, bounded memory."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from coinf.ble_protocol import entropy, negotiate, packing, priors
from coinf.ble_protocol.entropy import ChannelPriors, decode, encode
from coinf.ble_protocol.packing import PackSpec
from coinf.convert import calibrate as cal
from coinf.convert import entropy_cal
from coinf.convert.packcal import tensor_specs
from hypothesis import given, settings
from hypothesis import strategies as st

from coinf import bundle as bundle_mod
from coinf.bundle import Bundle
from coinf.errors import BundleError, ErrorCode, ProtocolError
from tests.bundles import fixed
from tests.test_calibrate import make_bundle, make_data


@pytest.fixture(autouse=True)
def _own_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no table known and no bundle remembered."""
    monkeypatch.setattr(priors, "_BOOK", {})
    monkeypatch.setattr(priors, "_INDEXES", {})
    monkeypatch.setattr(bundle_mod, "PRIOR_ROOTS", [])


def _priors(c: int, k: int, contexts: int = 1, precision: int = 12, seed: int = 0,
            offsets: np.ndarray | None = None, name: str = "t") -> ChannelPriors:
    rng = np.random.default_rng(seed)
    shape = (c, contexts, k) if contexts > 1 else (c, k)
    counts = rng.integers(0, 60, shape) * (rng.random(shape) < 0.7)
    return ChannelPriors.from_counts(counts, precision, offsets, name)


def _skewed(rng: np.random.Generator, c: int, n: int, k: int) -> np.ndarray:
    p = 0.55 ** np.arange(k)
    return rng.choice(k, (c, n), p=p / p.sum())


# --- the coder ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("c", "n", "k", "contexts", "width", "lanes"), [
    (1, 1, 1, 1, 0, None), (3, 17, 4, 1, 0, None), (8, 400, 16, 16, 20, None),
    (8, 400, 16, 16, 20, 1), (5, 123, 256, 16, 11, 7), (2, 999, 8, 16, 0, 10_000),
    (64, 1, 16, 1, 0, None), (4, 5000, 3, 16, 50, None)])
def test_round_trip_is_exact(c: int, n: int, k: int, contexts: int, width: int,
                             lanes: int | None) -> None:
    rng = np.random.default_rng(c * n + k)
    pr = _priors(c, k, contexts, precision=16 if k > 16 else 12)
    sym = _skewed(rng, c, n, k)
    data = encode(sym, pr, lanes, width)
    out = decode(data, pr, c, n, width)
    assert out.dtype == np.int64 and out.shape == (c, n)
    assert np.array_equal(out, sym)
    assert entropy.stream_key(data) == pr.key


@settings(max_examples=60, deadline=None)
@given(c=st.integers(1, 6), n=st.integers(0, 300), k=st.integers(1, 40),
       contexts=st.sampled_from([1, 16]), width=st.integers(0, 30), lanes=st.integers(1, 400),
       seed=st.integers(0, 2**16))
def test_round_trip_property(c: int, n: int, k: int, contexts: int, width: int, lanes: int,
                             seed: int) -> None:
    rng = np.random.default_rng(seed)
    pr = _priors(c, k, contexts, seed=seed)
    sym = rng.integers(0, k, (c, n))
    assert np.array_equal(decode(encode(sym, pr, lanes, width), pr, c, n, width), sym)


def test_out_of_range_symbols_are_escaped_not_clipped() -> None:
    rng = np.random.default_rng(1)
    offsets = np.array([-3, 0, 100])
    pr = _priors(3, 8, 16, offsets=offsets)
    sym = rng.integers(0, 8, (3, 200)) + offsets[:, None]
    plain = encode(sym, pr, width=10)
    odd = sym.copy()
    big = np.iinfo(np.int64)
    odd[0, 0], odd[0, 5], odd[1, 7], odd[2, 199] = -4, 5, big.max, big.min  # just outside too
    data = encode(odd, pr, width=10)
    assert np.array_equal(decode(data, pr, 3, 200, 10), odd)
    assert len(data) > len(plain) + 20  # the values travel as varints (two of 10 bytes)
    with pytest.raises(ValueError, match="fit int64"):
        encode(np.array([[2**63]], np.uint64), _priors(1, 4))


def test_priors_keep_every_symbol_codable() -> None:
    counts = np.zeros((2, 16, 5))
    counts[0, :, 0] = 1000  # channel 0 never saw symbols 1..4; channel 1 saw nothing
    pr = ChannelPriors.from_counts(counts, 10)
    assert pr.freqs.min() >= 1 and np.all(pr.freqs.sum(axis=2) == 1 << 10)
    assert pr.freqs.shape == (2, 16, 6) and pr.contexts == 16 and pr.symbols == 5
    with pytest.raises(ValueError, match=">= 1"):
        ChannelPriors(np.array([[4096, 0]]), None, 12)
    with pytest.raises(ValueError, match="sum"):
        ChannelPriors(np.array([[100, 1]]), None, 12)
    with pytest.raises(ValueError, match="precision"):
        ChannelPriors.from_counts(np.ones((1, 300)), 8)
    same = ChannelPriors(pr.freqs.copy(), None, 10)
    assert same.key == pr.key and ChannelPriors(pr.freqs, None, 10, "other").key != pr.key


def _stream(c: int = 4, n: int = 300, seed: int = 2) -> tuple[ChannelPriors, np.ndarray, bytes]:
    pr = _priors(c, 8, 16, seed=seed)
    sym = _skewed(np.random.default_rng(seed), c, n, 8)
    return pr, sym, encode(sym, pr, width=15)


def test_every_truncation_and_extension_is_refused() -> None:
    pr, _, data = _stream(2, 60)
    for cut in range(len(data)):
        with pytest.raises(ProtocolError):
            decode(data[:cut], pr, 2, 60, 15)
    for extra in (b"\0", b"\0\0", b"\x01\x00"):
        with pytest.raises(ProtocolError):
            decode(data + extra, pr, 2, 60, 15)


def test_corrupt_bytes_are_refused_or_keep_the_shape() -> None:
    pr, _, data = _stream()
    rng = np.random.default_rng(3)
    refused = 0
    for _ in range(1500):
        bad = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            bad[int(rng.integers(0, len(bad)))] ^= 1 << int(rng.integers(0, 8))
        try:
            out = decode(bytes(bad), pr, 4, 300, 15)
        except ProtocolError as exc:
            assert exc.code in (ErrorCode.MALFORMED, ErrorCode.TRUNCATED)
            refused += 1
        else:
            assert out.shape == (4, 300) and out.dtype == np.int64
    assert refused >= 1490  # the key, the lane states' end and the word count catch them


def _parts(data: bytes) -> tuple[bytes, int, int, bytes]:
    """(key, lanes, escape bytes, the rest) of a stream."""
    mv = memoryview(data)
    lanes, pos = entropy._read_varint(mv, 4, "lanes")
    esc, pos = entropy._read_varint(mv, pos, "escapes")
    return data[:4], lanes, esc, data[pos:]


def _join(key: bytes, lanes: int, esc: int, rest: bytes) -> bytes:
    return key + entropy._varint(lanes) + entropy._varint(esc) + rest


def test_crafted_streams_are_refused() -> None:
    pr, _, data = _stream()
    key, lanes, esc, rest = _parts(data)
    states, words = rest[: 4 * lanes], rest[4 * lanes:]
    low = struct.pack("<I", 0xFFFF) + states[4:]
    cases = {
        "no lanes": _join(key, 0, esc, rest),
        "more lanes than symbols": _join(key, 1201, esc, rest),
        "one lane: too many steps": _join(key, 1, esc, rest),
        "a lane count leaving a lane empty": _join(key, lanes + 1, esc, rest),
        "escape bytes past the end": _join(key, lanes, 2**32, rest),
        "escape bytes without escapes": _join(key, lanes, 2, states + b"\x01\x02" + words),
        "a state below 2**16": _join(key, lanes, esc, low + words),
        "an odd word byte": _join(key, lanes, esc, rest + b"\0"),
        "an extra word": _join(key, lanes, esc, rest + b"\0\0"),
        "a word too few": _join(key, lanes, esc, rest[:-2]),
        "non-minimal lane varint": key + b"\x80\x00" + rest,
        "long varint": key + b"\xff" * 6 + rest,
        "other priors' key": bytes(4) + data[4:],
    }
    for what, body in cases.items():
        with pytest.raises(ProtocolError) as info:
            decode(body, pr, 4, 300, 15)
        assert info.value.code in (ErrorCode.MALFORMED, ErrorCode.TRUNCATED), what
    with pytest.raises(ProtocolError, match="coded with priors"):
        decode(data, _priors(4, 8, 16, seed=99), 4, 300, 15)  # same shape, other table
    with pytest.raises(ProtocolError, match="channels"):
        decode(data, pr, 5, 240, 15)
    big = 2 * entropy.MAX_STEPS  # one lane for so many symbols: refused before the loop
    with pytest.raises(ProtocolError, match="steps"):
        decode(_join(pr.key_bytes, 1, 0, bytes(4) * 1), pr, 4, big, 15)


def test_declared_sizes_are_never_allocated() -> None:
    """Hostile streams for a tensor of a million symbols are refused before anything of that
    size exists; a valid decode stays within a few dozen bytes per symbol."""
    pr = _priors(4, 8, 16)
    n = 250_000
    hostile = [_join(pr.key_bytes, 60_000, 2**34 - 1, b""),
               _join(pr.key_bytes, 2**34 - 1, 0, bytes(64)),
               _join(pr.key_bytes, 1, 0, bytes(64)),
               _join(pr.key_bytes, 1_000_000, 0, bytes(64))]
    tracemalloc.start()
    try:
        for body in hostile:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            with pytest.raises(ProtocolError):
                decode(body, pr, 4, n, 100)
            assert tracemalloc.get_traced_memory()[1] - base < 64 * 1024
        sym = _skewed(np.random.default_rng(0), 4, 5000, 8)
        data = encode(sym, pr, width=100)
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        decode(data, pr, 4, 5000, 100)
        assert tracemalloc.get_traced_memory()[1] - base < 48 * sym.size + 256 * 1024
    finally:
        tracemalloc.stop()


def test_contexts_and_lanes_cost_what_they_should() -> None:
    """On a patchy map the 16 context pmfs code well under one pmf per channel, and each
    stream comes within the lanes' states (4 B each) plus 2% of its ideal length."""
    rng = np.random.default_rng(4)
    field = rng.standard_normal((6, 44, 44))
    smooth = sum(np.roll(np.roll(field, i, 1), j, 2) for i in range(4) for j in range(4))
    sym = np.clip(np.round(smooth[:, :40, :40] - 2), 0, 7).astype(np.int64).reshape(6, -1)
    with_ctx = priors.count_levels(sym, 3, 16, 40)
    flat = ChannelPriors.from_counts(with_ctx.sum(axis=1), 11)
    ctx = ChannelPriors.from_counts(with_ctx, 11)
    for pr in (flat, ctx):
        data = encode(sym, pr, width=40)
        lanes = _parts(data)[1]
        assert len(data) <= pr.cost_bits(sym, 40) / 8 * 1.02 + 4 * lanes + 16
    assert ctx.cost_bits(sym, 40) < 0.8 * flat.cost_bits(sym, 40)


# --- the ansN packing --------------------------------------------------------------------------


def _relu(rng: np.random.Generator, shape: tuple[int, ...] = (1, 8, 12, 12)) -> np.ndarray:
    x = rng.standard_normal(shape).cumsum(axis=-1).cumsum(axis=-2) / 4
    return np.maximum(x - 0.3, 0).astype(np.float32)


def _linear(rng: np.random.Generator, shape: tuple[int, ...] = (1, 8, 12, 12)) -> np.ndarray:
    """Values around 0 whose extremes, and so the level of 0, move from input to input."""
    x = rng.standard_normal(shape).reshape(-1)
    x[:2] = -rng.uniform(2, 8), rng.uniform(2, 8)
    return x.reshape(shape).astype(np.float32)


def _fit(make, bits: int, shape: tuple[int, ...] = (1, 8, 12, 12),
         n: int = 24) -> entropy_cal.PriorFit:
    from coinf.bundle import Candidate, Part, TensorSpec

    t = TensorSpec("x", shape, "float32", 4 * int(np.prod(shape)))
    cand = Candidate("c001", "cut", (t,), Part(None, 0, 0, ()), Part("t.onnx", 0, 0, ()))
    fit = entropy_cal.PriorFit(cand, [bits])
    rng = np.random.default_rng(bits)
    for i in range(n):
        fit.add(i, {"x": make(rng, shape)})
    fit.fit()
    return fit


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", ["relu", "linear", "dense"])
def test_ans_packing_decodes_to_the_q_values(bits: int, kind: str) -> None:
    make, shape = {"relu": (_relu, (1, 8, 12, 12)), "linear": (_linear, (1, 8, 12, 12)),
                   "dense": (_linear, (1, 40))}[kind]
    fit = _fit(make, bits, shape)
    tp = fit.tables[("x", bits)][-1]
    assert tp.centered or kind != "linear" or bits < 4  # the level of 0 moves: centred wins
    book = fit.book
    rng = np.random.default_rng(100 + bits)
    for _ in range(4):
        x = make(rng, shape)
        body = packing.pack(x, PackSpec("ans", bits, priors=tp))
        assert packing.describe(body)["codec"] == "ans"
        got = packing.unpack(body, book=book)
        want = packing.unpack(packing.pack(x, f"q{bits}"))
        assert got.dtype == x.dtype and np.array_equal(got, want)  # the very levels of qN
        h = packing.read_header(body)
        bound = packing.quantization_bound(h.scale, float(np.abs(x).max()))
        assert float(np.abs(got - x).max()) <= bound
    with pytest.raises(ProtocolError, match="does not have"):
        packing.unpack(body)  # the receiver lacks the table


def test_ans_is_smaller_than_qz_on_patchy_maps() -> None:
    fit = _fit(_relu, 3, n=40)
    tp = fit.tables[("x", 3)][-1]
    rng = np.random.default_rng(7)
    xs = [_relu(rng) for _ in range(10)]
    ans = sum(len(packing.pack(x, PackSpec("ans", 3, priors=tp))) for x in xs)
    qz = sum(len(packing.pack(x, "qz3")) for x in xs)
    assert ans < 0.9 * qz


def test_ans_spec_and_fallbacks() -> None:
    assert str(PackSpec.parse("ans4")) == "ans4" and PackSpec.parse("ANS8").bits == 8
    for bad in ("ans0", "ans9", "ans16"):
        with pytest.raises(ValueError):
            PackSpec.parse(bad)
    x = _relu(np.random.default_rng(0))
    assert packing.describe(packing.pack(x, "ans4"))["codec"] == "quantz"  # no table: qz4
    tp = _fit(_relu, 4).tables[("x", 4)][-1]
    other = np.ones((1, 9, 12, 12), np.float32) * np.arange(144, dtype=np.float32).reshape(12, 12)
    assert packing.describe(packing.pack(other, PackSpec("ans", 4, priors=tp)))["codec"] \
        == "quantz"  # a table of another shape: qz4
    assert packing.describe(packing.pack(np.zeros((2, 3), np.float32), "ans2"))["codec"] \
        == "const"
    assert packing.describe(packing.pack(np.arange(6), "ans2"))["codec"] == "lossless"
    with pytest.raises(BundleError, match="re-run"):
        packing.pack(x, PackSpec("ans", 4, priors="0badc0de"))  # a key nobody has
    assert "ans" not in negotiate.decodable()
    priors.register(tp)
    assert "ans" in negotiate.decodable()


def test_ans_bodies_naming_other_tables_are_refused() -> None:
    fit2, fit4 = _fit(_relu, 2), _fit(_relu, 4)
    t2, t4 = fit2.tables[("x", 2)][-1], fit4.tables[("x", 4)][-1]
    book = {t2.key: t2, t4.key: t4}
    x = _relu(np.random.default_rng(1))
    body = packing.pack(x, PackSpec("ans", 4, priors=t4))
    h = packing.read_header(body)
    head, payload = body[:h.payload_offset], body[h.payload_offset:]
    two = packing.pack(x, PackSpec("ans", 2, priors=t2))
    swapped = head + two[packing.read_header(two).payload_offset:]  # 4-bit header, 2-bit table
    with pytest.raises(ProtocolError, match="names entropy priors"):
        packing.unpack(swapped, book=book)
    wider = packing._header(packing.ANS, 0, 4, 1, (1, 16, 12, 12), h.scale, h.offset)
    with pytest.raises(ProtocolError, match="names entropy priors"):
        packing.unpack(wider + payload, book=book)  # a 16-channel header, an 8-channel table
    crafted = {
        "no elements": packing.HEADER.pack(packing.MAGIC, packing.ANS, 0, 4, 1, 1) + b"\x00"
        + packing.PARAMS.pack(0.1, 0.0) + payload,
        "9 bits": head[:5] + bytes([9]) + head[6:] + payload,
        "an LZ4 flag": head[:4] + b"\x01" + head[5:] + payload,
        "an int dtype": head[:6] + bytes([7]) + head[7:] + payload,
        "no payload": head,
        "half a key": head + payload[:2],
    }
    for what, data in crafted.items():
        with pytest.raises(ProtocolError):
            packing.unpack(data, book=book)
        assert what


# --- calibration, the bundle files, the planner --------------------------------------------------


def _calibrated(tmp_path: Path, specs: tuple[str, ...] = ("q3", "qz3", "ans2", "ans4")
                ) -> tuple[Bundle, dict]:
    bundle = make_bundle(tmp_path / "b")
    make_data(tmp_path / "val.npz", n=80)
    data = cal.load_dataset(str(tmp_path / "val.npz"), bundle)
    results = cal.calibrate(bundle, data, specs)
    cal.store(bundle, results, data)
    return Bundle.load(bundle.root), results


def test_calibration_fits_stores_and_names_the_tables(tmp_path: Path) -> None:
    bundle, results = _calibrated(tmp_path, ("q3", "qz3", "ans2", "ans3", "ans4"))
    rows = {r["spec"]: r for r in results["c001"]}
    # on a 64-value vector ans3's body is not smaller than q3's: the same tensor, more bytes and
    # time, never a choice, so the row (and its table) is dropped; ans2/ans4 have no q to lose to
    assert "ans3" not in rows and {"ans2", "ans4"} <= set(rows)
    for spec in ("ans2", "ans4"):
        row = rows[spec]
        assert set(row["priors"]) == {"h"} and row["encode_ms"] > 0 and row["decode_ms"] > 0
        assert row["bits"] == int(spec[3:]) and row["codec"] == "ans"
    # the same levels as q4: the same outputs, the same accuracy
    data = cal.load_dataset(str(tmp_path / "val.npz"), bundle)
    q4 = cal.calibrate_candidate(bundle, bundle.candidate("c001"), data, ["q4"])[0]
    assert rows["ans4"]["accuracy_drop_pp"] == q4["accuracy_drop_pp"]
    assert rows["ans4"]["rel_l2"] == q4["rel_l2"] and rows["ans4"]["mean_bytes"] > q4["mean_bytes"]
    assert (bundle.root / priors.INDEX).is_file() and (bundle.root / priors.DATA).is_file()
    assert bundle.meta[bundle_mod.ENTROPY_PRIORS]["tables"] == 4  # c000's x and c001's h, x 2
    assert bundle.root.resolve() in bundle_mod.PRIOR_ROOTS
    tables = {tp.key: tp for tp in priors.read_tables(bundle.root)}
    assert rows["ans4"]["priors"]["h"] in tables
    assert tables[rows["ans4"]["priors"]["h"]].priors.name == "c001/h/ans4/axis1" + (
        "/centered" if tables[rows["ans4"]["priors"]["h"]].centered else "")

    # another process: nothing registered, the tables come from the loaded bundle's files
    priors._BOOK.clear()
    bundle_mod.PRIOR_ROOTS.clear()
    again = Bundle.load(bundle.root)
    cand = again.candidate("c001")
    spec = tensor_specs(cand, "ans4")["h"]
    assert spec.codec == "ans" and spec.priors == rows["ans4"]["priors"]["h"]
    h = np.maximum(np.random.default_rng(0).standard_normal((1, 64)), 0).astype(np.float32)
    body = packing.pack(h, spec)
    assert packing.describe(body)["codec"] == "ans"
    assert np.array_equal(packing.unpack(body), packing.unpack(packing.pack(h, "q4")))
    assert entropy_cal.missing_priors(cand, "ans4") is None
    assert "ans" in negotiate.decodable()


def test_a_lost_or_tampered_table_is_not_offered(tmp_path: Path) -> None:
    from coinf.wearable.planner.codec_costs import undecodable

    bundle, results = _calibrated(tmp_path, ("ans4",))
    key = results["c001"][0]["priors"]["h"]
    import json

    tp = priors.lookup(key)
    assert tp is not None
    freqs = tp.priors.freqs.copy()
    top = np.unravel_index(int(freqs.argmax()), freqs.shape)
    freqs[top] -= 1
    freqs[(*top[:-1], (top[-1] + 1) % freqs.shape[-1])] += 1  # rows still sum right
    forged = priors.TensorPriors(ChannelPriors(freqs, None, tp.priors.precision, tp.priors.name),
                                 tp.cut, tp.tensor, tp.bits, tp.axis, tp.centered)
    priors.write(bundle.root, [forged])
    index = json.loads((bundle.root / priors.INDEX).read_text())
    index["tables"][0]["key"] = key  # the rows' key over other frequencies
    (bundle.root / priors.INDEX).write_text(json.dumps(index))
    with pytest.raises(BundleError, match="does not match its key"):
        priors.read_tables(bundle.root)
    index["tables"][0]["precision"] += 1
    (bundle.root / priors.INDEX).write_text(json.dumps(index))
    with pytest.raises(BundleError, match="not a valid table"):
        priors.read_tables(bundle.root)
    (bundle.root / priors.DATA).write_bytes(bytes(64))
    with pytest.raises(BundleError, match=r"decompress|runs past"):
        priors.read_tables(bundle.root)
    priors._BOOK.clear()
    cand = Bundle.load(bundle.root).candidate("c001")
    assert priors.lookup(key) is None
    why = undecodable("ans4", frozenset({"ans", "q"}), cand)
    assert why is not None and key in why
    assert "cannot decode ans" in str(undecodable("ans4", frozenset({"q"})))
    x = np.ones((1, 64), np.float32) * np.arange(64, dtype=np.float32)
    with pytest.raises(ProtocolError, match="does not have"):
        fit = _fit(_linear, 4, (1, 64))
        packing.unpack(packing.pack(x, PackSpec("ans", 4, priors=fit.tables[("x", 4)][-1])))


def test_a_session_runs_an_ans_split(tmp_path: Path) -> None:
    """The wearable packs with the table its calibration row names, the handheld finds it in
    the bundle it loaded: the output is the q4 run's, bit for bit."""
    from coinf import Session

    bundle, _ = _calibrated(tmp_path, ("q3", "ans4"))
    priors._BOOK.clear()
    x = np.random.default_rng(5).standard_normal((1, 16)).astype(np.float32)
    with Session(bundle.root, fixed("c001", "ans4")) as sess:
        got = sess.run(None, {"x": x})[0]
        assert sess.last_run.packing == "ans4"
    with Session(bundle.root, fixed("c001", "q4")) as sess:
        want = sess.run(None, {"x": x})[0]
    assert np.array_equal(got, want)


def test_the_planner_prices_ans_by_its_times_and_offers_it_only_with_tables(
        tmp_path: Path) -> None:
    from coinf.wearable.planner.adapt import LinkEstimate
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.policy import Policy

    bundle, results = _calibrated(tmp_path, ("q3", "ans4"))
    row = next(r for r in results["c001"] if r["spec"] == "ans4")
    planner = Planner(bundle, policy=Policy(accuracy_tolerance_pp=100.0))
    link = LinkEstimate(20_000, 20_000, 30)
    rows = {r.id: r for r in planner.costs(link)}
    assert planner.codec_ms["c001~ans4"] == pytest.approx(
        (row["encode_ms"] * planner.codec_slowdown, row["decode_ms"]), rel=1e-6)
    assert rows["c001~ans4"].crossing_bytes > 0 and "c001~q3" in rows
    planner.peer_decoders = frozenset({"q", "f32", "f16", "raw", "qz"})  # no ans there
    planner.reset_configs()
    assert "c001~ans4" not in {r.id for r in planner.costs(link)}
    assert "cannot decode ans" in planner.excluded_configs["c001~ans4"]
    planner.peer_decoders = frozenset({"q", "f32", "f16", "raw", "ans"})
    priors._BOOK.clear()
    (bundle.root / priors.INDEX).unlink()  # this wearable lost its tables
    planner.reset_configs()
    assert "c001~ans4" not in {r.id for r in planner.costs(link)}
    assert "lacks the entropy priors" in planner.excluded_configs["c001~ans4"]


def test_ans_is_offered_only_to_a_handheld_with_the_same_tables(tmp_path: Path) -> None:
    """HELLO_ACK names the handheld's tables (``priors``): another set, or none, and ansN is
    not planned; a fixed ans4 goes as qz4 (the same levels), or q4 without zstd there."""
    from coinf.handheld.daemon import HandheldDaemon
    from coinf.wearable.planner.codec_costs import check_decodable, peer_decoders

    bundle, _ = _calibrated(tmp_path, ("q3", "ans4"))
    loaded = Bundle.load(bundle.root)
    digest = loaded.priors_digest
    assert digest is not None
    ack = HandheldDaemon(loaded).hello_payload()
    assert ack["priors"] == digest and "ans" in ack["decoders"]
    assert "ans" in peer_decoders(ack, digest)
    for other in ({**ack, "priors": "0" * 64}, {**ack, "priors": None}):
        names = peer_decoders(other, digest)
        assert "ans" not in names
        check_decodable(PackSpec.parse("ans4"), names)  # not refused: it has a substitute
        fitted, why = negotiate.fit(PackSpec.parse("ans4"), names)
        assert str(fitted) == "qz4" and "other entropy tables" in str(why)
        no_zstd = negotiate.peer_set([n for n in other["decoders"] if n not in ("qz", "zstd")],
                                     same_priors=False)
        assert str(negotiate.fit(PackSpec.parse("ans4"), no_zstd)[0]) == "q4"
    check_decodable(PackSpec.parse("ans4"), peer_decoders(ack, digest))  # the same tables
    assert negotiate.fit(PackSpec.parse("ans4"), peer_decoders(ack, digest))[1] is None
