"""``bench attack``'s key-copy attackers: a process that copied a device's ``identity.pem``
(docs/SECURITY.md, "A local process"). Registered in :data:`attack_arena.ATTACKERS`.

* ``identity_copy_helper``: a copy of the helper's key connects to the helper *as the helper*
  (TLS with the helper's own certificate), three times, each sending HELLO, STATUS, PROFILE and
  a REQUEST. A device trusts only its pairing records, never its own certificate, so the TLS
  handshake fails: all four figures 0.
* ``identity_copy_wearable``: a copy of the wearable's key squats the helper's address while
  the helper is down and serves a real daemon there, presenting the *wearable's* certificate;
  a wearable Session sends it frames. The wearable does not trust its own certificate as a
  helper's, so no tensor leaves and every frame finishes locally: all four 0.

What a copied key still does, by design: it *is* that device to the devices paired with it.
``identity_copy_wearable`` measures it too, outside the four figures: the same copy connects
to the paired helper as the wearable and is served (``detail.as_the_wearable_to_its_helper``).
A key file is 0600 in a 0700 directory, so only its user (and root) can copy it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from coinf.cli.bench.attack_arena import Arena, Outcome, attacker

#: what the by-design figure means (the figure's note)
BY_DESIGN = ("a copy of a device's identity.pem is that device to the devices paired with it; "
             "only its user and root can read the file (0600 in a 0700 directory): "
             "docs/SECURITY.md")


def copy_of(arena: Arena, store: Any, name: str) -> Any:
    """The thief's store in the bench directory: a copy of ``store``'s identity.pem and
    peers.json, plus a record of that certificate (the thief accepts itself)."""
    from coinf.ble_protocol.tls_store import TlsStore, private_dir, write_private

    thief = TlsStore(arena.root / name)
    private_dir(thief.directory)
    write_private(thief.identity_file, store.ensure_identity().read_bytes())
    if store.peers_file.exists():
        write_private(thief.peers_file, store.peers_file.read_bytes())
    thief.pin("copied", thief.certificate_der())
    return thief


def _requests(bundle: Any) -> list[tuple[Any, bytes]]:
    """HELLO, STATUS, PROFILE and a REQUEST for the first candidate's tail."""
    import numpy as np

    from coinf.ble_protocol.messages import PROTOCOL_VERSION, MsgType, encode_json
    from coinf.ble_protocol.request import Request, encode_request
    from coinf.ble_protocol.tensors import encode_tensors

    cand = bundle.candidates[0]
    feeds = {t.name: np.zeros(t.shape, dtype=t.dtype) for t in cand.crossing}
    hello = {"protocol": PROTOCOL_VERSION, "bundle": bundle.identity, "role": "wearable"}
    return [(MsgType.HELLO, encode_json(hello)), (MsgType.STATUS, b""), (MsgType.PROFILE, b""),
            (MsgType.REQUEST, encode_request(Request.split(cand.id, bundle.candidates[-1].id, 0),
                                             encode_tensors(feeds)))]


async def _knock(address: str, store: Any, bundle: Any, times: int = 3) -> int:
    """Connect ``times`` times over TLS with ``store``'s key, each sending HELLO, STATUS,
    PROFILE and a REQUEST; the replies that came back (ERRORs included)."""
    from coinf.ble_protocol.loopback import connect_socket
    from coinf.ble_protocol.rpc import RpcClient
    from coinf.errors import CoinfError

    answered = 0
    for _ in range(times):
        try:
            rpc = RpcClient(await connect_socket(address, 5.0, tls=store))
        except CoinfError:
            continue
        try:
            for mtype, payload in _requests(bundle):
                try:
                    await rpc.request(mtype, payload, 5.0)
                except CoinfError as exc:
                    if not getattr(exc, "code", None) or not rpc.link.is_open:
                        break  # the link closed: nothing came back
                answered += 1
        finally:
            with contextlib.suppress(Exception):
                await rpc.close()
    return answered


@attacker("identity_copy_helper", "tcp", "a process that copied the helper's identity.pem "
          "connects to the helper as the helper (HELLO, STATUS, PROFILE, REQUEST)")
async def identity_copy_helper(arena: Arena) -> Outcome:
    thief = copy_of(arena, arena.helper_store, "thief-helper")
    assert thief.fingerprint == arena.helper_store.fingerprint  # the very same key
    before = arena.daemon.requests

    async def attack() -> Outcome:
        replied = await _knock(arena.address, thief, arena.bundle)
        served = replied + arena.daemon.requests - before
        return Outcome(served=served, tensors_read=0, results_accepted=0,
                       detail={"replies": replied, "tls_refused": arena.listener.tls_refused})

    return await arena.under_watch(attack())


@attacker("identity_copy_wearable", "tcp", "a process that copied the wearable's identity.pem "
          "serves on the helper's address with it; a wearable Session sends it frames")
async def identity_copy_wearable(arena: Arena) -> Outcome:
    from coinf.ble_protocol.listen import open_listener
    from coinf.cli.bench.attack_peers import _frames, _middle
    from coinf.handheld.daemon import HandheldDaemon

    thief = copy_of(arena, arena.wearable_store, "thief-wearable")
    # by design: the copy is the wearable to the helper paired with it (not in the figures)
    before = arena.daemon.requests
    as_wearable = await _knock(arena.address, thief, arena.bundle, times=1)
    as_wearable_served = arena.daemon.requests - before
    address = arena.address
    await arena.listener.aclose()  # the helper is down; the thief takes its port
    cid = _middle(arena.bundle)
    crossing = len(arena.bundle.candidate(cid).crossing)
    async with HandheldDaemon(arena.bundle) as fake, \
            open_listener(address, tls=thief) as fake_listener:
        fake.spawn(fake.serve_listener(fake_listener))
        frames, offloaded, why = await _frames(arena, arena.bundle, address, cid)
        return Outcome(served=fake.requests, tensors_read=fake.requests * crossing,
                       results_accepted=offloaded,
                       detail={"frames": frames, "finished_locally": frames - offloaded,
                               "thief_connections": fake.connections, "why": why[:200],
                               "as_the_wearable_to_its_helper": {
                                   "replies": as_wearable, "requests_served": as_wearable_served,
                                   "by_design": BY_DESIGN}})


__all__ = ["BY_DESIGN", "copy_of", "identity_copy_helper", "identity_copy_wearable"]
