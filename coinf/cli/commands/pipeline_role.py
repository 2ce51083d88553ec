"""``coinf handheld --pipeline CONFIG --name NAME``: the helper's forward role, from the config."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from coinf.errors import UserError


def forwarder_for(args: argparse.Namespace) -> tuple[Callable[[Any, Any], Any], str]:
    """(a factory ``(bundle, emulation) -> Forwarder``, this helper's address in the config)."""
    from coinf.handheld.forward import Forwarder, Peer
    from coinf.wearable.pipeline_config import load_helpers

    if not args.pipeline or not args.name:
        raise UserError("a pipeline helper needs both --pipeline CONFIG and --name NAME")
    helpers = load_helpers(args.pipeline)
    names = [h.name for h in helpers]
    if args.name not in names:
        raise UserError(f"--name {args.name!r} is not in {args.pipeline} (helpers: "
                        f"{', '.join(names)})")
    own = next(h for h in helpers if h.name == args.name)
    listen = args.listen or (f"ble:{args.hci}" if args.hci else args.transport or "")
    if own.over_ble and not listen.startswith("ble"):
        # the wearable would wait at its GATT server for a central that never comes
        raise UserError(f"{args.pipeline} says the wearable reaches {args.name!r} over BLE "
                        f"(wearable_link {own.wearable_link!r}): give --listen ble:HCI (or "
                        f"--listen ble), so this helper connects to the wearable as a central; "
                        f"it also listens on {own.address} for its peers")
    peers = {h.name: Peer(h.name, h.address, h.channel, h.fingerprint, h.allow_insecure)
             for h in helpers if h.name != args.name}

    def make(bundle: Any, emulation: Any) -> Forwarder:
        return Forwarder(bundle, args.name, peers, emulation=emulation)

    return make, own.address


def check_announce(args: argparse.Namespace) -> None:
    """``--announce`` needs ``--name``; its companion flags need ``--announce``."""
    if args.announce and not args.name:
        raise UserError("--announce needs --name NAME: what the wearable and the other helpers "
                        "call this helper (1-32 of [A-Za-z0-9_-])")
    lone = [f for f, v in (("--speed-gflops", args.speed_gflops), ("--allow", args.allow),
                           ("--mdns-interface", args.mdns_interface)) if v]
    if lone and not args.announce:
        raise UserError(f"{lone[0]} is for --announce")
    if args.allow and args.pipeline:
        raise UserError("--allow chooses the announced helpers to forward to; with --pipeline "
                        "the peers are the config's")


def discovered_forwarder(args: argparse.Namespace) -> Callable[[Any, Any], Any]:
    """``--announce --name NAME`` without a config: a factory ``(bundle, emulation) ->
    Forwarder`` with no peers yet; the announcer keeps them to the helpers it finds."""
    from coinf.ble_protocol.request import valid_name
    from coinf.handheld.forward import Forwarder

    if not valid_name(args.name) or args.name in ("wearable", "handheld"):
        raise UserError(f"--name must be 1-32 of [A-Za-z0-9_-] and not wearable or handheld, "
                        f"got {args.name!r}")

    def make(bundle: Any, emulation: Any) -> Forwarder:
        return Forwarder(bundle, args.name, {}, emulation=emulation)

    return make
