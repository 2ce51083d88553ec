"""BLE air-time model on top of bumble's virtual link and controllers.

bumble's :class:`~bumble.link.LocalLink` hands ACL data to the peer instantly and its controller
returns ACL buffer credits as soon as the host submits a packet. :class:`RadioController` instead
queues every HCI ACL packet (one link-layer PDU: the host fragments at the advertised
``le_acl_data_packet_length``) and :class:`RadioLink` puts queued packets on the air in
connection events: every ``interval`` the central and the peripheral alternate packets (data or
empty), separated by T_IFS, until neither has more data, ``max_packets_per_event`` exchanges
happened, or the next exchange would overrun the interval. A packet is delivered to the peer, and
its buffer credit returned to the sender's host (Number Of Completed Packets), only at the moment
its air time ends -- so hosts feel the radio's back-pressure.

Time is emulated: ``time_scale`` real seconds pass per emulated second (0.1 = ten times faster
than real time). :meth:`RadioLink.now` gives the emulated clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from bumble import controller as bumble_controller
from bumble import hci
from bumble.link import LocalLink
from coinf.ble_protocol.messages import PROTOCOL_VERSION, MsgType
from coinf.ble_protocol.radio.params import RadioParams

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    ctrl: RadioController
    conn: bumble_controller.Connection
    packet: hci.HCI_AclDataPacket


@dataclass(eq=False)
class _AirConnection:
    """Both ends of one LE connection and their transmit queues."""

    central: tuple[RadioController, bumble_controller.Connection]
    peripheral: tuple[RadioController, bumble_controller.Connection]
    anchor0: float
    queues: dict[bool, deque[_Pending]] = field(
        default_factory=lambda: {True: deque(), False: deque()}
    )
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    packets: int = 0
    events: int = 0
    exchanges: int = 0
    payload_bytes: int = 0


_TYPES = frozenset(int(t) for t in MsgType)


class ChunkFaults:
    """Drops, duplicates, corrupts or reorders coinf data chunks in L2CAP PDUs (ATT
    notification 0x1B or write command 0x52 on the ATT channel whose value starts like a chunk:
    this protocol version, a known message type, at least the 14-byte header). Everything else
    passes."""

    def __init__(self, params: RadioParams) -> None:
        self.p = params
        self.enabled = any((params.fault_drop, params.fault_duplicate, params.fault_corrupt,
                            params.fault_reorder))
        self.rng = random.Random(params.fault_seed)
        self.held: dict[tuple[int, int], bytes] = {}  # a chunk waiting to be overtaken
        self.counts = {"dropped": 0, "duplicated": 0, "corrupted": 0, "reordered": 0}

    @staticmethod
    def is_chunk(pdu: bytes) -> bool:
        if len(pdu) < 4 + 3 + 14:
            return False
        cid = int.from_bytes(pdu[2:4], "little")
        value = pdu[7:]
        return (cid == 0x0004 and pdu[4] in (0x1B, 0x52) and value[0] == PROTOCOL_VERSION
                and value[1] in _TYPES)

    def apply(self, way: tuple[int, int], pdu: bytes) -> list[bytes]:
        """The PDUs to deliver now, in order, for one PDU sent in direction ``way``."""
        if not self.enabled or not self.is_chunk(pdu):
            return [pdu]
        r, p = self.rng.random(), self.p
        out: list[bytes]
        if r < p.fault_drop:
            self.counts["dropped"] += 1
            out = []
        elif r < p.fault_drop + p.fault_duplicate:
            self.counts["duplicated"] += 1
            out = [pdu, pdu]
        elif r < p.fault_drop + p.fault_duplicate + p.fault_corrupt:
            self.counts["corrupted"] += 1
            at = self.rng.randrange(7 + 14, len(pdu)) if len(pdu) > 7 + 14 else len(pdu) - 1
            out = [pdu[:at] + bytes([pdu[at] ^ 0x5A]) + pdu[at + 1:]]
        elif r < p.fault_drop + p.fault_duplicate + p.fault_corrupt + p.fault_reorder:
            if way not in self.held:  # hold it: the next chunk goes first
                self.counts["reordered"] += 1
                self.held[way] = pdu
                return []
            out = [pdu]
        else:
            out = [pdu]
        held = self.held.pop(way, None)
        return [*out, held] if held is not None else out


class RadioLink(LocalLink):
    """A :class:`LocalLink` whose LE ACL traffic follows connection-event timing."""

    def __init__(self, params: RadioParams) -> None:
        super().__init__()
        self.params = params
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._air: dict[int, _AirConnection] = {}  # by id() of either end's Connection
        self.encrypted: set[int] = set()  # id() of connections that reported encryption
        #: how many intervals late an event may run at its nominal time (see ``_run``)
        self.catch_up = 4
        self.faults = ChunkFaults(params)

    # --- clock ---------------------------------------------------------------------------
    def now(self) -> float:
        """Emulated seconds since the radio started."""
        return (self._loop.time() - self._t0) / self.params.time_scale

    def _real(self, emulated: float) -> float:
        return self._t0 + emulated * self.params.time_scale

    # --- air time --------------------------------------------------------------------------
    def air_time(self, payload: int, encrypted: bool) -> float:
        """Seconds one LL data PDU with ``payload`` bytes occupies the air."""
        return self.params.packet_air_time(payload, encrypted)

    # --- queueing --------------------------------------------------------------------------
    def _air_connection(
        self, ctrl: RadioController, conn: bumble_controller.Connection
    ) -> _AirConnection | None:
        air = self._air.get(id(conn))
        if air is not None and self._alive(air):
            return air
        peer_ctrl = self.find_le_controller(conn.peer_address)
        if not isinstance(peer_ctrl, RadioController):
            return None
        peer_conn = peer_ctrl.le_connections.get(conn.self_address)
        if peer_conn is None:
            # the peer may know us by another address; search its connections
            peer_conn = next(
                (
                    c
                    for c in peer_ctrl.le_connections.values()
                    if c.peer_address == conn.self_address
                ),
                None,
            )
        if peer_conn is None:
            return None
        me, peer = (ctrl, conn), (peer_ctrl, peer_conn)
        central, peripheral = (me, peer) if conn.role == hci.Role.CENTRAL else (peer, me)
        if air is not None and air.task is not None:
            air.task.cancel()
        air = _AirConnection(central, peripheral, anchor0=self.now())
        air.task = self._loop.create_task(self._run(air))
        self._air[id(conn)] = self._air[id(peer_conn)] = air
        return air

    @staticmethod
    def _alive(air: _AirConnection) -> bool:
        for ctrl, conn in (air.central, air.peripheral):
            if ctrl.le_connections.get(conn.peer_address) is not conn:
                return False
        return True

    def enqueue(
        self,
        ctrl: RadioController,
        conn: bumble_controller.Connection,
        packet: hci.HCI_AclDataPacket,
    ) -> None:
        air = self._air_connection(ctrl, conn)
        if air is None:  # no peer: the packet is lost, but the host gets its credit back
            ctrl.complete(conn, 1)
            return
        is_central = air.central[1] is conn
        air.queues[is_central].append(_Pending(ctrl, conn, packet))
        air.wakeup.set()

    def drop_connection(self, conn: bumble_controller.Connection) -> None:
        air = self._air.pop(id(conn), None)
        self.encrypted.discard(id(conn))
        if air is not None:
            for _, c in (air.central, air.peripheral):
                if self._air.get(id(c)) is air:
                    del self._air[id(c)]
            if air.task is not None:
                air.task.cancel()

    # --- the scheduler ---------------------------------------------------------------------
    async def _run(self, air: _AirConnection) -> None:
        p = self.params
        t_ifs = p.t_ifs_us * 1e-6
        anchor = -1.0
        try:
            while True:
                if not air.queues[True] and not air.queues[False]:
                    air.wakeup.clear()
                    await air.wakeup.wait()
                if not self._alive(air):
                    break
                now = self.now()
                # Events follow each other every interval. When the host process is briefly
                # late (a loaded machine) an overdue event still runs at its nominal time, so
                # jitter does not cost throughput; after a real pause we resync to the grid.
                anchor += p.interval_s
                if anchor < now - self.catch_up * p.interval_s or anchor < 0:
                    k = max(0, math.ceil((now - air.anchor0) / p.interval_s - 1e-9))
                    anchor = air.anchor0 + k * p.interval_s
                delay = self._real(anchor) - self._loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if not self._alive(air):
                    break
                air.events += 1
                enc = (
                    id(air.central[1]) in self.encrypted or id(air.peripheral[1]) in self.encrypted
                )
                t = 0.0
                for n in range(p.max_packets_per_event):
                    c = air.queues[True].popleft() if air.queues[True] else None
                    r = air.queues[False].popleft() if air.queues[False] else None
                    if c is None and r is None:
                        break
                    tc = self.air_time(len(c.packet.data) if c else 0, enc and c is not None)
                    tr = self.air_time(len(r.packet.data) if r else 0, enc and r is not None)
                    if n > 0 and t + tc + t_ifs + tr > p.interval_s + 1e-9:
                        if r is not None:
                            air.queues[False].appendleft(r)
                        if c is not None:
                            air.queues[True].appendleft(c)
                        break
                    for pend, end in ((c, t + tc), (r, t + tc + t_ifs + tr)):
                        if pend is not None:
                            self._loop.call_at(self._real(anchor + end), self._deliver, air, pend)
                    t += tc + tr + 2 * t_ifs
                    air.exchanges += 1
        except asyncio.CancelledError:
            pass
        finally:
            for q in air.queues.values():
                for pend in q:
                    pend.ctrl.complete(pend.conn, 1)
                q.clear()
            for _, end_conn in (air.central, air.peripheral):
                if self._air.get(id(end_conn)) is air:
                    del self._air[id(end_conn)]

    def _deliver(self, air: _AirConnection, pend: _Pending) -> None:
        if not self._alive(air):
            return
        air.packets += 1
        air.payload_bytes += len(pend.packet.data)
        pend.conn.assembler.feed_packet(pend.packet)  # complete L2CAP PDUs go to the peer now
        pend.ctrl.complete(pend.conn, 1)

    def send_acl_data(
        self,
        sender_controller: bumble_controller.Controller,
        destination_address: hci.Address,
        transport: Any,
        data: bytes,
    ) -> None:
        """Deliver a reassembled L2CAP PDU at once (its air time was already spent), through
        the fault injector when one is configured."""
        dest = self.find_le_controller(destination_address)
        if dest is None:
            return
        # the address this connection was made with: a controller that changed its random
        # address since (a new resolvable private address to advertise) keeps it per connection
        conn = sender_controller.le_connections.get(destination_address)
        source = conn.self_address if conn is not None else sender_controller.random_address
        way = (id(sender_controller), id(dest))
        for pdu in self.faults.apply(way, data):
            dest.on_link_acl_data(source, transport, pdu)
        if way in self.faults.held:  # a held chunk goes out after the next one, or soon anyway

            def flush() -> None:
                late = self.faults.held.pop(way, None)
                if late is not None:
                    dest.on_link_acl_data(source, transport, late)

            self._loop.call_later(self._real(4 * self.params.interval_s) - self._t0, flush)

    def stats(self) -> dict[str, int]:
        return {
            "packets": sum(a.packets for a in set(self._air.values())),
            "payload_bytes": sum(a.payload_bytes for a in set(self._air.values())),
        }


class RadioController(bumble_controller.Controller):
    """A bumble controller whose LE ACL packets wait for their air time on a :class:`RadioLink`."""

    def __init__(self, name: str, link: RadioLink, **kwargs: object) -> None:
        super().__init__(name, link=link, **kwargs)  # type: ignore[arg-type]
        self.radio = link
        p = link.params
        self.le_acl_data_packet_length = p.ll_payload
        self.total_num_le_acl_data_packets = p.acl_buffers
        self.acl_data_packet_length = p.ll_payload
        self.total_num_acl_data_packets = p.acl_buffers
        self.hci_version = p.hci_version
        self.lmp_version = p.hci_version
        features = self.le_features
        if p.ll_payload <= 27:
            features &= ~hci.LeFeatureMask.LE_DATA_PACKET_LENGTH_EXTENSION
        if p.phy_mbps < 2:
            features &= ~hci.LeFeatureMask.LE_2M_PHY
        self.le_features = features

    def on_advertising_pdu(self, pdu: Any) -> None:
        """bumble's controller reports the advertising data again as the scan response; report
        the advertiser's real scan response data instead (the service UUID lives there)."""
        sender = self.radio.find_le_controller(pdu.advertiser_address)
        rsp = b""
        if sender is not None:
            rsp = bytes(sender.le_legacy_advertiser.scan_response_data)
            for adv_set in sender.advertising_sets.values():
                if adv_set.address == pdu.advertiser_address and adv_set.scan_response_data:
                    rsp = bytes(adv_set.scan_response_data)
        self._scan_rsp: bytes | None = rsp
        try:
            super().on_advertising_pdu(pdu)
        finally:
            self._scan_rsp = None

    def send_hci_packet(self, packet: hci.HCI_Packet) -> None:
        rsp = getattr(self, "_scan_rsp", None)
        if rsp is not None:
            if isinstance(packet, hci.HCI_LE_Extended_Advertising_Report_Event):
                flag: Any = hci.HCI_LE_Extended_Advertising_Report_Event.EventType.SCAN_RESPONSE
                reports = [
                    dataclasses.replace(r, data=rsp) if r.event_type & flag else r
                    for r in packet.reports
                ]
                packet = hci.HCI_LE_Extended_Advertising_Report_Event(reports)
            elif isinstance(packet, hci.HCI_LE_Advertising_Report_Event):
                flag = hci.HCI_LE_Advertising_Report_Event.EventType.SCAN_RSP
                legacy = [
                    dataclasses.replace(r, data=rsp) if r.event_type == flag else r
                    for r in packet.reports
                ]
                packet = hci.HCI_LE_Advertising_Report_Event(legacy)
        super().send_hci_packet(packet)

    def on_hci_acl_data_packet(self, packet: hci.HCI_AclDataPacket) -> None:
        conn = self.find_le_connection_by_handle(packet.connection_handle)
        if conn is None:
            super().on_hci_acl_data_packet(packet)
            return
        self.radio.enqueue(self, conn, packet)

    def complete(self, conn: bumble_controller.Connection, count: int) -> None:
        """Return ``count`` ACL buffer credits to the host."""
        self.send_hci_packet(
            hci.HCI_Number_Of_Completed_Packets_Event(
                connection_handles=[conn.handle], num_completed_packets=[count]
            )
        )

    def on_le_encryption_change(
        self, connection: bumble_controller.Connection, status: int
    ) -> None:
        if status == hci.HCI_ErrorCode.SUCCESS:
            self.radio.encrypted.add(id(connection))
        super().on_le_encryption_change(connection, status)

    def on_le_disconnected(self, connection: bumble_controller.Connection, reason: int) -> None:
        self.radio.drop_connection(connection)
        super().on_le_disconnected(connection, reason)

    def on_hci_reset_command(self, command: hci.HCI_Reset_Command) -> Any:
        """A (re)attached host starts clean: drop connections left by a previous host."""
        self.drop_all(hci.HCI_ErrorCode.REMOTE_USER_TERMINATED_CONNECTION_ERROR)
        return super().on_hci_reset_command(command)

    def drop_all(self, reason: int) -> int:
        """End every LE connection of this controller; the peers are told ``reason``. Returns
        how many were dropped. (A host that vanished: its device went silent, and after the
        supervision timeout the peer's controller reports CONNECTION_TIMEOUT.)"""
        dropped = 0
        for conn in list(self.le_connections.values()):
            peer = self.radio.find_le_controller(conn.peer_address)
            with contextlib.suppress(Exception):
                if peer is not None:
                    peer_conn = peer.le_connections.get(conn.self_address)
                    if peer_conn is not None:
                        peer.on_le_disconnected(peer_conn, reason)
            self.radio.drop_connection(conn)
            del self.le_connections[conn.peer_address]
            dropped += 1
        return dropped
