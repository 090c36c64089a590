"""The stream server's pipelined group commit (issue 16) keeps the log's promise: a push is
confirmed only after the fsync that covers it, confirms keep push order, and while one batch
is being fsynced the server goes on writing the next.

(Here beside the log's own written/durable tests because it is the log's durability rule that
is checked, through the server that uses ``Log.append_payloads_then``.)"""

from __future__ import annotations

import errno
import socket
import threading

from loglake.log import SegmentLog, fs
from loglake.streams import codec
from loglake.streams.client import ClientCore, StreamClient
from loglake.streams.messages import StreamInfoRequest
from loglake.streams.server import BackgroundServer
from loglake.streams.service import STREAM_SERVICE_ADDRESS, StreamService, worker_address
from loglake.wire.ockam import Address
from tests.waiting import wait_until

PUSHES = 3000


def test_confirms_wait_for_their_fsync_while_the_next_batches_are_written(tmp_path, monkeypatch):
    log = SegmentLog(tmp_path)
    held, release = threading.Event(), threading.Event()
    written_while_held = 0
    real_sync, real_write = fs.fdatasync, fs.write

    def fdatasync(fd: int) -> None:
        # hold the first fsync made by the log's sync thread (the pipelined path)
        if threading.current_thread().name == "loglake-sync" and not release.is_set():
            held.set()
            assert release.wait(20)
        real_sync(fd)

    def write(fd: int, data) -> int:
        nonlocal written_while_held
        if held.is_set() and not release.is_set() and len(data) >= 1000:  # a batch
            written_while_held += 1
        return real_write(fd, data)

    monkeypatch.setattr(fs, "fdatasync", fdatasync)
    monkeypatch.setattr(fs, "write", write)
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    with BackgroundServer(StreamService(log)) as srv:
        clients = [StreamClient(port=srv.port, window=1000) for _ in range(3)]
        for c in clients:  # connected and addressed before anything is held
            c.create_stream("s")

        def pusher(k: int) -> None:
            try:
                results[k] = clients[k].push_many(
                    "s", [b"%d:%06d|" % (k, i) + bytes(20) for i in range(PUSHES)]
                )
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=pusher, args=(k,)) for k in range(3)]
        try:
            threads[0].start()
            threads[1].start()
            wait_until(held.is_set, 30, "a pipelined append's fsync")
            part = log._partition("s", 0)
            durable = part.visible_next
            # pushes that come now are written at once, beside the fsync being held (before,
            # the server's one worker thread waited in that fsync)
            threads[2].start()
            wait_until(lambda: written_while_held >= 1, 20, "a write while an fsync runs")
            assert part.visible_next == durable  # nothing more is durable while it is held
            assert part.next_index > durable
        finally:
            release.set()
            for t in threads:
                if t.ident is not None:
                    t.join(60)
            for c in clients:
                c.close()
    assert not errors, errors
    every = sorted(results[0] + results[1] + results[2])
    assert every == list(range(3 * PUSHES))  # every push confirmed once, no index reused
    got = dict(log.read_payloads("s", 0, 3 * PUSHES))
    for k in (0, 1, 2):
        # confirms in push order, each naming the index that holds that push
        assert [got[i] for i in results[k]] == [
            b"%d:%06d|" % (k, i) + bytes(20) for i in range(PUSHES)
        ]
    log.close()


def test_a_failed_fsync_of_a_pipelined_batch_fails_its_pushes_and_the_server_goes_on(
    tmp_path, monkeypatch
):
    """The fsync of a burst runs on the log's sync thread while the event loop goes on; when it
    fails, every push of the burst is answered with an error (none confirmed), what was
    confirmed before stays, and the loop keeps serving other streams."""
    log = SegmentLog(tmp_path)
    real_sync = fs.fdatasync
    failing, failed = threading.Event(), threading.Event()

    def fdatasync(fd: int) -> None:
        if failing.is_set() and threading.current_thread().name == "loglake-sync":
            failed.set()
            raise OSError(errno.EIO, "Input/output error")
        real_sync(fd)

    monkeypatch.setattr(fs, "fdatasync", fdatasync)
    before = [b"before %d" % i for i in range(PUSHES)]
    with BackgroundServer(StreamService(log)) as srv:
        with StreamClient(port=srv.port, window=1000) as c:
            c.create_stream("s")
            c.create_stream("t")
            assert c.push_many("s", before) == list(range(PUSHES))
        failing.set()
        # one burst in one send, every answer read (a client would stop at the first error)
        core = ClientCore()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as sock:
            sock.sendall(core.initial_bytes())
            rids, parts = core.push_parts(
                Address.local(worker_address("s", 0)), [b"lost %d" % i for i in range(500)]
            )
            sock.sendall(b"".join(parts))
            while len(core.confirms) + len(core.push_errors) < len(rids):
                data = sock.recv(1 << 16)
                assert data, "the server closed the connection"
                core.receive_data(data)
        assert failed.is_set()  # the pipelined path's fsync failed
        assert [ok for ok, _ in core.confirms.values()] == [False] * (
            len(rids) - len(core.push_errors)
        )
        failing.clear()
        with StreamClient(port=srv.port, window=1000) as c:  # another stream: served as before
            assert c.push_many("t", [b"t %d" % i for i in range(PUSHES)]) == list(range(PUSHES))
    log.close()
    reopened = SegmentLog(tmp_path)
    # every confirmed push is there, at its index (the failed burst's records may or may not
    # be: they were never confirmed)
    assert [d for _, d in reopened.read_payloads("s", 0, PUSHES)] == before
    assert [d for _, d in reopened.read_payloads("t", 0, PUSHES)] == [
        b"t %d" % i for i in range(PUSHES)
    ]
    reopened.close()


def test_pushes_after_a_non_push_message_are_not_overtaken_by_the_next_batch(tmp_path, monkeypatch):
    """One read brings pushes, a request that is not a push, and more pushes: the core appends
    the first pushes, answers the request, then appends the rest. If the first append were
    left to the sync thread while the loop went on, the connection's next pushes (the next
    read, the next batch) could be written before the rest of this one: its pushes stored out
    of order. The sync thread's fsync is held here so that a later batch has every chance to
    overtake; the confirms must still follow the push order."""
    log = SegmentLog(tmp_path)
    held, release = threading.Event(), threading.Event()
    real_sync = fs.fdatasync

    def fdatasync(fd: int) -> None:
        if threading.current_thread().name == "loglake-sync" and not release.is_set():
            held.set()
            assert release.wait(20)
        real_sync(fd)

    monkeypatch.setattr(fs, "fdatasync", fdatasync)
    worker = Address.local(worker_address("s", 0))
    with BackgroundServer(StreamService(log)) as srv:
        with StreamClient(port=srv.port) as c:
            c.create_stream("s")
        core = ClientCore()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as sock:
            sock.sendall(core.initial_bytes())
            first, head = core.push_parts(worker, [b"a%d" % i for i in range(30)])
            info, info_frame = core.request(
                (Address.local(STREAM_SERVICE_ADDRESS),), codec.encode_payload(StreamInfoRequest())
            )
            rest, tail = core.push_parts(worker, [b"b%d" % i for i in range(30)])
            sock.sendall(b"".join([*head, info_frame, *tail]))  # one read: one batch
            try:
                wait_until(held.is_set, 20, "a pipelined fsync")
                later, more = core.push_parts(worker, [b"c%d" % i for i in range(30)])
                sock.sendall(b"".join(more))  # the next batch, while that fsync is held
                part = log._partition("s", 0)
                wait_until(lambda: part.next_index >= 60, 20, "the next batch written")
            finally:
                release.set()
            rids = first + rest + later
            while len(core.confirms) < len(rids) or info not in core.replies:
                data = sock.recv(1 << 16)
                assert data, "the server closed the connection"
                core.receive_data(data)
    indexes = [core.confirms[r] for r in rids]
    assert all(ok for ok, _ in indexes)
    assert [i for _, i in indexes] == list(range(90))  # in push order, every one once
    stored = [d for _, d in log.read_payloads("s", 0, 90)]
    assert stored == [b"%s%d" % (x, i) for x in (b"a", b"b", b"c") for i in range(30)]
    log.close()
