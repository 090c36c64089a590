"""What an ``error`` reply of loglake's stream service starts with: ``"<code>: <detail>"``.

Why a code inside the text: the Ockam stream protocol's ``Error`` message is only ``{reason:
string}`` (build-trust/ockam's stream service sends free text), so a reference client shows
the reason as it is, and loglake's client reads the code before the first ``": "`` to raise the
typed error a local ``Log`` would (``streams.client``), never a regular expression over the
detail. The detail is for people and may change; the codes are the contract.
"""

from __future__ import annotations

from typing import Final

PERMISSION_DENIED: Final = "permission denied"
"""The peer's identity lacks the permission (the detail names the action and the one needed)."""
DISK_FULL: Final = "disk full"
"""The service's disk is full; nothing of the request was stored (retriable)."""
DAMAGED_HISTORY: Final = "damaged history"
"""The records asked for failed their checksum: damage, not the stream's end."""
READ_FAILED: Final = "read failed"
"""The disk refused a read (EIO)."""
UNKNOWN_STREAM: Final = "unknown stream"
UNKNOWN_PARTITION: Final = "unknown partition"
INTERNAL_ERROR: Final = "internal error"
"""A bug in the service (logged there with its traceback)."""

CODES: Final = frozenset(
    {
        PERMISSION_DENIED,
        DISK_FULL,
        DAMAGED_HISTORY,
        READ_FAILED,
        UNKNOWN_STREAM,
        UNKNOWN_PARTITION,
        INTERNAL_ERROR,
    }
)


def with_code(code: str, detail: str) -> str:
    """The reason of an ``error`` reply: ``code`` (one of ``CODES``), then the detail."""
    assert code in CODES, code
    return f"{code}: {detail}"


def code_of(reason: str) -> str | None:
    """The code a reason starts with, or None (a reason from another service, or free text)."""
    code, sep, _ = reason.partition(": ")
    return code if sep and code in CODES else None
