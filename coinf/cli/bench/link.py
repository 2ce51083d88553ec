"""``coinf bench link``: goodput of the full BLE protocol over the emulated radio.

A wearable (bumble GATT server) and a handheld (bleak on the bumble backend) connect through an
in-process :class:`~ble_protocol.radio.EmulatedRadio`, pair, handshake, then send ``--messages``
messages of ``--bytes`` bytes. Goodput = payload bytes / emulated seconds from the first chunk
handed to the link to the last message reassembled, per message; the median is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import secrets
from typing import Any

from coinf.cli import argtypes
from coinf.cli.bench import emit, median, options, progress


def register(parser: argparse.ArgumentParser) -> None:
    options.add_preset(parser)
    parser.add_argument("--bytes", type=argtypes.integer(1, 1 << 30), default=100_000,
                        help="message size in bytes")
    parser.add_argument("--messages", type=argtypes.positive_int, default=3,
                        help="messages per direction")
    parser.add_argument(
        "--direction",
        choices=["up", "down", "both"],
        default="up",
        help="up = wearable->handheld (notifications), down = handheld->wearable (writes)",
    )
    parser.add_argument(
        "--time-scale",
        type=argtypes.number(0, 100, lo_open=True),
        default=1.0,
        help="real seconds per emulated second (>1 = slow motion when the CPU cannot keep up)",
    )
    parser.add_argument("--set", action="append", metavar="FIELD=VALUE", help="radio override")
    options.add_json(parser)
    options.add_png(parser, "each message's goodput against the capacity")
    parser.set_defaults(func=run)


async def measure(
    preset: str,
    nbytes: int,
    messages: int,
    direction: str,
    time_scale: float,
    overrides: dict[str, Any],
) -> dict[str, Any]:
    from coinf.ble_protocol.central import Central
    from coinf.ble_protocol.messages import Message, MsgType
    from coinf.ble_protocol.peripheral import WearableServer
    from coinf.ble_protocol.radio import EmulatedRadio

    overrides = {**overrides, "time_scale": time_scale}
    async with EmulatedRadio(preset, **overrides) as radio:
        wspec, hspec = radio.specs
        mtu = radio.params.att_mtu
        # the emulated radio's explicit test path of pairing: a one-off passkey on both sides
        passkey = secrets.randbelow(1_000_000)
        server = WearableServer(wspec, bundle_identity="bench", mtu=mtu, passkey=passkey,
                                pairing_window_s=math.inf)
        await server.start()
        try:
            async with Central("coinf-wearable", bundle_identity="bench", hci=hspec,
                               mtu=mtu, passkey=passkey) as central:
                accept = asyncio.ensure_future(server.accept(60))
                try:
                    handheld = await central.connect()
                    wearable = await accept
                finally:
                    accept.cancel()
                payload = os.urandom(nbytes)
                rates: list[float] = []
                per_dir: dict[str, list[float]] = {}
                dirs = ["up", "down"] if direction == "both" else [direction]
                try:
                    for d in dirs:
                        src, dst = (wearable, handheld) if d == "up" else (handheld, wearable)
                        for i in range(messages):
                            t0 = radio.now()
                            await src.send(Message(MsgType.REQUEST, i + 1, payload))
                            got = await dst.receive()
                            dt = radio.now() - t0
                            if got.payload != payload:
                                raise RuntimeError("payload corrupted in transit")
                            rates.append(nbytes / dt)
                            per_dir.setdefault(d, []).append(round(nbytes / dt, 1))
                            progress(f"{d} message {i + 1}: {dt:.3f} s emulated, "
                                     f"{nbytes / dt:.0f} B/s")
                finally:
                    await handheld.close()
                    await wearable.close()
        finally:
            await server.close()
        capacity = radio.params.capacity_bps()
        goodput = median(rates)
        return {
            "preset": preset,
            "message_bytes": nbytes,
            "messages": len(rates),
            "goodput_bps": round(goodput, 1),
            "capacity_bps": round(capacity, 1),
            "efficiency": round(goodput / capacity, 4),
            "direction": direction,
            "message_bps": per_dir,
            "time_scale": time_scale,
            "att_mtu": mtu,
            "chunk_bytes": wearable.chunk_size,  # type: ignore[attr-defined]
            "radio": radio.params.describe(),
        }


def run(args: argparse.Namespace) -> int:
    from coinf.ble_protocol.radio import parse_overrides, preset
    from coinf.errors import UserError

    if args.bytes < 1 or args.messages < 1:
        raise UserError("--bytes and --messages must be >= 1")
    overrides = parse_overrides(args.set)
    preset(args.preset, **overrides)  # validate before starting anything
    options.check_png(args.png)
    result = asyncio.run(measure(args.preset, args.bytes, args.messages, args.direction,
                                 args.time_scale, overrides))
    if args.png:
        _plot(result, args.png)
        result["png"] = args.png
    emit(result)
    return 0


def _plot(result: dict[str, Any], path: str) -> None:
    """Each message's goodput, per direction, against the radio's formula capacity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for i, (d, rates) in enumerate(result["message_bps"].items()):
        ax.scatter([i] * len(rates), [r / 1000 for r in rates], s=20, zorder=3,
                   label=f"{d}: {len(rates)} messages of {result['message_bytes']:,} B")
    ax.axhline(result["capacity_bps"] / 1000, color="grey", ls="--", lw=1,
               label=f"capacity {result['capacity_bps'] / 1000:.1f} kB/s (formula)")
    ax.set_xticks(range(len(result["message_bps"])), list(result["message_bps"]))
    ax.set_xlim(-0.5, len(result["message_bps"]) - 0.5)
    ax.set_ylim(0, result["capacity_bps"] / 1000 * 1.15)
    ax.set_ylabel("goodput (kB/s)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"BLE link, {result['preset']}: efficiency {result['efficiency']:.3f} "
                 f"(ATT MTU {result['att_mtu']}, chunks of {result['chunk_bytes']} B)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
