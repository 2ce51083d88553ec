"""Issue 40, part 4: bonds persist in private stores, `coinf doctor` lists them without key
material and revokes one; a revoked handheld is no longer served."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from coinf.ble_protocol.central import Central
from coinf.ble_protocol.peripheral import WearableServer
from coinf.ble_protocol.radio import EmulatedRadio

from coinf.errors import PairingError, PairingFailure
from tests.ble_servers import HANDHELD_PAIRING, WEARABLE_PAIRING

WEARABLE_ADDR, HANDHELD_ADDR = "C0:F1:00:00:00:01", "C0:F1:00:00:00:02"


def doctor(*args: str, cfg: Path) -> subprocess.CompletedProcess[str]:
    env = {"COINF_CONFIG": str(cfg / "policy.json"), "XDG_CONFIG_HOME": str(cfg),
           "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "coinf", "doctor", *args], capture_output=True,
                          text=True, timeout=120, env=env)


async def pair(wstore: str, hstore: str) -> None:
    async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio, \
            WearableServer(radio.specs[0], bundle_identity="b", keystore=wstore,
                           **WEARABLE_PAIRING) as server, \
            Central(WEARABLE_ADDR, bundle_identity="b", hci=radio.specs[1], keystore=hstore,
                    timeout=10, **HANDHELD_PAIRING) as central:
        accept = asyncio.ensure_future(server.accept(30))
        await (await central.connect()).close()
        await (await accept).close()


async def served(wstore: str, hstore: str) -> None:
    """The wearable restarted with its store, window closed: serves the stored bond only."""
    async with EmulatedRadio("ble5-2m", time_scale=0.2) as radio, \
            WearableServer(radio.specs[0], bundle_identity="b", keystore=wstore) as server, \
            Central(WEARABLE_ADDR, bundle_identity="b", hci=radio.specs[1], keystore=hstore,
                    timeout=10, **HANDHELD_PAIRING) as central:
        accept = asyncio.ensure_future(server.accept(30))
        try:
            await (await central.connect()).close()
            await (await accept).close()
        finally:
            accept.cancel()
            await asyncio.gather(accept, return_exceptions=True)


def test_doctor_lists_bonds_without_keys_and_revokes_one(tmp_path: Path) -> None:
    wstore, hstore = str(tmp_path / "w" / "bonds.json"), str(tmp_path / "h" / "bonds.json")
    asyncio.run(asyncio.wait_for(pair(wstore, hstore), 120))
    asyncio.run(asyncio.wait_for(served(wstore, hstore), 120))  # persisted on both sides
    stored = json.loads(Path(wstore).read_text())
    secrets = [k["value"] for ns in stored.values() for e in ns.values()
               for k in e.values() if isinstance(k, dict) and "value" in k]
    assert secrets  # the LTK and IRK are there, in hex

    listed = doctor("--json", "--keystore", wstore, "--keystore", hstore, cfg=tmp_path / "cfg")
    report = json.loads(listed.stdout)["checks"]["bonds"]
    assert report["status"] == "ok", report
    bonds = {b["address"]: b for s in report["stores"].values() for b in s["bonds"]}
    assert set(bonds) == {WEARABLE_ADDR, HANDHELD_ADDR}
    for bond in bonds.values():
        assert bond["key_type"] == "le-sc-authenticated" and bond["irk"]
        assert bond["paired_at"] and bond["paired_at"].endswith("Z")
    assert not any(secret in listed.stdout for secret in secrets)

    revoked = doctor("--revoke", HANDHELD_ADDR.lower(), "--keystore", wstore,
                     cfg=tmp_path / "cfg")
    assert revoked.returncode == 0, revoked.stderr
    assert f"revoked the bond with {HANDHELD_ADDR}" in revoked.stdout
    again = doctor("--revoke", HANDHELD_ADDR, "--keystore", wstore, cfg=tmp_path / "cfg")
    assert again.returncode == 2 and "no bond with" in again.stderr
    bad = doctor("--revoke", "nonsense", cfg=tmp_path / "cfg")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1

    # the wearable forgot the handheld: its stored key is refused, and with the window closed
    # re-pairing is refused too -> a typed, final error
    async def refused() -> PairingError | None:
        try:
            await asyncio.wait_for(served(wstore, hstore), 120)
        except PairingError as exc:
            return exc
        return None

    err = asyncio.run(refused())
    assert err is not None and err.reason == PairingFailure.BOND_LOST, err


def test_doctor_lists_the_wifi_peers_without_their_certificates(tmp_path: Path) -> None:
    from coinf.ble_protocol.tls_store import TlsStore

    mine, helper = TlsStore(tmp_path / "cfg" / "tls"), TlsStore(tmp_path / "helper")
    entry = mine.pin("phone", helper.certificate_der(), "tcp:10.0.0.7:7878")
    env = {"COINF_TLS_DIR": str(mine.directory), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
           "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "coinf", "doctor", "--json"],
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    report = json.loads(proc.stdout)
    peers = report["checks"]["wifi_peers"]["peers"]
    assert [(p["name"], p["fingerprint"], p["address"]) for p in peers] == [
        ("phone", entry.fingerprint, "tcp:10.0.0.7:7878")]
    assert "BEGIN" not in proc.stdout  # no certificate, let alone a key
