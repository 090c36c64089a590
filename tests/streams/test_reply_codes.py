"""An ``error`` reply starts with a code (``streams.reply_codes``) and loglake's client raises
the typed error by that code alone, the one a local ``Log`` raises; the reference's own texts
carry no code and stay as it spells them."""

from __future__ import annotations

import pytest

from loglake.log import MemoryLog
from loglake.log.api import UnknownPartition, UnknownStream
from loglake.streams import codec
from loglake.streams.client import StreamClient, StreamServiceError, _raise_error
from loglake.streams.messages import Error, PullRequest
from loglake.streams.reply_codes import (
    CODES,
    DAMAGED_HISTORY,
    DISK_FULL,
    UNKNOWN_STREAM,
    code_of,
    with_code,
)
from loglake.streams.server import BackgroundServer
from loglake.streams.service import INVALID_REQUEST, StreamService, worker_address
from loglake.wire.ockam import Address, route


def test_codes_are_read_before_the_first_separator_only() -> None:
    assert code_of(with_code(DISK_FULL, "stream 's' partition 0: no space")) == DISK_FULL
    assert code_of("disk full") is None  # no detail, no code
    assert code_of(INVALID_REQUEST) is None and code_of("Empty stream name") is None
    assert code_of("stream 'disk full: x' exists with 2 partitions") is None
    for code in CODES:
        assert code_of(with_code(code, "x: y")) == code


@pytest.mark.parametrize(
    ("reason", "raised"),
    [
        (with_code(UNKNOWN_STREAM, "'s'"), UnknownStream),
        ("unknown partition: stream 's' has partitions 0..1, not 7", UnknownPartition),
        (with_code(DAMAGED_HISTORY, "stream 's' partition 0 at index 3: crc"), StreamServiceError),
        ("Invalid request", StreamServiceError),
        ("something else: entirely", StreamServiceError),
    ],
)
def test_the_client_raises_by_code(reason: str, raised: type[Exception]) -> None:
    with pytest.raises(raised) as e:
        _raise_error(Error(reason), "s", 7)
    if raised is UnknownPartition:
        assert e.value.partition == 7 and e.value.stream == "s"


def test_over_tcp_the_typed_errors_match_the_local_log() -> None:
    log = MemoryLog()
    log.create_stream("s")
    with BackgroundServer(StreamService(log)) as srv, StreamClient(port=srv.port) as c:
        with pytest.raises(UnknownStream):
            c.get_index("me", "nope")
        with pytest.raises(UnknownPartition) as e:
            c.get_index("me", "s", 7)
        assert e.value.partition == 7
        with pytest.raises(UnknownStream):
            c.info("nope")
        # a pull sent to the worker of a partition that does not exist
        tok, frame = c.core.request(
            route(Address.local(worker_address("s", 3))),
            codec.encode_payload(PullRequest(1, 0, 10)),
        )
        c.sock.sendall(frame)
        while not c.core.replies.get(tok):
            c._read()
        reply = codec.decode_response(c.core.replies[tok][0].payload, Error)
        assert code_of(reply.reason) == UNKNOWN_STREAM, reply.reason
