"""SIGKILL crash lives for the durable parts (issue 15 §3), after ``tests/log/crash_writer.py``.

A life is a child process that opens a part (its recovery runs) and performs operations,
writing one line per acknowledged operation to a pipe (``ack <line>``, one ``os.write`` each, so
a line cut by the kill is not a whole acknowledgement). The parent SIGKILLs it at a seeded
random moment — one life in four while it is still opening — reopens the part and checks every
acknowledgement so far (``Part.check``).

Why ``fork`` rather than a new interpreter: a life then costs milliseconds instead of the ~1 s
of starting Python and importing the part, which is what lets ``make test`` afford 10 kills of
each of seven parts. The child is a real process (its own fds, locks and page cache writes),
killed by a real SIGKILL; it never returns into the caller (``os._exit``). The caller must not
hold the part open while forking.

A SIGKILL leaves the page cache intact, so these lives check recovery from a dead process, not
what an fsync promises; ``tests/faults/test_faults.py`` adds power losses after disk faults.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.parts import PARTS, Part, close_quietly, preload

LIFE_LIMIT_S = 30.0
"""A life that is never killed stops writing after this long (a bound, not a timing)."""


@dataclass
class Figures:
    part: str
    lives: int = 0
    acks: int = 0
    checked: int = 0
    killed_opening: int = 0
    seconds: float = 0.0
    acks_list: list[str] = field(default_factory=list)


def _child(part: Part, root: Path, life: int, seed: int, fd: int) -> int:
    rnd = random.Random(seed)
    os.write(fd, b"opening\n")
    part.open(root, life)
    os.write(fd, b"ready\n")
    deadline = time.monotonic() + LIFE_LIMIT_S
    while time.monotonic() < deadline:
        ack = part.step(rnd)
        if ack is None:  # nothing left to do: wait for the kill
            time.sleep(0.01)
            continue
        os.write(fd, b"ack " + ack.encode() + b"\n")
    part.close()
    return 0


def _read_until(fd: int, buf: bytearray, want: bytes, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while want not in buf:
        left = end - time.monotonic()
        if left <= 0:
            return False
        r, _, _ = select.select([fd], [], [], left)
        if r:
            chunk = os.read(fd, 65536)
            if not chunk:
                return False
            buf += chunk
    return True


def life(part: Part, root: Path, n: int, rnd: random.Random) -> tuple[list[str], bool]:
    """One child life of ``part`` on ``root``, SIGKILLed at a random moment. Returns the
    acknowledgements it wrote and whether it was killed while opening."""
    r, w = os.pipe()
    seed = rnd.randrange(1 << 32)
    opening = rnd.random() < 0.25
    pid = os.fork()
    if pid == 0:  # the child: never return into the caller
        code = 1
        try:
            os.close(r)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            code = _child(part, root, n, seed, w)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(w)
    buf = bytearray()
    try:
        ok = _read_until(r, buf, b"opening\n", 30)
        assert ok, f"{part.name}: life {n} never started"
        if opening:
            time.sleep(rnd.uniform(0.0, 0.03))
        else:
            ok = _read_until(r, buf, b"ready\n", 30)
            assert ok, f"{part.name}: life {n} died while opening (see its traceback above)"
            time.sleep(rnd.uniform(0.01, 0.25))
        os.kill(pid, signal.SIGKILL)
        while chunk := os.read(r, 65536):
            buf += chunk
    finally:
        os.close(r)
        with contextlib.suppress(ProcessLookupError):  # a life that failed to start
            os.kill(pid, signal.SIGKILL)
        with_status = os.waitpid(pid, 0)[1]
    died = os.WIFSIGNALED(with_status) and os.WTERMSIG(with_status) == signal.SIGKILL
    assert died, f"{part.name}: life {n} ended on its own (status {with_status}), not by the kill"
    lines = bytes(buf).split(b"\n")[:-1]  # a line cut by the kill is no acknowledgement
    acks = [ln[4:].decode() for ln in lines if ln.startswith(b"ack ")]
    return acks, opening and b"ready\n" not in buf


def run_part(name: str, root: Path, kills: int, seed: int) -> Figures:
    """``kills`` lives of part ``name`` on a fresh ``root``, each checked against every
    acknowledgement so far. Raises ``AssertionError`` naming the part, life and seed."""
    preload()  # a child never imports: another thread may hold the import lock at the fork
    part = PARTS[name]()
    fig = Figures(name)
    rnd = random.Random(seed)
    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    part.setup(root)
    for n in range(kills):
        acks, at_open = life(part, root, n, rnd)
        fig.lives += 1
        fig.acks += len(acks)
        fig.killed_opening += at_open
        fig.acks_list += acks
        try:
            fig.checked = part.check(root, fig.acks_list)
        except AssertionError as e:
            raise AssertionError(f"{name}: after life {n} (seed {seed}): {e}") from e
        finally:
            close_quietly(part)
    fig.seconds = time.perf_counter() - t0
    return fig
