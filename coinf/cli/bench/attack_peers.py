"""``bench attack``'s insiders and BLE attackers, registered in :data:`attack.ATTACKERS`.

* ``tampered_tail``: the helper's tail slice was changed after the split (its weights negated;
  the manifest, and so the bundle identity, unchanged), as the issue's probe pushed it. The
  helper software is honest, so what it reads is what a paired helper reads by design:
  ``tensors_read`` does not apply (None). What counts: ``served`` (RESULTs computed with the
  changed slice) and ``results_accepted`` (frames whose output came from it).
* ``replayed_result``: a paired helper gone bad that answers every request with the RESULT of
  its first one (inside TLS nobody else can replay). It reads what it is sent by design
  (``tensors_read`` None); ``results_accepted`` counts replays a wearable took as its output.
* ``ble_*``: the BLE attackers of :mod:`coinf.cli.bench.attack_ble` (an unpaired, a legacy and
  a Just Works central against the wearable; an impostor wearable against a bonded handheld),
  each on its own emulated radio.
"""

from __future__ import annotations

import shutil
from typing import Any

from coinf.cli.bench.attack_arena import ATTACKERS, Arena, Attacker, Outcome, attacker


async def _frames(arena: Arena, bundle: Any, address: str, cid: str) -> tuple[int, int, str]:
    """Run frames of ``bundle`` split at ``cid`` against ``address``: (frames, those whose
    output did not come from this wearable, the last fallback)."""
    from coinf.cli.sample import bundle_feeds
    from coinf.wearable.options import LinkOptions, PlacementOptions, SessionOptions
    from coinf.wearable.session import AsyncSession

    opts = SessionOptions(placement=PlacementOptions(split=cid), link=LinkOptions(
        transport=address, timeout=5.0, transport_options={"tls": arena.wearable_store}))
    frames = max(4, int(arena.duration_s / 0.25))
    offloaded, why = 0, ""
    async with AsyncSession(bundle, opts) as sess:
        for i in range(frames):
            await sess.run(None, bundle_feeds(bundle, i))
            run = sess.last_run
            if run is not None and not run.local:
                offloaded += 1
            elif run is not None:
                why = run.fallback or why
    return frames, offloaded, why


def _middle(bundle: Any) -> str:
    cands = [c for c in bundle.candidates if not (c.is_handheld_only or c.is_wearable_only)]
    return (cands[len(cands) // 2] if cands else bundle.candidates[0]).id


@attacker("tampered_tail", "tcp", "the helper's tail slice changed after the split (weights "
          "negated, same manifest and identity); a wearable Session sends it frames")
async def tampered_tail(arena: Arena) -> Outcome:
    import onnx
    from onnx import numpy_helper

    from coinf.ble_protocol.listen import open_listener
    from coinf.bundle import Bundle
    from coinf.handheld.daemon import HandheldDaemon

    root = arena.root.parent / "tampered"
    shutil.copytree(arena.bundle.root, root)
    cid = _middle(arena.bundle)
    tail = root / str(arena.bundle.candidate(cid).tail.file)
    model = onnx.load(str(tail))
    for init in model.graph.initializer:  # negate the first float weights
        arr = numpy_helper.to_array(init)
        if arr.dtype.kind == "f" and arr.size > 1:
            init.CopyFrom(numpy_helper.from_array(-arr, init.name))
            break
    onnx.save(model, str(tail))
    bad = Bundle.load(root)
    assert bad.identity == arena.bundle.identity  # the change does not show in the identity
    address = arena.address
    await arena.listener.aclose()  # the real helper restarts with the changed file
    async with HandheldDaemon(bad) as helper, \
            open_listener(address, tls=arena.helper_store) as listener:
        helper.spawn(helper.serve_listener(listener))
        frames, offloaded, why = await _frames(arena, arena.bundle, address, cid)
        return Outcome(served=helper.requests, tensors_read=None,
                       results_accepted=offloaded,
                       detail={"frames": frames, "finished_locally": frames - offloaded,
                               # a bundle split before slices had hashes cannot tell
                               "slice_hashes": bool(arena.bundle.candidate(cid).tail.sha256),
                               "why": why[:200]})


@attacker("replayed_result", "tcp", "a paired helper gone bad: every request gets the RESULT "
          "of its first; a wearable Session sends it frames")
async def replayed_result(arena: Arena) -> Outcome:
    from coinf.ble_protocol.listen import open_listener
    from coinf.handheld.daemon import HandheldDaemon, Reply

    class Replayer(HandheldDaemon):
        first: Reply | None = None

        def run(self, request: Any, blob: Any, cancel: Any = None) -> Reply:
            reply = super().run(request, blob, cancel)
            if Replayer.first is None:
                Replayer.first = reply
            return Replayer.first

    cid = _middle(arena.bundle)
    address = arena.address
    await arena.listener.aclose()
    async with Replayer(arena.bundle) as helper, \
            open_listener(address, tls=arena.helper_store) as listener:
        helper.spawn(helper.serve_listener(listener))
        frames, offloaded, why = await _frames(arena, arena.bundle, address, cid)
        # the first frame's RESULT is genuine; every later one is a replay
        replays_taken = max(0, offloaded - 1)
        return Outcome(served=0, tensors_read=None,
                       results_accepted=replays_taken,
                       detail={"frames": frames, "genuine_first": int(offloaded >= 1),
                               "replays_sent": max(0, helper.requests - 1),
                               "finished_locally": frames - offloaded, "why": why[:200]})


def _ble(name: str, fn: Any, doc: str) -> None:
    async def run(arena: Arena) -> Outcome:
        row = await fn()
        return Outcome(row["served"], row["tensors_read"], row["results_accepted"],
                       float(row["lockout_s"]), {"connections": row.get("connections", 0)})

    ATTACKERS[name] = Attacker(name, "ble", doc, run)


def register_ble() -> None:
    from coinf.cli.bench import attack_ble

    for name, fn in attack_ble.ATTACKERS.items():
        _ble(name.replace("-", "_"), fn, (fn.__doc__ or name).strip().splitlines()[0])


register_ble()

__all__ = ["register_ble", "replayed_result", "tampered_tail"]
