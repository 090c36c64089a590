"""A lone request on an idle server is appended and fsynced on the event loop before it goes on
(issue 16's one-by-one latency), while a burst is pipelined: written on the loop, fsynced by the
log's sync thread while the loop goes on; the log's promise holds on both roads:
a confirm only after the fsync that covers it, every push stored once, each connection's
pushes in its order, and what several connections send in one loop iteration shares one batch.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time

from loglake.log import SegmentLog, fs
from loglake.log.segment import SEGMENT_SUFFIX
from loglake.streams.client import ClientCore, StreamClient
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService, worker_address
from loglake.wire.ockam import Address


def _fsync_threads(monkeypatch) -> list[str]:
    """Record the thread of every fsync of a segment (not the watermark's, once a second)."""
    names: list[str] = []
    real = fs.fdatasync

    def fdatasync(fd: int) -> None:
        real(fd)
        if os.readlink(f"/proc/self/fd/{fd}").endswith(SEGMENT_SUFFIX):
            names.append(threading.current_thread().name)

    monkeypatch.setattr(fs, "fdatasync", fdatasync)
    return names


def test_a_lone_push_is_stored_and_confirmed_on_the_event_loop_and_a_burst_is_pipelined(
    tmp_path, monkeypatch
):
    log = SegmentLog(tmp_path)
    names = _fsync_threads(monkeypatch)
    with BackgroundServer(StreamService(log)) as srv, StreamClient(port=srv.port) as c:
        c.create_stream("s")
        c.pull("s", 0, 1)  # the partition opens on first use (its opening fsyncs): now
        names.clear()
        lone = [c.push("s", b"lone %d" % i) for i in range(20)]
        # each one-by-one push was fsynced before its confirm, by the server's loop thread:
        # no hand-off to the log's sync thread
        assert lone == list(range(20))
        assert names == ["loglake-server"] * 20
        names.clear()
        burst = c.push_many("s", [b"burst %d" % i for i in range(3000)])
        assert burst == list(range(20, 3020))
        # the burst was pipelined: its fsyncs ran on the log's sync thread while the loop went
        # on (a small last batch on an idle server may still be fsynced on the loop)
        assert set(names) - {"loglake-server"}, names
        assert c.push("s", b"after") == 3020  # and an idle server runs inline again
        assert names[-1] == "loglake-server"
    stored = [d for _, d in log.read_payloads("s", 0, 4000)]
    assert stored == (
        [b"lone %d" % i for i in range(20)] + [b"burst %d" % i for i in range(3000)] + [b"after"]
    )
    log.close()


def test_inline_and_pipelined_batches_from_several_connections_keep_each_ones_order(tmp_path):
    """One-by-one pushes, small windows (inline-sized) and a large window at once: the server
    switches roads as it goes idle and busy; every push is confirmed once, at the index that
    holds it, in each connection's push order."""
    log = SegmentLog(tmp_path)
    plans = {0: (1, 400), 1: (8, 1200), 2: (1000, 4000), 3: (4, 800)}  # window, pushes
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    with BackgroundServer(StreamService(log)) as srv:
        clients = {k: StreamClient(port=srv.port, window=w) for k, (w, _) in plans.items()}
        clients[0].create_stream("s")

        def pusher(k: int) -> None:
            window, n = plans[k]
            datas = [b"%d:%05d" % (k, i) for i in range(n)]
            try:
                out: list[int] = []
                step = 1 if window == 1 else window * 3
                for lo in range(0, n, step):
                    part = datas[lo : lo + step]
                    out += (
                        [clients[k].push("s", part[0])]
                        if step == 1
                        else (clients[k].push_many("s", part))
                    )
                results[k] = out
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=pusher, args=(k,)) for k in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for c in clients.values():
            c.close()
    assert not errors, errors
    total = sum(n for _, n in plans.values())
    assert sorted(i for r in results.values() for i in r) == list(range(total))
    got = dict(log.read_payloads("s", 0, total))
    for k, (_, n) in plans.items():
        assert results[k] == sorted(results[k])  # confirms in push order
        assert [got[i] for i in results[k]] == [b"%d:%05d" % (k, i) for i in range(n)]
    log.close()


def test_what_connections_send_in_one_loop_iteration_is_one_batch_on_the_loop(
    tmp_path, monkeypatch
):
    """Redis's group commit for one-by-one clients: while the loop is busy (here: held),
    pushes from three connections wait in their sockets; the next iteration reads them all and
    hands them to the core as one batch, performed on the loop, each confirmed on its own
    connection."""
    log = SegmentLog(tmp_path)
    names = _fsync_threads(monkeypatch)
    batches: list[int] = []
    real_batch = StreamService.batch

    def batch(self, msgs, **kw):
        batches.append(len(msgs))
        return real_batch(self, msgs, **kw)

    monkeypatch.setattr(StreamService, "batch", batch)
    worker = Address.local(worker_address("s", 0))
    with BackgroundServer(StreamService(log)) as srv:
        with StreamClient(port=srv.port) as c:
            c.create_stream("s")
        cores = [ClientCore() for _ in range(3)]
        socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in cores]
        try:
            for core, sock in zip(cores, socks, strict=True):
                sock.sendall(core.initial_bytes())
                core.receive_data(sock.recv(1))  # the version byte: the connection is served
            assert srv.server is not None
            loop = srv.server._loop
            assert loop is not None
            held, release = threading.Event(), threading.Event()

            def hold() -> None:
                held.set()
                assert release.wait(20)

            loop.call_soon_threadsafe(hold)
            assert held.wait(10)
            names.clear()
            batches.clear()
            for k, (core, sock) in enumerate(zip(cores, socks, strict=True)):
                _, parts = core.push_parts(worker, [b"c%d" % k])
                sock.sendall(b"".join(parts))
            # every push readable on the server's side before the loop goes on (loopback may
            # deliver after sendall returns)
            ours = {s.getsockname() for s in socks}
            theirs = [
                c.transport.get_extra_info("socket")
                for c in list(srv.server._conns)
                if c.transport is not None and c.transport.get_extra_info("peername") in ours
            ]
            assert len(theirs) == 3
            deadline = time.monotonic() + 10
            while len(select.select(theirs, [], [], 0.1)[0]) < 3:
                assert time.monotonic() < deadline, "the pushes never reached the server"
            release.set()
            for core, sock in zip(cores, socks, strict=True):
                while not core.confirms:
                    data = sock.recv(65536)
                    assert data, "the server closed the connection"
                    core.receive_data(data)
                assert [ok for ok, _ in core.confirms.values()] == [True]
        finally:
            release.set()
            for sock in socks:
                sock.close()
    # the reads of one loop iteration share a batch (epoll may still report a socket one
    # iteration later than the others, though the test saw its data readable first)
    assert sum(batches) == 3 and max(batches) >= 2, batches
    assert names and set(names) == {"loglake-server"}  # fsynced on the loop
    assert sorted(d for _, d in log.read_payloads("s", 0, 10)) == [b"c0", b"c1", b"c2"]
    log.close()
