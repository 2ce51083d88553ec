"""``coinf doctor [--json]``: check what decides this device's behaviour, on either side.

* the links this device has (BLE when a controller answered, Wi-Fi when a wireless interface is
  up: what ``coinf plan --links`` chooses among);
* the Bluetooth controller and its LE features, read from the controller (``--hci SPEC``, or
  ``hci-socket:N`` for the kernel's first controller; ``--hci-dump FILE`` decodes recorded
  Command Complete events, one hex packet per line): Data Length Extension, 2M PHY, max LE ACL
  data length -> the matching radio preset;
* onnxruntime / LiteRT versions, and whether one is known to break the wearable;
* free memory against the wearable's memory budget; the CPU frequency governor;
* the bond stores (``coinf wearable pair`` / ``coinf handheld pair``): every bond, with the peer's
  identity address, the store's role, the key type and when it was made (never key material);
  the Wi-Fi devices paired with ``coinf wifi pair`` (name, fingerprint, address, when; revoked
  with ``coinf wifi revoke``); the key files (``identity.pem``, ``peers.json``, the bond
  stores: each this user's, 0600, in a 0700 directory; warns when a pairing record names this
  device's own certificate, docs/SECURITY.md); and the bundle's identity.

Each check is ``ok``, ``warn`` or ``fail``; the exit code is 1 when any check fails, else 0.

``coinf doctor --revoke ADDRESS`` removes the bond with that peer from the bond stores (the
default ones, or ``--keystore FILE``) instead of checking: the peer must pair again. A running
``coinf wearable`` / ``coinf handheld`` keeps the bond it loaded until it restarts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import re
import sys
from pathlib import Path
from typing import Any

from coinf.cli import argtypes
from coinf.errors import AdapterError, CoinfError, UserError

DEFAULT_BUNDLE = "/var/lib/coinf/bundle"


def _check(status: str, summary: str, **facts: Any) -> dict[str, Any]:
    return {"status": status, "summary": summary, **facts}


def controller_check(hci: str | None, dump: str | None, timeout: float) -> dict[str, Any]:
    from coinf.ble_protocol.controller import (
        local_controllers,
        matching_preset,
        parse_responses,
        read_controller,
    )

    raws: list[bytes] = []
    if dump:
        try:
            lines = Path(dump).read_text().split()
            raws = [bytes.fromhex(x) for x in lines]
            info = parse_responses(raws)
        except (OSError, ValueError) as exc:
            raise UserError(f"--hci-dump {dump}: {exc} (expected one HCI event in hex per line, "
                            f"as `coinf doctor --json` records under controller.raw)") from None
        source = f"recorded ({dump})"
    else:
        spec = hci
        if spec is None:
            found = local_controllers()
            if not found:
                where = ("the kernel lists no Bluetooth controller (/sys/class/bluetooth is "
                         "empty)" if sys.platform.startswith("linux") else
                         f"{platform.system()} has no HCI socket")
                return _check("warn", f"no Bluetooth controller found: {where}; on a Pi Zero 2 W "
                              f"check that config.txt has no dtoverlay=disable-bt and that "
                              f"hciuart is running; elsewhere pass --hci usb:0 for a dongle",
                              present=False)
            spec = f"hci-socket:{found[0].removeprefix('hci')}"
        try:
            info, raws = asyncio.run(read_controller(spec, timeout))
        except AdapterError as exc:
            return _check("warn", f"{exc}; with bluetoothd running, stop it first (sudo "
                          f"systemctl stop bluetooth) or run as the coinf service user, which "
                          f"has CAP_NET_ADMIN", present=True, hci=spec)
        source = spec
    name, overrides, why = matching_preset(info)
    summary = (f"{info.company or 'controller'}, HCI {info.hci_version or '?'}; DLE "
               f"{_yn(info.data_length_extension)}, 2M PHY {_yn(info.le_2m_phy)}, max LE ACL "
               f"data {info.max_acl_data_length or '?'} B -> radio preset {name} ({why})")
    return _check("ok", summary, present=True, source=source, preset=name,
                  preset_overrides=overrides, features=info.to_json(),
                  raw=[r.hex() for r in raws])


def wifi_interfaces(root: Path = Path("/sys/class/net")) -> list[dict[str, str]]:
    """The kernel's wireless interfaces (those with a ``wireless`` or ``phy80211`` entry), each
    with its operational state (``up``, ``down``, ``dormant``...)."""
    out = []
    try:
        names = sorted(p.name for p in root.iterdir())
    except OSError:
        return []
    for name in names:
        d = root / name
        if not ((d / "wireless").exists() or (d / "phy80211").exists()):
            continue
        try:
            state = (d / "operstate").read_text().strip() or "unknown"
        except OSError:
            state = "unknown"
        out.append({"interface": name, "state": state})
    return out


def links_check(controller: dict[str, Any], net_root: Path = Path("/sys/class/net")
                ) -> dict[str, Any]:
    """Which links this device has for the planner to choose from (``coinf plan --links``):
    BLE when a controller answered, Wi-Fi when a wireless interface is up."""
    links: list[str] = []
    parts: list[str] = []
    if controller.get("present") and controller.get("status") == "ok":
        links.append("ble")
        parts.append(f"ble (radio preset {controller.get('preset')})")
    wifi = wifi_interfaces(net_root)
    up = [w for w in wifi if w["state"] in ("up", "unknown")]
    if up:
        links.append("wifi")
        parts.append(f"wifi ({', '.join(w['interface'] for w in up)})")
    down = [w for w in wifi if w not in up]
    if down:
        parts.append("wireless interface(s) not up: " + ", ".join(
            f"{w['interface']} {w['state']}" for w in down))
    if not links:
        return _check("warn", "no link to a handheld: no Bluetooth controller answered and no "
                      "wireless interface is up" + (f" ({parts[0]})" if parts else ""),
                      links=links, wifi=wifi)
    return _check("ok", "; ".join(parts) + f" -> coinf plan --links {','.join(links)}",
                  links=links, wifi=wifi)


def _yn(v: bool | None) -> str:
    return "?" if v is None else ("yes" if v else "no")


def runtime_check() -> dict[str, Any]:
    from coinf.device.runtimes import installed_versions, known_bad

    versions = installed_versions()
    bad = {d: why for d, v in versions.items() if (why := known_bad(d, v))}
    shown = ", ".join(f"{d} {v}" for d, v in versions.items() if v)
    if bad:
        return _check("fail", "; ".join(f"{d} {versions[d]}: {why}" for d, why in bad.items()),
                      versions=versions, known_bad=bad)
    if versions.get("onnxruntime") is None:
        return _check("fail", "onnxruntime is not installed (pip install the coinf wheel)",
                      versions=versions)
    return _check("ok", shown, versions=versions)


def memory_check(role: str | None) -> dict[str, Any]:
    from coinf.device.profile import load_or_default
    from coinf.wearable.planner.memory import budget_of

    info = _meminfo()
    budget = None
    with contextlib.suppress(CoinfError):
        budget = budget_of(load_or_default("wearable")) if role != "handheld" else None
    if not info:
        return _check("warn", "free memory unknown (no /proc/meminfo)", budget_mb=budget)
    total, avail = info["MemTotal"] / 1024, info.get("MemAvailable", info["MemFree"]) / 1024
    text = f"{avail:.0f} MB available of {total:.0f} MB"
    status = "ok"
    if budget is not None:
        text += f"; the planner's head budget is {budget:g} MB"
        if budget > avail:
            status = "warn"
            text += (f", more than is available: lower it (`coinf profile --memory-budget "
                     f"{max(avail * 0.8, 1):.0f}`) or free memory")
    return _check(status, text, total_mb=round(total, 1), available_mb=round(avail, 1),
                  budget_mb=budget)


def _meminfo() -> dict[str, int]:
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0])  # kB
    return out


def governor_check() -> dict[str, Any]:
    govs = {}
    for path in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor")):
        try:
            govs[path.parts[-3]] = path.read_text().strip()
        except OSError:
            continue
    if not govs:
        return _check("ok", "no cpufreq governor exposed (a VM, or a fixed clock)", governors={})
    kinds = sorted(set(govs.values()))
    status = "ok" if kinds == ["performance"] else "warn"
    text = f"{', '.join(kinds)} on {len(govs)} CPUs"
    if status == "warn":
        text += ("; head times vary with the clock: `performance` keeps them as profiled "
                 "(deploy/pi/provision.sh sets it)")
    return _check(status, text, governors=govs)


def bond_stores(keystores: list[str] | None) -> list[tuple[str, Path]]:
    """(role, path) of the stores to look at: ``--keystore`` files (role "file"), else the
    default wearable and handheld stores."""
    from coinf.cli.commands.pair import default_bond_store

    if keystores:
        return [("file", Path(k)) for k in keystores]
    return [(role, Path(default_bond_store(role))) for role in ("wearable", "handheld")]


def bonds_check(keystores: list[str] | None = None) -> dict[str, Any]:
    from coinf.ble_protocol.bonds import BondStoreError, list_bonds

    stores: dict[str, dict[str, Any]] = {}
    lines = []
    for role, path in bond_stores(keystores):
        if not path.is_file():
            continue
        try:
            bonds = list_bonds(path)
        except BondStoreError as exc:
            return _check("warn", str(exc), stores=stores)
        key = role if role != "file" else str(path)
        stores[key] = {"file": str(path), "peers": len(bonds),
                       "bonds": [b.to_json() for b in bonds]}
        peer = {"wearable": "handheld", "handheld": "wearable"}.get(role, "peer")
        lines += [f"{role}: {peer} {b.address} ({b.key_type}, paired "
                  f"{b.paired_at or 'at an unknown time'})" for b in bonds]
    if not any(s["peers"] for s in stores.values()):
        return _check("warn", "no bonds: pair first (`coinf wearable pair` on the Pi, `coinf "
                      "handheld pair` on the laptop)", stores=stores)
    weak = [line for line in lines if "le-sc-authenticated" not in line]
    summary = "; ".join(lines)
    if weak:
        return _check("warn", f"{summary}; bonds other than le-sc-authenticated are never "
                      "served: revoke them (`coinf doctor --revoke ADDRESS`)", stores=stores)
    return _check("ok", summary, stores=stores)


def wifi_peers_check() -> dict[str, Any]:
    """The Wi-Fi (TLS) devices this one has paired with (``coinf wifi pair``); never keys."""
    import datetime

    from coinf.ble_protocol.tls_store import TlsStoreError, default_store, default_tls_dir

    if not default_tls_dir().exists():
        return _check("ok", "no Wi-Fi identity yet (made on first use; pair helpers with "
                      "`coinf wifi pair`)", peers=[])
    try:
        peers = default_store().peers()
    except TlsStoreError as exc:
        return _check("warn", str(exc), peers=[])
    rows = [{"name": p.name, "fingerprint": p.fingerprint, "address": p.address,
             "added": datetime.datetime.fromtimestamp(p.added, datetime.UTC).isoformat(
                 timespec="seconds") if p.added else None} for p in peers]
    if not rows:
        return _check("ok", "no Wi-Fi peers paired (`coinf wifi pair`)", peers=rows)
    text = "; ".join(f"{p.name} {p.fingerprint[:19]}... {p.address}".rstrip() for p in peers)
    return _check("ok", f"{text} (revoke with `coinf wifi revoke NAME`)", peers=rows)


def key_files_check(keystores: list[str] | None = None) -> dict[str, Any]:
    """identity.pem, peers.json and the bond stores: files of this user, 0600, in 0700
    directories; and whether a pairing record names this device's own certificate (then a
    copy of identity.pem is trusted as a peer). Reports, changes nothing."""
    from coinf.ble_protocol.tls_store import (
        IDENTITY_FILE,
        PEERS_FILE,
        TlsStoreError,
        default_store,
        default_tls_dir,
    )
    from coinf.files import privacy_problems

    tls = default_tls_dir()
    files = [tls / IDENTITY_FILE, tls / PEERS_FILE, *(p for _, p in bond_stores(keystores))]
    present = [f for f in files if f.exists()]
    problems = [p for f in present for p in privacy_problems(f)]
    self_trusted = False
    if (tls / IDENTITY_FILE).exists() and not problems:
        with contextlib.suppress(TlsStoreError, OSError):
            self_trusted = default_store().trusts_itself()
    extra = {"files": [str(f) for f in present], "problems": problems,
             "trusts_itself": self_trusted}
    if problems:
        return _check("warn", "; ".join(dict.fromkeys(problems)) + ": the next coinf command "
                      "tightens a file to 0600 (a key readable by others may have been copied: "
                      "make a new identity and pair again); `chmod 700` a directory", **extra)
    if self_trusted:
        return _check("warn", f"{tls / PEERS_FILE} has a record of this device's own "
                      "certificate: any process that copies identity.pem is trusted as a peer; "
                      "revoke it (`coinf wifi revoke NAME`) unless two roles here share the "
                      "store on purpose", **extra)
    if not present:
        return _check("ok", "no key files yet", **extra)
    return _check("ok", f"{len(present)} key files, each 0600 and this user's, in private "
                  "directories", **extra)


def revoke(address: str, keystores: list[str] | None) -> int:
    """``--revoke ADDRESS``: remove that peer's bond from the stores."""
    from coinf.ble_protocol.bonds import revoke_bond

    if not re.fullmatch(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}", address):
        raise UserError(f"--revoke {address}: expected a Bluetooth address (AA:BB:CC:DD:EE:FF)")
    stores = [(role, path) for role, path in bond_stores(keystores) if path.is_file()]
    done = [str(path) for _, path in stores if revoke_bond(path, address)]
    if not done:
        where = ", ".join(str(p) for _, p in stores) or "no bond store"
        raise UserError(f"--revoke {address}: no bond with it in {where}")
    print(f"coinf doctor: revoked the bond with {address.upper()} ({', '.join(done)}); it must "
          f"pair again", flush=True)
    return 0


def bundle_check(path: str | None) -> dict[str, Any]:
    from coinf.bundle import Bundle

    given = path is not None
    path = path or DEFAULT_BUNDLE
    if not Path(path).exists():
        if given:
            return _check("fail", f"no bundle at {path}")
        return _check("warn", f"no bundle at {DEFAULT_BUNDLE} (pass --bundle, or `coinf push`)")
    try:
        b = Bundle.load(path)
    except CoinfError as exc:
        return _check("fail", f"bundle {path} does not load: {exc}")
    return _check("ok", f"{path}: {b.model_file}, {len(b.candidates)} candidates, identity "
                  f"{b.identity}", identity=b.identity, candidates=len(b.candidates))


def run(args: argparse.Namespace) -> int:
    from coinf.device.profile import detect_role

    if args.revoke:
        return revoke(args.revoke, args.keystore)
    if not args.timeout > 0:
        raise UserError("--timeout must be > 0 s")
    role = args.role or detect_role()
    controller = controller_check(args.hci, args.hci_dump, args.timeout)
    checks = {
        "controller": controller,
        "links": links_check(controller),
        "runtime": runtime_check(),
        "memory": memory_check(role),
        "cpu_governor": governor_check(),
        "bonds": bonds_check(args.keystore),
        "key_files": key_files_check(args.keystore),  # before anything tightens them
        "wifi_peers": wifi_peers_check(),
        "bundle": bundle_check(args.bundle),
    }
    report = {"role": role, "machine": platform.machine(), "python": platform.python_version(),
              "checks": checks}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"coinf doctor: {role or 'unknown role'} on {platform.machine()}, Python "
              f"{platform.python_version()}")
        for name, c in checks.items():
            print(f"[{c['status']:>4}] {name}: {c['summary']}")
    return 1 if any(c["status"] == "fail" for c in checks.values()) else 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hci", type=argtypes.connect_address,
                        help="read the controller on this bumble HCI transport "
                                      "(hci-socket:0, usb:0, tcp-client:HOST:PORT); default: "
                                      "the kernel's first controller")
    parser.add_argument("--hci-dump", metavar="FILE", type=argtypes.existing_file,
                        help="decode recorded HCI Command Complete events (hex, one per line) "
                             "instead of reading a controller")
    parser.add_argument("--bundle", help=f"bundle to identify (default {DEFAULT_BUNDLE})")
    parser.add_argument("--role", choices=("wearable", "handheld"), default=None,
                        help="default: detected (a Raspberry Pi is the wearable)")
    parser.add_argument("--timeout", type=argtypes.seconds, default=5.0,
                        help="seconds to wait for the controller per command (default 5)")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--keystore", action="append", metavar="FILE",
                        help="the bond store(s) to list or revoke in (default: this machine's "
                        "wearable and handheld stores)")
    parser.add_argument("--revoke", metavar="ADDRESS",
                        help="remove the bond with this peer (it must pair again) and exit")
    parser.set_defaults(func=run)
