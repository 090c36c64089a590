"""loglake.streams — the Ockam stream service: messages, service (sans-I/O), TCP server, client.

Parts program against ``Streams`` (``streams/api.py``): ``LocalStreams`` in process, or
``StreamClient`` / ``AsyncStreamClient`` against ``loglake serve`` (``client_context`` builds
the TLS context for a node started with certificates); ``JetStreamLog`` keeps streams in a
NATS JetStream cluster.
"""

from typing import TYPE_CHECKING

from loglake.errors import Unavailable
from loglake.faces import lazy_face
from loglake.streams.api import LocalStreams, StreamMessage, Streams
from loglake.streams.client import (
    AsyncStreamClient,
    DamagedHistory,
    PushTooLarge,
    StreamClient,
    StreamServiceError,
)
from loglake.streams.retry import RetryingStreams, RetryPolicy
from loglake.streams.tls import client_context

if TYPE_CHECKING:
    from loglake.streams.jetstream import ClusterUnavailable, JetStreamLog

_FACE = {
    "ClusterUnavailable": "loglake.streams.jetstream",
    "JetStreamLog": "loglake.streams.jetstream",
}
"""The JetStream backend, imported on first use: nats-py is needed only by who keeps streams
in a cluster (a node on ``--backend``, the Spark source reading a stream's unsealed part)."""

__getattr__, __dir__ = lazy_face(__name__, _FACE)

__all__ = [
    "AsyncStreamClient",
    "ClusterUnavailable",
    "DamagedHistory",
    "JetStreamLog",
    "LocalStreams",
    "PushTooLarge",
    "RetryPolicy",
    "RetryingStreams",
    "StreamClient",
    "StreamMessage",
    "StreamServiceError",
    "Streams",
    "Unavailable",
    "client_context",
]
