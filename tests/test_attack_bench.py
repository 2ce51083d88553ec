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
