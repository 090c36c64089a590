"""The root of loglake's exception tree.

Every typed error in loglake derives from ``LoglakeError`` so a CLI or a server can turn any of
them into a readable message without catching bare ``Exception``. Parts define their own
subclasses next to the code that raises them; this module only holds the roots, split by whose
fault it is (the h11 model: the caller asked for something illegal, or the peer sent it).
"""


class LoglakeError(Exception):
    """Base class of every error loglake raises on purpose."""


class DecodeError(LoglakeError, ValueError):
    """Bytes from outside (a file, a socket, a peer) do not decode as the format requires."""


class LocalProtocolError(LoglakeError):
    """The caller asked for something the protocol forbids."""


class RemoteProtocolError(LoglakeError):
    """The peer sent something the protocol forbids."""
