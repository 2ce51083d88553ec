"""Compressor sets at run time (issue 13, S3): attaching a set to a bundle (validation,
identity), requests carrying a compressor's code on the handheld and in pipeline routes (hostile
ones refused
before anything runs), and a 3-device pipeline whose links switch gamma with bandwidth, its
outputs equal to head -> encoder -> decoder -> tail computed locally."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from coinf.ble_protocol.messages import ErrorCode, Message, MsgType, encode_json
from coinf.ble_protocol.packing import pack_tensors
from coinf.ble_protocol.request import Hop, Request, encode_request
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from coinf.convert.compressors import attach, load_set
from coinf.convert.split import split_model
from coinf.handheld.daemon import HandheldDaemon
from coinf.handheld.pipeline_host import local_helpers
from coinf.wearable.pipeline_config import HelperConfig
from coinf.wearable.planner.compress_select import (
    OVERHEAD_BYTES,
    link_options,
    lookup,
    option_label,
    thresholds,
)

from coinf.bundle import Bundle
from coinf.errors import InputError, ProtocolError
from tests.wire import result_blob

pytest.importorskip("torch")

POOL1, RELU2 = "/pool1/MaxPool_output_0", "/Relu_1_output_0"
#: accuracies written into the set's index (the untrained autoencoders' own are near chance):
#: a higher gamma costs accuracy, so only a slower link makes it worth it
ACC = {2: {"raw": 0.97, "q8": 0.965}, 4: {"raw": 0.95, "q8": 0.945},
       8: {"raw": 0.90, "q8": 0.89}}


def sync(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 90))

    return run


@pytest.fixture(scope="module")
def cset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.compressor_sets import make_set

    out = make_set(tmp_path_factory.mktemp("set") / "set", cuts=("pool1", "relu2"),
                   steps=0, test_limit=40)
    index = json.loads((out / "index.json").read_text())
    index["base_accuracy"] = {"raw": 0.98}
    for e in index["compressors"]:
        e["accuracy"] = ACC[e["gamma"]]
    (out / "index.json").write_text(json.dumps(index))
    return out


@pytest.fixture(scope="module")
def bundle(cset: Path, tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    root = tmp_path_factory.mktemp("b") / "lenet"
    split_model(cset / "backbone.onnx", root)
    return attach(root, cset)


def frames(bundle: Bundle, n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    spec = bundle.inputs[0]
    return [{spec.name: rng.standard_normal(spec.shape).astype(np.float32)} for _ in range(n)]


def ort_run(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    want = {i.name for i in sess.get_inputs()}
    return dict(zip(names, sess.run(names, {k: v for k, v in feeds.items() if k in want}),
                    strict=True))


def compressed_reference(bundle: Bundle, feed: dict[str, np.ndarray],
                         gammas: dict[str, int]) -> np.ndarray:
    """The whole model computed locally, slice by slice, through the compressor of each cut
    in ``gammas`` (head -> encoder -> decoder -> tail; no packing)."""
    x = dict(feed)
    prev = bundle.candidates[0].id
    for cut in [*gammas, bundle.candidates[-1].id]:
        from coinf.convert.stage_slices import StageSlices

        if cut == bundle.candidates[-1].id:
            path = bundle.path(bundle.candidate(prev).tail.file or "")
        else:
            path = StageSlices(bundle).path(prev, cut)
        x.update(ort_run(path, x))
        if cut in gammas:
            comp = bundle.compressor(cut, gammas[cut])
            code = ort_run(bundle.path(comp.encoder), x)
            x.update(ort_run(bundle.path(comp.decoder), code))
        prev = cut
    return x[bundle.outputs[0].name]


# -- attaching ------------------------------------------------------------------------------
def test_attach_records_compressors_and_changes_the_identity(cset: Path, bundle: Bundle,
                                                             tmp_path: Path) -> None:
    plain = split_model(cset / "backbone.onnx", tmp_path / "plain")
    assert plain.compressors() == [] and plain.identity != bundle.identity
    pool1 = next(c for c in bundle.candidates if [t.name for t in c.crossing] == [POOL1])
    comps = bundle.compressors(pool1.id)
    assert [c.gamma for c in comps] == [2, 4, 8]
    for c in comps:
        assert c.label == f"g{c.gamma} at {pool1.id}"
        assert c.code.nbytes * c.gamma == pool1.crossing_bytes  # 1/gamma of the activation
        assert c.code_bytes["raw"] == c.code.nbytes and c.code_bytes["q8"] < c.code.nbytes
        assert bundle.path(c.encoder).is_file() and bundle.path(c.decoder).is_file()
        assert c.relative_accuracy("raw") == pytest.approx(ACC[c.gamma]["raw"] / 0.98)
    assert Bundle.load(bundle.root).identity == bundle.identity
    # a daemon with the compressors refuses a wearable without them (HELLO)
    daemon = HandheldDaemon(bundle)
    hello = {"protocol": daemon.hello_payload()["protocol"], "bundle": plain.identity}
    with pytest.raises(ProtocolError) as info:
        asyncio.run(daemon.handle(Message(MsgType.HELLO, 1, encode_json(hello))))
    assert info.value.code == ErrorCode.BUNDLE_MISMATCH


def _copy(cset: Path, tmp_path: Path) -> tuple[Path, dict]:
    out = tmp_path / "set"
    shutil.copytree(cset, out)
    return out, json.loads((out / "index.json").read_text())


@pytest.mark.parametrize("damage, message", [
    ("backbone", "is not the model bundle"),
    ("signature", "inputs are"),
    ("missing", "is missing"),
    ("gamma", "gamma must be an integer"),
    ("accuracy", "accuracy"),
    ("crossing", "no candidate"),
    ("code_shape", "expected float32"),
    ("format", "format"),
])
def test_attach_refuses_a_bad_set_naming_the_problem(cset: Path, bundle: Bundle, tmp_path: Path,
                                                     damage: str, message: str) -> None:
    bad, index = _copy(cset, tmp_path)
    entry = index["compressors"][0]
    if damage == "backbone":
        (bad / "backbone.onnx").write_bytes((bad / entry["decoder"]).read_bytes())
    elif damage == "signature":  # a decoder where the encoder belongs
        entry["encoder"] = entry["decoder"]
    elif damage == "missing":
        (bad / entry["decoder"]).unlink()
    elif damage == "gamma":
        entry["gamma"] = "4"
    elif damage == "accuracy":
        entry["accuracy"] = {"raw": 1.5}
    elif damage == "crossing":
        entry["crossing"] = ["nonexistent"]
    elif damage == "code_shape":
        entry["code_shape"] = [1, 99, 1, 1]
    elif damage == "format":
        index["format"] = 7
    (bad / "index.json").write_text(json.dumps(index))
    before = (bundle.root / "manifest.json").read_bytes()
    with pytest.raises(InputError, match=message):
        attach(bundle.root, bad)
    assert (bundle.root / "manifest.json").read_bytes() == before  # nothing recorded
    if damage == "gamma":  # the field is named
        with pytest.raises(InputError, match=r"compressors\[0\]\.gamma"):
            load_set(bad)


def test_the_cli_attaches_and_refuses_with_exit_2(cset: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from coinf.cli import main

    root = tmp_path / "b"
    split_model(cset / "backbone.onnx", root)
    assert main(["convert", "compressors", str(root), str(cset)]) == 0
    assert "g4 at c" in capsys.readouterr().out and Bundle.load(root).compressors()
    assert main(["convert", "compressors", str(root), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no index.json" in err and "Traceback" not in err


# -- the wire -------------------------------------------------------------------------------
def test_the_handheld_decodes_a_code_and_refuses_hostile_ones(bundle: Bundle) -> None:
    daemon = HandheldDaemon(bundle)
    cut = bundle.compressors()[0].candidate
    comp = bundle.compressor(cut, 4)
    feed = frames(bundle, 1)[0]
    head = ort_run(bundle.path(bundle.candidate(cut).head.file or ""), feed)
    code = ort_run(bundle.path(comp.encoder), head)
    last = bundle.candidates[-1].id

    def req(cut: str, gamma: int, blob: bytes) -> bytes:
        return encode_request(Request.split(cut, last, gamma), blob)

    reply = daemon.run_request(req(cut, 4, encode_tensors(code)))
    got = decode_tensors(result_blob(reply.payload))[bundle.outputs[0].name]
    np.testing.assert_allclose(got, compressed_reference(bundle, feed, {cut: 4}),
                               rtol=1e-4, atol=1e-5)
    # packed code (q8) decodes too
    packed = encode_tensors({}, packed=pack_tensors(code, "q8"))
    daemon.run_request(req(cut, 4, packed))

    def refused(cid: str, gamma: int, tensors: dict[str, np.ndarray]) -> ProtocolError:
        with pytest.raises(ProtocolError) as info:
            daemon.run_request(req(cid, gamma, encode_tensors(tensors)))
        return info.value

    err = refused(cut, 99, code)
    assert err.code == ErrorCode.UNKNOWN_CANDIDATE and "g99" in err.text
    assert "no compressor" in refused(bundle.candidates[-2].id, 4, code).text
    wrong = {"code": np.zeros((1, 6, 3, 3), np.float32)}  # smaller than g4's code
    assert refused(cut, 4, wrong).code == ErrorCode.MALFORMED
    big = {"code": np.zeros((1, 6, 60, 60), np.float32)}  # more than the code's bytes
    assert refused(cut, 4, big).code == ErrorCode.TOO_LARGE
    assert refused(cut, 4, head).code in (ErrorCode.TOO_LARGE, ErrorCode.MALFORMED)
    assert daemon.tails.loaded == [cut]  # only the one good request ran a tail


@sync
async def test_hostile_compressed_pipeline_routes_are_refused(bundle: Bundle) -> None:
    from coinf.ble_protocol.loopback import connect_socket
    from coinf.ble_protocol.rpc import RpcClient

    a, b = (c.candidate for c in bundle.compressors()[::3])  # pool1's and relu2's cuts
    last = bundle.candidates[-1].id
    feed = frames(bundle, 1)[0]
    head = ort_run(bundle.path(bundle.candidate(a).head.file or ""), feed)
    code = ort_run(bundle.path(bundle.compressor(a, 4).encoder), head)
    async with local_helpers(bundle, ["h1", "h2"]) as hosts:
        rpc = RpcClient(await connect_socket(hosts[0].address))

        async def ask(g1: int, g2: int, tensors: dict, packing: str = "raw") -> ProtocolError:
            with pytest.raises(ProtocolError) as info:
                await rpc.request(MsgType.REQUEST, route(g1, g2, tensors, packing), 5.0)
            return info.value

        def route(g1: int, g2: int, tensors: dict, packing: str = "raw") -> bytes:
            hops = [Hop(a, b, "h1", g1, packing), Hop(b, last, "h2", g2)]
            return encode_request(Request.route(hops), encode_tensors(tensors))

        err = await ask(99, 0, code)
        assert err.code == ErrorCode.UNKNOWN_CANDIDATE and "g99" in err.text
        err = await ask(4, 16, code)
        assert err.code == ErrorCode.UNKNOWN_CANDIDATE and "g16" in err.text
        assert (await ask(4, 0, head)).code in (ErrorCode.TOO_LARGE, ErrorCode.MALFORMED)
        wrong = {"code": np.zeros((1, 6, 3, 3), np.float32)}
        assert (await ask(4, 0, wrong)).code == ErrorCode.MALFORMED
        assert hosts[0].daemon.forward.stages == 0 and hosts[1].daemon.forward.stages == 0
        # a good one: h1 decodes g4, runs a..b, encodes with g2 for h2, which decodes
        reply = await rpc.request(MsgType.REQUEST, route(4, 2, code, "q8"), 5.0)
        assert reply.type == MsgType.RESULT and hosts[0].daemon.forward.stages == 1
        assert hosts[1].daemon.requests == 1  # the last hop ran as a tail
        await rpc.close()


# -- run-time selection -------------------------------------------------------------------------
def test_thresholds_order_gammas_by_bandwidth(bundle: Bundle) -> None:
    cut = bundle.compressors()[0].candidate
    opts = link_options(bundle.candidate(cut), bundle.compressors(cut))
    assert {(o.gamma, o.packing) for o in opts} >= {(1, "raw"), (2, "q8"), (4, "raw"),
                                                     (8, "q8")}
    table = thresholds(opts, compute_fps=100.0, input_fps=100.0)
    bws = [1e7, 3e5, 1e5, 3e4, 1e4, 1e3]
    gammas = [lookup(table, bw).gamma for bw in bws]
    assert gammas[0] == 1 and gammas[-1] == 8
    assert gammas == sorted(gammas)  # less bandwidth, never less compression


def helper_session(bundle: Bundle, helpers: list[HelperConfig], speed: float,
                   input_fps: float | None = None, tolerance_pp: float = 1.0) -> Any:
    """A Session given ``helpers`` for a stream, the wearable running ``speed`` FLOP/s."""
    from coinf.device.profile import PI_ZERO_2W_POWER, DeviceProfile
    from coinf.wearable.policy import Policy

    from coinf import AsyncSession, LinkOptions, PlacementOptions, PlannerOptions, SessionOptions

    prof = DeviceProfile("even", "wearable", PI_ZERO_2W_POWER, gflops=speed / 1e9)
    return AsyncSession(bundle, SessionOptions(
        placement=PlacementOptions(helpers=helpers),
        planner=PlannerOptions(objective="throughput", wearable_profile=prof,
                               handheld_profile=prof, input_fps=input_fps,
                               policy=Policy(battery_aware=False,
                                             accuracy_tolerance_pp=tolerance_pp)),
        link=LinkOptions(timeout=10.0)))


@sync
async def test_a_pipeline_switches_gamma_when_a_links_bandwidth_drops(bundle: Bundle) -> None:
    """A Session given two helpers, its split fixed: each hop's packing follows its link's
    bandwidth estimate frame by frame (the threshold table's choice), and the outputs are the
    model's through the codes sent."""
    from coinf.wearable.planner.codec_costs import parse_config_spec

    feeds = frames(bundle, 6)
    speed = float(bundle.candidates[-1].head.flops) * 1000
    async with local_helpers(bundle, ["h1", "h2"]) as hosts:
        helpers = [HelperConfig(h.name, h.address, 1e9, speed_flops=speed) for h in hosts]
        cuts = [c.candidate for c in bundle.compressors()[::3]]  # pool1's, relu2's
        async with helper_session(bundle, helpers, speed, input_fps=100.0) as sess:
            rp = sess.replanner
            rp.adaptive = False  # keep the split; only the links' options move
            plan = rp.pin(cuts)
            assert [st.end for st in plan.stages[:-1]] == cuts
            compute_fps = min(rp.chosen.compute_fps, 1e9)
            seen = []
            # the links' bandwidth estimates (set before each frame: the local links' own
            # measurements would pull them back up), fast -> slow
            for bw1, bw2 in ((1e9, 1e9), (2e3, 1e9), (2e3, 5e2), (1e9, 5e2)):
                expect = []
                for cut, bw in zip(cuts, (bw1, bw2), strict=True):
                    table = thresholds(link_options(bundle.candidate(cut),
                                                    bundle.compressors(cut), OVERHEAD_BYTES),
                                       compute_fps, 100.0)
                    expect.append(option_label(lookup(table, bw)))
                for feed in feeds[:2]:
                    rp.links.assume("h1", bw1)
                    rp.links.assume("h2", bw2)
                    (got,) = await sess.run(None, feed)
                    st = sess.last_run
                    assert st is not None and st.fallback is None
                    assert list(st.packings) == expect and list(st.cuts) == cuts
                    gammas = {c: parse_config_spec(p)[0] for c, p in zip(cuts, st.packings,
                                                                         strict=True)}
                    ref = compressed_reference(bundle, feed,
                                               {c: g for c, g in gammas.items() if g})
                    if all(p == "raw" for p in st.packings):
                        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4)
                    else:  # a quantized code: close, not equal
                        assert np.abs(got - ref).max() <= 0.05 * np.abs(ref).max() + 0.05
                seen.append(tuple(st.packings))
    assert seen[0] == ("raw", "raw")
    assert seen[1][0].startswith("g") and seen[1][1] == "raw"
    assert seen[2][0] == seen[1][0] and seen[2][1].startswith("g8")
    assert seen[3][0] == "raw" and seen[3][1] == seen[2][1]


# -- the two-device Session ---------------------------------------------------------------------
def _session(bundle: Bundle, bandwidth: float, tolerance_pp: float):
    from coinf.ble_protocol.shaped import Channel
    from coinf.device.profile import LAPTOP_POWER, PI_ZERO_2W_POWER, DeviceProfile
    from coinf.wearable.policy import Policy

    from coinf import LinkOptions, PlannerOptions, Session, SessionOptions

    planner = PlannerOptions(
        wearable_profile=DeviceProfile("slow", "wearable", PI_ZERO_2W_POWER, gflops=0.002),
        handheld_profile=DeviceProfile("fast", "handheld", LAPTOP_POWER, gflops=50.0),
        policy=Policy(battery_aware=False, accuracy_tolerance_pp=tolerance_pp),
        objective="latency")
    return Session(bundle, SessionOptions(
        link=LinkOptions(transport=Channel(bandwidth, latency_s=0.0005)), planner=planner))


def test_a_session_sends_a_code_on_a_slow_link_within_its_accuracy_budget(
        bundle: Bundle) -> None:
    """20 kB/s: a compressor configuration (``c002~g8+q8``, ...) wins, but only one whose
    accuracy drop is within the policy's tolerance (ACC: g2 drops 1-1.5 pp, g4 3-3.5 pp, g8
    8-9 pp); the code goes over a real (shaped) link to a real daemon."""
    x = frames(bundle, 1)[0]
    chosen = {}
    for tolerance in (10.0, 0.5):
        with _session(bundle, 20_000, tolerance_pp=tolerance) as sess:
            for _ in range(3):
                out = sess.run(None, x)
            st = sess.last_run
            decision = sess.plan()
            excluded = decision.excluded
        assert st is not None
        chosen[tolerance] = st.gamma
        if st.gamma == 1:
            assert "~g" not in decision.winner
            continue
        assert f"~g{st.gamma}" in decision.winner
        comp = bundle.compressor(st.candidate, st.gamma)
        assert (comp.base_accuracy - comp.accuracy[st.packing]) * 100 <= tolerance
        ref = compressed_reference(bundle, x, {st.candidate: st.gamma})
        if st.packing == "raw":
            np.testing.assert_allclose(out[0], ref, rtol=1e-3, atol=1e-4)
        else:
            assert np.abs(out[0] - ref).max() <= 0.05 * np.abs(ref).max() + 0.05
    assert chosen[10.0] > 1 and chosen[0.5] == 1
    assert any("~g8" in k for k in excluded)  # the 0.5 pp budget rules the compressors out


def test_plan_pipeline_shows_each_links_compressor(cset: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``coinf plan --helpers`` shows what each link would carry, priced as the planner prices
    it (headers included): with the fixture's set, never a code (every one costs more accuracy
    than the policy allows); with a g4 that keeps the model's accuracy, its q8 code wherever a
    plan crosses a cut with compressors, and a slow first link draws the cut there."""
    from coinf.cli import main

    config = tmp_path / "p.json"
    config.write_text(json.dumps({"helpers": [
        {"name": "phone", "address": "tcp:127.0.0.1:9", "bandwidth_kbps": 2},
        {"name": "laptop", "address": "tcp:127.0.0.1:10", "bandwidth_kbps": 2}]}))
    good, index = _copy(cset, tmp_path)
    for e in index["compressors"]:
        if e["gamma"] == 4:
            e["accuracy"] = {"raw": 0.98, "q8": 0.98}
    (good / "index.json").write_text(json.dumps(index))
    crossed = {}
    for attached, expect in ((cset, "raw"), (good, "g4+q8")):
        root = tmp_path / f"b-{expect}"
        split_model(cset / "backbone.onnx", root)
        b = attach(root, attached)
        assert main(["plan", str(root), "--helpers", str(config), "--json",
                     "--wearable-slowdown", "1000"]) == 0
        out = json.loads(capsys.readouterr().out)
        for option in out["strategies"]:
            for cut, packing in zip(option["cuts"], option["packings"], strict=True):
                assert packing == (expect if b.compressors(cut) else "raw")
        links = [s for s in out["stages"] if s["link_ms"] is not None]
        for cut, stage in zip(out["cuts"], links, strict=True):
            size = (b.compressor(cut, 4).code_bytes["q8"] if stage["compressor"] == "g4+q8"
                    else b.candidate(cut).crossing_bytes)
            assert stage["link_bytes"] == size + OVERHEAD_BYTES  # as priced: with headers
        crossed[expect] = out["cuts"]
    assert crossed["g4+q8"] and b.compressors(crossed["g4+q8"][0])
    assert main(["plan", str(root), "--helpers", str(config), "--wearable-slowdown",
                 "1000"]) == 0
    assert "carrying g4+q8 (" in capsys.readouterr().out


def test_the_switching_bench_refuses_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from coinf.cli import main
    from coinf.cli.bench.pipeline_switch import schedule

    assert schedule("1000, 20,5") == [1000.0, 20.0, 5.0]
    for bad in ("", "a,b", "10,-1", "0"):
        with pytest.raises(InputError, match="schedule"):
            schedule(bad)
    assert main(["bench", "pipeline", "--compressors", "/nonexistent"]) == 2
    assert "--bandwidth-kbps-schedule" in capsys.readouterr().err
    assert main(["bench", "pipeline", "--bandwidth-kbps-schedule", "10,1"]) == 2
    assert "--rate" in capsys.readouterr().err


# time beyond the suite's 30 s a test: three devices over a shaped link (10 s alone)
@pytest.mark.timeout(90)
def test_the_switching_bench_sends_codes_when_the_link_drops(
        bundle: Bundle, capsys: pytest.CaptureFixture[str]) -> None:
    """``bench pipeline --bandwidth-kbps-schedule`` end to end on the fixture's bundle: the
    split is kept, and at 3 kB/s the session following its links sends compressor codes where
    the raw session cannot."""
    from coinf.cli import main

    cuts = [c.candidate for c in bundle.compressors()[::3]]  # pool1's, relu2's
    assert main(["bench", "pipeline", "--bundle", str(bundle.root), "--cuts", ",".join(cuts),
                 "--bandwidth-kbps-schedule", "1000,3", "--rate", "20", "--frames", "5",
                 "--warmup", "3", "--slowdown", "3", "--devices", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["bandwidth_kbps"] for p in out["phases"]] == [1000.0, 3.0]
    assert out["cuts"] == cuts and len(out["thresholds_first_link"]) > 1
    slow = out["phases"][1]
    assert any(o.split("/")[0].startswith("g") for o in slow["adaptive"]["options"]), \
        json.dumps([out["cuts"], out["thresholds_first_link"], out["phases"]])
    assert not any(o.startswith("g") for o in slow["raw"]["options"])


def test_coinf_plan_lists_compressor_configurations(bundle: Bundle, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``coinf plan B`` (two devices) shows a row per compressor configuration and, when one
    wins, its stages under the compressed id."""
    from coinf.cli import main

    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"accuracy_tolerance_pp": 10, "battery_aware": False}))
    assert main(["plan", str(bundle.root), "--bandwidth-kbps", "2", "--objective", "latency",
                 "--wearable-slowdown", "3000", "--policy", str(policy)]) == 0
    text = capsys.readouterr().out
    cut = bundle.compressors()[0].candidate
    for comp in bundle.compressors(cut):
        assert f"{cut}~g{comp.gamma}+q8" in text  # a compressor's code is a packing of the cut
    assert f"-> chose {cut}~g" in text
    assert f"stages: split: c000..{cut}@wearable(onnxruntime)[g" in text  # the code crosses
    assert main(["plan", str(bundle.root), "--bandwidth-kbps", "2", "--objective", "latency",
                 "--wearable-slowdown", "3000"]) == 0  # default 1 pp: g2 (1 pp) only
    text = capsys.readouterr().out
    assert f"excluded {cut}~g8" in text and f"excluded {cut}~g2:" not in text


def test_a_damaged_compressors_section_is_refused_on_load(bundle: Bundle, tmp_path: Path) -> None:
    from coinf.errors import BundleError

    copy = tmp_path / "b"
    shutil.copytree(bundle.root, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    entry = manifest["compressors"]["entries"][0]
    (copy / entry["decoder"]).unlink()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="needs missing"):
        Bundle.load(copy)
    del entry["code"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="malformed compressors"):
        Bundle.load(copy)
    entry["code"] = {"name": "code", "shape": [1], "dtype": "float32", "nbytes": 4}
    entry["candidate"] = "c999"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="names no candidate"):
        Bundle.load(copy)


def test_the_two_device_planner_compresses_when_the_bandwidth_drops(bundle: Bundle) -> None:
    """The Session's planner (hand-set device speeds, deterministic): on a fast link no
    compressor; as the link slows, the compressed configuration within the accuracy tolerance
    (g8 at 10 pp, g2 at 2 pp, none at 0.5 pp)."""
    from coinf.device.profile import LAPTOP_POWER, PI_ZERO_2W_POWER, DeviceProfile
    from coinf.wearable.planner.adapt import LinkEstimate
    from coinf.wearable.planner.planner import Planner, parse_config_spec, split_config
    from coinf.wearable.policy import Policy

    w = DeviceProfile("slow", "wearable", PI_ZERO_2W_POWER, gflops=0.002)
    h = DeviceProfile("fast", "handheld", LAPTOP_POWER, gflops=50.0)
    gammas = {}
    for tol in (10.0, 2.0, 0.5):
        planner = Planner(bundle, w, h, Policy(objective="latency", accuracy_tolerance_pp=tol,
                                               battery_aware=False))
        for bw in (1e9, 1e5, 2e4):
            winner = planner.decide(LinkEstimate(bw, bw, 0)).winner
            gammas[tol, bw] = parse_config_spec(split_config(winner)[1])[0]
    assert all(gammas[tol, bw] is None for tol in (10.0, 2.0, 0.5) for bw in (1e9, 1e5))
    assert gammas[10.0, 2e4] == 8 and gammas[2.0, 2e4] == 2 and gammas[0.5, 2e4] is None


def test_a_fixed_split_is_checked(bundle: Bundle) -> None:
    helpers = [HelperConfig(n, "tcp:127.0.0.1:9", 1e6) for n in ("h1", "h2")]
    ids = [c.id for c in bundle.candidates]
    sess = helper_session(bundle, helpers, 1e9)
    with pytest.raises(InputError, match="strictly before"):
        sess.replanner.pin([ids[3], ids[2]])
    with pytest.raises(InputError, match="cuts from this bundle"):
        sess.replanner.pin(["nope", ids[2]])
    assert sess.replanner.pinned is None and sess.strategies["limits"]["pinned"] is None
    plan = sess.replanner.pin([ids[2], ids[3]])
    assert [st.end for st in plan.stages[:-1]] == [ids[2], ids[3]]
    assert sess.strategies["limits"]["pinned"] == [ids[2], ids[3]]


def test_the_pipeline_dp_puts_a_slow_links_cut_where_a_compressor_shrinks_it(
        bundle: Bundle) -> None:
    """A slow first link: the one cost model charges each cut its cheapest encoding within the
    policy's tolerance, so the cut moves to a compressor's cut; with no loss allowed it does
    not."""
    from coinf.wearable.planner.strategy import Devices, choose_strategy

    with_codes = {c.id for c in bundle.candidates if bundle.compressors(c.id)}
    assert with_codes
    whole = float(bundle.candidates[-1].head.flops) * 100
    slow = (HelperConfig("h1", "tcp:127.0.0.1:9", 500.0, speed_flops=whole),
            HelperConfig("h2", "tcp:127.0.0.1:9", 1e9, speed_flops=whole))
    cuts = {}
    for tolerance in (2.0, 0.0):  # the fixture's gamma-2 code keeps 0.97 / 0.98
        sess = helper_session(bundle, list(slow), whole, tolerance_pp=tolerance)
        planner = sess.replanner.planner
        _, best, _ = choose_strategy(bundle, planner, Devices(slow, all_devices=True),
                                     "throughput", 1e6)
        cuts[tolerance] = best.cuts[0]
        assert best.name == "pipeline"
    assert cuts[2.0] in with_codes and cuts[0.0] not in with_codes


def test_plan_pipeline_draws_every_stage(bundle: Bundle, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``coinf plan --pipeline --png``: one bar per compute and per link stage, the link's
    option in its label; a folder as --png is refused before any work."""
    from coinf.wearable.planner.pipeline_chart import stage_bars

    from coinf.cli import main

    config = tmp_path / "p.json"
    config.write_text(json.dumps({"helpers": [
        {"name": "phone", "address": "tcp:127.0.0.1:9", "bandwidth_kbps": 2},
        {"name": "laptop", "address": "tcp:127.0.0.1:10", "bandwidth_kbps": 1e6}]}))
    png = tmp_path / "pipe.png"
    assert main(["plan", str(bundle.root), "--pipeline", str(config), "--png", str(png),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out["chart"] == str(png)
    bars = stage_bars(out["stages"])
    assert len(bars) == 2 * len(out["devices"]) - 1
    assert [k for _, _, k in bars] == ["compute", "link"] * (len(out["devices"]) - 1) + \
        ["compute"]
    links = [s for s in out["stages"] if s["link_ms"] is not None]
    assert all(s["compressor"] in label for s, (label, _, _) in
               zip(links, [b for b in bars if b[2] == "link"], strict=True))
    assert main(["plan", str(bundle.root), "--pipeline", str(config), "--png",
                 str(tmp_path)]) == 2


def test_an_overdue_message_lowers_the_links_bandwidth_at_once(bundle: Bundle) -> None:
    """A message on the wearable's own link that is still unsent long after the estimate
    says it should have gone bounds the bandwidth by bytes / elapsed; a sent one, or one
    not yet overdue, leaves the estimate alone."""
    import time

    from coinf.wearable.link_meter import LinkMeter

    meter = LinkMeter({"h1": 1e6})
    assert meter.current("h1", 5.0) == pytest.approx(1e6)
    # times 100 s apart and messages that take 2 s at the estimate: the few ms this test takes
    # between reading the clock and the estimate reading it do not move any of the outcomes
    now = time.perf_counter()
    a = meter.sending("h1", 2_000_000, now - 100.0, {})  # 2 MB unsent after 100 s: <= 20 kB/s
    assert meter.current("h1", 5.0) == pytest.approx(20_000, rel=0.01)
    a.marks = {"sent": now - 90.0}  # gone: not evidence
    b = meter.sending("h1", 2_000_000, now - 0.001, {})  # just started
    assert meter.current("h1", 5.0) == pytest.approx(1e6)
    meter.finished("h1", b)
    meter.sending("h1", 2_000_000, now - 100.0, {})  # waited behind the first, then 90 s
    assert meter.current("h1", 5.0) == pytest.approx(2_000_000 / 90.0, rel=0.01)
    # the plan's packing follows: at a fast estimate raw, with an overdue message a code
    helpers = [HelperConfig(n, "tcp:127.0.0.1:9", 1e6) for n in ("h1", "h2")]
    ids = [c.id for c in bundle.candidates]
    cut = next(i for i in ids if bundle.compressors(i))
    rp = helper_session(bundle, helpers, 1e9, input_fps=100.0).replanner
    rp.pin([cut, ids[ids.index(cut) + 1]])
    rp.links.assume("h1", 1e9)
    plan, before = rp.take()
    assert plan.stages[0].end == cut and plan.stages[0].packing == "raw"
    rp.sending("h1", 10_000_000, time.perf_counter() - 500.0, {})  # <= 20 kB/s
    plan, after = rp.take()
    assert plan.stages[0].gamma > 1 and after == before + 1
    assert "packing follows" in rp.history[-1]["reason"]


def test_cuts_are_weighed_by_their_predicted_time(bundle: Bundle) -> None:
    """The one cost model weighs each cut by the wearable's predicted time of its head, in
    FLOP units: the whole model's FLOPs at the last cut, growing along the chain, and not the
    FLOPs again (a pooling or a small layer costs more than its FLOPs)."""
    from coinf.device.profile import DeviceProfile
    from coinf.wearable.planner.planner import Planner
    from coinf.wearable.planner.strategy import cut_work

    planner = Planner(bundle, DeviceProfile.pi_zero_2w(), DeviceProfile.laptop())
    work = cut_work(bundle, planner)
    total = float(bundle.candidates[-1].head.flops)
    by_time = [work[c.id] for c in bundle.candidates]
    by_flops = [float(c.head.flops) for c in bundle.candidates]
    assert by_time[-1] == pytest.approx(total) and by_time[0] == 0.0
    assert all(a <= b + 1e-6 for a, b in itertools.pairwise(by_time))
    assert any(abs(a - b) > 0.05 * total for a, b in zip(by_time, by_flops, strict=True))


def test_the_encoders_one_time_load_is_not_counted_as_the_frames_compute(
        bundle: Bundle) -> None:
    """The executor opens a compressor's encoder before the emulated (stretched) step, as the
    slice runner does for the slices: a x77 Pi emulation used to stretch the load into the
    first frame's head time (0.4 s for MobileNetV2's learned bottleneck)."""
    from coinf.convert.compressors import CodecRunner
    from coinf.device.emulation import DeviceEmulation
    from coinf.wearable.executor import _encode
    from coinf.wearable.frame import RunStats
    from coinf.wearable.plan import Plan

    comp = bundle.compressors()[0]
    cand = bundle.candidate(comp.candidate)
    codecs = CodecRunner(bundle)
    loaded_when_timed: list[bool] = []

    class Recording(DeviceEmulation):
        def timed(self, fn, cancel=None):  # type: ignore[no-untyped-def, override]
            loaded_when_timed.append(comp.encoder in codecs._sessions)
            return super().timed(fn, cancel)

    plan = Plan.for_candidate(bundle, cand, gamma=comp.gamma)
    feat = {t.name: np.zeros(t.shape, np.float32) for t in cand.crossing}
    stats = RunStats(cand.id)
    for _ in range(2):
        code = _encode(codecs, Recording(), plan, feat, stats)
        assert code["code"].shape == comp.code.shape and stats.gamma == comp.gamma
    assert loaded_when_timed == [True, True]
