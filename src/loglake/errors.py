"""The root of loglake's exception tree.

Every typed error in loglake derives from ``LoglakeError`` so a CLI or a server can turn any of
them into a readable message without catching bare ``Exception``. Parts define their own
subclasses next to the code that raises them; this module only holds the roots, split by whose
fault it is (the h11 model: the caller asked for something illegal, or the peer sent it).

Each error also says whether trying again can succeed (aiokafka's ``retriable``): a caller
retries by that attribute, never by a list of classes of its own, so a new transient failure
is retried everywhere the day its class says so.
"""

from typing import ClassVar


class LoglakeError(Exception):
    """Base class of every error loglake raises on purpose."""

    retriable: ClassVar[bool] = False
    """Whether the same request may succeed later unchanged (the peer or the disk recovers):
    a caller may back off and retry. False means retrying cannot help without a change."""


class Unavailable(LoglakeError, ConnectionError):
    """The service cannot be reached now: the connection was refused, lost or timed out. The
    request may or may not have been carried out (a lost reply), so only an idempotent request,
    or one whose repeat the caller tolerates, is retried blindly."""

    retriable = True


class DecodeError(LoglakeError, ValueError):
    """Bytes from outside (a file, a socket, a peer) do not decode as the format requires."""


class LocalProtocolError(LoglakeError):
    """The caller asked for something the protocol forbids."""


class RemoteProtocolError(LoglakeError):
    """The peer sent something the protocol forbids."""
