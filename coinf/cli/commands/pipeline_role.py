"""``coinf handheld --pipeline CONFIG --name NAME``: the helper's forward role, from the config."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from coinf.errors import UserError


def forwarder_for(args: argparse.Namespace) -> tuple[Callable[[Any, Any], Any], str]:
    """(a factory ``(bundle, emulation) -> Forwarder``, this helper's address in the config)."""
    from coinf.handheld.forward import Forwarder, Peer
    from coinf.wearable.pipeline import load_helpers

    if not args.pipeline or not args.name:
        raise UserError("a pipeline helper needs both --pipeline CONFIG and --name NAME")
    helpers = load_helpers(args.pipeline)
    names = [h.name for h in helpers]
    if args.name not in names:
        raise UserError(f"--name {args.name!r} is not in {args.pipeline} (helpers: "
                        f"{', '.join(names)})")
    own = next(h for h in helpers if h.name == args.name)
    peers = {h.name: Peer(h.name, h.address, h.channel) for h in helpers if h.name != args.name}

    def make(bundle: Any, emulation: Any) -> Forwarder:
        return Forwarder(bundle, args.name, peers, emulation=emulation)

    return make, own.address
