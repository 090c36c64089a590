"""Replies of pipelined pulls keep their order per return route, at a cost linear in the pulls.

Found from outside (review 9): a client pipelined N pulls (of one record each) on one return
route. Every finished pull rescanned every unanswered request of the connection
(``_Connection._flush_slots``), hashing their return routes, so the event loop's time grew with
N squared: 1,000 pulls took 1.5 s, 8,000 took 39.9 s (44 of 54 s of CPU in the rescans), and
another client's pushes waited up to 0.7 s meanwhile. Now each return route has its own queue
and a finished pull looks only at the head of its own.

Against a real server on loopback. The cost test times N and 4 N pulls on a return route of
the most addresses the decoder allows (32): hashing a route is what each rescan step cost, so
the quadratic term shows at a few hundred pulls and the test stays short; it compares the two
times with each other (4 × the pulls must take under 6 × the time), not with a fixed bound."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from loglake.log import StreamConfig, open_log
from loglake.streams import codec
from loglake.streams.messages import PullRequest, PullResponse, PushConfirm
from loglake.streams.service import worker_address
from loglake.wire.ockam import Address, RoutingMessage, TcpConnection, encode_frame, route
from tests.procs import free_port, wait_port
from tests.streams.test_hostile_clients import serving

LONG_BACK = tuple(Address.local(f"hop{k:02d}" + "x" * 100) for k in range(32))
"""A return route of 32 addresses of 105 bytes: the decoder's most addresses, within its 4,096
bytes (``wire/ockam.py``)."""
WAIT = 60.0


def _client(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    s.sendall(TcpConnection.initial_bytes())
    return s


def _replies(s: socket.socket, n: int) -> list[RoutingMessage]:
    wire = TcpConnection(1 << 22)
    got: list[RoutingMessage] = []
    while len(got) < n:
        data = s.recv(1 << 20)
        assert data, f"closed after {len(got)} replies"
        got += wire.receive_data(data)
    return got


def _pulls_take(port: int, n: int) -> float:
    """Seconds from sending ``n`` pipelined pulls (one record each, all on ``LONG_BACK``) to
    having all their replies, which come in request order."""
    to = route(worker_address("s", 0))
    frames = b"".join(
        encode_frame(RoutingMessage(to, LONG_BACK, codec.encode_payload(PullRequest(i, i, 1))))
        for i in range(n)
    )
    s = _client(port)
    try:
        t = time.perf_counter()
        sender = threading.Thread(target=s.sendall, args=(frames,), daemon=True)
        sender.start()
        got = _replies(s, n)
        took = time.perf_counter() - t
        sender.join(WAIT)
    finally:
        s.close()
    pulls = [codec.decode_pull_reply(m.payload) for m in got]
    assert [(p.request_id, [m.index for m in p.messages]) for p in pulls] == [
        (i, [i]) for i in range(n)
    ]
    return took


def _cpu_seconds(pid: int) -> float:
    """CPU time (user and system) the process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_cost_of_pipelined_pulls_on_one_return_route_grows_linearly(tmp_path) -> None:
    """The server's CPU time (``loglake serve``, its own process: waits and the test's own
    work are not counted) for N and 4 N pipelined pulls."""
    n = 300
    data = tmp_path / "data"
    log = open_log(data)
    log.create_stream("s", StreamConfig(durability="none"))
    log.append_payloads("s", [b"r%d" % i for i in range(4 * n)])
    log.close()
    port = free_port()
    cmd = [sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(data)]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_port(port, proc)

        def cost(k: int) -> float:
            before = _cpu_seconds(proc.pid)
            _pulls_take(port, k)
            return _cpu_seconds(proc.pid) - before

        cost(50)  # warm up (threads, caches)
        # the fewest of two tries each: a loaded machine adds time, never takes it away
        small = min(cost(n) for _ in range(2))
        large = min(cost(4 * n) for _ in range(2))
    finally:
        proc.kill()
        proc.wait(10)
    # before: 300 → 1,200 pulls cost ~12 × the CPU; linear is 4 ×
    print(f"server CPU: {n} pulls {small:.2f} s, {4 * n} pulls {large:.2f} s")
    assert large < 6 * small, (small, large)


def test_replies_keep_request_order_per_return_route_whatever_order_the_reads_finish(
    tmp_path,
) -> None:
    """Pulls and pushes on two return routes, in one batch; the first pull is read slowly, so
    the later reads finish first. Each route's replies come in its requests' order, and a push
    behind a pull on its route is answered after it (before: the pull never started while the
    push's confirm waited for it, and neither was ever sent)."""
    log = open_log(tmp_path / "data")
    log.create_stream("s", StreamConfig(durability="none"))
    log.append_payloads("s", [b"r%d" % i for i in range(10)])
    to = route(worker_address("s", 0))
    a, b = route("a"), route("b")
    plan: list[tuple[tuple[Address, ...], str, int]] = [
        (a, "pull", 0), (a, "push", 100), (b, "pull", 1), (a, "pull", 2), (b, "push", 101),
        (b, "pull", 3), (a, "push", 102), (a, "pull", 4), (b, "pull", 5), (a, "pull", 6),
    ]  # fmt: skip
    frames = []
    for back, kind, rid in plan:
        payload = (
            codec.encode_payload(PullRequest(rid, rid, 1))
            if kind == "pull"
            else codec.encode_push_request(rid, b"p%d" % rid)
        )
        frames.append(encode_frame(RoutingMessage(to, back, payload)))
    try:
        with serving(log) as srv:
            server = srv.server
            assert server is not None
            real, slowed = server._read, threading.Event()

            def slow_first(pending: Any) -> Any:
                if not slowed.is_set():
                    slowed.set()
                    time.sleep(0.5)
                return real(pending)

            server._read = slow_first  # type: ignore[method-assign]
            s = _client(srv.port)
            s.sendall(b"".join(frames))
            got = _replies(s, len(plan))
            s.close()
        assert [m.data for m in log.read("s", 10, 10)] == [b"p100", b"p101", b"p102"]
    finally:
        log.close()

    def what(m: RoutingMessage) -> tuple[str, int]:
        if codec.decode_base(m.payload).protocol == "stream_pull":
            pull = codec.decode_pull_reply(m.payload)
            assert isinstance(pull, PullResponse), pull
            return "pull", pull.request_id
        confirm = codec.decode_response(m.payload, PushConfirm)
        assert isinstance(confirm, PushConfirm), confirm
        return "push", confirm.request_id

    for back in (a, b):
        sent = [(kind, rid) for r, kind, rid in plan if r == back]
        assert [what(m) for m in got if m.onward_route == back] == sent
