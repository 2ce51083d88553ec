"""``Session``: run a split model like ``onnxruntime.InferenceSession``, offloading the tail.

>>> sess = Session("bundles/mobilenetv2", split="c012", transport="inprocess")
>>> probs, = sess.run(None, {"input": x})
>>> sess.last_run.transfer_ms
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort
from coinf.ble_protocol.link import Link
from coinf.ble_protocol.loopback import InProcessLink, connect_socket
from coinf.ble_protocol.messages import (
    PROTOCOL_VERSION,
    ErrorCode,
    MsgType,
    ProtocolError,
    decode_json,
    decode_result,
    encode_json,
    encode_request,
)
from coinf.ble_protocol.packing import PackSpec, pack_tensors
from coinf.ble_protocol.rpc import RpcClient
from coinf.ble_protocol.shaped import Channel, ShapedLink
from coinf.ble_protocol.tensors import decode_tensors, encode_tensors
from coinf.convert.bundle import Bundle, Candidate, TensorSpec
from coinf.device.emulation import DeviceEmulation
from coinf.device.profile import DeviceProfile, load_or_default
from coinf.wearable.autoplan import AutoPlan
from coinf.wearable.loop import LoopThread
from coinf.wearable.planner.costs import Decision
from coinf.wearable.planner.planner import _UNSET
from coinf.wearable.policy import OBJECTIVES, Policy, load_policy

from coinf.errors import CoinfError, InputError

if TYPE_CHECKING:
    from coinf.device.runtime import TailRunner

LinkFactory = Callable[[], Awaitable[Link]]
log = logging.getLogger(__name__)

_ORT_TYPES = {
    "float32": "tensor(float)",
    "float16": "tensor(float16)",
    "float64": "tensor(double)",
    "int8": "tensor(int8)",
    "uint8": "tensor(uint8)",
    "int16": "tensor(int16)",
    "uint16": "tensor(uint16)",
    "int32": "tensor(int32)",
    "uint32": "tensor(uint32)",
    "int64": "tensor(int64)",
    "uint64": "tensor(uint64)",
    "bool": "tensor(bool)",
}


@dataclass(frozen=True)
class NodeArg:
    """Same fields as ``onnxruntime.NodeArg``: name, shape, type (e.g. ``tensor(float)``)."""

    name: str
    shape: list[int]
    type: str


@dataclass
class FrameResult:
    """One frame of :meth:`Session.stream`: its index, outputs (or error) and timings."""

    index: int
    outputs: list[np.ndarray] | None
    error: BaseException | None
    stats: RunStats | None

    def value(self) -> list[np.ndarray]:
        """The outputs, or raise this frame's error."""
        if self.error is not None:
            raise self.error
        assert self.outputs is not None
        return self.outputs


@dataclass
class RunStats:
    """Timings (ms) and bytes of one ``Session.run``."""

    candidate: str
    packing: str = "raw"
    head_ms: float = 0.0
    pack_ms: float = 0.0
    transfer_ms: float = 0.0
    tail_ms: float = 0.0
    return_ms: float = 0.0
    total_ms: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    local: bool = False
    fallback: str | None = None  # why an offloaded inference was completed on the wearable

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Session:
    """Runs ``bundle`` split between this wearable and a handheld.

    Args:
        bundle: a bundle directory (``coinf split``) or a loaded :class:`Bundle`.
        split: candidate id (``c007``) or ``handheld-only`` / ``wearable-only`` to fix the split;
            ``None`` (default) lets the planner choose before every run (docs/PLANNER.md).
        transport: ``"inprocess"`` (a handheld in this process), ``"socket"`` (a
            ``coinf handheld`` daemon at ``handheld=unix:/path`` or ``tcp:HOST:PORT``), a
            :class:`~ble_protocol.shaped.Channel` (an in-process handheld behind a link with that
            bandwidth and latency), a :class:`Link`, or an async factory returning one.
        handheld: address for ``transport="socket"``.
        hci, ble_options: for ``transport="ble"``, the bumble HCI transport of this wearable's
            controller (``hci-socket:0`` on a Pi, ``usb:0``, or ``tcp-client:HOST:PORT`` of
            ``coinf radio``) and options of :func:`wearable.gatt_server.accept_link` (``name``,
            ``keystore``...). The wearable advertises and waits for the handheld to connect.
        slowdown, threads: wearable emulation (see :class:`DeviceEmulation`).
        handheld_slowdown, handheld_threads: emulation of the in-process handheld.
        timeout: seconds to wait for one offloaded inference before failing it.
        packing: how crossing tensors travel: ``raw`` (as is), ``f32`` (lossless shuffle + LZ4),
            ``f16``, or ``q1``..``q16`` (per-input quantization + bit shuffle + LZ4; see
            docs/PACKING.md).
        fallback: when the handheld is unreachable, times out or fails a tail, finish that
            inference on the wearable (``last_run.fallback`` says why) and retry the handheld
            after a backoff (0.5 s doubling to ``max_backoff_s``). Configuration errors (bundle
            mismatch, protocol version) always raise.
        objective, latency_budget_ms, policy: what the planner optimises (``auto``, ``latency``,
            ``energy``, ``throughput``, ``neurosurgeon-*``, ``dyno``) and under which budget;
            default from the policy file (``coinf policy``). ``policy`` may be a Policy or a
            path to a policy JSON file.
        wearable_profile, handheld_profile: device profiles (``coinf profile``) or paths; by
            default the saved ones, else built-in Pi Zero 2 W / laptop estimates. Without a
            handheld profile the handheld is asked for its own when the link comes up.
        packings: packings the planner may choose from with each cut (``("raw", "q8", "q4")``);
            only those ``coinf calibrate`` measured for a candidate are considered, and only
            within the policy's accuracy tolerance. The default ``("auto",)`` is every
            calibrated packing; an uncalibrated bundle travels raw.
    """

    def __init__(
        self,
        bundle: str | Path | Bundle,
        *,
        split: str | None = None,
        transport: str | Channel | Link | LinkFactory = "inprocess",
        handheld: str | None = None,
        slowdown: float = 1.0,
        threads: int = 0,
        handheld_slowdown: float = 1.0,
        handheld_threads: int = 0,
        timeout: float = 30.0,
        head_cache: int = 4,
        packing: str | PackSpec = "raw",
        fallback: bool = True,
        max_backoff_s: float = 30.0,
        objective: str | None = None,
        latency_budget_ms: Any = _UNSET,
        policy: Policy | str | Path | None = None,
        wearable_profile: DeviceProfile | str | Path | None = None,
        handheld_profile: DeviceProfile | str | Path | None = None,
        packings: Sequence[str] = ("auto",),
        hci: str | None = None,
        ble_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.load(bundle)
        self.emulation = DeviceEmulation(slowdown, threads)
        self._handheld_emulation = DeviceEmulation(handheld_slowdown, handheld_threads)
        self.timeout = timeout
        self._head_cache = head_cache
        self._heads: OrderedDict[str, ort.InferenceSession] = OrderedDict()
        try:
            self.packing = packing if isinstance(packing, PackSpec) else PackSpec.parse(packing)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        self.autoplan: AutoPlan | None = None
        if split is None:
            self.autoplan = self._make_autoplan(
                objective, latency_budget_ms, policy, wearable_profile, handheld_profile,
                packings,
            )
            split = self.autoplan.choose(None)[0]
        self._candidate = self._pick(split)
        self._transport = transport
        self._handheld_addr = handheld
        if transport == "socket" and not handheld:
            raise ValueError("transport='socket' needs handheld='unix:/path' or 'tcp:HOST:PORT'")
        if transport == "ble" and not hci:
            raise ValueError("transport='ble' needs hci='hci-socket:0', 'usb:0' or "
                             "'tcp-client:HOST:PORT' (coinf radio)")
        if isinstance(transport, str) and transport not in ("inprocess", "socket", "ble"):
            raise ValueError(
                f"unknown transport {transport!r}: expected 'inprocess', 'socket', 'ble', a "
                "Channel, a Link or an async link factory"
            )
        self._hci = hci
        self._ble_options = dict(ble_options or {})
        self._connected_once = False
        self._rtt_ms = 0.0
        self.fallback = fallback
        self.max_backoff_s = max_backoff_s
        self._backoff_s = 0.0
        self._offline_until = 0.0
        self._offline_reason = ""
        self._local_tails: TailRunner | None = None
        self._planner_off: AutoPlan | None = None
        self._loop: LoopThread | None = None
        self._rpc: RpcClient | None = None
        self._server_task: asyncio.Task[None] | None = None
        self.handheld_info: dict[str, Any] | None = None
        self.last_run: RunStats | None = None

    # -- onnxruntime-like surface ----------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return [_node_arg(t) for t in self.bundle.inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [_node_arg(t) for t in self.bundle.outputs]

    def get_providers(self) -> list[str]:
        return ["CPUExecutionProvider"]

    @property
    def split(self) -> Candidate:
        """The candidate the next run uses."""
        return self._candidate

    def set_split(self, split: str | None, packing: str | PackSpec | None = None) -> None:
        """Fix the split (and packing) from now on; ``None`` hands the choice back to the
        planner (only for a Session created without ``split``)."""
        if split is None:
            if self._planner_off is None:
                raise ValueError("this Session was created with a fixed split; it has no planner")
            self.autoplan, self._planner_off = self._planner_off, None
            return
        self._candidate = self._pick(split)
        if packing is not None:
            self.packing = packing if isinstance(packing, PackSpec) else PackSpec.parse(packing)
        if self.autoplan is not None:
            self._planner_off, self.autoplan = self.autoplan, None

    def plan(self) -> Decision:
        """The planner's current decision: every candidate's predicted head, transfer, tail,
        return and energy, the winner, and why (``print(session.plan().explain())``)."""
        auto = self.autoplan or self._planner_off
        if auto is None:
            auto = self._planner_off = self._make_autoplan(
                None, _UNSET, None, None, None, ("auto",)
            )
        decision = auto.decision()
        if self.offline is not None:
            decision.notes.append(
                f"offline: runs complete on the wearable (wearable-only) - {self.offline}"
            )
        if self.autoplan is None:
            decision.notes.append(f"split fixed by the caller at {self._candidate.id}")
        return decision

    def _make_autoplan(
        self,
        objective: str | None,
        latency_budget_ms: Any,
        policy: Policy | str | Path | None,
        wearable_profile: DeviceProfile | str | Path | None,
        handheld_profile: DeviceProfile | str | Path | None,
        packings: Sequence[str],
    ) -> AutoPlan:
        pol = policy if isinstance(policy, Policy) else load_policy(policy)[0]
        if objective is not None and objective not in OBJECTIVES:
            raise InputError(f"unknown objective {objective!r}; expected one of "
                             f"{', '.join(OBJECTIVES)}")
        wprof = (wearable_profile if isinstance(wearable_profile, DeviceProfile)
                 else load_or_default("wearable", wearable_profile))
        measured_here = bool(wprof.models) or wprof.predictor is not None
        if measured_here and self.emulation.slowdown != 1.0 and wprof.slowdown == 1.0:
            # a profile measured on this machine, which now plays a K x slower wearable
            wprof = dataclasses.replace(wprof, slowdown=self.emulation.slowdown)
        hprof = (handheld_profile if isinstance(handheld_profile, DeviceProfile)
                 else load_or_default("handheld", handheld_profile)
                 if handheld_profile is not None else None)
        return AutoPlan(self.bundle, policy=pol, wearable_profile=wprof, handheld_profile=hprof,
                        objective=objective, latency_budget_ms=latency_budget_ms,
                        packings=packings)

    def _ensure_link(self) -> None:
        """With a planner, connect (and probe) before deciding, unless offline: the planner
        must know the link even when its first choice keeps everything on the wearable."""
        if self.offline is not None or (self._rpc is not None and self._rpc.link.is_open):
            return
        try:
            self._loop_thread().run(self._connect(), timeout=self.timeout + 5)
        except (ProtocolError, TimeoutError) as exc:
            if not self.fallback or not _transient(exc):
                raise
            self._went_offline(exc)

    def _plan_next(self) -> None:
        """Let the planner choose the split and packing of the next run."""
        if self.autoplan is None:
            return
        cid, spec = self.autoplan.choose(self.offline)
        if cid != self._candidate.id:
            self._candidate = self.bundle.candidate(cid)
        if str(self.packing) != spec:
            self.packing = PackSpec.parse(spec)

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: object | None = None,
    ) -> list[np.ndarray]:
        """Run one inference; returns the requested outputs (all when ``output_names`` is None)."""
        feeds = self._check_feed(input_feed)
        names = self._check_outputs(output_names)
        if self.autoplan is not None:
            self.autoplan.started()
            self._ensure_link()
            self._plan_next()
        cand = self._candidate
        stats = RunStats(candidate=cand.id, packing=str(self.packing))
        t_start = time.perf_counter()
        crossing = self._run_head(cand, feeds, stats)
        if cand.is_wearable_only:
            outputs = crossing
            stats.local = True
        else:
            outputs = self._offload_or_local(cand, crossing, stats)
        stats.total_ms = (time.perf_counter() - t_start) * 1e3
        self.last_run = stats
        if self.autoplan is not None:
            self.autoplan.finished(stats)
        return [outputs[n] for n in names]

    def stream(
        self,
        feeds: Iterable[Mapping[str, Any]],
        output_names: Sequence[str] | None = None,
        *,
        depth: int = 3,
        pipelined: bool = True,
    ) -> Iterator[FrameResult]:
        """Run a stream of inputs; yields one :class:`FrameResult` per input, in order.

        Stages overlap: while the handheld computes frame n and the link carries frame n+1, the
        wearable computes frame n+2. At most ``depth`` frames are in flight; the input iterable is
        only pulled when there is room (back-pressure). A frame that fails yields a result whose
        ``error`` is set; later frames go on. ``pipelined=False`` runs frames one at a time.
        """
        from coinf.wearable.stream import run_stream

        return run_stream(self, feeds, output_names, depth=depth if pipelined else 1)

    async def astream(
        self,
        feeds: AsyncIterable[Mapping[str, Any]] | Iterable[Mapping[str, Any]],
        output_names: Sequence[str] | None = None,
        *,
        depth: int = 3,
        pipelined: bool = True,
    ) -> AsyncIterator[FrameResult]:
        """The asyncio variant of :meth:`stream`: ``async for r in sess.astream(frames)``.

        ``feeds`` may be an async iterable (e.g. a camera coroutine); it is pulled only when
        the pipeline has room, and results are delivered in order without blocking the caller's
        event loop.
        """
        loop = asyncio.get_running_loop()
        results: asyncio.Queue[FrameResult | BaseException | None] = asyncio.Queue(depth)
        done = threading.Event()

        def pull() -> Iterator[Mapping[str, Any]]:
            if not isinstance(feeds, AsyncIterable):
                yield from feeds
                return
            agen = aiter(feeds)

            async def next_feed() -> Mapping[str, Any]:
                return await anext(agen)

            while not done.is_set():
                try:
                    yield asyncio.run_coroutine_threadsafe(next_feed(), loop).result()
                except StopAsyncIteration:
                    return

        def worker() -> None:
            try:
                for r in self.stream(pull(), output_names, depth=depth, pipelined=pipelined):
                    if done.is_set():
                        break
                    asyncio.run_coroutine_threadsafe(results.put(r), loop).result()
                item: BaseException | None = None
            except BaseException as exc:  # delivered to the caller below
                item = exc
            if not done.is_set():
                asyncio.run_coroutine_threadsafe(results.put(item), loop).result()

        thread = threading.Thread(target=worker, name="coinf-astream", daemon=True)
        thread.start()
        try:
            while True:
                got = await results.get()
                if got is None:
                    return
                if isinstance(got, BaseException):
                    raise got
                yield got
        finally:
            done.set()
            while not results.empty():  # unblock a worker waiting to put
                results.get_nowait()
            await asyncio.to_thread(thread.join, 30)

    # -- lifecycle ------------------------------------------------------------------------------
    def connect(self) -> dict[str, Any]:
        """Connect and handshake now (otherwise done on the first offloaded run)."""
        if self._rpc is None or not self._rpc.link.is_open:
            self._loop_thread().run(self._connect(), timeout=self.timeout + 5)
        assert self.handheld_info is not None
        return self.handheld_info

    def close(self) -> None:
        if self._loop is not None and self._transport == "ble":
            from coinf.wearable.gatt_server import close_servers

            with contextlib.suppress(Exception):
                self._loop.run(close_servers(), timeout=10)
        if self._loop is not None:
            if self._rpc is not None:
                rpc_client = self._rpc
                self._rpc = None
                with contextlib.suppress(Exception):
                    self._loop.run(rpc_client.close(), timeout=5)
            self._loop.close()
            self._loop = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -- internals -------------------------------------------------------------------------------
    def _pick(self, split: str | None) -> Candidate:
        if split is not None:
            return self.bundle.candidate(split)
        inner = self.bundle.candidates[1:-1] or self.bundle.candidates
        return min(inner, key=lambda c: (c.crossing_bytes, c.head.flops))

    def _check_feed(self, feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        expected = {t.name: t for t in self.bundle.inputs}
        unknown = sorted(set(feed) - set(expected))
        if unknown:
            raise InputError(
                f"unknown input {unknown[0]!r}; the model's inputs are {sorted(expected)}"
            )
        out: dict[str, np.ndarray] = {}
        for name, spec in expected.items():
            if name not in feed:
                raise InputError(
                    f"missing input {name!r}: expected {spec.dtype}{list(spec.shape)}"
                )
            arr = np.asarray(feed[name])
            if arr.dtype != np.dtype(spec.dtype):
                raise InputError(
                    f"input {name!r} has dtype {arr.dtype}, expected {spec.dtype} "
                    f"with shape {list(spec.shape)}"
                )
            if tuple(arr.shape) != spec.shape:
                raise InputError(
                    f"input {name!r} has shape {list(arr.shape)}, expected {list(spec.shape)} "
                    f"({spec.dtype})"
                )
            out[name] = arr
        return out

    def _check_outputs(self, names: Sequence[str] | None) -> list[str]:
        known = [t.name for t in self.bundle.outputs]
        if names is None:
            return known
        for n in names:
            if n not in known:
                raise InputError(f"unknown output {n!r}; the model's outputs are {known}")
        return list(names)

    def _head_session(self, cand: Candidate) -> ort.InferenceSession:
        sess = self._heads.get(cand.id)
        if sess is None:
            assert cand.head.file is not None
            sess = ort.InferenceSession(
                str(self.bundle.path(cand.head.file)),
                self.emulation.session_options(),
                providers=["CPUExecutionProvider"],
            )
            self._heads[cand.id] = sess
            while len(self._heads) > self._head_cache:
                self._heads.popitem(last=False)
        else:
            self._heads.move_to_end(cand.id)
        return sess

    def _run_head(
        self, cand: Candidate, feeds: dict[str, np.ndarray], stats: RunStats
    ) -> dict[str, np.ndarray]:
        """Run the head; return the crossing tensors (graph inputs the tail needs pass through)."""
        wanted = [t.name for t in cand.crossing]
        if cand.is_handheld_only:
            return {n: feeds[n] for n in wanted}
        sess = self._head_session(cand)
        head_in = {i.name: feeds[i.name] for i in sess.get_inputs()}
        head_out = [o.name for o in sess.get_outputs()]
        values, elapsed = self.emulation.timed(lambda: sess.run(head_out, head_in))
        stats.head_ms = elapsed * 1e3
        produced = dict(zip(head_out, values, strict=True))
        return {n: produced[n] if n in produced else feeds[n] for n in wanted}

    # -- nothing is lost: offload, or finish on the wearable ------------------------------------
    def _offload_or_local(
        self, cand: Candidate, crossing: dict[str, np.ndarray], stats: RunStats
    ) -> dict[str, np.ndarray]:
        if time.monotonic() < self._offline_until:
            return self._finish_locally(cand, crossing, stats, self._offline_reason)
        payload = self._pack(cand, crossing, stats)
        try:
            reply = self._loop_thread().run(
                self._exchange(payload, stats), timeout=self.timeout + 10
            )
        except (ProtocolError, TimeoutError) as exc:
            if not self.fallback or not _transient(exc):
                raise
            self._went_offline(exc)
            return self._finish_locally(cand, crossing, stats, self._offline_reason)
        self._backoff_s = 0.0
        return self._unpack(reply, stats)

    def _went_offline(self, exc: BaseException) -> None:
        self._backoff_s = min(max(self._backoff_s * 2, 0.5), self.max_backoff_s)
        self._offline_until = time.monotonic() + self._backoff_s
        self._offline_reason = f"handheld unavailable ({exc}); retry in {self._backoff_s:.1f} s"
        log.warning("offloading paused: %s", self._offline_reason)

    def _finish_locally(
        self, cand: Candidate, crossing: dict[str, np.ndarray], stats: RunStats, why: str
    ) -> dict[str, np.ndarray]:
        """Run ``cand``'s tail on the wearable (the bundle carries it) instead of the handheld."""
        if self._local_tails is None:
            from coinf.device.runtime import TailRunner

            self._local_tails = TailRunner(self.bundle, self.emulation, capacity=2)
        outputs, elapsed = self._local_tails.run(cand.id, crossing)
        stats.tail_ms = elapsed * 1e3
        stats.local = True
        stats.fallback = why
        return outputs

    @property
    def link(self) -> Link | None:
        """The link to the handheld, once connected."""
        return self._rpc.link if self._rpc is not None else None

    @property
    def offline(self) -> str | None:
        """Why offloading is paused right now, or None when the handheld is in use."""
        return self._offline_reason if time.monotonic() < self._offline_until else None

    def _loop_thread(self) -> LoopThread:
        if self._loop is None:
            self._loop = LoopThread()
        return self._loop

    def _pack(self, cand: Candidate, crossing: dict[str, np.ndarray], stats: RunStats) -> bytes:
        t0 = time.perf_counter()
        spec = PackSpec.parse(stats.packing)
        if spec.codec == "raw":
            blob = encode_tensors(crossing)
        else:
            blob = encode_tensors({}, packed=pack_tensors(crossing, spec))
        payload = encode_request(cand.id, blob)
        stats.pack_ms = (time.perf_counter() - t0) * 1e3
        stats.bytes_up = len(payload)
        return payload

    async def _exchange(self, payload: bytes, stats: RunStats) -> bytes:
        """Send a packed request, await its result; fills transfer/tail/return times."""
        if self._rpc is None or not self._rpc.link.is_open:
            await self._connect()
        assert self._rpc is not None
        if self.autoplan is not None:
            await self.autoplan.maintain(self._rpc, self.timeout)
        marks: dict[str, float] = {}
        t0 = time.perf_counter()
        reply = await self._rpc.request(MsgType.REQUEST, payload, self.timeout, marks)
        tail_us, _ = decode_result(reply.payload)
        stats.tail_ms = tail_us / 1e3
        stats.bytes_down = len(reply.payload)
        # A link may take a message before it is on the air (BLE queues a window of chunks),
        # so "send returned" is not "delivered". What is exact: round trip minus tail compute.
        # Split that network time: half the idle round trip each way, the rest by bytes.
        net = max((marks["replied"] - t0) * 1e3 - stats.tail_ms, 0.0)
        rtt = min(self._rtt_ms, net)
        share = stats.bytes_up / max(stats.bytes_up + stats.bytes_down, 1)
        stats.transfer_ms = rtt / 2 + (net - rtt) * share
        stats.return_ms = rtt / 2 + (net - rtt) * (1 - share)
        return reply.payload

    def _unpack(self, reply: bytes, stats: RunStats) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        _, blob = decode_result(reply)
        outputs = decode_tensors(blob)
        stats.return_ms += (time.perf_counter() - t0) * 1e3
        return outputs

    async def _connect(self) -> None:
        link = await self._open_link()
        client = RpcClient(link)
        hello = {
            "protocol": PROTOCOL_VERSION,
            "bundle": self.bundle.identity,
            "role": "wearable",
            "capabilities": ["raw", "packed"],
        }
        try:
            t0 = time.perf_counter()
            reply = await client.request(MsgType.HELLO, encode_json(hello), self.timeout)
            self._rtt_ms = (time.perf_counter() - t0) * 1e3
            for _ in range(2):  # the idle round trip: the smallest of a few tiny echoes
                t0 = time.perf_counter()
                await client.request(MsgType.PROBE, b"", self.timeout)
                self._rtt_ms = min(self._rtt_ms, (time.perf_counter() - t0) * 1e3)
        except BaseException:
            await client.close()
            raise
        self.handheld_info = decode_json(reply.payload)
        self._rpc = client
        self._connected_once = True
        if self.autoplan is not None:
            try:
                await self.autoplan.on_connect(client, self.timeout)
            except ProtocolError as exc:
                log.info("link probe at connection failed: %s", exc)

    async def _open_link(self) -> Link:
        transport = self._transport
        if isinstance(transport, Link):
            return transport
        if callable(transport) and not isinstance(transport, Channel):
            return await transport()
        # after the first connection a lost handheld is waited for briefly, then we go local
        wait = self.timeout if not self._connected_once else min(self.timeout, 3.0)
        if transport == "socket":
            assert self._handheld_addr is not None
            return await connect_socket(self._handheld_addr, timeout=wait)
        if transport == "ble":
            from coinf.wearable.gatt_server import accept_link

            assert self._hci is not None
            try:
                return await accept_link(self._hci, bundle_identity=self.bundle.identity,
                                         timeout=wait, **self._ble_options)
            except TimeoutError:
                raise ProtocolError(ErrorCode.DISCONNECTED,
                                    f"no handheld connected within {wait:.0f} s") from None
        # in-process handheld on this loop; tails run on the loop's default executor
        from coinf.handheld.daemon import HandheldDaemon

        ours: Link
        theirs: Link
        if isinstance(transport, Channel):
            ours, theirs = ShapedLink.pair(transport)
        else:
            ours, theirs = InProcessLink.pair()
        daemon = HandheldDaemon(self.bundle, self._handheld_emulation)
        self._server_task = asyncio.get_running_loop().create_task(daemon.serve(theirs))
        return ours


_TRANSIENT = {
    ErrorCode.DISCONNECTED,
    ErrorCode.TIMEOUT,
    ErrorCode.BUSY,
    ErrorCode.TAIL_FAILED,
    ErrorCode.CANCELLED,
}


def _transient(exc: BaseException) -> bool:
    """Errors after which finishing locally and retrying later is right."""
    return isinstance(exc, TimeoutError) or (
        isinstance(exc, ProtocolError) and exc.code in _TRANSIENT
    )


def _node_arg(spec: TensorSpec) -> NodeArg:
    return NodeArg(spec.name, list(spec.shape), _ORT_TYPES.get(spec.dtype, f"tensor({spec.dtype})"))


__all__ = ["CoinfError", "FrameResult", "NodeArg", "RunStats", "Session"]
