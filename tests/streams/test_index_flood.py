"""A flood of consumer-index requests from one client does not stall the others, and what the
flood saved is stored, monotonic and durable (docs/streams.md, "Saving an index is a cast").

Found from outside: the index service's requests were performed one by one on the event loop,
each save its own fsync of the consumer store, and a whole read's worth (thousands) before
anything else. One client's 8,000 pipelined ``SaveIndex`` (a cast: no reply, so no output flow
control held it back) made another client's pushes wait 24 s each; 15,000 pipelined ``GetIndex``
with new client ids (each one wrote a record, with its fsync) held them 28 s, and left 15,000
permanent records."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from loglake.log import open_log
from loglake.log.consumer_store import FILE_NAME, encode_entry
from loglake.streams import codec
from loglake.streams.client import StreamClient
from loglake.streams.messages import GetIndex, Index, SaveIndex
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService
from loglake.wire.ockam import RoutingMessage, TcpConnection, encode_frame, route
from tests.procs import wait_port

SAVES = 8_000
PUSHES = 10
BOUND_S = 2.0
"""The other client's slowest push while the flood is served (before: ~24 s; now tens of ms,
a few hundred on a loaded 2-core machine)."""


def raw_client(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(TcpConnection.initial_bytes())
    assert s.recv(1) == b"\x01"
    return s


def index_frame(request: object) -> bytes:
    msg = RoutingMessage(
        route("stream_index_service"), route("flood"), codec.encode_payload(request)
    )
    return encode_frame(msg)


def serve(data_dir, port: int) -> subprocess.Popen:
    args = ["serve", "--data-dir", str(data_dir), "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "loglake.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc)
    except BaseException:
        proc.kill()
        raise
    return proc


def test_a_flood_of_index_saves_does_not_stall_other_clients_and_is_durable(tmp_path, port) -> None:
    """One client sends 8,000 ``SaveIndex`` with rising indexes in one write and never reads;
    a client connected before it pushes one at a time meanwhile: each push is confirmed within
    ``BOUND_S``. The flood's last save is then what a ``GetIndex`` answers, and it survives a
    SIGKILL of the server (a save is fsynced before any get sees it)."""
    proc = serve(tmp_path, port)
    try:
        with StreamClient(port=port, timeout=60) as victim:
            victim.create_stream("orders")
            victim.push("orders", b"warm-up")  # both paths warm: a latency, not a first use
            assert victim.get_index("warm-up", "orders") == 0
            flood = raw_client(port)
            try:
                flood.sendall(
                    b"".join(index_frame(SaveIndex("c", "orders", i + 1)) for i in range(SAVES))
                )
                took = []
                for i in range(PUSHES):
                    t = time.monotonic()
                    victim.push("orders", b"%d" % i)
                    took.append(time.monotonic() - t)
                assert max(took) < BOUND_S, [round(x, 3) for x in took]
                with StreamClient(port=port, timeout=60) as reader:
                    deadline = time.monotonic() + 60
                    while (got := reader.get_index("c", "orders")) < SAVES:
                        assert time.monotonic() < deadline, got
                        time.sleep(0.05)
                    assert got == SAVES
            finally:
                flood.close()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    log = open_log(tmp_path)
    try:
        assert log.get_index("c", "orders") == SAVES
        assert log.consumer_indexes() == {("c", "orders", 0): SAVES}
    finally:
        log.close()


def test_gets_of_new_client_ids_are_answered_0_and_write_nothing(tmp_path) -> None:
    """A ``GetIndex`` of a client id that never saved is answered ``some(0)`` (the bytes the
    spec's "new record ... with an index 0" gives) without writing a record: reading is
    not saving, as in the reference (its storages answer ``:undefined`` and store nothing).
    2,000 pipelined gets with new client ids leave the consumer store as it was."""
    n = 2_000  # several turns of the loop (``server.INDEX_TURN``)
    log = open_log(tmp_path)
    log.create_stream("orders")
    store = tmp_path / FILE_NAME
    size = store.stat().st_size
    try:
        with BackgroundServer(StreamService(log)) as srv:
            s = raw_client(srv.port)
            try:
                s.sendall(b"".join(index_frame(GetIndex(f"c{i}", "orders")) for i in range(n)))
                wire = TcpConnection(1 << 20)
                wire.receive_data(b"\x01")
                replies: list[RoutingMessage] = []
                while len(replies) < n:
                    data = s.recv(1 << 20)
                    assert data, f"closed after {len(replies)} replies"
                    replies += wire.receive_data(data)
            finally:
                s.close()
            answers = [codec.decode_response(m.payload, Index) for m in replies]
            assert answers == [Index(f"c{i}", "orders", 0) for i in range(n)]
            with StreamClient(port=srv.port, timeout=30) as c:
                assert c.get_index("c7", "orders") == 0
                assert c.save_index("c7", "orders", 3) == 3
        assert log.consumer_indexes() == {("c7", "orders", 0): 3}
    finally:
        log.close()
    assert store.stat().st_size == size + len(encode_entry("c7", "orders", 0, 3))  # the save
    log = open_log(tmp_path)
    try:
        assert log.consumer_indexes() == {("c7", "orders", 0): 3}
    finally:
        log.close()
