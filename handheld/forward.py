"""The helper's "forward" role in a pipeline over n devices (docs/PIPELINE.md).

A STAGES request of several hops (:mod:`ble_protocol.request`) names the hops still to run.
This helper must be the first hop: it checks the tensors against cut FROM's crossing set (the
wire is untrusted), runs the slice FROM..TO (its own compute thread, one slice at a time, with
the device's emulated slowdown), then sends cut TO's crossing tensors to the next hop over a
helper-to-helper link and relays that hop's RESULT back. (The last hop gets a one-hop
request: the daemon runs it as a tail.) The next hop's address comes from this helper's own
peer list, never from the wire.

Cancellation runs down the chain: when this request is cancelled (the sender's CANCEL, its
timeout, its link dropping), the pending request to the next hop is cancelled too, which sends
CANCEL there. A next hop that cannot be reached fails the request with ERROR DISCONNECTED
whose ``hop`` field is that hop's index in the route this helper received (1), so the wearable
can re-plan without it; its link is dropped, never reused. An error from further down is passed
up with its hop index shifted by one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from coinf.ble_protocol.link import Link
from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    ErrorCode,
    MsgType,
    ProtocolError,
    encode_json,
)
from coinf.ble_protocol.packing import PackSpec, pack_tensors
from coinf.ble_protocol.request import (
    Hop,
    HopStats,
    Request,
    decode_result,
    encode_request,
    encode_result,
    new_nonce,
)
from coinf.ble_protocol.rpc import RpcClient
from coinf.ble_protocol.shaped import Channel
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from coinf.ble_protocol.transport import connect_within, open_connector
from coinf.convert.compressors import CodecRunner, check_code
from coinf.convert.stage_slices import StageSlices, slice_name
from coinf.device.cancel import Cancelled, CancelToken
from coinf.device.emulation import DeviceEmulation

from coinf.bundle import Bundle, Candidate, Compressor, open_slice
from coinf.errors import BundleError, CoinfError, RemoteError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Peer:
    """Another helper this one may forward to: its name, address and (emulation) the shape of
    the link to it."""

    name: str
    address: str
    channel: Channel | None = None
    #: its pinned TLS certificate (``sha256:...``); None: any paired peer's
    fingerprint: str | None = None
    #: a ``tcp+insecure:`` address is allowed (the pipeline config's ``allow_insecure``)
    allow_insecure: bool = False


class _PeerLink:
    """At most one link to one peer; a link that failed is closed and never reused."""

    def __init__(self, peer: Peer, identity: str, connect_timeout: float) -> None:
        self.peer = peer
        self.identity = identity
        self.connect_timeout = connect_timeout
        self._rpc: RpcClient | None = None
        self._lock = asyncio.Lock()

    async def client(self) -> RpcClient:
        rpc = self._rpc
        if rpc is not None and rpc.link.is_open:
            return rpc
        async with self._lock:
            rpc = self._rpc
            if rpc is not None and rpc.link.is_open:
                return rpc
            await self.drop()
            pin = self.peer.fingerprint
            plain = self.peer.address.startswith("tcp+insecure:")
            connector = (open_connector(self.peer.address, fingerprint=pin)
                         if pin and self.peer.address.startswith("tcp:")
                         else open_connector(self.peer.address,
                                             allow_insecure=self.peer.allow_insecure)
                         if plain else open_connector(self.peer.address))
            link: Link = await connect_within(connector, self.connect_timeout)
            if self.peer.channel is not None:
                from coinf.ble_protocol.throttle import ThrottledLink

                link = ThrottledLink(link, self.peer.channel)
            rpc = RpcClient(link)
            try:
                hello = {"protocol": PROTOCOL_VERSION, "bundle": self.identity,
                         "role": "helper", "capabilities": ["raw"]}
                await rpc.request(MsgType.HELLO, encode_json(hello), self.connect_timeout)
            except BaseException:
                await rpc.close()
                raise
            self._rpc = rpc
            return rpc

    async def drop(self) -> None:
        rpc, self._rpc = self._rpc, None
        if rpc is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await rpc.close()


class Forwarder:
    """Runs pipeline stages for a :class:`~coinf.handheld.daemon.HandheldDaemon` (its
    ``forward``): ``await handle(request, blob)`` answers one request of several hops with
    its RESULT payload (the daemon decoded the header)."""

    def __init__(self, bundle: Bundle, name: str, peers: Mapping[str, Peer] | None = None, *,
                 emulation: DeviceEmulation | None = None, request_timeout: float = 30.0,
                 connect_timeout: float = 5.0, lru: int = 8,
                 max_request_bytes: int = 64 * 1024 * 1024) -> None:
        self.bundle = bundle
        self.name = name
        self.peers = dict(peers or {})
        self.emulation = emulation or DeviceEmulation()
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.max_request_bytes = max_request_bytes
        self.slices = StageSlices(bundle)
        self.codecs = CodecRunner(bundle, self.emulation.session_options())
        self.stages = 0
        self._lru = lru
        self._sessions: OrderedDict[str, Any] = OrderedDict()
        self._links: dict[str, _PeerLink] = {}
        self._sent_end: dict[str, float] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"coinf-stage-{name}")

    async def set_peers(self, peers: Mapping[str, Peer]) -> None:
        """Replace the peer list (discovery, handheld/announce.py): the link to a peer that
        left or moved is closed (a request on it fails as the peer's would)."""
        self.peers = dict(peers)
        for name, link in list(self._links.items()):
            if self.peers.get(name) != link.peer:
                del self._links[name]
                await link.drop()

    async def aclose(self) -> None:
        for link in self._links.values():
            await link.drop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- one request ----------------------------------------------------------------------
    async def handle(self, request: Request, blob: memoryview) -> bytes:
        hop, rest = request.hops[0], request.hops[1:]
        if not rest:
            raise ProtocolError(ErrorCode.MALFORMED, "a one-hop request is a tail, not a stage")
        if hop.device and hop.device != self.name:
            raise ProtocolError(ErrorCode.MALFORMED, f"route starts at {hop.device!r}, this "
                                f"helper is {self.name!r}")
        try:
            self.bundle.candidate(hop.start), self.bundle.candidate(hop.end)
        except BundleError as exc:  # an unknown cut
            raise ProtocolError(ErrorCode.UNKNOWN_CANDIDATE, str(exc)) from None
        try:
            start, end = self.slices.pair(hop.start, hop.end)
        except BundleError as exc:  # known cuts, FROM not before TO
            raise ProtocolError(ErrorCode.MALFORMED, str(exc)) from None
        try:
            comp_in = self.bundle.compressor(hop.start, hop.gamma) if hop.gamma else None
        except BundleError as exc:
            raise ProtocolError(ErrorCode.UNKNOWN_CANDIDATE, str(exc)) from None
        if end is self.bundle.candidates[-1]:
            raise ProtocolError(ErrorCode.MALFORMED, "only the last hop may end at the last cut")
        spec = PackSpec.parse(hop.packing)  # a packing name: checked with the header
        nxt = rest[0]
        if nxt.start != end.id:
            raise ProtocolError(ErrorCode.MALFORMED, f"hop {nxt} does not start at cut {end.id}")
        try:
            comp_out = self.bundle.compressor(end.id, nxt.gamma) if nxt.gamma else None
        except BundleError as exc:
            raise ProtocolError(ErrorCode.UNKNOWN_CANDIDATE, str(exc)) from None
        if nxt.device not in self.peers:
            raise ProtocolError(ErrorCode.MALFORMED, f"{self.name} has no peer "
                                f"{nxt.device!r} in its pipeline configuration")
        # never allocate more than FROM's crossing set (or its compressor's code) takes
        need = comp_in.code.nbytes if comp_in is not None else start.crossing_bytes
        feeds = decode_tensors(blob, max_bytes=min(need, self.max_request_bytes))
        if comp_in is not None:
            check_code(comp_in, feeds)
        else:
            check_crossing(start, feeds)
        cancel = CancelToken()
        loop = asyncio.get_running_loop()
        try:
            outputs, elapsed = await loop.run_in_executor(
                self._pool, self._run, start, end, feeds, cancel, comp_in, comp_out)
        except asyncio.CancelledError:
            cancel.set()
            raise
        except Cancelled:
            raise ProtocolError(ErrorCode.CANCELLED, "request cancelled") from None
        except CoinfError as exc:
            raise ProtocolError(ErrorCode.TAIL_FAILED, f"{self.name}: {exc}") from None
        own = int(elapsed * 1e6)
        nonce = new_nonce()
        reply, send_s, nbytes = await self._forward(rest, outputs, spec, nonce)
        stats, tail_blob = decode_result(reply, len(rest), nonce)
        self.stages += 1
        return encode_result([HopStats(own, int(send_s * 1e6), nbytes), *stats],
                             bytes(tail_blob), request.nonce)

    def _run(self, start: Candidate, end: Candidate, feeds: dict[str, np.ndarray],
             cancel: CancelToken, comp_in: Compressor | None, comp_out: Compressor | None
             ) -> tuple[dict[str, np.ndarray], float]:
        """Decode (``comp_in``), run slice start..end, and collect cut ``end``'s crossing
        tensors, encoded with ``comp_out``: (tensors, emulated seconds)."""
        sess = self._session(start.id, end.id)
        wanted = [i.name for i in sess.get_inputs()]
        names = [o.name for o in sess.get_outputs()]

        def work(ro: Any) -> dict[str, np.ndarray]:
            x = self.codecs.decode(comp_in, feeds) if comp_in is not None else feeds
            out = dict(zip(names, sess.run(names, {k: x[k] for k in wanted}, ro), strict=True))
            sent = {t.name: out[t.name] if t.name in out else x[t.name] for t in end.crossing}
            return self.codecs.encode(comp_out, sent) if comp_out is not None else sent

        with cancel.run_options() as ro:
            try:
                return self.emulation.timed(lambda: work(ro), cancel)
            except Cancelled:
                raise
            except Exception:
                if cancel.is_set():
                    raise Cancelled(f"stage {slice_name(start.id, end.id)} cancelled") \
                        from None
                raise

    def _session(self, start: str, end: str) -> Any:
        key = slice_name(start, end)
        sess = self._sessions.get(key)
        if sess is None:
            sess = open_slice(self.slices.path(start, end), self.emulation.session_options())
            self._sessions[key] = sess
            while len(self._sessions) > self._lru:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(key)
        return sess

    async def _forward(self, rest: tuple[Hop, ...], tensors: dict[str, np.ndarray],
                       spec: PackSpec, nonce: int) -> tuple[bytes, float, int]:
        """Send to the next hop, await its RESULT: (payload, send seconds, bytes sent)."""
        name = rest[0].device
        link = self._links.get(name)
        if link is None:
            peer = self.peers.get(name)
            if peer is None:  # it left (discovery) while this stage ran
                raise ProtocolError(ErrorCode.DISCONNECTED, f"next hop {name} left", hop=1)
            link = self._links[name] = _PeerLink(peer, self.bundle.identity,
                                                 self.connect_timeout)
        blob = (encode_tensors(tensors) if spec.codec == "raw"
                else encode_tensors({}, packed=pack_tensors(tensors, spec)))
        payload = encode_request(Request.route(rest, nonce), blob)
        marks: dict[str, float] = {}
        try:
            rpc = await link.client()
            t0 = time.perf_counter()
            reply = await rpc.request(MsgType.REQUEST, payload, self.request_timeout, marks)
        except RemoteError as exc:  # its ERROR (about itself, or a hop further down)
            raise ProtocolError(exc.code, exc.text, hop=1 + (exc.hop or 0)) from None
        except ProtocolError as exc:  # our link to it failed, or its reply was refused here
            code = exc.code
            if code in (ErrorCode.DISCONNECTED, ErrorCode.TIMEOUT):
                await link.drop()
                log.warning("%s: next hop %s failed: %s", self.name, name, exc)
                code = ErrorCode.DISCONNECTED
            raise ProtocolError(code, f"next hop {name}: {exc}"[:1000], hop=1) from None
        sent = marks.get("sent", t0)  # links are FIFO: waiting behind earlier frames is
        start = max(t0, self._sent_end.get(name, 0.0))  # queueing, not transfer
        self._sent_end[name] = max(sent, self._sent_end.get(name, 0.0))
        return reply.payload, max(sent - start, 0.0), len(payload)


def check_crossing(cand: Candidate, feeds: Mapping[str, np.ndarray]) -> None:
    """Tensors from the wire must be exactly cut ``cand``'s crossing set (names, dtypes,
    shapes)."""
    expected = {t.name: t for t in cand.crossing}
    if set(feeds) != set(expected):
        raise ProtocolError(ErrorCode.MALFORMED, f"cut {cand.id}: missing tensors "
                            f"{sorted(set(expected) - set(feeds))}, unexpected "
                            f"{sorted(set(feeds) - set(expected))}")
    for name, arr in feeds.items():
        spec = expected[name]
        if tuple(arr.shape) != spec.shape or arr.dtype != np.dtype(spec.dtype):
            raise ProtocolError(ErrorCode.MALFORMED, f"tensor {name!r} is "
                                f"{arr.dtype}{list(arr.shape)}, cut {cand.id} expects "
                                f"{spec.dtype}{list(spec.shape)}")


__all__ = ["Forwarder", "Peer", "check_crossing"]
