"""The one executor: what any :class:`~coinf.wearable.plan.Plan` does for one frame.

    crossing = await ex.first_stage(plan, feeds, stats)          # here (head thread)
    outputs = await ex.send(plan, rpc, crossing, stats, timeout)  # every later stage
    outputs = await ex.finish_here(plan.candidate, crossing, stats, why)  # a fallback

The first stage runs on this wearable: the head of the cut the plan sends from (the whole
model for a local plan). Its crossing tensors are encoded by the plan's compressor, if any,
packed as planned (codec thread when large), and sent as ONE request naming every later stage
(docs/PROTOCOL.md §6.9): a split is one hop, a pipeline several, forwarded from device to
device. The reply is checked against the model's outputs before anyone sees it, and each
hop's compute, hand-off and bytes land in ``stats.hops``. A session decides what to do when a
link fails (:class:`~coinf.wearable.core.AsyncSession` finishes here; a pipeline leaves the
device out and tries again); this module only runs plans.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
from coinf.ble_protocol.messages import MsgType
from coinf.ble_protocol.negotiate import fit, missing
from coinf.ble_protocol.packing import LOSSLESS_SPEC, PackSpec, pack
from coinf.ble_protocol.request import decode_result, new_nonce, with_nonce
from coinf.ble_protocol.rpc import RpcClient
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from coinf.convert.compressors import CodecRunner
from coinf.device.emulation import DeviceEmulation
from coinf.device.runtime import SliceRunner
from coinf.wearable.frame import RunStats, nbytes_of, result_bound, validate_result
from coinf.wearable.plan import Plan
from coinf.wearable.planner.codec_costs import is_packing_work

from coinf.bundle import Bundle, Candidate
from coinf.errors import ModelError, PeerResultError, ProtocolError

T = TypeVar("T")
INLINE_CODEC_BYTES = 64 * 1024  # at or below this, packing/unpacking runs on the loop (µs)
#: raw packing is one copy (~0.1 ms a 350 kB tensor here): up to this size the codec thread's
#: two hops cost more than the copy blocks the loop
INLINE_RAW_BYTES = 1024 * 1024
#: A lone run whose head last took less than this runs it on the loop: a thread hop costs
#: ~0.1 ms, and blocking the loop this briefly delays no link noticeably. Streams always use the
#: head thread (the loop must keep the link busy while the next head computes).
INLINE_HEAD_MS = 1.0


class Executor:
    """Runs plans of ``bundle`` for one wearable: its slices (``slices``), its compressors'
    encoders (``codecs``), one head thread and one codec thread."""

    def __init__(self, bundle: Bundle, slices: SliceRunner, codecs: CodecRunner,
                 emulation: DeviceEmulation, codec_emulation: DeviceEmulation) -> None:
        self.bundle = bundle
        self.slices = slices
        self.codecs = codecs
        self.emulation = emulation
        self.codec_emulation = codec_emulation
        self.head_pool = ThreadPoolExecutor(1, thread_name_prefix="coinf-head")
        self.codec_pool = ThreadPoolExecutor(1, thread_name_prefix="coinf-codec")
        self.head_ms: dict[str, float] = {}  # last measured head time per cut
        self._result_bytes = sum(t.nbytes for t in bundle.outputs)
        self._bounds: dict[int, int] = {}  # hops -> the largest valid RESULT (receiver bound)

    def close(self) -> None:
        self.head_pool.shutdown(wait=False, cancel_futures=True)
        self.codec_pool.shutdown(wait=False, cancel_futures=True)

    # -- the first stage -------------------------------------------------------------------------
    async def first_stage(self, plan: Plan, feeds: dict[str, np.ndarray], stats: RunStats,
                          alone: bool = False) -> dict[str, np.ndarray]:
        """Run the first stage here: the tensors it sends on (the outputs, for a local plan).
        ``alone``: no other frame is in flight, so a head known to be short runs on the loop."""
        cand = plan.candidate
        if alone and self.head_ms.get(cand.id, INLINE_HEAD_MS) < INLINE_HEAD_MS:
            crossing = self._run_head(cand, feeds, stats)  # cheaper than a thread hop
        else:
            crossing = await self.on(self.head_pool, self._run_head, cand, feeds, stats)
        self.head_ms[cand.id] = stats.head_ms
        return crossing

    def _run_head(self, cand: Candidate, feeds: dict[str, np.ndarray],
                  stats: RunStats) -> dict[str, np.ndarray]:
        """The crossing tensors of ``cand`` (graph inputs the tail needs pass through)."""
        wanted = [t.name for t in cand.crossing]
        if cand.is_handheld_only:
            return {n: feeds[n] for n in wanted}
        produced, elapsed = self.slices.run_slice(cand, "head", feeds)
        stats.head_ms = elapsed * 1e3
        return {n: produced[n] if n in produced else feeds[n] for n in wanted}

    # -- the later stages ------------------------------------------------------------------------
    async def encode(self, plan: Plan, crossing: dict[str, np.ndarray],
                     stats: RunStats, decoders: frozenset[str] | None = None) -> bytes:
        """The request: the compressor's code (wearable compute, counted as head) or the
        crossing tensors, packed as planned, behind the header naming every later stage.
        ``decoders``: what the next device decodes (its HELLO_ACK); a packing it lacks goes
        as the nearest one it takes (:func:`coinf.ble_protocol.negotiate.fit`)."""
        stats.nonce = new_nonce()  # the RESULT must carry it: no stale or replayed reply
        sent = crossing
        table = None
        if plan.compressor is not None:
            sent = await self.on(self.head_pool, _encode, self.codecs, self.emulation, plan,
                                 crossing, stats)
            if plan.packing.codec == "latent":
                table = self.codecs.latent_tables.get((plan.compressor.candidate,
                                                       plan.compressor.gamma))
                if table is None:
                    raise ModelError(f"compressor g{plan.compressor.gamma} at "
                                     f"{plan.compressor.candidate} has no entropy table: its "
                                     f"code cannot travel as 'latent'")
        size = nbytes_of(sent)
        if plan.packing.codec == "raw" and size <= INLINE_RAW_BYTES:
            size = 0  # a copy: on the loop
        return await self.codec(_pack, size, plan, sent, stats, self.codec_emulation, table,
                                decoders)

    async def exchange(self, plan: Plan, rpc: RpcClient, payload: bytes, stats: RunStats,
                       timeout: float, rtt_ms: float,
                       marks: dict[str, float] | None = None) -> dict[str, np.ndarray]:
        """Send the request, await the RESULT, check it: the model's outputs. Fills the
        transfer, compute and return times and ``stats.hops``; ``marks`` gets the link's
        ``sent``/``delivered``/``replied`` times. The timeout cancels the request on the peer."""
        marks = {} if marks is None else marks
        count = len(plan.remote)
        nonce = stats.nonce
        t0 = time.perf_counter()
        bound = self._bounds.get(count)
        if bound is None:
            bound = self._bounds[count] = result_bound(self.bundle, count)
        reply = await rpc.request(MsgType.REQUEST, payload, timeout, marks, max_reply=bound)
        try:
            records, _ = decode_result(reply.payload, count, nonce)
        except ProtocolError as exc:  # a stale, replayed or crossed reply: never an output
            raise PeerResultError(exc.text) from None
        stats.hops = [{"device": st.device, "compute_ms": r.compute_us / 1e3,
                       "send_ms": r.send_us / 1e3, "bytes": r.nbytes}
                      for st, r in zip(plan.remote, records, strict=True)]
        stats.tail_ms = sum(r.compute_us for r in records) / 1e3
        stats.bytes_down = len(reply.payload)
        # A link may take a message before it is on the air (BLE queues a window of chunks),
        # so "send returned" is not "delivered". What is exact: round trip minus the remote
        # stages' compute and hand-offs. Split that network time: half the idle round trip
        # each way, the rest by bytes.
        onward = sum(r.send_us for r in records) / 1e3
        net = max((marks["replied"] - t0) * 1e3 - stats.tail_ms - onward, 0.0)
        rtt = min(rtt_ms, net)
        share = stats.bytes_up / max(stats.bytes_up + stats.bytes_down, 1)
        stats.transfer_ms = rtt / 2 + (net - rtt) * share
        stats.return_ms = rtt / 2 + (net - rtt) * (1 - share)
        return await self.codec(self._unpack, len(reply.payload), reply.payload, count, stats)

    def _unpack(self, reply: bytes, count: int, stats: RunStats) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        _, blob = decode_result(reply, count, stats.nonce)
        # never allocate more than the model's outputs take, whatever the peer declares
        try:
            decoded = decode_tensors(blob, max_bytes=self._result_bytes)
        except ProtocolError as exc:
            raise PeerResultError(f"result does not decode: {exc}") from None
        outputs = validate_result(self.bundle, decoded)
        stats.return_ms += (time.perf_counter() - t0) * 1e3
        return outputs

    async def finish_here(self, cand: Candidate, crossing: dict[str, np.ndarray],
                          stats: RunStats, why: str) -> dict[str, np.ndarray]:
        """Run ``cand``'s tail on the wearable (the bundle carries it) instead of the helpers."""

        def tail() -> dict[str, np.ndarray]:
            outputs, elapsed = self.slices.run_slice(cand, "tail", crossing)
            stats.tail_ms = elapsed * 1e3
            return outputs

        outputs = await self.on(self.head_pool, tail)
        stats.runtimes = (*stats.runtimes[:1], self.slices.runtime_of(cand, "tail"))
        stats.local = True
        stats.gamma = 1  # the tail ran here on the plain crossing tensors
        stats.hops = []
        stats.fallback = why
        return outputs

    # -- threads ---------------------------------------------------------------------------------
    async def codec(self, fn: Callable[..., T], nbytes: int, *args: Any) -> T:
        """Codec work: small bodies inline (a thread hop costs more than encoding a few KB),
        larger ones on the codec thread so the event loop only moves bytes."""
        if nbytes <= INLINE_CODEC_BYTES:
            return fn(*args)
        return await self.on(self.codec_pool, fn, *args)

    @staticmethod
    async def on(pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


def _pack(plan: Plan, crossing: dict[str, np.ndarray], stats: RunStats,
          codec_emulation: DeviceEmulation, table: Any = None,
          decoders: frozenset[str] | None = None) -> bytes:
    """The REQUEST payload. Packing (any but raw: quantizing, shuffling, LZ4/zstd, rANS, a
    standard codec) is stretched as the planner prices it on a slower wearable
    (``codec_emulation``: ``CODEC_SLOWDOWN``, at most the head's; docs/PLANNER.md, "What
    packing costs"). ``table``: a learned code's entropy table (the ``latent`` packing);
    ``decoders``: what the next device decodes."""
    t0 = time.perf_counter()
    if plan.packing.codec == "raw":
        blob = encode_tensors(crossing)
    else:
        blob = encode_tensors({}, packed={
            n: _pack_one(a, PackSpec("latent", priors=table) if table is not None
                         else plan.spec_of(n), decoders, stats)
            for n, a in crossing.items()})
    payload = with_nonce(plan.request_header, stats.nonce) + blob
    elapsed = time.perf_counter() - t0
    if is_packing_work(plan.packing.codec):  # as the planner prices it (codec_costs)
        elapsed = codec_emulation.stretch(elapsed)
    stats.pack_ms = elapsed * 1e3
    stats.bytes_up = len(payload)
    return payload


def _pack_one(array: np.ndarray, spec: PackSpec, decoders: frozenset[str] | None,
              stats: RunStats) -> bytes:
    """One tensor packed as ``spec``, or as the nearest packing ``decoders`` has (the same
    values; a standard codec it lacks: LOSSLESS); the first substitution lands in ``stats``."""
    if decoders is None:
        return pack(array, spec)
    fitted, why = fit(spec, decoders)
    if missing(fitted, decoders) is not None:  # a tensor's own standard codec: exact instead
        fitted, why = LOSSLESS_SPEC, f"{spec} sent as f32: {missing(fitted, decoders)}"
    if why is not None and stats.packing_fallback is None:
        stats.packing_fallback = why
    return pack(array, fitted, zstd="zstd" in decoders)


def _encode(codecs: CodecRunner, emulation: DeviceEmulation, plan: Plan,
            crossing: dict[str, np.ndarray], stats: RunStats) -> dict[str, np.ndarray]:
    """The compressor's encoder on the crossing tensors (wearable compute: counted as head;
    opening its session the first time is not: a slowed-down emulation would stretch that
    one-time load into the frame, as it does not for the slices)."""
    codecs.open_encoder(plan.compressor)
    code, elapsed = emulation.timed(lambda: codecs.encode(plan.compressor, crossing))
    stats.head_ms += elapsed * 1e3
    stats.gamma = plan.compressor.gamma
    return code


__all__ = ["INLINE_CODEC_BYTES", "INLINE_HEAD_MS", "INLINE_RAW_BYTES", "Executor"]
