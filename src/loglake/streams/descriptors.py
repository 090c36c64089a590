"""The process's file descriptors: the soft limit raised at start, and one budget for the
connections of every server in the process.

Why: a node runs the stream server, its HTTP API and up to four events roles in one process,
each with a connection cap of its own (1,024, 512 and 512 each: 3,584 in all), and the log
keeps up to half the soft limit for its open partitions (``default_max_open_partitions``).
Under the soft limit most systems start processes with (1,024), connections alone could take
every descriptor; the log's next ``open`` then failed with EMFILE, and an events role whose
storage fails stops serving until it is restarted. So a server process raises its soft limit
to the hard one at start (``raise_soft_limit``: the JVM does the same), and every connection a
server accepts first takes a place in ``CONNECTIONS``, a quarter of the soft limit for the
whole process (the partitions have half, the rest is for lake files, sealed segments being
read and outgoing connections); one past it is closed as it is accepted, as one past the
server's own cap is.
"""

from __future__ import annotations

import logging
import resource
import threading

log = logging.getLogger("loglake.streams")

UNLIMITED = 1 << 20
"""What an unlimited soft or hard limit counts as (Linux's default ``fs.nr_open``)."""
CONNECTIONS_SHARE = 4
"""The process's connections may hold ``1 / CONNECTIONS_SHARE`` of its soft limit."""


def soft_limit() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return UNLIMITED if soft == resource.RLIM_INFINITY or soft <= 0 else soft


def raise_soft_limit() -> int:
    """The soft descriptor limit raised to the hard one (at most ``UNLIMITED``); returns the
    limit now in force. A system that refuses keeps the old one (logged)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = UNLIMITED if hard == resource.RLIM_INFINITY or hard <= 0 else min(hard, UNLIMITED)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return soft_limit()
    # macOS refuses more than its OPEN_MAX (10,240) even under an unlimited hard limit
    error: Exception | None = None
    for limit in dict.fromkeys(x for x in (want, min(want, 10_240)) if x > soft):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        except (ValueError, OSError) as e:
            error = e
            continue
        log.info("descriptor limit raised from %d to %d", soft, limit)
        return soft_limit()
    if error is not None:
        log.warning("descriptor limit kept at %d (raising it failed: %s)", soft, error)
    return soft_limit()


class Connections:
    """Connections open in the process, all servers together, against ``limit`` (a share of
    the soft limit as it is at each admission: raised at start, it counts from then on)."""

    def __init__(self) -> None:
        self.open = 0
        self.refused = 0
        self._lock = threading.Lock()  # a node's servers run on event loops of their own threads

    @property
    def limit(self) -> int:
        return max(1, soft_limit() // CONNECTIONS_SHARE)

    def admit(self) -> bool:
        """Count one connection in; False (and nothing counted) when the process holds its
        share already: the caller closes it."""
        limit = self.limit
        with self._lock:
            if self.open >= limit:
                self.refused += 1
                return False
            self.open += 1
            return True

    def release(self) -> None:
        """One admitted connection closed."""
        with self._lock:
            self.open = max(0, self.open - 1)


CONNECTIONS = Connections()
"""The process's budget: every server's accept path admits and releases through it."""
