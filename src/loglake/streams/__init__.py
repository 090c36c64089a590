"""loglake.streams — the Ockam stream service: messages, service (sans-I/O), TCP server, client.

Parts program against ``Streams`` (``streams/api.py``): ``LocalStreams`` in process, or
``StreamClient`` / ``AsyncStreamClient`` against ``loglake serve`` (``client_context`` builds
the TLS context for a node started with certificates).
"""

from loglake.errors import Unavailable
from loglake.streams.api import LocalStreams, StreamMessage, Streams
from loglake.streams.client import (
    AsyncStreamClient,
    DamagedHistory,
    StreamClient,
    StreamServiceError,
)
from loglake.streams.retry import RetryingStreams, RetryPolicy
from loglake.streams.tls import client_context

__all__ = [
    "AsyncStreamClient",
    "DamagedHistory",
    "LocalStreams",
    "RetryPolicy",
    "RetryingStreams",
    "StreamClient",
    "StreamMessage",
    "StreamServiceError",
    "Streams",
    "Unavailable",
    "client_context",
]
