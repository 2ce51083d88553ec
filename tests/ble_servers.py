"""Wearable GATT servers for tests: ``accept_link`` starts one (per call) and returns the next
handheld's link; ``close_servers`` closes every server this module started."""

from __future__ import annotations

import math
from typing import Any

from coinf.ble_protocol.link import Link
from coinf.ble_protocol.peripheral import WearableServer

#: The explicit test path of pairing: a fixed passkey on both sides, the wearable's pairing window
#: always open. Real wearables show a random passkey and accept new bonds only in a window.
TEST_PASSKEY = 123456
WEARABLE_PAIRING: dict[str, Any] = {"passkey": TEST_PASSKEY, "pairing_window_s": math.inf}
HANDHELD_PAIRING: dict[str, Any] = {"passkey": TEST_PASSKEY}

_started: list[WearableServer] = []


def cli_pairing(tmp: Any, role: str) -> list[str]:
    """The command-line spelling of the test path of pairing for ``role`` (a ``coinf handheld``
    or ``coinf run`` process): the test passkey in a 0600 file, and a bond store in ``tmp``."""
    import os

    from coinf.cli.passkey import write_passkey_file

    directory = os.path.join(os.fspath(tmp), f"pairing-{role}")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return ["--passkey-file", write_passkey_file(directory, TEST_PASSKEY),
            "--keystore", os.path.join(directory, "bonds", f"{role}.json")]


async def accept_link(spec: str, *, bundle_identity: str, timeout: float | None = None,
                      **options: Any) -> Link:
    options = {**WEARABLE_PAIRING, **options}
    server = WearableServer(spec, bundle_identity=bundle_identity, **options)
    _started.append(server)
    await server.start()
    return await server.accept(timeout)


async def close_servers() -> None:
    while _started:
        await _started.pop().close()
