"""A ``Streams`` that outlives a restarting node: retriable errors are retried with back-off,
and a lost connection is reopened.

Why a wrapper and not retries in each part: whether to retry is the error's to say
(``LoglakeError.retriable``), and how (back-off, a fresh connection, a deadline) is the same for
every part, so the Cardinal transport, the events store and the archives builder take the same
object as any other ``Streams``. The decision that differs per caller is whether a push may be
repeated: after a lost connection its outcome is unknown, so repeating it may store it twice.
Cardinal reassembles exactly once from duplicates and may; a part that may not gets the error
(``Unavailable``) and decides.

Reads, index gets and saves (monotonic: saving the same index twice is one save) and creates
(an existing stream with the same partitions is opened) are safe to repeat and always retried.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from loglake.errors import Unavailable
from loglake.streams.api import StreamMessage, Streams
from loglake.structured_logging import log_event

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential back-off from ``first_wait`` to ``max_wait``, until ``deadline`` seconds
    after the first failure of a call; then the last error is raised."""

    first_wait: float = 0.1
    max_wait: float = 5.0
    deadline: float = 60.0

    def waits(self) -> Any:
        wait = self.first_wait
        while True:
            yield wait
            wait = min(self.max_wait, wait * 2)


class RetryingStreams:
    """``Streams`` over whatever ``connect()`` returns (a ``StreamClient`` to ``loglake serve``),
    retrying what ``retriable`` says may succeed later. ``repeat_pushes``: the caller tolerates a
    message stored twice, so a push whose outcome a lost connection hid is sent again.
    ``close()`` it."""

    def __init__(
        self,
        connect: Callable[[], Streams],
        policy: RetryPolicy | None = None,
        *,
        repeat_pushes: bool = False,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._connect = connect
        self.policy = policy or RetryPolicy()
        self.repeat_pushes = repeat_pushes
        self._clock, self._sleep = clock, sleep
        self._client: Streams | None = None
        self.retries = 0
        """Attempts repeated so far (after a retriable error): for metrics and tests."""
        self._current()  # fail now, not at first use, when the service is not there at all

    def _current(self) -> Streams:
        if self._client is None:
            self._client = self._connect()
        return self._client

    def _drop(self) -> None:
        client, self._client = self._client, None
        close = getattr(client, "close", None)
        if close is not None:
            with contextlib.suppress(OSError):  # the connection is already gone
                close()

    def _run(
        self,
        what: str,
        call: Callable[[Streams], T],
        repeatable: bool = True,
        partial: bool = False,
    ) -> T:
        """``call`` on the current connection, again after each retriable error. A call that is
        not ``repeatable`` is not repeated after a lost connection (its outcome is unknown) nor,
        if ``partial`` (several pushes: a refusal may follow stored ones), after any error."""
        waits = self.policy.waits()
        give_up: float | None = None
        while True:
            try:
                return call(self._current())
            except Exception as e:
                if not getattr(e, "retriable", False):
                    raise
                lost = isinstance(e, Unavailable)
                if lost:
                    self._drop()
                if not repeatable and (lost or partial):
                    raise  # a repeat may store some of it twice
                now = self._clock()
                give_up = now + self.policy.deadline if give_up is None else give_up
                wait = next(waits)
                if now + wait > give_up:
                    raise
                self.retries += 1
                log_event(logger, logging.INFO, "retrying", call=what, wait=wait, error=str(e))
                self._sleep(wait)

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> RetryingStreams:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- Streams --------------------------------------------------------------------------------
    def create_stream(self, name: str | None = None, partitions: int = 1) -> str:
        # a random name (None) is not repeatable: a retry would make a second stream
        return self._run(
            "create_stream", lambda s: s.create_stream(name, partitions), name is not None
        )

    def partitions(self, stream: str) -> int:
        return self._run("partitions", lambda s: s.partitions(stream))

    def push(self, stream: str, data: bytes, partition: int = 0) -> int:
        return self._run("push", lambda s: s.push(stream, data, partition), self.repeat_pushes)

    def push_many(self, stream: str, datas: Sequence[bytes], partition: int = 0) -> list[int]:
        return self._run(
            "push_many",
            lambda s: s.push_many(stream, datas, partition),
            self.repeat_pushes,
            partial=True,
        )

    def pull(self, stream: str, index: int, limit: int, partition: int = 0) -> list[StreamMessage]:
        return self._run("pull", lambda s: s.pull(stream, index, limit, partition))

    def bounds(self, stream: str, partition: int = 0) -> tuple[int, int]:
        return self._run("bounds", lambda s: s.bounds(stream, partition))

    def get_index(self, client_id: str, stream: str, partition: int = 0) -> int:
        return self._run("get_index", lambda s: s.get_index(client_id, stream, partition))

    def save_index(self, client_id: str, stream: str, index: int, partition: int = 0) -> int:
        return self._run("save_index", lambda s: s.save_index(client_id, stream, index, partition))

    def truncate_before(self, stream: str, index: int, partition: int = 0) -> int:
        return self._run("truncate_before", lambda s: s.truncate_before(stream, index, partition))

    def __getattr__(self, name: str) -> Any:
        # what a particular client adds beyond ``Streams`` (``info``, ``list_streams``): on the
        # current connection, not retried. Private names are never forwarded (an attribute this
        # object has not set yet must not recurse through ``_current``).
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._current(), name)
