"""The wearable's pairing policy (docs/PROTOCOL.md, "Pairing and security"): only LE Secure
Connections with MITM protection (passkey entry or numeric comparison) gives a usable key.

:class:`SecurePairingSession` refuses any other pairing request before bumble's SMP state machine
starts; :func:`strong_keys` is the test every coinf characteristic access applies to the key an
encrypted link uses.
"""

from __future__ import annotations

import logging
from typing import Any

from bumble import smp
from bumble.keys import PairingKeys

from coinf.errors import InputError

log = logging.getLogger(__name__)


def strong_keys(keys: PairingKeys | None) -> bool:
    """Keys from LE Secure Connections pairing with MITM protection (passkey or numeric
    comparison). Legacy pairing stores ``ltk_central``/``ltk_peripheral``, not ``ltk``."""
    return keys is not None and keys.ltk is not None and bool(keys.ltk.authenticated)


def check_passkey(passkey: int | None) -> int | None:
    if passkey is not None and (
        isinstance(passkey, bool) or not isinstance(passkey, int) or not 0 <= passkey <= 999_999
    ):
        raise InputError(f"a passkey is 6 digits (0..999999), not {passkey!r}")
    return passkey


class SecurePairingSession(smp.Session):
    """bumble's SMP session, refusing (as responder) every pairing request that would not end in
    an LE Secure Connections key with MITM protection: legacy pairing (SC bit clear), OOB,
    encryption keys shorter than 16 bytes, and IO capabilities that give Just Works."""

    async def on_smp_pairing_request_command_async(
        self, command: smp.SMP_Pairing_Request_Command
    ) -> None:
        why = self._refusal(command)
        if why is not None:
            log.warning("refusing pairing with %s: %s", self.connection.peer_address, why)
            self.send_pairing_failed(smp.ErrorCode.AUTHENTICATION_REQUIREMENTS)
            return
        await super().on_smp_pairing_request_command_async(command)

    def _refusal(self, command: smp.SMP_Pairing_Request_Command) -> str | None:
        if not command.auth_req & smp.AuthReq.SC:
            return "LE legacy pairing (Secure Connections required)"
        if command.oob_data_flag:
            return "out-of-band pairing is not offered"
        if command.maximum_encryption_key_size < 16:
            return f"encryption key of {command.maximum_encryption_key_size} bytes (16 required)"
        try:
            method: Any = self.PAIRING_METHODS[command.io_capability][  # type: ignore[index]
                self.io_capability
            ]
        except KeyError:
            return f"invalid IO capability {command.io_capability}"
        if isinstance(method, tuple) and len(method) == 2:
            method = method[1]  # the Secure Connections entry
        if isinstance(method, tuple):
            method = method[0]
        if method not in (smp.PairingMethod.PASSKEY, smp.PairingMethod.NUMERIC_COMPARISON):
            return (f"IO capability {smp.IoCapability(command.io_capability).name} gives "
                    "Just Works (no MITM protection); pair with a keyboard (passkey entry)")
        return None


__all__ = ["SecurePairingSession", "check_passkey", "strong_keys"]
