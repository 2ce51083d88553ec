"""The :class:`Planner`: a bundle + two device profiles + a policy -> a :class:`Decision`.

The Session calls :meth:`Planner.decide` whenever :class:`~wearable.planner.adapt.ReplanTrigger`
says an input moved; the call only does arithmetic over the cached per-candidate base times.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from coinf.device.profile import DeviceProfile
from coinf.device.status import DeviceStatus
from coinf.wearable.planner.adapt import (
    DEFAULT_LINK,
    LinkEstimate,
    LinkEstimator,
    LoadFactor,
    ReplanTrigger,
)
from coinf.wearable.planner.codec_costs import (
    CODEC_SLOWDOWN,
    codec_factor,
    codec_ms,
    estimated_pack_ms,
    is_packing_work,
    parse_config_spec,
    undecodable,
)
from coinf.wearable.planner.costs import TIMEOUT_MARGIN, CandidateCost, Decision
from coinf.wearable.planner.memory import MemoryModel, budget_of
from coinf.wearable.planner.mincut import CutResult, min_cut
from coinf.wearable.planner.onnx_dag import dag_from_onnx
from coinf.wearable.planner.schedulers import coinf_schedule, dyno, neurosurgeon
from coinf.wearable.policy import OBJECTIVES, Policy

from coinf.errors import CoinfError


class _Unset:
    """The value of an argument not given: take the policy's (a budget of None means "no
    budget"). One object, kept by copy and pickle (options holding it equal their copies)."""

    def __repr__(self) -> str:
        return "UNSET"

    def __reduce__(self) -> str:
        return "_UNSET"


_UNSET: Any = _Unset()
#: separates candidate id and packing in a configuration id (``c003~q4``)
PACK_SEP = "~"



def split_config(config_id: str) -> tuple[str, str]:
    """``"c003~q4"`` -> ``("c003", "q4")``; a plain candidate id -> ``(id, "raw")``;
    ``"c003~g4+q8"`` (compressor g4's code, packed q8) -> ``("c003", "g4+q8")``."""
    cid, _, spec = config_id.partition(PACK_SEP)
    return cid, spec or "raw"


def protocol_wire_bytes(cand: Any, outputs: Any) -> tuple[int, int]:
    """REQUEST and RESULT payload sizes of the raw protocol for ``cand``: the tensor data (or
    the manifest's ``wire_bytes`` extra) plus names, shapes and headers; the bare tensor bytes
    if the protocol module is unavailable."""
    nbytes = int(cand.extra.get("wire_bytes", cand.crossing_bytes))
    out = tuple(outputs)
    out_bytes = sum(t.nbytes for t in out)
    try:
        import numpy as np
        from coinf.ble_protocol.request import HopStats, Request, encode_request, encode_result
        from coinf.ble_protocol.tensors import encode_tensors
    except ImportError:
        return nbytes, out_bytes

    def header(specs: Any) -> int:
        empty = {t.name: np.zeros((0,) * len(t.shape) if t.shape else (), dtype=t.dtype)
                 for t in specs}
        return len(encode_tensors(empty)) - sum(a.nbytes for a in empty.values())

    req = len(encode_request(Request.split(cand.id, "c999"), b"")) + header(cand.crossing)
    res = len(encode_result([HopStats(0)], b"")) + header(out)
    return nbytes + req, out_bytes + res


def learned_bound(comp: Any, packing: str) -> float | None:
    """The 95 % upper bound (pp) on a learned compressor's agreement loss, from its held-out
    feeds (``test_feeds``), as a calibrated packing's drop is bounded; None for a compressor
    without a sample count (an autoencoder set: its measured drop is all there is)."""
    n = getattr(comp, "test_feeds", None)
    if comp.kind != "learned" or not n or packing not in comp.accuracy:
        return None
    from coinf.convert.calibrate import upper_bound

    changed = round((1.0 - comp.accuracy[packing] / max(comp.base_accuracy, 1e-9)) * n)
    return 100.0 * upper_bound(max(changed, 0), int(n))


class Planner:
    """Decides which candidate cut of ``bundle`` to run."""

    def __init__(self, bundle: Any, wearable_profile: DeviceProfile | None = None,
                 handheld_profile: DeviceProfile | None = None, policy: Policy | None = None,
                 predictor_style: str = "incontext",
                 wire_bytes: Callable[[Any], tuple[int, int]] | None = None,
                 packings: Sequence[str] = ("auto",), pack_mb_s: float = 50.0,
                 timeout_s: float = 30.0, runtimes: Mapping[str, str] | None = None,
                 memory_budget_mb: float | None = _UNSET) -> None:
        """``wire_bytes(candidate) -> (request bytes, result bytes)`` is what travels raw; by
        default the exact size of the raw REQUEST/RESULT payloads of :mod:`ble_protocol`.

        ``packings`` (e.g. ``("raw", "f16", "q8", "q4")``; the default ``("auto",)`` means every
        packing the bundle was calibrated for) makes each (candidate, packing) a
        configuration, DynO-style: a row ``c003~q4`` uses the calibrated mean packed size and
        accuracy drop from the bundle (``coinf calibrate``); packings a candidate was not
        calibrated for are skipped, and so are those whose calibrated accuracy drop exceeds the
        policy's ``accuracy_tolerance_pp`` (default 1 pp). Packing costs wearable time, added
        to the head, and handheld time, added to the tail: the times the devices' profiles or
        the calibration measured (:mod:`~coinf.wearable.planner.codec_costs`); without any,
        ``crossing bytes / pack_mb_s`` (default 50 MB/s, an estimate for a Pi Zero 2 W core),
        stretched as an emulated wearable would. Use :func:`split_config` on the winner.

        ``timeout_s`` is the Session's per-inference timeout (``LinkOptions.timeout``):
        a configuration whose predicted exchange (transfer + tail + return) times
        ``TIMEOUT_MARGIN`` (2) exceeds it is infeasible and never chosen (``Decision.excluded``
        says so); ``wearable-only`` always is feasible.

        ``runtimes`` (``{"wearable": ..., "handheld": ...}``, default onnxruntime) are the
        runtimes asked for per device; each slice's time is that of the runtime that will run it
        (:func:`coinf.device.litert.resolve`), measured per runtime by ``coinf profile``;
        ``stage_runtimes`` records them per candidate.
        ``memory_budget_mb`` (default: the wearable profile's, see ``planner.memory``; None =
        unconstrained) is a hard constraint: a head that does not fit is never chosen."""
        if not pack_mb_s > 0:
            raise ValueError(f"pack_mb_s must be > 0, got {pack_mb_s}")
        self.pack_mb_s = pack_mb_s
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        #: configurations ruled out by calibration, with the reason (filled by ``_configs``)
        self.excluded_configs: dict[str, str] = {}
        self.bundle = bundle
        self.wire_bytes = wire_bytes or (lambda c: protocol_wire_bytes(c, bundle.outputs))
        self.wearable = wearable_profile or DeviceProfile.default("wearable")
        self.handheld = handheld_profile or DeviceProfile.default("handheld")
        self.policy = policy or Policy()
        self.predictor_style = predictor_style
        self._features: Any = None
        self._wire_cfg: dict[str, list[tuple[str, int, int, float]]] = {}
        #: (encode ms where calibrated, decode ms) of each codec configuration (``c000~png``)
        self.codec_ms: dict[str, tuple[float, float]] = {}
        #: the packing codecs the handheld decodes (HELLO_ACK ``decoders``); None = not known,
        #: so every calibrated packing is offered (``coinf plan`` without a peer)
        self.peer_decoders: frozenset[str] | None = None
        #: the compressors the handheld decodes (HELLO_ACK ``compressors``; None: all)
        self.peer_compressors: frozenset[tuple[str, int]] | None = None
        self.codec_slowdown = CODEC_SLOWDOWN  # see codec_costs.codec_factor
        from coinf.ble_protocol.packing import PackSpec

        for spec in packings:
            if spec == "auto":
                continue
            try:
                PackSpec.parse(spec)
            except ValueError as exc:
                raise ValueError(f"{exc}, or auto (every calibrated packing)") from None
        self.packings = tuple(packings)
        self.memory = MemoryModel(bundle, self.wearable, budget_of(self.wearable)
                                  if memory_budget_mb is _UNSET else memory_budget_mb)
        self._base: list[tuple[float, float, str, str]] | None = None
        self.runtimes = {"wearable": "onnxruntime", "handheld": "onnxruntime", **(runtimes or {})}
        self.stage_runtimes: dict[str, tuple[str, str]] = {}

    # -- base compute times (cached) ---------------------------------------------------------
    def _node_features(self) -> Any:
        if self._features is None:
            import onnx
            from coinf.device.features import node_features

            self._features = node_features(onnx.load(str(self.bundle.model_path)))
        return self._features

    def _predictions(self, profile: DeviceProfile) -> dict[str, float]:
        if profile.predictor is None:  # a built-in profile: per-op-type rates
            assert profile.rates is not None
            return profile.rates.node_map(self._node_features())
        style = self.predictor_style
        if style == "incontext":  # the in-context slice predictor, if the profile has one
            from coinf.device.incontext import incontext_node_times

            got = incontext_node_times(profile.predictor.meta, self.bundle.model_path)
            if got is not None:
                return got
            style = "coinf"
        return profile.predictor.predict_nodes(self._node_features(), style)

    def base_times(self) -> list[tuple[float, float, str, str]]:
        """Per candidate: (head_ms, tail_ms, head source, tail source) at idle, full clock."""
        if self._base is None:
            ident = self.bundle.identity
            cache: dict[str, dict[str, float]] = {}

            def preds(p: DeviceProfile) -> Any:
                return lambda: cache.setdefault(p.role, self._predictions(p))

            self._base = []
            for c in self.bundle.candidates:
                h, hs = self.wearable.part_ms(ident, c.id, "head", c.head.nodes, c.head.flops,
                                              preds(self.wearable))
                t, ts = self.handheld.part_ms(ident, c.id, "tail", c.tail.nodes, c.tail.flops,
                                              preds(self.handheld))
                (h, hs), (t, ts) = self._runtime_ms(c, (h, hs), (t, ts))
                self._base.append((h, t, hs, ts))
        return self._base

    def _runtime_ms(self, c: Any, head: tuple[float, str], tail: tuple[float, str],
                    ) -> tuple[tuple[float, str], tuple[float, str]]:
        """The slices' times under the runtimes that will run them (LiteRT when measured)."""
        from coinf.device.litert import LITERT, resolve, resolved_ms

        out = []
        for part, (ms, src), role, prof in (("head", head, "wearable", self.wearable),
                                            ("tail", tail, "handheld", self.handheld)):
            # a remote handheld's LiteRT is its own business: assume it has the runtime it asks
            rt = resolve(self.runtimes[role], self.bundle, c, part, prof,
                         have_litert=None if role == "wearable" else True)
            lite = resolved_ms(prof, self.bundle.identity, c, part, rt) if rt == LITERT else None
            out.append((lite, "measured slice (litert)") if lite is not None else (ms, src))
            self.stage_runtimes.setdefault(c.id, ("onnxruntime", "onnxruntime"))
            pair = list(self.stage_runtimes[c.id])
            pair[part == "tail"] = rt
            self.stage_runtimes[c.id] = (pair[0], pair[1])
        return out[0], out[1]

    # -- cost table -------------------------------------------------------------------------
    def costs(self, link: LinkEstimate | None = None, wearable_status: DeviceStatus | None = None,
              handheld_status: DeviceStatus | None = None,
              load_factor: float = 1.0, handheld_load: float = 1.0) -> list[CandidateCost]:
        """One row per candidate under the given link, device status and load factors
        (``load_factor``: the wearable's measured/predicted head time; ``handheld_load``: the
        same for the handheld's tails)."""
        link = link or DEFAULT_LINK
        for name, f in (("load factor", load_factor), ("handheld load", handheld_load)):
            if not 0 < f < 1e3 or math.isnan(f):
                raise ValueError(f"{name} must be in (0, 1000), got {f}")
        sw = (wearable_status.speed_factor() if wearable_status else 1.0) * load_factor
        sh = (handheld_status.speed_factor() if handheld_status else 1.0) * handheld_load
        pw, ph = self.wearable.power, self.handheld.power
        rows = []
        for c, (h, t, _, _) in zip(self.bundle.candidates, self.base_times(), strict=True):
            for spec, nbytes, out_bytes, acc in self._configs(c):
                head, tail = h * sw, t * sh
                gamma, packing = parse_config_spec(spec)
                codec = self.codec_ms.get(f"{c.id}{PACK_SEP}{spec}")
                comp = None if gamma is None else self.bundle.compressor(c.id, gamma)
                if codec is not None:  # pack and unpack times measured here, there
                    head += codec[0] * sw
                    tail += codec[1] * sh
                elif is_packing_work(packing):  # no time measured: a Pi core's pack_mb_s
                    head += estimated_pack_ms(c.crossing_bytes if comp is None
                                              else comp.code.nbytes, self.wearable,
                                              self.pack_mb_s, self.codec_slowdown) * sw
                if comp is not None:  # the encoder here, the decoder there: the set gives
                    # their FLOPs together; each side is charged all of them at its model rate
                    flops = comp.flops
                    head += flops * self._ms_per_flop("wearable") * sw
                    tail += flops * self._ms_per_flop("handheld") * sh
                xfer = ret = 0.0
                if not c.is_wearable_only:
                    xfer, ret = link.up_ms(nbytes), link.down_ms(out_bytes)
                # marginal energy over idle: compute above idle power, plus the radio
                (w_tx, w_rx, w_wake), (h_tx, h_rx, h_wake) = (
                    pw.radio(link.kind), ph.radio(link.kind))
                woke = 0.0 if c.is_wearable_only else 1.0
                ew = head * max(pw.cpu_active_w - pw.cpu_idle_w, 0) + xfer * w_tx \
                    + ret * w_rx + woke * w_wake
                eh = tail * max(ph.cpu_active_w - ph.cpu_idle_w, 0) + xfer * h_rx \
                    + ret * h_tx + woke * h_wake
                tail += link.queue_ms * woke  # waiting at a shared service: latency only
                rid = c.id if spec == "raw" else f"{c.id}{PACK_SEP}{spec}"
                label = c.label if spec == "raw" else f"{c.label} {spec}"
                rows.append(CandidateCost(rid, head, tail, xfer, ret, ew, eh, nbytes, acc, label))
        return rows

    def _ms_per_flop(self, role: str) -> float:
        """A device's predicted ms per FLOP over the whole model (prices a compressor)."""
        base, cands = self.base_times(), self.bundle.candidates
        ms, flops = ((base[-1][0], cands[-1].head.flops) if role == "wearable"
                     else (base[0][1], cands[0].tail.flops))
        return float(ms) / max(int(flops), 1)

    def _specs(self, c: Any) -> list[str]:
        """``self.packings`` with ``auto`` expanded to every packing ``c`` was calibrated for."""
        from coinf.convert.calibrate import packing_rows

        out: list[str] = []
        for spec in self.packings:
            out += [str(r.get("spec")) for r in packing_rows(c)] if spec == "auto" else [spec]
        return list(dict.fromkeys(out))

    def reset_configs(self) -> None:
        """Forget the configurations (the peer's decoders or the calibration changed)."""
        self._wire_cfg.clear()
        self.codec_ms.clear()
        self.excluded_configs.clear()

    def _configs(self, c: Any) -> list[tuple[str, int, int, float]]:
        """(packing, request bytes, result bytes, accuracy drop) of each configuration of
        candidate ``c``: raw, plus every packing in ``self.packings`` it was calibrated for."""
        if c.id in self._wire_cfg:
            return self._wire_cfg[c.id]
        if c.is_wearable_only:
            out = [("raw", 0, 0, 0.0)]
        else:
            req, res = self.wire_bytes(c)
            out = [("raw", req, res, float(c.extra.get("accuracy_drop_pp", 0.0)))]
            header = req - int(c.extra.get("wire_bytes", c.crossing_bytes))
            for spec in self._specs(c):
                if spec == "raw":
                    continue
                try:
                    from coinf.convert.calibrate import (
                        accuracy_bound,
                        accuracy_drop,
                        expected_packed_bytes,
                    )

                    packed = expected_packed_bytes(c, spec)
                    drop = accuracy_drop(c, spec)
                    bound, samples = accuracy_bound(c, spec, self._calibration_samples())
                except (ImportError, CoinfError, KeyError, ValueError):
                    continue  # not calibrated for this packing: not a configuration
                tol = self.policy.accuracy_tolerance_pp
                rid = f"{c.id}{PACK_SEP}{spec}"
                missing = undecodable(spec, self.peer_decoders, c, self.peer_compressors)
                if missing:
                    self.excluded_configs[rid] = missing
                    continue
                if drop > tol:  # beyond the user's accuracy tolerance: never a choice
                    self.excluded_configs[rid] = (
                        f"accuracy drop {drop:.2f} pp > tolerance {tol:g} pp")
                    continue
                if bound > tol:  # too few samples to show the drop is within the tolerance
                    from coinf.convert.calibrate import samples_needed

                    self.excluded_configs[rid] = (
                        f"accuracy drop {drop:.2f} pp measured on {samples} samples, but its "
                        f"95% upper bound is {bound:.1f} pp > tolerance {tol:g} pp (with no "
                        f"change seen, {samples_needed(tol)} samples establish {tol:g} pp)")
                    continue
                out.append((spec, round(packed) + header, res, drop))
                ms = codec_ms(self, c, spec)
                if ms is not None:
                    self.codec_ms[rid] = ms
            if "auto" in self.packings:
                out += self._compressor_configs(c, header, res)
        self._wire_cfg[c.id] = out
        return out

    def _compressor_configs(self, c: Any, header: int, res: int
                            ) -> list[tuple[str, int, int, float]]:
        """Configurations ``g4``, ``g4+q8``, ... of the compressors attached at ``c``
        (``coinf convert compressors``): the code's bytes as measured when attached, the
        accuracy drop from the set's test accuracies; the same accuracy tolerance applies."""
        found = getattr(self.bundle, "compressors", None)
        out = []
        for comp in found(c.id) if callable(found) else []:
            for packing, size in sorted(comp.code_bytes.items()):
                if packing not in comp.accuracy:
                    continue
                spec = f"g{comp.gamma}" if packing == "raw" else f"g{comp.gamma}+{packing}"
                missing = undecodable(spec, self.peer_decoders, c, self.peer_compressors)
                if missing:
                    self.excluded_configs[f"{c.id}{PACK_SEP}{spec}"] = missing
                    continue
                drop = max(round((comp.base_accuracy - comp.accuracy[packing]) * 100.0, 6), 0.0)
                tol = self.policy.accuracy_tolerance_pp
                if drop > tol:
                    self.excluded_configs[f"{c.id}{PACK_SEP}{spec}"] = (
                        f"accuracy drop {drop:.2f} pp > tolerance {tol:g} pp")
                    continue
                bound = learned_bound(comp, packing)
                if bound is not None and bound > tol:  # as a calibrated packing must show
                    self.excluded_configs[f"{c.id}{PACK_SEP}{spec}"] = (
                        f"accuracy drop {drop:.2f} pp measured on {comp.test_feeds} held-out "
                        f"feeds, but its 95% upper bound is {bound:.1f} pp > tolerance {tol:g} pp")
                    continue
                out.append((spec, size + header, res, drop))
                coded = comp.code_ms.get(packing)
                if coded is not None:  # the entropy coder's time, here and there
                    self.codec_ms[f"{c.id}{PACK_SEP}{spec}"] = (
                        coded[0] * codec_factor(self.wearable, self.codec_slowdown), coded[1])
        return out

    def _calibration_samples(self) -> int | None:
        meta = getattr(self.bundle, "meta", None) or {}
        n = (meta.get("packing_calibration") or {}).get("samples")
        return int(n) if isinstance(n, int) else None

    # -- exact optimum over every cut of the graph -----------------------------------------
    def optimal_cut(self, link: LinkEstimate | None = None,
                    wearable_status: DeviceStatus | None = None,
                    handheld_status: DeviceStatus | None = None,
                    load_factor: float = 1.0) -> CutResult:
        """The latency-optimal cut over *all* downward-closed node sets of the model (min-cut on
        per-node times), whether or not the bundle lists it as a candidate. Compare its latency
        with the best candidate's to see what the candidate list leaves on the table."""
        import onnx

        link = link or DEFAULT_LINK
        feats = self._node_features()
        ident = self.bundle.identity
        sw = (wearable_status.speed_factor() if wearable_status else 1.0) * load_factor
        sh = handheld_status.speed_factor() if handheld_status else 1.0
        w = {k: v * sw for k, v in self.wearable.node_ms(ident, feats).items()}
        h = {k: v * sh for k, v in self.handheld.node_ms(ident, feats).items()}
        dag = dag_from_onnx(onnx.load(str(self.bundle.model_path)), w, h)
        up = {t.name: link.up_ms(t.nbytes) for t in dag.tensors}
        down = {t.name: link.down_ms(t.nbytes) for t in dag.tensors if t.is_output}
        return min_cut(dag, up, down)

    # -- decision ---------------------------------------------------------------------------
    def decide(self, link_estimate: LinkEstimate | None = None,
               wearable_status: DeviceStatus | None = None,
               handheld_status: DeviceStatus | None = None, objective: str | None = None,
               latency_budget_ms: float | None = _UNSET, *, load_factor: float = 1.0,
               handheld_load: float | None = None,
               only: Callable[[CandidateCost], bool] | None = None) -> Decision:
        """Pick a candidate. ``objective`` and ``latency_budget_ms`` default to the policy's
        (pass ``latency_budget_ms=None`` explicitly for "no budget"). ``handheld_load`` scales
        the handheld's tails (Neurosurgeon's K; by default the handheld status' speed factor
        for Neurosurgeon, 1 otherwise). ``only`` restricts the choice to the rows it keeps
        (the reference points of :mod:`wearable.planner.references`); ``ValueError`` when it
        keeps none."""
        pol = self.policy
        objective = objective or pol.objective
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; expected one of "
                             f"{', '.join(OBJECTIVES)}")
        budget = pol.latency_budget_ms if latency_budget_ms is _UNSET else latency_budget_ms
        all_rows = self.costs(link_estimate, wearable_status, handheld_status, load_factor,
                              handheld_load if handheld_load is not None else 1.0)
        rows, excluded = self.feasible(all_rows)
        if only is not None:
            rows = [r for r in rows if only(r)]
            if not rows:
                raise ValueError("no feasible configuration of that kind")
        ww, wh, why_w = pol.weights(wearable_status, handheld_status)
        streaming = pol.streaming or objective == "throughput"
        if objective == "auto":
            d = coinf_schedule(rows, budget, w_wearable=ww, w_handheld=wh, streaming=streaming)
        elif objective in ("latency", "throughput"):
            d = coinf_schedule(rows, 0, w_wearable=ww, w_handheld=wh, streaming=streaming)
        elif objective == "energy":
            d = coinf_schedule(rows, None, w_wearable=ww, w_handheld=wh, streaming=streaming)
        elif objective.startswith("neurosurgeon"):
            k = handheld_load if handheld_load is not None else (
                handheld_status.speed_factor() if handheld_status else 1.0)
            # the handheld's load is applied by K here, not twice
            rows = [r for r in self.feasible(self.costs(
                link_estimate, wearable_status, None, load_factor))[0] if only is None or only(r)]
            d = neurosurgeon(rows, objective.split("-", 1)[1], handheld_load=k)
        else:
            d = dyno(rows, pol.dyno_constraints(), pol.dyno_targets(), streaming=streaming,
                     w_wearable=ww, w_handheld=wh)
        link = link_estimate or DEFAULT_LINK
        ranked = {r.id: r for r in d.rows}
        d.rows = [ranked.get(r.id, r) for r in all_rows]  # bundle order, the excluded too
        d.excluded = {**excluded, **self.excluded_configs}
        d.headline = self._headline(d, objective, budget, streaming)
        d.notes.append(f"link: up {link.up_bps / 1000:.1f} kB/s, down "
                       f"{link.down_bps / 1000:.1f} kB/s, RTT {link.rtt_ms:.0f} ms ({link.source})")
        d.notes.append("weights: " + "; ".join(why_w))
        d.notes.append(self.sources_note(load_factor))
        d.notes.append(self.memory.note(split_config(d.winner)[0]))
        return d

    def sources_note(self, load_factor: float = 1.0) -> str:
        """Where the compute times came from, per side, in words."""
        parts = []
        for side, idx, prof in (("wearable heads", 2, self.wearable),
                                ("handheld tails", 3, self.handheld)):
            srcs = sorted({str(b[idx]) for b in self.base_times()} - {"empty"})
            parts.append(f"{side} from {' / '.join(srcs) or 'nothing to run'} "
                         f"(profile {prof.name!r}"
                         + (f", x{prof.slowdown:g} slowdown" if prof.slowdown != 1 else "")
                         + ")")
        text = "compute times: " + "; ".join(parts)
        if "flops/gflops" in text or "default op rates" in text:
            text += (" -- built-in estimates from published figures (docs/PLANNER.md), not "
                     "measurements: `coinf profile` measures them")
        if load_factor != 1.0:
            text += f"; wearable load factor {load_factor:.2f}"
        return text

    def feasible(self, rows: list[CandidateCost]) -> tuple[list[CandidateCost], dict[str, str]]:
        """Rows whose predicted exchange fits the timeout with ``TIMEOUT_MARGIN``, and the
        reason each other row is excluded. Never empty: with nothing feasible every row stays
        (the Session's deadline stretches instead, see ``wearable.options.request_timeout``)."""
        limit_ms = self.timeout_s * 1e3 / TIMEOUT_MARGIN
        rows, too_big = self.memory.fits(rows)  # hard: never restored below
        ok, excluded = [], dict(too_big)
        for r in rows:
            if r.exchange_ms() <= limit_ms or r.exchange_ms() == 0:
                ok.append(r)
            else:
                excluded[r.id] = (
                    f"infeasible: predicted exchange {r.exchange_ms() / 1e3:.1f} s (transfer "
                    f"{r.transfer_ms / 1e3:.1f} s of {r.crossing_bytes / 1e3:.0f} kB) x"
                    f"{TIMEOUT_MARGIN:g} margin exceeds the {self.timeout_s:g} s timeout")
        return (ok, excluded) if ok else (rows, too_big)

    @staticmethod
    def _headline(d: Decision, objective: str, budget: float | None, streaming: bool) -> str:
        """``objective: ...; chose X: why`` in one line."""
        if objective == "auto":
            if budget is None or math.isinf(budget):
                obj = "least energy (objective auto, no latency budget)"
            elif budget == 0:
                obj = "lowest latency (objective auto, budget 0)"
            else:
                obj = f"least energy within {budget:g} ms (objective auto)"
        else:
            obj = f"objective {objective}"
        if streaming:
            obj += ", streaming"
        n_ex = sum(1 for r in d.rows if r.id in d.excluded)
        ex = f"; {n_ex} of {len(d.rows)} rows excluded" if n_ex else ""
        n_pack = len(d.excluded) - n_ex
        if n_pack:
            ex += f"; {n_pack} packed configurations refused (accuracy)"
        return f"{obj}{ex} -> chose {d.winner}: {d.why}"


class AdaptivePlanner:
    """What a Session keeps between runs: the planner, the link estimator, the wearable's load
    factor and the re-plan trigger. :meth:`current` re-decides only when an input moved by more
    than the policy's threshold (default 5%), otherwise returns the cached decision.

    Typical Session use::

        ap = AdaptivePlanner(Planner(bundle, wprof, hprof, policy), latency_budget_ms=200)
        cid = ap.current().winner                     # before each run
        ap.observe_head(cid, measured_head_ms)        # after the head ran
        ap.link.observe_transfer(nbytes, seconds)     # after each upload (and probes)
        ap.handheld_status = DeviceStatus.from_json(msg)  # when the handheld reports
    """

    def __init__(self, planner: Planner, *, objective: str | None = None,
                 latency_budget_ms: float | None = _UNSET,
                 link: LinkEstimator | None = None) -> None:
        self.planner = planner
        self.objective = objective
        self.latency_budget_ms = latency_budget_ms
        self.link = link or LinkEstimator()
        self.load = LoadFactor()
        self.trigger = ReplanTrigger(planner.policy.replan_threshold)
        self.wearable_status: DeviceStatus | None = None
        self.handheld_status: DeviceStatus | None = None
        #: the handheld's queueing delay (a tail service reports it in STATUS), ms
        self.handheld_queue_ms = 0.0
        self.decision: Decision | None = None
        self.replans = 0

    def observe_head(self, cid: str, measured_ms: float) -> None:
        """Feed DynO's scaling factor: measured head time vs. the unscaled prediction."""
        for c, (h, _, _, _) in zip(self.planner.bundle.candidates, self.planner.base_times(),
                                   strict=True):
            if c.id == cid:
                sw = self.wearable_status.speed_factor() if self.wearable_status else 1.0
                self.load.observe(measured_ms, h * sw)
                return

    def inputs(self) -> dict[str, float]:
        """Every number the decision depends on (what the trigger compares)."""
        est = self.link.estimate()
        out = {"up_bps": est.up_bps, "down_bps": est.down_bps, "rtt_ms": est.rtt_ms,
               "load_factor": self.load.value, "queue_ms": self.handheld_queue_ms}
        for side, st in (("wearable", self.wearable_status), ("handheld", self.handheld_status)):
            if st is not None:
                out[f"{side}_speed"] = st.speed_factor()
                if st.battery_pct is not None:
                    out[f"{side}_battery"] = st.battery_pct
                out[f"{side}_charging"] = float(bool(st.charging))
        return out

    def current(self, force: bool = False) -> Decision:
        inputs = self.inputs()
        if self.decision is None or force or self.trigger.should_replan(inputs):
            est = dataclasses.replace(self.link.estimate(), queue_ms=self.handheld_queue_ms)
            self.decision = self.planner.decide(
                est, self.wearable_status, self.handheld_status,
                self.objective, self.latency_budget_ms, load_factor=self.load.value)
            self.trigger.planned(inputs)
            self.replans += 1
        return self.decision
