"""``coinf bench attack`` runs its attackers against real daemons and reports what they got:
every attacker nothing, and the registry takes new attackers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coinf.cli import main
from coinf.cli.bench.attack import ATTACKERS, Arena, Outcome, attacker
from tests.bundles import make_tiny_bundle


def test_the_tcp_attackers_get_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    seen: list[str] = []

    @attacker("probe_only", "tcp", "a test entry: the paired device is watched throughout")
    async def probe_only(arena: Arena) -> Outcome:
        seen.append(arena.address)
        return await arena.under_watch(_nothing())

    try:
        assert main(["bench", "attack", "--bundle", str(bundle.root), "--duration-s", "1",
                     "--attackers", "unauthenticated_tcp", "squatter", "connection_flood",
                     "probe_only"]) == 0
    finally:
        ATTACKERS.pop("probe_only")
    out = json.loads(capsys.readouterr().out)
    got = out["attackers"]
    assert set(got) == {"unauthenticated_tcp", "squatter", "connection_flood", "probe_only"}
    for name, row in got.items():
        assert (row["served"], row["tensors_read"], row["results_accepted"]) == (0, 0, 0), name
    assert got["squatter"]["finished_locally"] == got["squatter"]["frames"] > 0
    assert got["connection_flood"]["connections"] > 0
    assert seen and seen[0].startswith("tcp:127.0.0.1:")


async def _nothing() -> Outcome:
    import asyncio

    await asyncio.sleep(0.3)
    return Outcome()


def test_a_tampered_tail_and_a_replayed_result_are_never_outputs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The helper's tail changed on disk after the split (same identity), and a paired helper
    replaying its first RESULT: every frame finishes on the wearable, none of theirs is used."""
    from coinf.convert.split import split_model
    from coinf.models import zoo

    root = tmp_path / "lenet"
    split_model(zoo.committed_path("lenet_digits"), root)  # records each slice's SHA-256
    assert main(["bench", "attack", "--bundle", str(root), "--duration-s", "1",
                 "--attackers", "tampered_tail", "replayed_result"]) == 0
    got = json.loads(capsys.readouterr().out)["attackers"]
    tampered, replay = got["tampered_tail"], got["replayed_result"]
    assert tampered["slice_hashes"] and tampered["served"] == tampered["results_accepted"] == 0
    assert tampered["finished_locally"] == tampered["frames"] > 0
    assert "tail_failed" in tampered["why"]
    assert replay["genuine_first"] == 1 and replay["replays_sent"] >= 1
    assert replay["results_accepted"] == 0 and "nonce" in replay["why"]
    assert replay["finished_locally"] == replay["frames"] - 1
    assert tampered["tensors_read"] is None and replay["tensors_read"] is None


def test_the_ble_attackers_are_registered() -> None:
    ble = {n for n, a in ATTACKERS.items() if a.link == "ble"}
    assert ble >= {"ble_unpaired_central", "ble_legacy_central", "ble_just_works_central",
                   "ble_impostor_wearable", "ble_rotating_flood", "ble_failed_pairing_injection",
                   "ble_tracking"}
    assert ATTACKERS["wifi_pair_hold"].link == "tcp"
