"""Loopback peers that misbehave, for the attack tests of the parts that call out: a TCP
server that runs a test's handler on each connection, or never reads at all."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tests.procs import free_port


@contextmanager
def peer_server(handle: Callable[[socket.socket], None] | None = None) -> Iterator[str]:
    """A loopback TCP server that runs ``handle`` on each connection (in a thread of its own,
    nothing read before it) and closes every connection when the test ends; without
    ``handle`` it never reads (a hung or hostile peer: what a client writes stays in the
    sockets' buffers)."""
    srv = socket.create_server(("127.0.0.1", free_port()))
    held: list[socket.socket] = []

    def serve(conn: socket.socket) -> None:
        assert handle is not None
        with contextlib.suppress(OSError):  # the client, or the test's end, closed it
            handle(conn)

    def run() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)
            if handle is not None:
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        # close() alone does not wake the thread's accept(): the join took its whole 10 s
        with contextlib.suppress(OSError):
            srv.shutdown(socket.SHUT_RDWR)
        srv.close()
        for conn in held:
            conn.close()
        t.join(10)
