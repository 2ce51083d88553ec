"""Every exception coinf raises on purpose, in one hierarchy (the bottom layer: imports nothing).

::

    CoinfError
    ├── UserError            the caller's input is wrong; fixing it fixes the error
    │   ├── InputError       (also ValueError) a feed, argument or option is not what was expected
    │   ├── ModelError       an ONNX model cannot be loaded, checked or shaped
    │   ├── BundleError      a split bundle is missing, malformed or lacks what was asked
    │   ├── MissingDependency  a feature needs a package from an extra that is not installed
    │   └── AdapterError     this machine's Bluetooth adapter / HCI transport cannot be opened
    └── LinkError            the link or the peer failed; ``transient`` says whether retrying
        │                    later (and finishing the inference locally now) is right
        ├── ProtocolError    with a wire error ``code`` (and the ``request_id`` it concerns)
        │   ├── LinkClosed   the peer went away (DISCONNECTED)
        │   ├── PairingError a BLE or Wi-Fi pairing failed for good (``reason``: a PairingFailure)
        │   └── PeerResultError  a result that does not match the model's outputs
        └── UntrustedPeer    a TLS peer whose certificate is not pinned (not paired, a squatter)

Exit codes belong to the command line (``coinf.cli``), not to these classes.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class CoinfError(Exception):
    """Base class of every error caused by input (files, flags, peers), not by a bug."""


class UserError(CoinfError):
    """Something the user gave (a file, a flag, a feed) is wrong."""


class InputError(UserError, ValueError):
    """A feed, argument or option does not match what was expected (name, shape, dtype, range)."""


class ModelError(UserError):
    """The ONNX model cannot be loaded, checked or shaped."""


class BundleError(UserError):
    """A split bundle is missing, malformed, or does not have what was asked for."""


class MissingDependency(UserError):
    """A feature needs a package from an extra that is not installed."""


class AdapterError(UserError):
    """This machine's Bluetooth adapter, Bluetooth stack or HCI transport cannot be opened at all
    (no adapter, no BlueZ, a bad ``--hci``): retrying does not mend it, the user must."""


class ErrorCode(IntEnum):
    """Error codes carried by ERROR messages and control frames (docs/PROTOCOL.md)."""

    BAD_VERSION = 1
    BAD_CRC = 2
    TRUNCATED = 3
    TOO_LARGE = 4
    UNKNOWN_TYPE = 5
    MALFORMED = 6
    BUNDLE_MISMATCH = 7
    UNKNOWN_CANDIDATE = 8
    TAIL_FAILED = 9
    BUSY = 10
    TIMEOUT = 11
    CANCELLED = 12
    DISCONNECTED = 13
    INSUFFICIENT_ENCRYPTION = 14
    UNSUPPORTED = 15


#: Codes after which the peer may well succeed later: finish locally now, retry after a backoff.
#: The others (version or bundle mismatch, a peer that breaks the protocol, missing encryption)
#: are configuration faults that retrying does not mend.
TRANSIENT_CODES = frozenset({
    ErrorCode.BAD_CRC,  # corrupted in transit: the next message may well arrive intact
    ErrorCode.DISCONNECTED,
    ErrorCode.TIMEOUT,
    ErrorCode.BUSY,
    ErrorCode.TAIL_FAILED,
    ErrorCode.CANCELLED,
})


class LinkError(CoinfError):
    """The link to a peer, or the peer, failed.

    ``transient`` is True when the same request may succeed later (disconnect, timeout, busy
    peer): a Session then finishes the inference on the wearable and retries after a backoff.
    """

    @property
    def transient(self) -> bool:
        return True


class ProtocolError(LinkError):
    """A peer sent something that breaks the protocol, or a request failed remotely.

    ``code`` is the wire :class:`ErrorCode`; ``request_id`` the request it concerns, if any;
    ``hop`` the index, in that request's route, of the device at fault (None: the receiver, or
    not about one hop).
    """

    def __init__(self, code: ErrorCode, text: str, request_id: int | None = None,
                 hop: int | None = None) -> None:
        super().__init__(f"{code.name.lower()}: {text}")
        self.code = code
        self.text = text
        self.request_id = request_id
        self.hop = hop

    @property
    def transient(self) -> bool:
        return self.code in TRANSIENT_CODES


class RemoteError(ProtocolError):
    """The peer answered a request with ERROR: ``code``, ``text`` and ``hop`` are its own
    (an error raised on this side of the link is a plain :class:`ProtocolError`)."""


class LinkClosed(ProtocolError):
    """The peer went away (disconnect, closed socket). Pending requests fail with this."""

    def __init__(self, text: str = "link closed") -> None:
        super().__init__(ErrorCode.DISCONNECTED, text)


class PairingFailure(StrEnum):
    """Why a BLE pairing failed (docs/PROTOCOL.md §2, "Pairing failures"), from the SMP
    ``Pairing Failed`` reason or what this side saw."""

    WRONG_PASSKEY = "wrong_passkey"  # SMP 0x04 Confirm Value Failed (or 0x01); Wi-Fi: wrong code
    WINDOW_CLOSED = "window_closed"  # SMP 0x05 Pairing Not Supported: the wearable's window is shut
    WEAK = "weak"  # SMP 0x03 Authentication Requirements: legacy / Just Works / short key refused
    UNAUTHENTICATED_PEER = "unauthenticated_peer"  # the peer's pairing gave no MITM protection
    TIMEOUT = "timeout"  # the pairing did not complete within its deadline
    REPEATED_ATTEMPTS = "repeated_attempts"  # SMP 0x09, or this side's own bound was reached
    NO_PASSKEY = "no_passkey"  # a passkey was asked and none was given
    BOND_LOST = "bond_lost"  # the peer refused our stored key (it forgot the bond)
    OTHER = "other"  # any other SMP reason (``smp_code`` says which)


class PairingError(ProtocolError):
    """A BLE or Wi-Fi pairing failed and retrying will not mend it: the user must act (type
    the right passkey or code, open the pairing window, remove an impostor...). Not transient.

    ``reason`` (:class:`PairingFailure`), ``peer`` (the address, if known), ``attempts`` (the
    pairings tried before giving up) and ``smp_code`` (the SMP reason byte, if one came)."""

    def __init__(self, reason: PairingFailure, text: str, *, peer: str | None = None,
                 attempts: int = 1, smp_code: int | None = None) -> None:
        super().__init__(ErrorCode.INSUFFICIENT_ENCRYPTION, text)
        self.reason = reason
        self.peer = peer
        self.attempts = attempts
        self.smp_code = smp_code

    def __str__(self) -> str:
        return f"pairing failed ({self.reason.value}): {self.text}"

    @property
    def transient(self) -> bool:
        return False


class PeerResultError(ProtocolError):
    """A peer's result does not match the model's output signature (names, dtypes, shapes,
    finite values). Transient: the inference is finished locally and the peer retried later."""

    def __init__(self, text: str) -> None:
        super().__init__(ErrorCode.MALFORMED, text)

    @property
    def transient(self) -> bool:
        return True


class UntrustedPeer(LinkError):
    """The peer on a TLS link presented a certificate this device has not pinned (another
    device holds the helper's address, or the two were never paired), or refused this
    device's certificate. Transient: the inference finishes locally and the helper is tried
    again after a backoff, when the real one may be back. ``fingerprint``: what it showed."""

    def __init__(self, text: str, fingerprint: str | None = None) -> None:
        super().__init__(text)
        self.fingerprint = fingerprint


__all__ = [
    "TRANSIENT_CODES",
    "AdapterError",
    "BundleError",
    "CoinfError",
    "ErrorCode",
    "InputError",
    "LinkClosed",
    "LinkError",
    "MissingDependency",
    "ModelError",
    "PairingError",
    "PairingFailure",
    "PeerResultError",
    "ProtocolError",
    "RemoteError",
    "UntrustedPeer",
    "UserError",
]
