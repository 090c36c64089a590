"""Idle connections at the connection cap make room for a new client, against a real server.

Found from outside (review 5, A8): with the default limits (no idle timeout), 4 × 256
connections from 127.0.0.2-.5 (each address under the per-peer cap) that sent their version
byte and nothing more kept an honest client out for 50 s and more: "1024 connections open
(max_connections)". Now a new connection at a cap closes the connection idle the longest
(silent for ``EVICT_IDLE_AFTER`` s, owed nothing); connections that are talking are never the
ones closed. Scaled down: a cap of 24 connections."""

from __future__ import annotations

import time

from loglake.log import open_log
from loglake.streams.client import StreamClient
from loglake.streams.server import EVICT_IDLE_AFTER
from tests.streams.test_hostile_clients import attacker, closed_by_server, on_loop, serving

CAP = 24


def test_idle_connections_at_the_cap_make_room_for_a_new_client(tmp_path) -> None:
    log = open_log(tmp_path)
    try:
        limits = {"max_connections": CAP, "max_connections_per_peer": CAP}
        with serving(log, **limits) as srv, StreamClient(port=srv.port, timeout=10) as talker:
            talker.create_stream("s")
            idle = [attacker(srv.port) for _ in range(CAP - 1)]
            deadline = time.monotonic() + EVICT_IDLE_AFTER + 0.5
            while time.monotonic() < deadline:
                talker.push("s", b"t")
                time.sleep(0.05)
            # before: refused ("24 connections open (max_connections)")
            with StreamClient(port=srv.port, timeout=10) as honest:
                i = honest.push("s", b"honest")
                assert [m.data for m in honest.pull("s", i, 1)] == [b"honest"]
            assert talker.push("s", b"still here") > i  # the talking client was kept
            closed = [s for s in idle if closed_by_server(s, 0.2)]
            assert len(closed) == 1  # one place was needed, one idle connection went
            assert on_loop(srv, lambda server: server.refused) == 0
            for s in idle:
                s.close()
    finally:
        log.close()
