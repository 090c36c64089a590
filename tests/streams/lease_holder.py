"""A lease contender as its own process, for the lease tests: it contends for one lease on a
NATS cluster and reports on stdout; commands come on stdin, one a line.

    python -m tests.streams.lease_holder URLS BUCKET NAME HOLDER TTL

``Holder`` starts one and reads what it says (the lease tests, ``benchmarks/lease.py``).

stdout: ``ready``, ``acquired <token>``, ``lost <token> <reason>``, and one answer per command.
stdin: ``fence`` (→ ``fence <token>`` or ``error <Type>``), ``put KEY VALUE``,
``putfenced TOKEN KEY VALUE`` (→ ``ok <revision>`` or ``error <Type>``), ``get KEY``
(→ ``value <v>``, ``-`` if none), ``release``."""

from __future__ import annotations

import asyncio
import queue
import signal
import subprocess
import sys
import threading
import time

import nats

from loglake.streams.lease import Acquired, JetStreamLease, lease_bucket


class Holder:
    """One contender process and the lines it printed."""

    def __init__(self, urls: str, bucket: str, name: str, holder: str, ttl: int) -> None:
        self.holder = holder
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.streams.lease_holder",
                urls,
                bucket,
                name,
                holder,
                str(ttl),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.seen: list[str] = []
        self.expect("ready", 30)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if line.startswith(prefix):
                return line
        raise AssertionError(f"{self.holder}: no {prefix!r} within {timeout}s; saw {self.seen}")

    def holds_now(self) -> bool:
        """Drain what it printed; True if its last acquired/lost line is ``acquired``."""
        while True:
            try:
                self.seen.append(self.lines.get_nowait())
            except queue.Empty:
                break
        state = [s for s in self.seen if s.startswith(("acquired", "lost"))]
        return bool(state) and state[-1].startswith("acquired")

    def send(self, line: str, answer: str = "", timeout: float = 10) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.expect(answer or ("ok", "error", "fence"), timeout) if answer != "-" else ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(urls: str, bucket: str, name: str, holder: str, ttl: int) -> None:
    nc = await nats.connect(urls.split(","), connect_timeout=2, max_reconnect_attempts=-1)
    js = nc.jetstream()
    replicas = min(3, len(urls.split(",")))
    await lease_bucket(js, bucket, replicas=replicas)

    def on_change(event) -> None:
        if isinstance(event, Acquired):
            say(f"acquired {event.token}")
        else:
            say(f"lost {event.token} {event.reason}")

    lease = await JetStreamLease(
        js, bucket, name, holder, ttl=ttl, replicas=replicas, on_change=on_change
    ).start()
    say("ready")
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        cmd, *args = line.split()
        try:
            if cmd == "fence":
                say(f"fence {lease.fence()}")
            elif cmd == "put":
                say(f"ok {await lease.put(args[0], args[1].encode())}")
            elif cmd == "putfenced":
                say(f"ok {await lease.put_fenced(args[1], args[2].encode(), int(args[0]))}")
            elif cmd == "get":
                value = await lease.get(args[0])
                say(f"value {value.decode() if value is not None else '-'}")
            elif cmd == "release":
                await lease.release()
                say("released")
        except Exception as e:  # the test reads the type
            say(f"error {type(e).__name__} {e}")
    await lease.close()
    await nc.close()


if __name__ == "__main__":
    urls, bucket, name, holder, ttl = sys.argv[1:6]
    asyncio.run(main(urls, bucket, name, holder, int(ttl)))
