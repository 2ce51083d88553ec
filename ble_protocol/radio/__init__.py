"""Emulated BLE radio: bumble controllers on a link with connection-event timing.

In-process (tests, benches)::

    async with EmulatedRadio("pi-zero-2w", time_scale=0.2) as radio:
        wearable_spec, handheld_spec = radio.specs   # "tcp-client:127.0.0.1:PORT"

Cross-process (``make demo``): ``spawn("pi-zero-2w")`` starts ``coinf radio`` in a subprocess and
returns the two HCI transport specs plus a ``stop`` callable.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from coinf.ble_protocol.radio.params import (
    PRESETS,
    RadioError,
    RadioParams,
    parse_overrides,
    preset,
)

__all__ = [
    "PRESETS",
    "EmulatedRadio",
    "RadioError",
    "RadioParams",
    "parse_overrides",
    "preset",
    "spawn",
]

SIDES = ("wearable", "handheld")


class EmulatedRadio:
    """A :class:`~ble_protocol.radio.model.RadioLink` with one controller per side, each served
    to a host over a local TCP HCI transport (H4 framing, as bumble's ``tcp-client`` expects)."""

    def __init__(
        self,
        params: RadioParams | str = "pi-zero-2w",
        host: str = "127.0.0.1",
        ports: tuple[int, int] = (0, 0),
        extra_hosts: int = 0,
        **overrides: Any,
    ) -> None:
        self.params = preset(params, **overrides) if isinstance(params, str) else params
        self.host = host
        self.ports = list(ports) + [0] * extra_hosts
        self.sides = list(SIDES) + [f"extra{i + 1}" for i in range(extra_hosts)]
        self.link: Any = None
        self.controllers: dict[str, Any] = {}
        self._transports: list[Any] = []
        self._watchdog: asyncio.Task[None] | None = None

    @property
    def specs(self) -> tuple[str, str]:
        """(wearable HCI spec, handheld HCI spec)."""
        return self.spec("wearable"), self.spec("handheld")

    def spec(self, side: str) -> str:
        """HCI transport spec of one side: wearable, handheld, extra1, extra2..."""
        return f"tcp-client:{self.host}:{self.ports[self.sides.index(side)]}"

    async def start(self) -> EmulatedRadio:
        from bumble.transport.tcp_server import open_tcp_server_transport_with_socket
        from coinf.ble_protocol.radio.model import RadioController, RadioLink

        self.link = RadioLink(self.params)
        for i, side in enumerate(self.sides):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # HCI packets are small: without TCP_NODELAY, Nagle + the host's delayed ACK held a
            # packet sent right after another for ~40 ms (accepted sockets inherit the option).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock.bind((self.host, self.ports[i]))
            except OSError as exc:
                sock.close()
                raise RadioError(f"cannot listen on {self.host}:{self.ports[i]}: {exc}") from None
            self.ports[i] = sock.getsockname()[1]
            transport = await open_tcp_server_transport_with_socket(sock)
            self._transports.append(transport)
            self.controllers[side] = RadioController(
                f"{side}-controller",
                self.link,
                host_source=transport.source,
                host_sink=transport.sink,
                public_address=f"F0:F1:F2:F3:F4:{0xA0 + i:02X}",
            )
        self._watchdog = asyncio.get_running_loop().create_task(self._supervise())
        return self

    async def _supervise(self) -> None:
        """A host whose HCI socket closed (its process died) leaves a silent device: after the
        supervision timeout its peers' controllers report the connection lost."""
        from bumble import hci

        timeout = self.params.supervision_ms / 1000.0 * self.params.time_scale  # real seconds
        gone_since: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(0.05, timeout / 4))
            for side, transport in zip(self.sides, self._transports, strict=True):
                attached = transport.sink.transport is not None
                if attached:
                    gone_since.pop(side, None)
                    continue
                since = gone_since.setdefault(side, loop.time())
                controller = self.controllers[side]
                if loop.time() - since >= timeout and controller.le_connections:
                    controller.drop_all(hci.HCI_ErrorCode.CONNECTION_TIMEOUT_ERROR)

    async def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
            self._watchdog = None
        for t in self._transports:
            with contextlib.suppress(Exception):  # the hosts attached now lose their radio
                if t.sink.transport is not None:
                    t.sink.transport.close()
            with contextlib.suppress(Exception):
                t.server.close()
            with contextlib.suppress(Exception):
                await t.close()
        self._transports.clear()

    def now(self) -> float:
        return float(self.link.now())

    async def __aenter__(self) -> EmulatedRadio:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def spawn(
    preset_name: str = "pi-zero-2w", overrides: list[str] | None = None, timeout: float = 20.0
) -> tuple[str, str, Callable[[], None]]:
    """Run ``coinf radio`` in a subprocess; returns (wearable spec, handheld spec, stop)."""
    cmd = [
        sys.executable,
        "-m",
        "coinf",
        "radio",
        "--preset",
        preset_name,
        "--listen",
        "127.0.0.1:0",
    ]
    for item in overrides or []:
        cmd += ["--set", item]
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    specs: dict[str, str] = {}
    timer = threading.Timer(timeout, proc.kill)  # a hung start-up cannot block the caller
    timer.start()
    try:
        while len(specs) < 2:
            line = proc.stdout.readline()
            if not line:
                proc.kill()
                proc.wait()
                raise RadioError(
                    f"radio process did not start within {timeout:.0f} s "
                    f"(exit code {proc.returncode})"
                )
            key, _, value = line.strip().partition("=")
            if key in SIDES:
                specs[key] = value
    finally:
        timer.cancel()

    return specs["wearable"], specs["handheld"], lambda: stop_process(proc)


def stop_process(proc: subprocess.Popen[Any], timeout: float = 5.0) -> None:
    """Terminate an emulated radio's (or air's) process; kill it if it does not stop."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
