"""Which bleak failures mean what (typed fields only, never message text): a security refusal
(pair first), no usable Bluetooth stack on this machine, or anything else (retried). Used by
:mod:`~coinf.ble_protocol.central`, which re-exports both functions."""

from __future__ import annotations

import errno

from coinf.ble_protocol.messages import ErrorCode

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
