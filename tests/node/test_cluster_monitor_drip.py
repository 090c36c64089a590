"""``read_meta`` against a NATS monitoring endpoint that answers a byte at a time: ``urlopen``'s
timeout bounds each socket read, not the request, so such an endpoint held the cluster status
(and ``/metrics`` and ``/api/cluster``, behind ``ClusterView``'s lock) for as long as it sent.
Now the read is bounded by ``MONITOR_TIMEOUT`` and a read still running is not started again.
Loopback only; every wait bounded."""

from __future__ import annotations

import socket
import threading
import time

from loglake.node import cluster
from tests.peers import peer_server


def _read_into(got: list[cluster.MetaStatus | None], url: str) -> None:
    got.append(cluster.read_meta((url,)))


def test_a_dripping_monitoring_endpoint_holds_the_status_read_no_longer_than_its_timeout(
    monkeypatch,
):
    monkeypatch.setattr(cluster, "MONITOR_TIMEOUT", 0.5)
    accepted: list[socket.socket] = []

    def drip(conn: socket.socket) -> None:  # until the test's end closes the connection
        accepted.append(conn)
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n{")
        while True:  # a byte every 0.2 s: no socket read waits 0.5 s
            conn.sendall(b" ")
            time.sleep(0.2)

    with peer_server(drip) as url:
        for _ in range(3):  # the second and third find the first read still running
            got: list[cluster.MetaStatus | None] = []
            reader = threading.Thread(target=_read_into, args=(got, url), daemon=True)
            t0 = time.monotonic()
            reader.start()
            reader.join(3)  # before the change: still waiting (the drip lasts the test)
            assert not reader.is_alive() and time.monotonic() - t0 < 1.5
            assert got[0] is not None
            assert got[0].monitors == {url: "unreachable: no whole answer in 0.5 s"}
        assert len(accepted) == 1  # one read a URL at a time, not one a status read
