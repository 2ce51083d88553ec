"""Keys as keys (docs/SECURITY.md): a device trusts only its pairing records, never its own
certificate, so a process that copied identity.pem gets nothing as that device; key files stay
this user's and private, and ``coinf doctor`` reports them. Real TLS, real daemons."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
from coinf.ble_protocol.bonds import BondStoreError, prepare_bond_store
from coinf.ble_protocol.listen import open_listener
from coinf.ble_protocol.loopback import connect_socket
from coinf.ble_protocol.rpc import RpcClient
from coinf.ble_protocol.socket_listener import SocketListener
from coinf.ble_protocol.tls_store import TlsStore, TlsStoreError, one_machine_env
from coinf.handheld.daemon import HandheldDaemon

from coinf.cli import main
from coinf.cli.commands.doctor import key_files_check
from coinf.errors import LinkClosed, UntrustedPeer
from tests.bundles import make_tiny_bundle, reference
from tests.test_listen import infer
from tests.tls_keys import pair

X = np.random.default_rng(5).standard_normal((1, 16)).astype(np.float32)
ROOT = hasattr(os, "getuid") and os.getuid() == 0


def fresh(directory: Path) -> TlsStore:
    store = TlsStore(directory)
    store.ensure_identity()
    return store


def copy_identity(store: TlsStore, directory: Path) -> TlsStore:
    """A thief's store: a copy of ``store``'s identity.pem, trusting that certificate."""
    thief = fresh(directory)
    shutil.copyfile(store.identity_file, thief.identity_file)
    thief = TlsStore(directory)
    thief.pin("copied", thief.certificate_der())
    return thief


def test_a_store_does_not_trust_its_own_certificate(tmp_path: Path) -> None:
    store = fresh(tmp_path / "a")
    assert not store.trusts(store.fingerprint) and not store.trusts_itself()
    other = fresh(tmp_path / "b")
    pair(store, other)
    assert store.trusts(other.fingerprint) and not store.trusts(store.fingerprint)
    store.pin("self", store.certificate_der())  # an explicit record: then it does
    assert store.trusts_itself()


def test_a_copied_key_is_not_let_in_as_the_device(tmp_path: Path) -> None:
    """Server side: a client presenting the helper's own certificate fails the TLS handshake
    (the helper has one paired wearable). Client side: a server presenting the wearable's own
    certificate is UntrustedPeer before a byte is sent. The paired wearable is served."""
    bundle = make_tiny_bundle(tmp_path / "b")
    helper, wearable = fresh(tmp_path / "helper"), fresh(tmp_path / "wearable")
    pair(helper, wearable)
    helper_copy = copy_identity(helper, tmp_path / "thief-h")
    wearable_copy = copy_identity(wearable, tmp_path / "thief-w")
    assert helper_copy.fingerprint == helper.fingerprint

    async def main_() -> None:
        async with HandheldDaemon(bundle) as daemon, \
                open_listener("tcp:127.0.0.1:0", tls=helper) as listener:
            assert isinstance(listener, SocketListener)
            daemon.spawn(daemon.serve_listener(listener))
            paired = RpcClient(await connect_socket(listener.address, tls=wearable))
            np.testing.assert_allclose(await infer(paired, bundle, X), reference(bundle, X),
                                       rtol=1e-5, atol=1e-6)
            await paired.close()
            with pytest.raises(LinkClosed):
                link = await connect_socket(listener.address, 5, tls=helper_copy)
                await link.receive()  # the server's alert ends the session
            for _ in range(500):
                if listener.tls_refused:
                    break
                await asyncio.sleep(0.01)
            assert listener.tls_refused == 1 and daemon.requests == 1
        async with open_listener("tcp:127.0.0.1:0", tls=wearable_copy) as fake:
            with pytest.raises(UntrustedPeer, match="not paired"):
                await connect_socket(fake.address, 5, tls=wearable)  # type: ignore[attr-defined]

    asyncio.run(main_())


def test_key_files_of_another_user_or_open_to_others(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    store = fresh(tmp_path / "tls")
    os.chmod(store.identity_file, 0o644)
    with caplog.at_level(logging.WARNING, "coinf.ble_protocol.tls_store"):
        TlsStore(store.directory).ensure_identity()
    assert stat.S_IMODE(os.stat(store.identity_file).st_mode) == 0o600
    assert any("may have been copied" in r.getMessage() for r in caplog.records)
    bonds = tmp_path / "bonds" / "w.json"
    prepare_bond_store(bonds)
    bonds.write_text("{}")
    os.chmod(bonds, 0o640)
    prepare_bond_store(bonds)
    assert stat.S_IMODE(os.stat(bonds).st_mode) == 0o600
    if not ROOT:  # only root can give a file away; the check is in _check_file either way
        return
    os.chown(store.identity_file, 65534, 65534)
    with pytest.raises(TlsStoreError, match="belongs to another user"):
        TlsStore(store.directory).ensure_identity()
    os.chown(bonds, 65534, 65534)
    with pytest.raises(BondStoreError, match="belongs to another user"):
        prepare_bond_store(bonds)


def test_doctor_reports_key_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COINF_TLS_DIR", str(tmp_path / "tls"))
    bonds = tmp_path / "bonds" / "wearable.json"
    assert key_files_check([str(bonds)])["summary"] == "no key files yet"
    store = fresh(tmp_path / "tls")
    prepare_bond_store(bonds)
    bonds.write_text("{}")
    os.chmod(bonds, 0o600)
    ok = key_files_check([str(bonds)])
    assert ok["status"] == "ok" and len(ok["files"]) == 2 and not ok["trusts_itself"]
    os.chmod(store.identity_file, 0o644)
    loose = key_files_check([str(bonds)])
    assert loose["status"] == "warn" and "0644" in loose["summary"]
    assert stat.S_IMODE(os.stat(store.identity_file).st_mode) == 0o644  # reported, not fixed
    os.chmod(store.identity_file, 0o600)
    store.pin("self", store.certificate_der())
    mine = key_files_check([str(bonds)])
    assert mine["status"] == "warn" and mine["trusts_itself"]
    assert "copies identity.pem" in mine["summary"]


def test_one_machine_stores_are_one_off(tmp_path: Path) -> None:
    before = os.environ.get("COINF_TLS_DIR")
    with one_machine_env() as store:
        assert os.environ["COINF_TLS_DIR"] == str(store.directory)
        assert store.trusts_itself()
        directory = store.directory
    assert os.environ.get("COINF_TLS_DIR") == before and not directory.exists()


def test_the_identity_copy_attackers_get_nothing(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bundle = make_tiny_bundle(tmp_path / "b")
    assert main(["bench", "attack", "--bundle", str(bundle.root), "--duration-s", "1",
                 "--attackers", "identity_copy_helper", "identity_copy_wearable"]) == 0
    got = json.loads(capsys.readouterr().out)["attackers"]
    for name in ("identity_copy_helper", "identity_copy_wearable"):
        row = got[name]
        assert (row["served"], row["tensors_read"], row["results_accepted"]) == (0, 0, 0), row
    helper = got["identity_copy_helper"]
    assert helper["replies"] == 0 and helper["tls_refused"] >= 1
    wearable = got["identity_copy_wearable"]
    assert wearable["finished_locally"] == wearable["frames"] > 0
    # by design (docs/SECURITY.md): the copy is the wearable to its paired helper
    assert wearable["as_the_wearable_to_its_helper"]["requests_served"] >= 1


DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_deployed_services_run_as_a_dedicated_user_with_a_private_store(tmp_path: Path) -> None:
    import subprocess

    pi = (DEPLOY / "pi" / "coinf-wearable.service").read_text()
    assert "User=@USER@" in pi and "Environment=COINF_TLS_DIR=@STATE@/tls" in pi
    assert "COINF_TLS_DIR=@STATE@/tls" in (DEPLOY / "pi" / "coinf-svc.sh").read_text()
    proc = subprocess.run(["bash", str(DEPLOY / "pi" / "provision.sh"), "--dry-run", "--wheel",
                           "coinf.whl", "--user", "coinf-test-nouser"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert ("+ install -d -m 0700 -o coinf-test-nouser -g coinf-test-nouser /var/lib/coinf/tls"
            in proc.stdout)
    unit = (DEPLOY / "handheld" / "coinf-handheld-system.service").read_text()
    for line in ("User=@USER@", "Environment=COINF_TLS_DIR=@STATE@/tls", "UMask=0077",
                 "ProtectHome=yes", "ReadWritePaths=@STATE@"):
        assert line in unit, line
    env = {**os.environ, "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(DEPLOY / "handheld" / "install.sh"), "--dry-run",
                           "--system", "Linux", "--dedicated-user", "coinf-hh-test", "--wheel",
                           "coinf.whl", "--bundle", "b"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    cmds = [line[2:] for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert cmds[0].startswith("useradd --system --home-dir /var/lib/coinf-hh-test")
    assert "install -d -m 0700 -o coinf-hh-test -g coinf-hh-test /var/lib/coinf-hh-test/tls" \
        in cmds
    assert cmds[-1] == "systemctl enable --now coinf-handheld.service"
    assert not any("--user" in c for c in cmds if c.startswith("systemctl"))


def test_trust_self_is_an_explicit_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    store_dir = str(tmp_path / "tls")
    assert main(["wifi", "trust-self", "--store", store_dir]) == 0
    assert "copies identity.pem" in capsys.readouterr().out
    assert TlsStore(store_dir).trusts_itself()
    assert main(["wifi", "revoke", "self", "--store", store_dir]) == 0
    assert not TlsStore(store_dir).trusts_itself()
