"""loglake.streams — the Ockam stream service: messages, service (sans-I/O), TCP server, client.

Parts program against ``Streams`` (``streams/api.py``): ``LocalStreams`` in process, or
``StreamClient`` / ``AsyncStreamClient`` against ``loglake serve``.
"""

from loglake.streams.api import LocalStreams, StreamMessage, Streams
from loglake.streams.client import (
    AsyncStreamClient,
    DamagedHistory,
    StreamClient,
    StreamServiceError,
)

__all__ = [
    "AsyncStreamClient",
    "DamagedHistory",
    "LocalStreams",
    "StreamClient",
    "StreamMessage",
    "StreamServiceError",
    "Streams",
]
