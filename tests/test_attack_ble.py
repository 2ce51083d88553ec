"""Issue 40, part 6 (BLE): the attackers of `coinf bench attack` get nothing, and the bonded
handheld is never locked out (bumble's real SMP over the emulated radio)."""

from __future__ import annotations

import asyncio

import pytest

from coinf.cli.bench.attack_ble import ATTACKERS


@pytest.mark.parametrize("name", sorted(ATTACKERS))
def test_attacker_gets_nothing(name: str) -> None:
    row = asyncio.run(asyncio.wait_for(ATTACKERS[name](rounds=2), 240))
    assert set(row) >= {"attacker", "served", "tensors_read", "results_accepted", "lockout_s"}
    assert (row["served"], row["tensors_read"], row["results_accepted"]) == (0, 0, 0), row
    assert row["lockout_s"] == 0, row  # no failed attempt of the bonded handheld at all
    if name != "ble-impostor-wearable":
        assert row["connections"] >= 1, row  # the attack did reach the wearable
    else:
        assert row["connections"] == 0, row  # the handheld never went to the impostor
