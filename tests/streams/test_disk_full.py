"""A full disk tells the client so (issue 15 §3).

A push that meets ENOSPC gets an ``error`` reply "disk full: stream 'S' partition P: …" — not
the bare ``PushConfirm ERROR`` the client could only report as "could not store request N" —
and the client raises ``DiskFull``. The mapping is tested on the core with a log that raises
what a full disk raises; the whole path on a real, small tmpfs when the test runs as root.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import subprocess

import pytest

from loglake.log import MemoryLog, open_log
from loglake.log.api import StorageFailed
from loglake.streams import codec
from loglake.streams.client import (
    AsyncStreamClient,
    DiskFull,
    PushFailed,
    StreamClient,
    _raise_error,
)
from loglake.streams.messages import (
    CreateStreamRequest,
    Error,
    PushConfirm,
    PushRequest,
    SaveIndex,
)
from loglake.streams.server import BackgroundServer
from loglake.streams.service import (
    INDEX_SERVICE_ADDRESS,
    StreamService,
    is_disk_full,
    worker_address,
)
from loglake.wire.ockam import Address, RoutingMessage, route
from tests.tmpfs import small_tmpfs


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


def _storage_failed_by(e: OSError) -> StorageFailed:
    try:
        raise StorageFailed("s/0: fsync failed; appends are refused") from e
    except StorageFailed as failed:
        return failed


class FailingLog(MemoryLog):
    """Appends and index saves raise ``error`` (what the disk said) while it is set."""

    error: Exception | None = None

    def append_payloads(self, stream, datas, *, partition=0):
        if self.error is not None:
            raise self.error
        return super().append_payloads(stream, datas, partition=partition)

    def save_index(self, client_id, stream, index, *, partition=0):
        if self.error is not None:
            raise self.error
        return super().save_index(client_id, stream, index, partition=partition)


def _push(service: StreamService, stream: str, partition: int, rid: int) -> object:
    msg = RoutingMessage(
        (Address.local(worker_address(stream, partition)),),
        (Address.local("p0"),),
        codec.encode_payload(PushRequest(rid, b"x")),
    )
    (reply,) = service.handle(msg)
    return codec.decode_response(reply.payload, PushConfirm)


@pytest.fixture
def service():
    log = FailingLog()
    svc = StreamService(log)
    svc.handle(
        RoutingMessage(
            route("stream_service"),
            (Address.local("r1"),),
            codec.encode_payload(CreateStreamRequest("s")),
        )
    )
    return svc


def test_enospc_on_a_push_is_a_disk_full_error_naming_stream_and_partition(service):
    service.log.error = _enospc()
    r = _push(service, "s", 0, 7)
    assert isinstance(r, Error)
    assert r.reason.startswith("disk full: stream 's' partition 0: ")
    service.log.error = None  # space freed: the next push is stored
    ok = _push(service, "s", 0, 8)
    assert (ok.request_id, ok.status, ok.index) == (8, "OK", 0)


def test_a_failed_fsync_caused_by_enospc_is_a_full_disk_too(service):
    service.log.error = _storage_failed_by(_enospc())
    assert _push(service, "s", 0, 1).reason.startswith("disk full: stream 's' partition 0")
    service.log.error = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert _push(service, "s", 0, 2).reason.startswith("disk full")


def test_other_storage_failures_stay_a_pushconfirm_error(service):
    service.log.error = _storage_failed_by(OSError(errno.EIO, "Input/output error"))
    r = _push(service, "s", 0, 3)
    assert (r.request_id, r.status) == (3, "ERROR")
    assert not is_disk_full(service.log.error)


def test_an_index_save_on_a_full_disk_is_logged_not_answered(service, caplog):
    # a save is a cast (the reference's stream/index/shard.ex): no reply, the failure is logged
    service.log.error = _storage_failed_by(_enospc())
    msg = RoutingMessage(
        route(INDEX_SERVICE_ADDRESS),
        (Address.local("r2"),),
        codec.encode_payload(SaveIndex("me", "s", 3)),
    )
    with caplog.at_level(logging.WARNING, "loglake.streams.service"):
        assert service.handle(msg) == []
    assert "index save failed" in caplog.text


def test_the_client_raises_disk_full_for_it():
    with pytest.raises(DiskFull, match="stream 's' partition 2") as e:
        _raise_error(Error("disk full: stream 's' partition 2: [Errno 28] No space"), "s", 2)
    assert isinstance(e.value, PushFailed)  # code catching PushFailed still catches it


# -- a real full disk ---------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (root only); yields its folder, unmounts afterwards."""
    with small_tmpfs(tmp_path / "disk", "4m") as where:
        yield where


def _grow(where) -> None:
    subprocess.run(["mount", "-o", "remount,size=16m", str(where)], check=True)


def test_a_full_tmpfs_gives_disk_full_keeps_acked_records_and_resumes(small_disk):
    log = open_log(small_disk / "data")
    try:
        with (
            BackgroundServer(StreamService(log)) as srv,
            StreamClient(port=srv.port, timeout=10) as c,
        ):
            c.create_stream("orders", 2)
            acked: dict[int, bytes] = {}
            with pytest.raises(DiskFull) as e:
                for i in range(1000):  # 16 MB: more than the disk holds
                    data = b"%06d" % i + bytes(16_000)
                    acked[c.push("orders", data, partition=1)] = data
            assert str(e.value).startswith("disk full: stream 'orders' partition 1: ")
            assert "No space left" in str(e.value)
            assert 0 < len(acked) < 1000
            got = {m.index: m.data for m in c.pull("orders", 0, 10_000, partition=1)}
            assert got == acked  # every acknowledged record is there, nothing else

            async def async_push():
                a = await AsyncStreamClient.connect(port=srv.port)
                try:
                    await a.push("orders", bytes(64_000), partition=1)
                finally:
                    await a.close()

            with pytest.raises(DiskFull, match="partition 1"):
                asyncio.run(async_push())
            _grow(small_disk)  # space frees: the same connection pushes again
            nxt = c.push("orders", b"after", partition=1)
            assert nxt == max(acked) + 1
            assert c.pull("orders", nxt, 1, partition=1)[0].data == b"after"
    finally:
        log.close()


def test_serve_starts_and_serves_on_a_full_disk(small_disk, port):
    """``loglake serve`` would not start on a full disk: opening the consumer index store
    compacted it, which needs room (a raw ``OSError: [Errno 28]``). It starts, serves what is
    stored, and the compaction waits for a start that has room."""
    import os
    import sys

    from tests.procs import process

    data = small_disk / "data"
    with open_log(data) as log:
        log.create_stream("orders")
        log.append_payloads("orders", [b"kept %d" % i for i in range(50)])
        for i in range(200):  # an uncompacted store: many entries for one key
            log.save_index("billing", "orders", i)
    fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT)
    with contextlib.suppress(OSError):
        while os.write(fd, bytes(64 * 1024)):
            pass
    os.close(fd)
    cmd = [sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(data),
           "--port", str(port)]  # fmt: skip
    with process(cmd, port), StreamClient(port=port, timeout=10) as c:
        assert [m.data for m in c.pull("orders", 48, 10)] == [b"kept 48", b"kept 49"]
        assert c.get_index("billing", "orders") == 199
    os.unlink(small_disk / "filler")  # room again: the next start compacts
    with process(cmd, port), StreamClient(port=port, timeout=10) as c:
        assert c.get_index("billing", "orders") == 199
    assert (data / "consumers.log").stat().st_size < 200 * 20  # one entry per key now
