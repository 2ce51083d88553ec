"""A Session given a helper it reaches over BLE (``wearable_link: ble:...``): this wearable's
GATT server on the emulated radio of a ``coinf radio`` process pairs with the helper, a real
``coinf handheld`` process, with ``LinkOptions.helper_ble_options``; the Session's own plan
sends frames to it over BLE, and when the helper dies mid-stream the frames finish on the
wearable and the plan leaves it out: none lost, none twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest
from coinf.convert.split import split_model
from coinf.device.profile import PI_ZERO_2W_POWER, DeviceProfile
from coinf.wearable.pipeline_config import load_helpers

from coinf import AsyncSession, LinkOptions, PlacementOptions, PlannerOptions, SessionOptions
from tests.ble_servers import WEARABLE_PAIRING
from tests.test_pipeline_ble import ble_pipeline
from tests.test_pipeline_run import frames, reference
from tests.test_pipeline_slices import LENET


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return split_model(LENET, tmp_path_factory.mktemp("sble") / "lenet")


def test_a_session_streams_to_a_ble_helper_and_replans_when_it_dies(bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pool = frames(bundle, 6)
    ref = reference(bundle, pool)

    async def main(config, procs) -> tuple[list, dict]:  # type: ignore[no-untyped-def]
        h1 = load_helpers(config)[:1]  # the BLE helper alone
        assert h1[0].over_ble
        opts = SessionOptions(
            placement=PlacementOptions(helpers=h1),
            link=LinkOptions(helper_ble_options=WEARABLE_PAIRING, timeout=20.0,
                             connect_timeout=20.0, max_backoff_s=30.0),
            # a wearable far slower than the helper: sending the frame pays even over BLE
            planner=PlannerOptions(objective="throughput", wearable_profile=DeviceProfile(
                "slow-wearable", "wearable", PI_ZERO_2W_POWER, gflops=0.001)))
        async with AsyncSession(bundle, opts) as sess:
            first = sess.strategies
            assert first is not None and first["chosen"] == "depth split", first["why"]

            async def feeds() -> AsyncIterator[dict[str, np.ndarray]]:
                for i in range(16):
                    if i == 8:
                        procs["h1"].kill()  # the BLE helper vanishes with frames in flight
                    yield pool[i % len(pool)]

            results = [r async for r in sess.astream(feeds(), depth=2)]
            return results, sess.strategies  # type: ignore[return-value]

    with ble_pipeline(bundle, tmp_path) as (config, procs):
        results, info = asyncio.run(asyncio.wait_for(main(config, procs), 90))
    assert [r.index for r in results] == list(range(16))  # every frame once, in order
    for r in results:
        np.testing.assert_allclose(r.value()[0], ref[r.index % len(pool)], rtol=1e-4,
                                   atol=1e-5)
    stats = [r.stats for r in results]
    assert stats[0] is not None and stats[0].hops and stats[0].hops[0]["device"] == "h1"
    assert any(s is not None and s.fallback for s in stats[8:])  # finished here when h1 died
    last = stats[-1]
    assert last is not None and last.strategy == "local"
    assert "h1" in info["left_out"] and info["history"][-1]["reason"].startswith("h1 failed")


def test_coinf_run_gives_its_ble_options_to_helpers_reached_over_ble(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from coinf.cli import build_parser
    from coinf.cli.commands.run import session_options
    from coinf.cli.passkey import write_passkey_file
    from coinf.errors import UserError

    def args(helpers: list[dict[str, str]]):  # type: ignore[no-untyped-def]
        config = tmp_path / "helpers.json"
        config.write_text(json.dumps({"helpers": helpers}))
        return build_parser("run").parse_args(
            ["run", str(tmp_path), "--helpers", str(config), "--keystore",
             str(tmp_path / "bonds.json"),
             "--passkey-file", write_passkey_file(tmp_path, 123456)])

    ble = {"name": "h1", "address": "tcp:127.0.0.1:9", "wearable_link": "ble:hci-socket:0"}
    opts = session_options(args([ble]))
    assert opts.link.helper_ble_options["passkey"] == 123456
    assert opts.link.helper_ble_options["keystore"] == str(tmp_path / "bonds.json")
    assert opts.link.transport_options == {}  # the handheld's link is not BLE
    with pytest.raises(UserError, match="or --helpers with a helper reached over BLE"):
        session_options(args([{"name": "h1", "address": "tcp:127.0.0.1:9"}]))
