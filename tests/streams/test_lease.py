"""Leases on a real 3-node JetStream cluster (loopback): contenders are separate processes
(``lease_holder.py``) so a holder can be SIGKILLed or SIGSTOPped as a node would be."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from tests.streams.jetstream_fixtures import new_prefix

TTL = 3
"""Seconds; the handover bound the issue sets is ttl + 2 s."""


class Holder:
    """One contender process and the lines it printed."""

    def __init__(self, urls: str, bucket: str, name: str, holder: str) -> None:
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
                str(TTL),
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


@pytest.fixture
def contenders(nats_r3):
    made: list[Holder] = []
    bucket = new_prefix() + "_leases"
    name = "sealer-" + uuid.uuid4().hex[:6]

    def make(holder: str) -> Holder:
        h = Holder(nats_r3.url, bucket, name, holder)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def first_holder(a: Holder, b: Holder, timeout: float = 15) -> tuple[Holder, Holder]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if a.holds_now():
            return a, b
        if b.holds_now():
            return b, a
        time.sleep(0.05)
    raise AssertionError(f"nobody acquired the lease in {timeout}s: {a.seen} {b.seen}")


def test_of_two_contenders_exactly_one_holds(contenders):
    a, b = contenders("a"), contenders("b")
    holder, other = first_holder(a, b)
    for _ in range(20):  # ~2 s, several renewals
        assert holder.holds_now() and not other.holds_now()
        time.sleep(0.1)
    assert holder.send("put state x").startswith("ok")
    assert other.send("put state y").startswith("error LeaseLost")


def test_a_killed_holder_is_replaced_within_ttl_plus_two_seconds(contenders):
    a, b = contenders("a"), contenders("b")
    holder, other = first_holder(a, b)
    killed = time.monotonic()
    holder.proc.kill()
    line = other.expect("acquired", TTL + 2)
    took = time.monotonic() - killed
    assert took <= TTL + 2, took
    assert other.send("put state after").startswith("ok")
    print(f"handover after SIGKILL: {took:.2f}s ({line})")


def test_a_released_lease_is_taken_at_once(contenders):
    a, b = contenders("a"), contenders("b")
    holder, other = first_holder(a, b)
    released = time.monotonic()
    holder.send("release", "released")
    other.expect("acquired", TTL)
    assert time.monotonic() - released < TTL - 1  # not by expiry: the key was deleted


def test_a_paused_holder_resumed_after_losing_the_lease_writes_nothing(contenders):
    a, b = contenders("a"), contenders("b")
    holder, other = first_holder(a, b)
    old = int(holder.send("fence", "fence").split()[1])
    assert holder.send("put state before").startswith("ok")
    holder.proc.send_signal(signal.SIGSTOP)
    paused = time.monotonic()
    new = int(other.expect("acquired", TTL + 2).split()[1])
    assert time.monotonic() - paused <= TTL + 2
    assert new > old  # tokens only grow
    assert other.send("put state new").startswith("ok")
    holder.proc.send_signal(signal.SIGCONT)
    # the write it took its token for before the pause: the cluster refuses it
    answer = holder.send(f"putfenced {old} state stale")
    assert answer.startswith("error FencedOut"), answer
    # and by its own clock it knows it lost the lease
    assert holder.send("put state stale").startswith("error LeaseLost")
    assert any(line.startswith("lost") for line in holder.seen), holder.seen
    check = contenders("reader")
    assert check.send(f"putfenced {old} probe x").startswith("error FencedOut")
    assert other.send("put state newest").startswith("ok")
    assert check.send("get state", "value") == "value newest"


def test_an_expired_lease_fences_its_last_token_even_with_no_new_holder(contenders):
    a = contenders("a")
    a.expect("acquired", 10)
    token = int(a.send("fence", "fence").split()[1])
    a.send("release", "released")
    answer = contenders("b").send(f"putfenced {token} state late")
    # b may have acquired meanwhile; either way the released holder's token is dead
    assert answer.startswith("error FencedOut"), answer
