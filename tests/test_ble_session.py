"""Session(transport="ble:...") end to end: wearable and handheld on their own bumble hosts, the
emulated radio in its own process (`coinf radio`)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
from coinf.ble_protocol.central import Central
from coinf.ble_protocol.radio import spawn
from coinf.handheld.daemon import HandheldDaemon

from coinf import LinkOptions, Session
from tests.ble_servers import HANDHELD_PAIRING, WEARABLE_PAIRING
from tests.bundles import fixed, make_tiny_bundle, reference


def test_session_over_ble_matches_the_whole_model(tmp_path) -> None:
    bundle = make_tiny_bundle(tmp_path / "tiny")
    wspec, hspec, stop_radio = spawn("pi-zero-2w", overrides=["time_scale=0.5"])
    stop = threading.Event()
    errors: list[BaseException] = []

    def handheld() -> None:
        async def main() -> None:
            try:
                async with Central(
                    "coinf-wearable", bundle_identity=bundle.identity, hci=hspec, timeout=20,
                    **HANDHELD_PAIRING,
                ) as central, HandheldDaemon(bundle) as daemon:
                    serving = daemon.start(await central.connect())
                    while not stop.is_set() and not serving.done():
                        await asyncio.sleep(0.05)
            except BaseException as exc:  # reported by the test below
                errors.append(exc)

        asyncio.run(main())

    thread = threading.Thread(target=handheld, daemon=True)
    thread.start()
    try:
        x = np.random.default_rng(3).standard_normal((1, 16)).astype(np.float32)
        link = LinkOptions(transport=f"ble:{wspec}", transport_options=WEARABLE_PAIRING,
                           timeout=60, fallback=False)
        with Session(bundle, fixed("c001", link=link)) as sess:
            (y,) = sess.run(None, {"x": x})
            stats = sess.last_run
            assert sess.core.connection.links_opened == 1
        np.testing.assert_allclose(y, reference(bundle, x), rtol=1e-5, atol=1e-6)
        assert stats is not None and not stats.local and stats.bytes_up > 0
    finally:
        stop.set()
        thread.join(30)
        stop_radio()
    assert not errors, errors
