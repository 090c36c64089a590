"""The one-push fast path (issue 16): a lone push on an idle server skips the ``Batch``
machinery (``StreamService.lone_push``), so it must answer exactly as the batch path does —
the same confirm bytes, the same error replies — and hand every other message back to it.
"""

from __future__ import annotations

import errno
import socket

import pytest

from loglake.log import MemoryLog, SegmentLog
from loglake.log.api import StorageFailed
from loglake.streams import codec
from loglake.streams.client import ClientCore, PermissionDenied, StreamClient
from loglake.streams.permissions import ANONYMOUS, AccessPolicy, Peer
from loglake.streams.server import BackgroundServer
from loglake.streams.service import Outcome, StreamService, perform, worker_address
from loglake.wire.ockam import ADDRESS_TYPE_LOCAL, Address, RoutingMessage, route

CLIENT = route("p0")
WRITER = Peer(frozenset({"*", "uri:w"}))
POLICY = {"grant": [{"identities": ["uri:w"], "streams": ["s"], "allow": ["write"]}]}


def _service(access: AccessPolicy | None = None) -> StreamService:
    """A service with stream ``s`` whose worker it knows (a first push went the batch path,
    which looks the stream up and caches its worker: until then ``lone_push`` says None)."""
    log = MemoryLog()
    log.create_stream("s")
    svc = StreamService(log, access=access)
    assert svc.lone_push(_push(0, b"first"), WRITER) is None
    svc.handle(_push(0, b"first"), WRITER)
    return svc


def _push(rid: int, data: bytes, worker: str = worker_address("s", 0)) -> RoutingMessage:
    return RoutingMessage((Address.local(worker),), CLIENT, codec.encode_push_request(rid, data))


def _batch_replies(svc: StreamService, msg: RoutingMessage, outcome: Outcome | None, peer):
    """What the batch path answers ``msg`` when its one append has ``outcome`` (None: the
    real log's)."""
    batch = svc.batch([msg], peers=[peer])
    while batch.actions:
        batch.feed([outcome or perform(svc.log, a) for a in batch.actions])
    return batch.replies[0]


@pytest.mark.parametrize("rid", [1, 127, 128, 70_000, 2**40])
def test_a_lone_push_is_stored_and_answered_byte_for_byte_as_the_batch_path(rid) -> None:
    fast, slow = _service(), _service()
    for data in (b"", b"x", bytes(range(256)) * 4):
        msg = _push(rid, data)
        push = fast.lone_push(msg)
        assert push is not None
        got = fast.lone_push_replies(push, perform(fast.log, push.action))
        want = _batch_replies(slow, msg, None, ANONYMOUS)
        assert [(r.onward_route, r.return_route, r.payload) for r in got] == [
            (r.onward_route, r.return_route, r.payload) for r in want
        ]
    assert fast.log.read_payloads("s", 0, 10) == slow.log.read_payloads("s", 0, 10)
    assert len(fast.log.read_payloads("s", 0, 10)) == 4


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),  # → error reply naming the partition
        StorageFailed("s/0: fsync failed; appends are refused"),  # → PushConfirm ERROR
        RuntimeError("a bug in the log"),  # → PushConfirm ERROR, logged
    ],
)
def test_a_failed_append_gets_the_batch_paths_error_reply(error) -> None:
    fast, slow = _service(), _service()
    msg = _push(9, b"data")
    push = fast.lone_push(msg)
    assert push is not None
    got = fast.lone_push_replies(push, Outcome(error=error))
    want = _batch_replies(slow, msg, Outcome(error=error), ANONYMOUS)
    assert [r.payload for r in got] == [r.payload for r in want]
    assert got[0].onward_route == CLIENT


def test_everything_but_a_plain_known_push_goes_to_the_batch_path() -> None:
    svc = _service(AccessPolicy.from_dict(POLICY))
    good = _push(1, b"a")
    assert svc.lone_push(good, WRITER) is not None
    assert svc.lone_push(good, ANONYMOUS) is None  # refused: the batch path says why
    assert svc.lone_push(_push(1, b"a", worker_address("nope", 0))) is None  # unknown worker
    bad = RoutingMessage(good.onward_route, CLIENT, good.payload[:-1] + b"xx")
    assert svc.lone_push(bad, WRITER) is None  # malformed: the batch path's INVALID_REQUEST
    other_type = Address(ADDRESS_TYPE_LOCAL + 1, good.onward_route[0].value)
    assert svc.lone_push(RoutingMessage((other_type,), CLIENT, good.payload), WRITER) is None
    assert svc.lone_push(RoutingMessage((), CLIENT, good.payload), WRITER) is None
    assert svc.log.read_payloads("s", 0, 10) == [(0, b"first")]  # deciding appends nothing


def test_over_tcp_lone_pushes_refusals_and_unknown_workers_keep_their_replies(tmp_path):
    """Through the real server: one-by-one pushes take the fast path; a refused push and a
    push to a worker of no stream take the batch path and get its error replies; the
    connection goes on in order."""
    log = SegmentLog(tmp_path)
    log.create_stream("s")
    log.create_stream("t")
    policy = AccessPolicy.from_dict(
        {"grant": [{"identities": ["*"], "streams": ["s"], "allow": ["read"]}] + POLICY["grant"]}
    )
    with (
        BackgroundServer(StreamService(log, access=policy)) as srv,
        StreamClient(port=srv.port) as c,
        pytest.raises(PermissionDenied),
    ):
        c.push("s", b"anonymous")
    with BackgroundServer(StreamService(log)) as srv:
        with StreamClient(port=srv.port) as c:
            assert [c.push("s", b"m%d" % i) for i in range(5)] == list(range(5))
            assert c.push("t", b"other") == 0
        core = ClientCore()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
            sock.sendall(core.initial_bytes())
            nowhere = Address.local(worker_address("missing", 0))
            (rid,), frames = core.push_frames(nowhere, [b"x"])
            sock.sendall(frames)
            while rid not in core.push_errors:
                core.receive_data(sock.recv(65536))
            assert core.push_errors[rid].reason.startswith("unknown stream")
        with StreamClient(port=srv.port) as c:
            assert c.push("s", b"m5") == 5
    assert [d for _, d in log.read_payloads("s", 0, 10)] == [b"m%d" % i for i in range(6)]
    log.close()
