"""``coinf run``: run inferences through a Session (the wearable process of ``coinf demo``)."""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from coinf.cli import argtypes
from coinf.cli.run_format import (
    format_plan,
    format_stream,
    format_table,
    progress_line,
    size_text,
)

if TYPE_CHECKING:
    from coinf.wearable.options import SessionOptions

RTOL, ATOL = 1e-4, 1e-5
#: the per-run times each row of --json lists under "runs"
RUN_FIELDS = ("head_ms", "pack_ms", "transfer_ms", "tail_ms", "return_ms", "total_ms")


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", help="bundle directory (from `coinf split`)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--split", help="candidate id, handheld-only or wearable-only (several, "
                       "comma-separated, run one after the other); ID~PACKING packs that "
                       "one so (c000~jpeg-q90)")
    which.add_argument("--all", action="store_true", help="run every candidate (or --max of them)")
    parser.add_argument("--max", type=argtypes.positive_int, default=None,
                        help="with --all: at most N, evenly spread")
    parser.add_argument("--transport", default="inprocess", choices=["inprocess", "socket", "ble"])
    parser.add_argument("--handheld", type=argtypes.connect_address,
                        help="daemon address for --transport socket")
    parser.add_argument("--hci", type=argtypes.connect_address,
                        help="for --transport ble: hci-socket:0 (Pi), usb:0, or "
                        "tcp-client:HOST:PORT (coinf radio)")
    parser.add_argument("--wifi", type=_wifi_address, metavar="tcp:HOST:PORT",
                        help="with --transport ble: a second link to the same handheld over "
                        "Wi-Fi (tcp: is TLS pinned to the handheld paired by `coinf wifi "
                        "pair`; tcp+insecure: is plain, --insecure-plaintext). The planner "
                        "chooses the link per inference; a failed frame moves to the other")
    parser.add_argument("--wifi-emulate", metavar="PRESET", type=_wifi_preset,
                        help="shape the --wifi link like this Wi-Fi preset (emulation: "
                        "pi-zero-2w-wifi)")
    parser.add_argument("--packing", default="raw",
                        help="raw, f32, f16, q1..q16, qz1..qz16, ans1..ans8, jpeg-qNN, webp-qNN, "
                             "png, pcm16 or flac (docs/PACKING.md)")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                        type=argtypes.name_equals_file)
    parser.add_argument("--seed", type=argtypes.seed, default=0, help="seed of random inputs")
    parser.add_argument("--repeat", type=argtypes.positive_int, default=3,
                        help="runs per candidate (median)")
    parser.add_argument("--warmup", type=argtypes.integer(0, 100), default=0, metavar="N",
                        help="runs per candidate before the measured ones, not counted (the "
                             "first frame of a cut opens its slices on both devices; `coinf "
                             "demo` and `bench map` use 1); their times are listed as "
                             "warmup_ms")
    parser.add_argument("--slowdown", type=argtypes.slowdown, default=1.0,
                        help="emulate a K x slower wearable")
    parser.add_argument("--threads", type=argtypes.threads_or_auto, default=0,
                        help="wearable onnxruntime threads")
    parser.add_argument("--compute-profile", choices=("pi-zero-2w",),
                        help="time each of the wearable's model slices as this built-in "
                        "profile predicts it (per layer) instead of --slowdown x this machine; "
                        "packing is still stretched by --slowdown")
    for flag, who in (("--runtime", "the wearable's slices"),
                      ("--handheld-runtime", "an in-process handheld's tails")):
        parser.add_argument(flag, choices=("onnxruntime", "litert", "auto"),
                            default="onnxruntime", help=f"runtime of {who} (default %(default)s)")
    parser.add_argument("--stream", type=argtypes.count, default=0, metavar="N",
                        help="also stream N frames, sequential then pipelined, and report fps "
                        "(with --all: at the most balanced offloading cut measured)")
    which.add_argument("--plan", metavar="FILE", type=_plan_file,
                       help="run this plan (JSON: `coinf plan --json` prints one under 'plan'; "
                       "any number of stages, docs/ARCHITECTURE.md)")
    parser.add_argument("--helpers", type=argtypes.existing_file, metavar="CONFIG",
                        help="helper devices (a pipeline config, docs/PIPELINE.md): the ones "
                        "a --plan names, or, alone, the devices the Session chooses a "
                        "strategy over (local, split or pipeline)")
    from coinf.cli.commands.discover import add_discover

    add_discover(parser)  # --discover [SECONDS], --allow, --mdns-interface
    parser.add_argument("--planner-runs", type=argtypes.count, default=0, metavar="N",
                        help="then let the planner choose (latency objective) for N runs in a "
                        "new session, and compare its choice with the table")
    parser.add_argument("--keystore", help="--transport ble: the bond store (default "
                        "<config dir>/coinf/bonds/wearable.json, as `coinf wearable pair`)")
    from coinf.cli.passkey import add_passkey_options

    add_passkey_options(parser, "--transport ble, emulated radio/scripts only: open the "
                        "pairing window for --window-s with this fixed passkey (the handheld "
                        "gives the same); without it only bonded handhelds are served")
    parser.add_argument("--window-s", type=argtypes.seconds, default=None,
                        help="with a passkey: how long the pairing window stays open (120 s)")
    argtypes.add_insecure_flag(parser)
    parser.add_argument("--no-fallback", action="store_true",
                        help="fail instead of finishing an inference on the wearable when the "
                        "handheld is unreachable, slow or failing (default: fall back, as a "
                        "Session does, and mark the row)")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    parser.set_defaults(func=run)


def _wifi_address(text: str) -> str:
    """A Wi-Fi link to the handheld: ``tcp:HOST:PORT`` (TLS) or ``tcp+insecure:HOST:PORT``."""
    if not text.startswith(("tcp:", "tcp+insecure:")):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected tcp:HOST:PORT (TLS, the handheld paired with `coinf wifi "
            f"pair`) or tcp+insecure:HOST:PORT")
    return argtypes.connect_address(text)


def _wifi_preset(text: str) -> str:
    from coinf.ble_protocol.wifi_preset import WifiError, wifi_preset

    try:
        wifi_preset(text)
    except WifiError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _plan_file(text: str) -> str:
    """A plan file; a number is the old ``--plan N``, now ``--planner-runs N``."""
    if text.lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"{text}: --plan now takes a plan file (coinf plan "
                                         f"--json); the planner's runs are --planner-runs N")
    return argtypes.existing_file(text)


def spread(n_items: int, k: int) -> list[int]:
    """Up to ``k`` indices evenly spread over ``range(n_items)``, always both ends."""
    if k <= 0 or k >= n_items:
        return list(range(n_items))
    if k == 1:
        return [n_items - 1]
    return sorted({round(i * (n_items - 1) / (k - 1)) for i in range(k)})


#: exit code when every inference finished but none left the wearable because the handheld was
#: unreachable or failing (each row's ``fallbacks`` says how often; README, "Commands")
EXIT_NEVER_OFFLOADED = 5


def check_args(args: argparse.Namespace) -> None:
    """Refuse a bad combination of flags before any work (one line, exit code 2)."""
    from coinf.cli.commands.discover import check_filters
    from coinf.errors import UserError

    check_filters(args)
    if args.helpers and args.discover is not None:
        raise UserError("give --helpers CONFIG or --discover, not both")
    if (args.helpers or args.discover is not None) and (args.split or args.all):
        flag = "--helpers" if args.helpers else "--discover"
        raise UserError(f"{flag}: with --plan FILE (the devices its stages name) or alone "
                        "(the Session chooses local, a split or a pipeline), not with "
                        "--split/--all")
    if args.repeat < 1:
        raise UserError("--repeat must be >= 1")
    if args.max is not None and not args.all:
        raise UserError(f"--max {args.max}: only with --all (at most N of every candidate)")
    if args.stream == 1:
        raise UserError("--stream 1: a stream needs at least 2 frames (0 = no stream)")
    if args.transport == "socket" and not args.handheld:
        raise UserError("--transport socket needs --handheld unix:/path or tcp:HOST:PORT")
    if args.transport == "ble" and not args.hci:
        raise UserError("--transport ble needs --hci hci-socket:0, usb:0 or tcp-client:HOST:PORT")
    argtypes.insecure_options(args, args.handheld if args.transport == "socket" else None,
                              getattr(args, "wifi", None))
    wifi_link(args)


def run(args: argparse.Namespace) -> int:
    from coinf.bundle import Bundle, open_slice
    from coinf.cli.commands.discover import discovered_helpers
    from coinf.cli.sample import bundle_feeds, load_feeds

    check_args(args)
    logging.getLogger("bumble").setLevel(logging.CRITICAL)  # teardown noise, see handheld
    bundle = Bundle.load(args.bundle)
    if args.discover is not None:  # found now, once: every session of this run uses them
        args.helpers = discovered_helpers(args, bundle)
    feeds = bundle_feeds(bundle, args.seed)
    feeds.update(load_feeds(args.input, bundle.inputs))
    ref_sess = open_slice(bundle.model_path)
    reference = dict(zip([o.name for o in ref_sess.get_outputs()], ref_sess.run(None, feeds),
                         strict=True))
    if args.all:
        ids = [bundle.candidates[i].id for i in spread(len(bundle.candidates), args.max or 0)]
    else:
        ids = [_config(bundle, c, args.packing) for c in args.split.split(",")] \
            if args.split else [""]
    rows: list[dict[str, Any]] = []
    opener = _Opener(args, bundle)
    session = opener.open(ids[0].partition("~")[0] or None, packing=args.packing)
    with session, TransferProgress(session):
        if any(c and not bundle.candidate(c.partition("~")[0]).is_wearable_only for c in ids):
            connect_or_fall_back(session, args.no_fallback)  # set-up is not an inference
        for k, config in enumerate(ids, 1):
            cid, _, packing = config.partition("~")
            if cid:
                session.set_split(cid, packing or args.packing)
            rows.append(measure_cut(session, bundle, feeds, reference, args))
            if len(ids) > 1:
                print(f"[{k}/{len(ids)}] {progress_line(rows[-1], args.repeat)}",
                      file=sys.stderr, flush=True)
        stream = None
        if args.stream > 1:
            if args.all:
                session.set_split(balanced(rows))
            stream = measure_stream(session, bundle, args.stream)
    planned = None
    if args.planner_runs:
        if args.all:
            print(f"planner: {args.planner_runs} run(s) with the planner choosing the cut",
                  file=sys.stderr, flush=True)
        with opener.open(None, objective="latency") as planner_session, \
                TransferProgress(planner_session):
            planned = measure_plan(planner_session, feeds, args.planner_runs, rows)
    if args.json:
        json.dump({"bundle": str(args.bundle), "rows": rows, "stream": stream,
                   "plan": planned}, sys.stdout, indent=1)
        print()
    else:
        print(format_table(rows, show_links=bool(args.wifi)))
        if stream:
            print(format_stream(stream))
        if planned:
            print(format_plan(planned))
    return exit_code(rows)


def exit_code(rows: list[dict[str, Any]]) -> int:
    """1 when an exact packing's outputs differ from the model's; :data:`EXIT_NEVER_OFFLOADED`
    when some inference was meant to leave the wearable and none did (the handheld was
    unreachable or failing: each finished on the wearable); else 0."""
    if not all(r["match"] for r in rows):
        return 1
    fell_back = sum(r["fallbacks"] for r in rows)
    offloaded = sum(len(r["runs"]["total_ms"]) - r["fallbacks"] for r in rows
                    if r["strategy"] != "local")
    if fell_back and not offloaded:
        print(f"coinf run: none of the {fell_back} inference(s) meant for the handheld reached "
              f"it (each finished on the wearable): exit code {EXIT_NEVER_OFFLOADED}",
              file=sys.stderr)
        return EXIT_NEVER_OFFLOADED
    return 0


class _Opener:
    """Opens the run's Sessions: the command line's options, one split and packing fixed (or
    the planner's choice), and a --plan's stages."""

    def __init__(self, args: argparse.Namespace, bundle: Any) -> None:
        self.args, self.bundle, self.base = args, bundle, session_options(args)

    def open(self, split: str | None, packing: str = "raw", objective: str | None = None) -> Any:
        from coinf.errors import UserError
        from coinf.wearable.session import Session

        args, base = self.args, self.base
        fixed = {"plan": args.plan, "helpers": args.helpers or ()} if args.plan else \
            {"helpers": args.helpers} if args.helpers and split is None else {}
        opts = base.replace(
            placement=base.placement.replace(split=split, packing=packing, **fixed),
            planner=base.planner.replace(objective=objective))
        try:
            return Session(self.bundle, opts)
        except ValueError as exc:
            raise UserError(str(exc)) from None


def measure_cut(session: Any, bundle: Any, feeds: dict[str, np.ndarray],
                reference: dict[str, np.ndarray], args: argparse.Namespace) -> dict[str, Any]:
    """``--warmup`` uncounted runs, then ``--repeat`` measured ones at the session's split:
    one row of the table (medians, every run's times, exactness against the model)."""
    cand = session.split
    warm, stats, outs = [], [], []
    for _ in range(args.warmup):  # a cut's first frame opens its slices: not counted
        session.run(None, feeds)
        warm.append(round(session.last_run.total_ms, 3))
    for _ in range(args.repeat):
        outs = session.run(None, feeds)
        stats.append(session.last_run)
    names = [t.name for t in bundle.outputs]
    err = max(float(np.max(np.abs(o.astype(np.float64) - reference[n].astype(np.float64))))
              if o.size else 0.0 for n, o in zip(names, outs, strict=True))
    comp = None if cand.is_wearable_only else session.compressor
    lossy = not cand.is_wearable_only and (comp is not None or not session.packing.lossless)
    match = all(np.allclose(o, reference[n], rtol=RTOL, atol=ATOL)
                for n, o in zip(names, outs, strict=True)) or lossy  # lossy: calibrated

    def med(field: str) -> float:
        return round(statistics.median(getattr(s, field) for s in stats), 3)

    return {
        "strategy": stats[-1].strategy,
        "plan": stats[-1].plan,  # every stage's device and slice (re-planned: the last)
        "plan_versions": sorted({s.plan_version for s in stats}),
        "candidate": cand.id,
        "packing": str(session.packing) if comp is None else f"g{comp.gamma}" + (
            "" if str(session.packing) == "raw" else f"+{session.packing}"),
        "label": cand.label,
        "tensors": len(cand.crossing),
        "bytes": 0 if cand.is_wearable_only else cand.crossing_bytes,
        "bytes_up": med("bytes_up"),
        "lossy": lossy,
        "top1_same": all(int(np.argmax(o)) == int(np.argmax(reference[n]))
                         for n, o in zip(names, outs, strict=True)),
        **{f: med(f) for f in RUN_FIELDS},
        "max_abs_err": err,
        "match": bool(match),
        "fallbacks": sum(s.fallback is not None for s in stats),
        # a packing the handheld does not decode went as the nearest one it does
        "packing_fallback": stats[-1].packing_fallback,
        # the link that carried each run (several links: the planner's choice)
        "links": {n: sum(s.link == n for s in stats)
                  for n in dict.fromkeys(s.link for s in stats if s.link)},
        # every run's times, for a spread or a test between points (bench map)
        "runs": {f: [round(getattr(s, f), 3) for s in stats] for f in RUN_FIELDS},
        "warmup_ms": warm,
    }


def _config(bundle: Any, text: str, default: str) -> str:
    """``c004``, ``c004~q8`` or ``c013~g5+latent`` (compressor g5's code, coded): the
    candidate's id and the packing (checked here, before any work)."""
    from coinf.ble_protocol.packing import PackSpec
    from coinf.errors import BundleError, UserError
    from coinf.wearable.planner.codec_costs import parse_config_spec

    cid, sep, packing = text.strip().partition("~")
    gamma, spec = parse_config_spec(packing if sep else default)
    try:
        PackSpec.parse(spec)
        if gamma:  # a compressor's code: c013~g5+latent
            bundle.compressor(bundle.candidate(cid).id, gamma)
    except (ValueError, BundleError) as exc:
        raise UserError(f"--split {text.strip()}: {exc}") from None
    return bundle.candidate(cid).id + (f"~{packing}" if sep else "")


class TransferProgress:
    """Shows, on stderr, a message to the handheld that takes longer than ``after_s``: bytes
    sent, rate and ETA, polled from the link's counters (:meth:`LinkStats.sending`) on a thread
    while the session works. On a terminal one line is rewritten; otherwise a line is printed at
    most every ``every_s`` seconds. Links that send in one piece (sockets, in-process) show
    nothing."""

    def __init__(self, session: Any, after_s: float = 1.0, every_s: float = 2.0,
                 poll_s: float = 0.2, stream: Any = None) -> None:
        import threading

        self.session = session
        self.after_s, self.every_s, self.poll_s = after_s, every_s, poll_s
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="coinf-progress", daemon=True)
        self._shown = False

    def __enter__(self) -> TransferProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)

    def line(self, done: int, total: int, seconds: float) -> str:
        rate = done / seconds if seconds > 0 else 0.0
        eta = f"{(total - done) / rate:.0f} s" if rate > 0 else "?"
        return (f"sending {size_text(done)} / {size_text(total)} ({100 * done / total:.0f}%), "
                f"{size_text(rate)}/s, ETA {eta}")

    def _main(self) -> None:
        import time

        last_print = 0.0
        while not self._stop.wait(self.poll_s):
            try:
                link = self.session.link
                now = link.stats.sending() if link is not None else None
            except Exception:  # the session is closing: nothing to show
                now = None
            if now is None or now[2] < self.after_s:
                if self._shown and self.tty:
                    print("\r\033[K", end="", file=self.stream, flush=True)
                self._shown = False
                continue
            text = self.line(*now)
            if self.tty:
                print(f"\r\033[K{text}", end="", file=self.stream, flush=True)
                self._shown = True
            elif time.monotonic() - last_print >= self.every_s or not self._shown:
                print(text, file=self.stream, flush=True)
                self._shown, last_print = True, time.monotonic()
        if self._shown and self.tty:
            print("\r\033[K", end="", file=self.stream, flush=True)


def connect_or_fall_back(session: Any, strict: bool) -> None:
    """Connect now (so set-up stays out of the timings); when the handheld cannot be reached
    and fallback is on, say so and let the runs finish on the wearable."""
    from coinf.errors import LinkError

    try:
        session.connect()
    except LinkError as exc:
        if strict or not exc.transient:
            raise
        print(f"coinf run: handheld unreachable ({exc}); inferences finish on the wearable "
              "and offloading is retried", file=sys.stderr)


def balanced(rows: list[dict[str, Any]]) -> str:
    """The offloading cut whose slowest pipeline stage (head, pack, link, tail) is fastest."""
    pool = [r for r in rows if r["bytes"] > 0 and r["label"] != "handheld-only"]
    pool = pool or [r for r in rows if r["bytes"] > 0] or rows

    def period(r: dict[str, Any]) -> float:
        return max(r["head_ms"], r["pack_ms"], r["transfer_ms"] + r["return_ms"], r["tail_ms"])

    return str(min(pool, key=period)["candidate"])


def measure_stream(session: Any, bundle: Any, frames: int) -> dict[str, Any]:
    """Frames/s of ``frames`` inputs run one at a time, then pipelined, on the current split."""
    import time

    from coinf.cli.sample import bundle_feeds

    data = [bundle_feeds(bundle, seed) for seed in range(frames)]
    out: dict[str, Any] = {"frames": frames, "cut": session.split.id}
    for name, pipelined in (("sequential_fps", False), ("pipelined_fps", True)):
        t0 = time.perf_counter()
        for result in session.stream(data, pipelined=pipelined):
            result.value()
        out[name] = round(frames / (time.perf_counter() - t0), 3)
    out["speedup"] = round(out["pipelined_fps"] / out["sequential_fps"], 3)
    return out


def measure_plan(session: Any, feeds: dict[str, np.ndarray], runs: int,
                 rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Run ``runs`` inferences with the planner choosing; its choice vs the table's fastest."""
    connect_or_fall_back(session, not session.options.link.fallback)
    chosen, totals = [], []
    for _ in range(runs):
        session.run(None, feeds)
        stats = session.last_run
        assert stats is not None
        spec = stats.packing if stats.gamma <= 1 else (
            f"g{stats.gamma}" + ("" if stats.packing == "raw" else f"+{stats.packing}"))
        chosen.append(stats.candidate + ("" if spec == "raw" else f"~{spec}"))
        totals.append(stats.total_ms)
    decision = session.plan()
    winner = max(set(chosen), key=chosen.count)
    predicted = next((r.latency_ms() for r in decision.rows if r.id == winner), None)
    fastest = min(rows, key=lambda r: r["total_ms"]) if rows else None
    return {
        "objective": "latency",
        "runs": runs,
        "chosen": winner,
        "label": session.bundle.candidate(winner.split("~")[0]).label,
        "choices": {c: chosen.count(c) for c in sorted(set(chosen))},
        "predicted_ms": None if predicted is None else round(predicted, 3),
        "measured_ms": round(statistics.median(totals), 3),
        "fastest_in_table": None if fastest is None else fastest["candidate"],
        "fastest_ms": None if fastest is None else fastest["total_ms"],
    }


def session_options(args: argparse.Namespace) -> SessionOptions:
    """The SessionOptions of ``coinf run``'s flags (``--transport socket --handheld ADDR`` is
    ``transport=ADDR``, ``--transport ble --hci SPEC`` is ``transport="ble:SPEC"``)."""
    from coinf.errors import UserError
    from coinf.wearable.options import (
        EmulationOptions,
        LinkOptions,
        PlacementOptions,
        SessionOptions,
    )

    transport = {"socket": args.handheld, "ble": f"ble:{args.hci}"}.get(args.transport,
                                                                       args.transport)
    over_ble = _ble_helpers(args)
    ble = ble_options(args, over_ble) or {}
    try:
        return SessionOptions(
            placement=PlacementOptions(packing=args.packing, runtime=args.runtime,
                                       handheld_runtime=args.handheld_runtime),
            link=LinkOptions(transport=transport,
                             transport_options=ble if args.transport == "ble" else
                             argtypes.insecure_options(args, transport),
                             helper_ble_options=ble if over_ble else {},
                             timeout=120.0, fallback=not args.no_fallback,
                             alternates=wifi_link(args)),
            emulation=EmulationOptions(slowdown=args.slowdown, threads=args.threads,
                                       compute_profile=args.compute_profile))
    except ValueError as exc:
        raise UserError(str(exc)) from None


def wifi_link(args: argparse.Namespace) -> dict[str, Any]:
    """``--wifi ADDR [--wifi-emulate PRESET]``: the alternate link named ``wifi`` beside
    ``--transport ble`` (LinkOptions.alternates)."""
    from coinf.errors import UserError
    from coinf.wearable.options import AlternateLink

    wifi, preset = getattr(args, "wifi", None), getattr(args, "wifi_emulate", None)
    if wifi is None:
        if preset is not None:
            raise UserError("--wifi-emulate shapes the --wifi link: give --wifi tcp:HOST:PORT")
        return {}
    if args.transport != "ble":
        raise UserError(f"--wifi is a second link beside --transport ble (--hci SPEC), not "
                        f"--transport {args.transport}"
                        + (" (the handheld's address there is --handheld)"
                           if args.transport == "socket" else ""))
    if getattr(args, "helpers", None) or getattr(args, "discover", None) is not None:
        raise UserError("--wifi reaches the handheld; --helpers/--discover plan over helpers: "
                        "give one or the other")
    channel = None
    if preset is not None:
        from coinf.ble_protocol.wifi_preset import wifi_preset

        channel = wifi_preset(preset).channel()
    return {"wifi": AlternateLink(transport=wifi, channel=channel,
                                  transport_options=argtypes.insecure_options(args, wifi))}


def _ble_helpers(args: argparse.Namespace) -> bool:
    """``--helpers`` (a config file, or the helpers ``--discover`` found) names a helper this
    wearable reaches over BLE (its ``wearable_link``)."""
    from coinf.wearable.pipeline_config import load_helpers

    given = getattr(args, "helpers", None)
    if not given:
        return False
    helpers = given if isinstance(given, list) else load_helpers(given)
    return any(h.over_ble for h in helpers)


def ble_options(args: argparse.Namespace, ble_helpers: bool = False) -> dict[str, Any] | None:
    """The BLE options of ``--keystore``, the passkey options and ``--window-s`` (for the
    handheld's BLE link and, with ``ble_helpers``, for helpers reached over BLE):
    the bond store defaults to the private one (bonds persist across restarts); a given passkey
    opens the pairing window for ``--window-s`` (default 120 s), never for the whole run."""
    from coinf.cli.commands.pair import DEFAULT_WINDOW_S, default_bond_store
    from coinf.cli.passkey import given_passkey
    from coinf.errors import UserError

    if args.transport != "ble" and not ble_helpers:
        if args.keystore or args.passkey_file or args.passkey_stdin or args.window_s:
            raise UserError("--keystore, --passkey-file, --passkey-stdin and --window-s are "
                            "for --transport ble, or --helpers with a helper reached over BLE")
        return None
    options: dict[str, Any] = {"keystore": args.keystore or default_bond_store("wearable")}
    passkey = given_passkey(args)
    if passkey is not None:
        window = DEFAULT_WINDOW_S if args.window_s is None else args.window_s
        if not window > 0:
            raise UserError("--window-s must be > 0")
        options.update(passkey=passkey, pairing_window_s=window)
    elif args.window_s is not None:
        raise UserError("--window-s opens the pairing window with a fixed passkey: give "
                        "--passkey-file or --passkey-stdin (or pair with `coinf wearable pair`)")
    return options
