"""The stream server's pipelined group commit (issue 16) keeps the log's promise: a push is
confirmed only after the fsync that covers it, confirms keep push order, and while one batch
is being fsynced the server goes on writing the next.

(Here beside the log's own written/durable tests because it is the log's durability rule that
is checked, through the server that uses ``Log.append_payloads_then``.)"""

from __future__ import annotations

import threading

from loglake.log import SegmentLog, fs
from loglake.streams.client import StreamClient
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService
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
    got = dict(log.read_payloads("s", 0, 0, 3 * PUSHES))
    for k in (0, 1, 2):
        # confirms in push order, each naming the index that holds that push
        assert [got[i] for i in results[k]] == [
            b"%d:%06d|" % (k, i) + bytes(20) for i in range(PUSHES)
        ]
    log.close()
