"""Errors say whether to retry, and ``RetryingStreams`` retries by that alone: across a real
``loglake`` stream server that stops and comes back on the same port, and a real full disk
(a small tmpfs, as root) that frees."""

from __future__ import annotations

import subprocess
import threading
import time

import nats.errors
import nats.js.errors
import pytest

from loglake.errors import DecodeError, LoglakeError, Unavailable
from loglake.log import open_log
from loglake.log.api import StorageFailed, UnknownStream
from loglake.streams import RetryingStreams, RetryPolicy
from loglake.streams.client import DiskFull, PermissionDenied, StreamClient
from loglake.streams.jetstream import ClusterUnavailable, _loglake_error
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService
from tests.tmpfs import small_tmpfs

FAST = RetryPolicy(first_wait=0.05, max_wait=0.2, deadline=20)


def test_the_errors_say_whether_to_retry() -> None:
    assert LoglakeError.retriable is False
    for cls in (Unavailable, DiskFull, StorageFailed, ClusterUnavailable):
        assert cls.retriable is True, cls
    for cls in (PermissionDenied, DecodeError, UnknownStream):
        assert cls.retriable is False, cls
    assert issubclass(Unavailable, ConnectionError)  # callers that catch OSError still do
    assert issubclass(ClusterUnavailable, Unavailable)


def test_nats_errors_are_retriable_exactly_when_transient() -> None:
    for e in (nats.errors.NoRespondersError(), nats.errors.ConnectionClosedError(), TimeoutError()):
        mapped = _loglake_error(e)
        assert isinstance(mapped, Unavailable) and mapped.retriable and mapped.__cause__ is e
    no_leader = nats.js.errors.APIError(code=503, description="no leader")
    assert _loglake_error(no_leader).retriable
    electing = nats.js.errors.APIError(code=500, err_code=10118, description="stream offline")
    assert _loglake_error(electing).retriable
    bad = nats.js.errors.APIError(code=400, err_code=10058, description="name in use")
    assert _loglake_error(bad) is bad and not getattr(bad, "retriable", False)


class _Node:
    """A stream server on a data dir and a fixed port that can stop and start again."""

    def __init__(self, data, port: int) -> None:
        self.data, self.port = data, port
        self.log = self.srv = None

    def start(self) -> None:
        self.log = open_log(self.data)
        self.srv = BackgroundServer(StreamService(self.log), port=self.port).__enter__()

    def stop(self) -> None:
        self.srv.__exit__(None, None, None)
        self.log.close()
        self.srv = self.log = None

    def start_after(self, seconds: float) -> threading.Thread:
        t = threading.Timer(seconds, self.start)
        t.start()
        return t


def _client(port: int):
    return lambda: StreamClient(port=port, timeout=5)


def test_a_restarted_node_is_waited_for_and_reads_resume(tmp_path, port) -> None:
    node = _Node(tmp_path / "data", port)
    node.start()
    try:
        with RetryingStreams(_client(port), FAST) as s:
            s.create_stream("orders", 2)
            s.push_many("orders", [b"a", b"b"], 1)
            assert s.save_index("reader", "orders", 1, 1) == 1
            node.stop()
            node.start_after(0.5)
            assert [m.data for m in s.pull("orders", 0, 10, 1)] == [b"a", b"b"]
            assert s.get_index("reader", "orders", 1) == 1
            assert s.retries >= 1
    finally:
        node.stop()


def test_a_push_is_repeated_after_a_lost_connection_only_when_the_caller_allows(
    tmp_path, port
) -> None:
    node = _Node(tmp_path / "data", port)
    node.start()
    try:
        strict = RetryingStreams(_client(port), FAST)
        lenient = RetryingStreams(_client(port), FAST, repeat_pushes=True)
        strict.create_stream("s")
        node.stop()
        with pytest.raises(Unavailable):
            strict.push("s", b"x")  # its outcome is unknown: not repeated
        assert strict.retries == 0
        node.start_after(0.5)
        assert lenient.push("s", b"y") == 0
        assert lenient.retries >= 1
        assert strict.push("s", b"z") == 1  # reconnects on the next call
        strict.close()
        lenient.close()
    finally:
        node.stop()


def test_it_gives_up_at_the_deadline_with_the_last_error(tmp_path, port) -> None:
    node = _Node(tmp_path / "data", port)
    node.start()
    clock = [0.0]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock[0] += seconds

    policy = RetryPolicy(first_wait=1, max_wait=8, deadline=30)
    s = RetryingStreams(_client(port), policy, clock=lambda: clock[0], sleep=sleep)
    s.create_stream("s")
    node.stop()  # never back
    t0 = time.monotonic()
    with pytest.raises(Unavailable, match="cannot connect"):
        s.pull("s", 0, 1)
    assert waits == [1, 2, 4, 8, 8]  # 23 s waited; the next 8 would pass the 30 s deadline
    assert time.monotonic() - t0 < 10


def test_an_error_that_retrying_cannot_fix_is_raised_at_once(tmp_path, port) -> None:
    node = _Node(tmp_path / "data", port)
    node.start()
    try:
        with RetryingStreams(_client(port), FAST) as s:
            with pytest.raises(UnknownStream):
                s.pull("nope", 0, 1)
            assert s.retries == 0
    finally:
        node.stop()


def test_a_service_that_is_not_there_at_all_fails_at_once(port) -> None:
    with pytest.raises(Unavailable, match="cannot connect"):
        RetryingStreams(_client(port), FAST)


def test_a_push_refused_for_a_full_disk_is_retried_until_space_frees(tmp_path, port) -> None:
    with small_tmpfs(tmp_path / "disk", "4m") as where:
        node = _Node(where / "data", port)
        node.start()
        grown: list[float] = []

        def sleep(seconds: float) -> None:  # space frees while the client backs off
            if not grown:
                subprocess.run(["mount", "-o", "remount,size=16m", str(where)], check=True)
            grown.append(seconds)

        try:
            with RetryingStreams(_client(port), FAST, sleep=sleep) as s:
                s.create_stream("s")
                n = 0
                while not grown:  # fills the 4 MiB; the refused push waits and succeeds
                    assert s.push("s", bytes(64_000)) == n
                    n += 1
                assert 10 < n < 100
                assert s.retries == len(grown) >= 1
        finally:
            node.stop()
