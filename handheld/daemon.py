"""The handheld daemon: answers a wearable's handshake, runs tails, returns results.

One daemon serves one bundle. It is transport-agnostic: give :meth:`HandheldDaemon.serve` any
:class:`~coinf.ble_protocol.link.Link` (socket, in-process, BLE), or :meth:`~HandheldDaemon.start`
it on every link a :mod:`~coinf.ble_protocol.listen` listener yields::

    bound = request_bound(bundle)  # the largest frame a peer may send this helper
    async with HandheldDaemon(bundle) as daemon, open_listener(
            "tcp:127.0.0.1:7878", max_message_bytes=bound) as links:
        async for link in links:
            daemon.start(link)

A REQUEST is one executor job, payload in, payload out: decoding the crossing tensors, the tail
and encoding the results all run off the event loop (:meth:`HandheldDaemon.run_request`), so a
large tensor never stalls the loop that moves other links' bytes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
from coinf.ble_protocol import rpc
from coinf.ble_protocol.link import Link
from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    ErrorCode,
    Message,
    MsgType,
    ProtocolError,
    decode_json,
    encode_json,
)
from coinf.ble_protocol.negotiate import decodable
from coinf.ble_protocol.packing import LOSSLESS_SPEC, pack
from coinf.ble_protocol.request import (
    HopStats,
    Kind,
    Request,
    decode_request,
    encode_result,
)
from coinf.ble_protocol.tasks import TaskSet
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from coinf.convert.compressors import CodecRunner, check_code
from coinf.device.cancel import Cancelled, CancelToken
from coinf.device.emulation import DeviceEmulation
from coinf.device.profile import DeviceProfile
from coinf.device.runtime import TailRunner
from coinf.device.spatial import TileRunner
from coinf.device.status import read_status

from coinf.bundle import Bundle
from coinf.errors import BundleError

log = logging.getLogger(__name__)

#: what this daemon serves: tensors raw and packed, the request kinds (§6.9-6.11)
CAPABILITIES = ["raw", "packed", "stages", "tile"]
#: the most compressors HELLO_ACK lists (more: none listed, the peer assumes the bundle's)
MAX_COMPRESSORS = 64


def encode_results(outputs: Mapping[str, np.ndarray]) -> bytes:
    """Results travel losslessly: each tensor raw or shuffled + LZ4, whichever is smaller."""
    packed = {}
    for name, arr in outputs.items():
        body = pack(arr, LOSSLESS_SPEC)
        if len(body) < arr.nbytes:
            packed[name] = body
    return encode_tensors({k: v for k, v in outputs.items() if k not in packed}, packed=packed)


#: room in a request for its header (up to 16 hops with names) and a packing's own headers
REQUEST_SLACK = 64 * 1024


def request_bound(bundle: Bundle) -> int:
    """The largest REQUEST payload this bundle's helper can need: twice the largest tensor set
    that can cross any of its cuts (the inputs for ``handheld-only``), RAW, plus
    :data:`REQUEST_SLACK`. Twice covers every packing (none is larger than raw float32 data
    but a few header bytes). A socket listener's ``max_message_bytes`` and the daemon's
    ``max_request_bytes`` default to it, so what a peer can make a helper buffer follows the
    model, not a protocol-wide 64 MiB. (A spatial TILE or REST request, which only ``bench
    spatial`` sends, is bounded by its region instead; its helpers are started with
    ``coinf handheld --max-request-mib``.)"""
    sets = [sum(t.nbytes for t in bundle.inputs), sum(t.nbytes for t in bundle.outputs)]
    sets += [c.crossing_bytes for c in bundle.candidates]
    return 2 * max(sets) + REQUEST_SLACK


class RequestCancelled(Exception):
    """The request was cancelled (by the peer's CANCEL) between two steps of its job."""


class Reply(NamedTuple):
    """What :meth:`HandheldDaemon.run_request` produced: the RESULT payload and, for the log,
    what ran and the (emulated) compute seconds."""

    payload: bytes
    what: str
    tail_s: float


class HelloFirst:
    """The handler of an unauthenticated link (plain TCP, ``tcp+insecure:``; docs/PROTOCOL.md
    §6.5): nothing but HELLO is served until a HELLO was answered with HELLO_ACK (other
    requests get ERROR UNSUPPORTED), and a refused HELLO does not name this handheld's bundle
    identity. What such a peer learns is at most the HELLO_ACK, and only by presenting the
    bundle identity."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self.greeted = False

    async def __call__(self, msg: Message) -> Message | None:
        if msg.type == MsgType.HELLO:
            try:
                reply = await self._handle(msg)
            except ProtocolError as exc:
                if exc.code == ErrorCode.BUNDLE_MISMATCH:
                    raise ProtocolError(ErrorCode.BUNDLE_MISMATCH, "the handheld serves another "
                                        "bundle: split the same model on both sides") from None
                raise
            self.greeted = reply is not None and reply.type == MsgType.HELLO_ACK
            return reply
        if not self.greeted:
            raise ProtocolError(ErrorCode.UNSUPPORTED, "HELLO first: this link is plain TCP "
                                "(unauthenticated) and serves nothing before a HELLO_ACK")
        return await self._handle(msg)


class HandheldDaemon:
    """Tail side of coinf: ``handle`` is the RPC handler, ``serve`` runs it over one link.

    An async context manager: on exit every task it started (:meth:`start`) is cancelled and
    awaited, and its executor is shut down. Counters: ``requests`` (REQUESTs answered with a
    RESULT), ``cancelled`` (requests cancelled by the peer's CANCEL), ``busy`` (requests refused
    at admission), ``connections``; ``serve_stats`` has the rest, summed over all links.
    """

    def __init__(
        self,
        bundle: Bundle,
        emulation: DeviceEmulation | None = None,
        lru: int = 4,
        max_request_bytes: int | None = None,
        profile: DeviceProfile | None = None,
        *,
        max_pending: int = 4,
        concurrency: int = 1,
        runtime: str = "onnxruntime",
        forward: Any = None,
    ) -> None:
        if max_pending < 1 or concurrency < 1:
            raise ValueError("max_pending and concurrency must be >= 1")
        self.bundle = bundle
        self.profile = profile
        # tails run with onnxruntime, LiteRT, or ``auto``: the faster one in ``profile``
        self.tails = TailRunner(bundle, emulation, capacity=lru, runtime=runtime, profile=profile)
        self.tiles = TileRunner(bundle.model_path, emulation)  # spatial partition (TILE, REST)
        # compressors' decoders (a hop with gamma N carries compressor gN's code)
        self.codecs = CodecRunner(bundle, (emulation or DeviceEmulation()).session_options())
        #: the largest request accepted (default :func:`request_bound` of the bundle)
        self.max_request_bytes = (request_bound(bundle) if max_request_bytes is None
                                  else max_request_bytes)
        self.max_pending = max_pending
        self.concurrency = concurrency
        self.serve_stats = rpc.ServeStats()
        self.requests = 0
        self.connections = 0
        self.started = time.monotonic()
        self._tasks = TaskSet()
        self._executor: ThreadPoolExecutor | None = None
        #: the pipeline "forward" role (handheld/forward.py ``Forwarder``), if any
        self.forward = forward

    @property
    def cancelled(self) -> int:
        return self.serve_stats.cancelled

    @property
    def busy(self) -> int:
        return self.serve_stats.busy

    # --- lifetime ----------------------------------------------------------------------------
    async def __aenter__(self) -> HandheldDaemon:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a task this daemon keeps and cancels in :meth:`aclose`."""
        return self._tasks.spawn(coro)

    def start(self, link: Link) -> asyncio.Task[Any]:
        """Serve ``link`` in a task of this daemon (:meth:`serve`)."""
        return self.spawn(self.serve(link))

    async def aclose(self) -> None:
        """Cancel and await every task started here; stop the executor (a tail already running
        in it finishes in its thread, its result is dropped)."""
        await self._tasks.cancel_all()
        if self.forward is not None:
            await self.forward.aclose()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=self.concurrency, thread_name_prefix="coinf-tail"
            )
        return self._executor

    # --- serving -----------------------------------------------------------------------------
    async def serve(self, link: Link) -> None:
        """Serve one connected wearable until the link closes; then close it."""
        self.connections += 1
        t0 = time.monotonic()
        log.info("wearable connected over %s", link.description)
        try:
            await rpc.serve(
                link,
                HelloFirst(self.handle) if getattr(link, "unauthenticated", False)
                else self.handle,
                # a stage awaiting the next hop must not hold a slot: the forwarder keeps its
                # own compute thread, so the next frame computes while this one travels on
                self.concurrency if self.forward is None else self.max_pending,
                max_pending=self.max_pending,
                stats=self.serve_stats,
            )
        finally:
            await link.close()
            log.info(
                "wearable on %s went away after %.1f s: %d B in, %d B out",
                link.description,
                time.monotonic() - t0,
                link.stats.bytes_received,
                link.stats.bytes_sent,
            )

    async def serve_listener(self, links: AsyncIterable[Link]) -> None:
        """Serve every link an async iterable of links (a listener) yields, each in its own
        task, until it ends."""
        async for link in links:
            self.start(link)

    # --- messages ----------------------------------------------------------------------------
    def hello_payload(self) -> dict[str, Any]:
        comps = self.compressors()
        return {
            "protocol": PROTOCOL_VERSION,
            "bundle": self.bundle.identity,
            "role": "handheld",
            "capabilities": CAPABILITIES,
            "decoders": decodable(),
            "priors": self.bundle.priors_digest,  # the ansN tables it decodes with
            **({} if comps is None else {"compressors": comps}),
        }

    def compressors(self) -> list[dict[str, Any]] | None:
        """The compressors whose code this daemon decodes (``{"cut": "c002", "gamma": 4}``):
        the bundle's whose decoder file is present; None (not listed: the peer assumes all)
        above 64."""
        found = sorted((c.candidate, c.gamma) for c in self.bundle.compressors()
                       if self.bundle.path(c.decoder).is_file())
        out: list[dict[str, Any]] = [{"cut": cut, "gamma": gamma} for cut, gamma in found]
        return out if len(out) <= MAX_COMPRESSORS else None

    def status(self) -> dict[str, Any]:
        """``device`` is a :class:`~device.status.DeviceStatus` (load, clock, battery)."""
        try:
            device = read_status().to_json()
        except ImportError:  # psutil not installed: no device figures
            device = {}
        return {
            "device": device,
            "role": "handheld",
            "requests": self.requests,
            "cancelled": self.cancelled,
            "busy": self.busy,
            "uptime_s": round(time.monotonic() - self.started, 1),
            "tails_loaded": self.tails.loaded,
        }

    async def handle(self, msg: Message) -> Message | None:
        if msg.type == MsgType.HELLO:
            check_session_hello(msg.payload, self.bundle.identity)
            return Message(MsgType.HELLO_ACK, msg.request_id, encode_json(self.hello_payload()))
        if msg.type == MsgType.STATUS:
            return Message(MsgType.STATUS, msg.request_id, encode_json(self.status()))
        if msg.type == MsgType.PROFILE:
            if self.profile is None:
                raise ProtocolError(ErrorCode.MALFORMED, "this handheld has no device profile")
            payload = json.dumps(self.profile.to_json(), separators=(",", ":")).encode()
            return Message(MsgType.PROFILE, msg.request_id, payload)
        if msg.type == MsgType.REQUEST:
            return await self._request(msg)
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"handheld does not accept {msg.type.name}")

    def admit(self, payload: bytes) -> tuple[Request, memoryview]:
        """The checks on a REQUEST before its tensors (docs/PROTOCOL.md §6.9, "Order of
        checks"): its size, its header, a TILE's region bound, and UNSUPPORTED for STAGES of
        several hops without the pipeline role."""
        size = len(payload)
        tile = payload[:1] in (bytes([Kind.TILE]), bytes([Kind.REST]))
        if size > self.max_request_bytes and not tile:  # before decoding anything
            raise ProtocolError(ErrorCode.TOO_LARGE, f"request of {size} B exceeds the "
                                f"daemon's limit of {self.max_request_bytes} B")
        request, blob = decode_request(payload)  # the one place a header is decoded
        if tile:  # a spatial tile (bench spatial): its region's own bound
            limit = max(self.max_request_bytes, self.tiles.budget(request.tile) + REQUEST_SLACK)
            if size > limit:
                raise ProtocolError(ErrorCode.TOO_LARGE, f"request of {size} B exceeds the "
                                    f"daemon's limit of {limit} B")
        if request.kind == Kind.STAGES and len(request.hops) > 1 and self.forward is None:
            raise ProtocolError(ErrorCode.UNSUPPORTED, "this handheld runs no pipeline "
                                "stages (coinf handheld --pipeline CONFIG --name NAME)")
        return request, blob

    async def _request(self, msg: Message) -> Message:
        rid, size = msg.request_id, len(msg.payload)
        try:
            request, blob = self.admit(msg.payload)
        except ProtocolError as exc:
            log.info("request %d refused: %s", rid, exc)
            raise
        if request.kind == Kind.STAGES and len(request.hops) > 1:
            assert self.forward is not None  # admit refused it otherwise
            payload: bytes = await self.forward.handle(request, blob)
            return Message(MsgType.RESULT, rid, payload)
        cancel = CancelToken()
        t0 = time.perf_counter()
        job = asyncio.get_running_loop().run_in_executor(
            self._pool(), self.run, request, blob, cancel
        )
        try:
            reply = await job
        except asyncio.CancelledError:
            cancel.set()  # stops the tail mid-run (onnxruntime terminate) or the next step
            log.info("request %d cancelled after %.1f ms (%d B in)", rid, _ms(t0), size)
            raise
        except ProtocolError as exc:
            log.info("request %d refused after %.1f ms (%d B in): %s", rid, _ms(t0), size, exc)
            raise
        except RequestCancelled:  # only set once this task was cancelled; never reached
            raise ProtocolError(ErrorCode.CANCELLED, "request cancelled") from None
        self.requests += 1
        log.info(
            "request %d %s: %d B in, %d B out, tail %.1f ms, %.1f ms in the daemon",
            rid,
            reply.what,
            size,
            len(reply.payload),
            reply.tail_s * 1e3,
            _ms(t0),
        )
        return Message(MsgType.RESULT, rid, reply.payload)

    # --- the executor job --------------------------------------------------------------------
    def run_request(self, payload: bytes, cancel: threading.Event | None = None) -> Reply:
        """REQUEST payload -> RESULT payload: :meth:`run` on its decoded header."""
        request, blob = decode_request(payload)
        return self.run(request, blob, cancel)

    def run(self, request: Request, blob: memoryview, cancel: threading.Event | None = None
            ) -> Reply:
        """One decoded request (a tail, a tile or the rest after the tiles) -> RESULT payload:
        decode the tensors, compute, encode. Runs in an executor thread; it stops with
        :class:`RequestCancelled` once ``cancel`` is set: between steps, and (for a
        :class:`~coinf.device.cancel.CancelToken`) inside the onnxruntime run."""
        what = str(request)
        feeds = self.decode(request, blob)
        if cancel is not None and cancel.is_set():
            raise RequestCancelled(what)
        token = cancel if isinstance(cancel, CancelToken) else None
        try:
            if request.kind == Kind.STAGES:
                hop = request.hops[0]
                if hop.gamma:  # decode compressor gN's code first (checked in decode)
                    comp = self.bundle.compressor(hop.start, hop.gamma)
                    feeds, dec_s = self.tails.emulation.timed(
                        lambda: self.codecs.decode(comp, feeds), token)
                else:
                    dec_s = 0.0
                outputs, elapsed = self.tails.run(hop.start, feeds, token)
                elapsed += dec_s
            else:
                outputs, elapsed = self.tiles.run(request.tile, feeds, token)
        except Cancelled:
            raise RequestCancelled(what) from None
        if cancel is not None and cancel.is_set():
            raise RequestCancelled(what)
        if request.kind == Kind.TILE:  # feature-map tiles go back raw (docs/SPATIAL.md)
            stats = [HopStats(int(elapsed * 1e6))]
            return Reply(encode_result(stats, encode_tensors(outputs), request.nonce), what,
                         elapsed)
        return Reply(self.encode(outputs, elapsed, request.nonce), what, elapsed)

    def decode(self, request: Request, blob: memoryview) -> dict[str, np.ndarray]:
        """The request's tensors, checked against what it names. Everything is untrusted: never
        allocate more than the cut's crossing tensors (or its compressor's code, or the tile's
        region) take, whatever is declared."""
        comp = None
        if request.kind != Kind.STAGES:
            need = self.tiles.budget(request.tile)
        else:
            hop = request.hops[0]
            if hop.end != self.bundle.candidates[-1].id:
                raise ProtocolError(ErrorCode.MALFORMED, f"hop {hop}: the last hop must end at "
                                    f"the last cut {self.bundle.candidates[-1].id}")
            try:
                cand = self.tails.candidate(hop.start)
                comp = self.bundle.compressor(hop.start, hop.gamma) if hop.gamma else None
            except BundleError as exc:
                raise ProtocolError(ErrorCode.UNKNOWN_CANDIDATE, str(exc)) from None
            need = comp.code.nbytes if comp is not None else cand.crossing_bytes
        if request.kind == Kind.STAGES:
            need = min(need, self.max_request_bytes)
        feeds = decode_tensors(blob, max_bytes=need)
        if comp is not None:
            check_code(comp, feeds)
        elif request.kind == Kind.STAGES:
            self.tails.check_feeds(cand, feeds)  # (again in tails.run: a library entry)
        return feeds

    def encode(self, outputs: Mapping[str, np.ndarray], elapsed: float, nonce: int = 0) -> bytes:
        """Tail outputs -> RESULT payload (one hop) answering the request of ``nonce``."""
        return encode_result([HopStats(int(elapsed * 1e6))], encode_results(outputs), nonce)


def check_session_hello(payload: bytes, identity: str) -> dict[str, Any]:
    """The handheld's checks on a session HELLO (docs/PROTOCOL.md §6.5), in order: a JSON
    object (MALFORMED; TOO_LARGE over 4096 B), ``protocol`` (BAD_VERSION), ``bundle``
    (BUNDLE_MISMATCH). Nothing else is checked."""
    hello = decode_json(payload)
    if hello.get("protocol") != PROTOCOL_VERSION:
        raise ProtocolError(ErrorCode.BAD_VERSION, f"wearable speaks protocol "
                            f"{hello.get('protocol')}, handheld speaks {PROTOCOL_VERSION}")
    if hello.get("bundle") != identity:
        raise ProtocolError(ErrorCode.BUNDLE_MISMATCH,
                            f"wearable has bundle {str(hello.get('bundle'))[:80]}, handheld has "
                            f"{identity}: split the same model on both sides")
    return hello


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


__all__ = ["CAPABILITIES", "HandheldDaemon", "HelloFirst", "Reply", "RequestCancelled",
           "check_session_hello", "encode_results"]
