"""Which bleak failures mean what (typed fields only, never message text): a failed pairing
(:func:`pairing_failure`), a security refusal (pair first), no usable Bluetooth stack on this
machine, or anything else (retried). Used by :mod:`~coinf.ble_protocol.central`, which
re-exports them."""

from __future__ import annotations

import errno

from coinf.ble_protocol.messages import ErrorCode

from coinf.errors import PairingFailure

#: ATT error codes (Core spec Vol 3 Part F 3.4.1.1) that mean "pair / encrypt first".
_ATT_SECURITY = frozenset({
    0x05,  # Insufficient Authentication
    0x08,  # Insufficient Authorization
    0x0C,  # Insufficient Encryption Key Size
    0x0F,  # Insufficient Encryption
})
#: BlueZ D-Bus error names for the same (BlueZ maps ATT 0x05, 0x0C and 0x0F to NotPermitted
#: "Not paired" -- older versions to NotPaired -- and 0x08 to NotAuthorized), and pairing faults.
_DBUS_SECURITY = frozenset({
    "org.bluez.Error.NotPermitted",
    "org.bluez.Error.NotPaired",
    "org.bluez.Error.NotAuthorized",
    "org.bluez.Error.AuthenticationFailed",
    "org.bluez.Error.AuthenticationRejected",
    "org.bluez.Error.AuthenticationCanceled",
})
#: SMP ``Pairing Failed`` reasons (Core spec Vol 3 Part H 3.5.5) -> why, for the user
SMP_REASONS: dict[int, PairingFailure] = {
    0x01: PairingFailure.WRONG_PASSKEY,  # Passkey Entry Failed (the user cancelled / mistyped)
    0x02: PairingFailure.WEAK,  # OOB Not Available
    0x03: PairingFailure.WEAK,  # Authentication Requirements
    0x04: PairingFailure.WRONG_PASSKEY,  # Confirm Value Failed
    0x05: PairingFailure.WINDOW_CLOSED,  # Pairing Not Supported (a coinf wearable: window shut)
    0x06: PairingFailure.WEAK,  # Encryption Key Size
    0x09: PairingFailure.REPEATED_ATTEMPTS,  # Repeated Attempts
    0x0B: PairingFailure.WRONG_PASSKEY,  # DHKey Check Failed
    0x0C: PairingFailure.WRONG_PASSKEY,  # Numeric Comparison Failed
}
#: BlueZ's D-Bus names for pairing faults -> why
_DBUS_PAIRING = {
    "org.bluez.Error.AuthenticationFailed": PairingFailure.WRONG_PASSKEY,
    "org.bluez.Error.AuthenticationRejected": PairingFailure.WINDOW_CLOSED,
    "org.bluez.Error.AuthenticationCanceled": PairingFailure.NO_PASSKEY,
    "org.bluez.Error.AuthenticationTimeout": PairingFailure.TIMEOUT,
}
#: What the user does about each failure (one clause, for the one error line)
PAIRING_HINTS: dict[PairingFailure, str] = {
    PairingFailure.WRONG_PASSKEY: "the passkey typed is not the one the wearable shows",
    PairingFailure.WINDOW_CLOSED: "the wearable accepts no new bond now: run `coinf wearable "
    "pair` on it, then pair within its window",
    PairingFailure.WEAK: "the peer refused this pairing method (LE Secure Connections with a "
    "passkey is required)",
    PairingFailure.UNAUTHENTICATED_PEER: "the peer paired without MITM protection (Just Works "
    "or legacy): not a coinf wearable, or an impostor",
    PairingFailure.TIMEOUT: "the pairing did not complete in time (type the passkey sooner)",
    PairingFailure.REPEATED_ATTEMPTS: "too many failed pairings: wait, then pair again with the "
    "right passkey",
    PairingFailure.NO_PASSKEY: "the wearable asks for its passkey and none was given "
    "(--passkey-file, --passkey-stdin or the prompt)",
    PairingFailure.BOND_LOST: "the wearable no longer has this bond: pair again (`coinf wearable "
    "pair` there, `coinf handheld pair` here)",
    PairingFailure.OTHER: "see the SMP reason",
}


def smp_failure(code: int | None) -> PairingFailure:
    """The :class:`PairingFailure` of an SMP ``Pairing Failed`` reason byte."""
    if code is None:
        return PairingFailure.OTHER
    return SMP_REASONS.get(int(code), PairingFailure.OTHER)


def pairing_failure(exc: BaseException) -> PairingFailure | None:
    """Why ``exc`` is a failed pairing (typed fields only): the ``pairing_failure`` of the bumble
    backend's :class:`~coinf.ble_protocol.bleak_bumble.BumblePairingError`, or a BlueZ D-Bus
    pairing error. None when ``exc`` is not about pairing."""
    reason = getattr(exc, "pairing_failure", None)
    if isinstance(reason, PairingFailure):
        return reason
    try:
        from bleak.exc import BleakDBusError
    except ImportError:  # pragma: no cover - bleak always ships it
        return None
    if isinstance(exc, BleakDBusError):
        return _DBUS_PAIRING.get(exc.dbus_error)
    return None


#: D-Bus errors meaning "there is no Bluetooth stack to talk to" (BlueZ not running).
_DBUS_NO_STACK = frozenset({
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
})
#: OSError numbers of connecting to the D-Bus system bus socket that mean no D-Bus/BlueZ here.
_NO_BUS_ERRNOS = frozenset({errno.ENOENT, errno.ECONNREFUSED, errno.EACCES})


def adapter_fault(exc: BaseException) -> str | None:
    """Why the OS Bluetooth stack cannot be used at all, if ``exc`` says so (typed fields only):
    no adapter or none with the central role (bleak >= 2), BlueZ absent from the D-Bus system bus,
    or no system bus socket. None for everything else (a wearable not found, a powered-off
    adapter that may be switched on, a failed connection: those are retried)."""
    try:
        from bleak.exc import BleakDBusError
    except ImportError:  # pragma: no cover - bleak always ships it
        return None
    try:
        from bleak.exc import (  # type: ignore[attr-defined,unused-ignore]
            BleakBluetoothNotAvailableError,
            BleakBluetoothNotAvailableReason,
        )
    except ImportError:  # bleak < 2
        pass
    else:
        if isinstance(exc, BleakBluetoothNotAvailableError) and \
                exc.reason != BleakBluetoothNotAvailableReason.POWERED_OFF:
            return f"no usable Bluetooth adapter ({exc.args[0]})"
    if isinstance(exc, BleakDBusError) and exc.dbus_error in _DBUS_NO_STACK:
        return f"BlueZ is not running ({exc.dbus_error})"
    if isinstance(exc, OSError) and exc.errno in _NO_BUS_ERRNOS:
        return f"cannot reach BlueZ on the D-Bus system bus ({exc})"
    return None


def classify_bleak_error(exc: BaseException) -> ErrorCode:
    """The wire code a bleak failure stands for, from its type and typed fields:
    INSUFFICIENT_ENCRYPTION for a security refusal (not transient: pair first), else
    DISCONNECTED (transient)."""
    code = getattr(exc, "att_error_code", None)  # BumbleATTError
    if isinstance(code, int) and code in _ATT_SECURITY:
        return ErrorCode.INSUFFICIENT_ENCRYPTION
    try:
        from bleak.exc import BleakDBusError
    except ImportError:  # pragma: no cover - bleak always ships it
        return ErrorCode.DISCONNECTED
    if isinstance(exc, BleakDBusError) and exc.dbus_error in _DBUS_SECURITY:
        return ErrorCode.INSUFFICIENT_ENCRYPTION
    return ErrorCode.DISCONNECTED
