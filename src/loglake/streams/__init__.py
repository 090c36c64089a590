"""loglake.streams — the Ockam stream service: messages, sans-I/O service, TCP server, client."""

from loglake.streams.api import LocalStreams, StreamMessage, Streams

__all__ = ["LocalStreams", "StreamMessage", "Streams"]
