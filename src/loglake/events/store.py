"""The storage side of the events adapters: performs the cores' storage actions on ``Streams``.

Why: events reaches the log the way every other part does, through the one stream API
(``loglake.streams.api.Streams``): ``LocalStreams`` over an embedded log (``open_log`` in a data
dir) or ``StreamClient`` to a ``loglake serve`` node. So a role runs unchanged on either, and
several roles can share one node. This module is the only one in ``events`` that touches a
``Streams``; the cores (``orchestrator``, ``publisher``, ``journal``, ``ledger`` …) only queue
actions (``actions.py``).

:class:`StreamsStore` performs actions (blocking: adapters call it off their event loop) and
reads what a core needs at start: :func:`open_orchestrator` replays the journal, the ledger and
the heads of the system namespaces into a fresh orchestrator core; :func:`open_ledger` replays
a ledger stream.

Over the Ockam wire a message is only ``(index, data)``: no timestamps or record headers, so
everything a core stores travels inside ``data`` (the Publisher's stored-event form is in
``publisher.py``). The head of a stream is found with ``pull`` alone (the Ockam protocol has no
"length" operation): doubling probes, then a binary search — about ``2·log2(n)`` one-message
pulls, once per replay.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from icp_principal import Principal

from loglake.events.actions import (
    Action,
    AppendEvents,
    CancelReplayJob,
    JobAction,
    JournalWrite,
    ReadBounds,
    ReadJobOutput,
    ReadRange,
    ReplayJobSpec,
    StartReplayJob,
    StorageAction,
)
from loglake.events.journal import stream_name as journal_stream
from loglake.events.ledger import Ledger, ledger_stream
from loglake.events.orchestrator import Orchestrator, Quotas
from loglake.streams.api import Streams, UnknownStream
from loglake.streams.fence import UNFENCED, Fence

READ_BATCH = 4096


class StreamsStore:
    """Performs storage actions on a ``Streams`` (blocking I/O: run it off an event loop).

    Streams are created on first write (``create_stream`` is create-or-open). One store is
    used by one thread at a time (the adapters run one batch of actions at a time)."""

    def __init__(
        self, streams: Streams, fence: Fence = UNFENCED, fenced: tuple[str, ...] = ()
    ) -> None:
        self.streams = streams
        self.fence = fence
        """Where the once-only writes go on a cluster shared by several nodes: a
        ``JournalWrite`` to a stream in ``fenced`` (the orchestrator's journal) is appended
        through it, so a node that lost the journal's lease cannot write it."""
        self.fenced = frozenset(fenced)
        fence.guard(*fenced)
        self._created: set[str] = set()

    def _ensure(self, stream: str) -> None:
        if stream not in self._created:
            self.streams.create_stream(stream)
            self._created.add(stream)

    def perform(self, action: StorageAction) -> Any:
        return self.perform_many([action])[0]

    def perform_many(self, actions: Sequence[Action]) -> list[Any]:
        """Perform in order; consecutive writes to one stream go as one ``push_many`` (one
        group commit). Returns one result per action."""
        out: list[Any] = []
        i, n = 0, len(actions)
        while i < n:
            a = actions[i]
            if isinstance(a, AppendEvents | JournalWrite):
                j, payloads, sizes = i, [], []
                while j < n:
                    b = actions[j]
                    if not isinstance(b, AppendEvents | JournalWrite) or b.stream != a.stream:
                        break
                    chunk = b.payloads if isinstance(b, AppendEvents) else [b.record]
                    payloads.extend(chunk)
                    sizes.append(len(chunk))
                    j += 1
                self._ensure(a.stream)
                if a.stream in self.fenced and isinstance(a, JournalWrite):
                    ids = self.fence.append(self.streams, a.stream, payloads)
                else:
                    ids = self.streams.push_many(a.stream, payloads) if payloads else []
                pos = 0
                for b, size in zip(actions[i:j], sizes, strict=True):
                    got = ids[pos : pos + size]
                    pos += size
                    out.append(got if isinstance(b, AppendEvents) else got[0])
                i = j
            elif isinstance(a, ReadRange):
                out.append(self.read_range(a.stream, a.start, a.limit))
                i += 1
            elif isinstance(a, ReadBounds):
                out.append(self.bounds(a.stream))
                i += 1
            else:
                raise TypeError(f"not a storage action: {a!r}")
        return out

    # -- reads -------------------------------------------------------------------------------
    def exists(self, stream: str) -> bool:
        if stream in self._created:
            return True
        try:
            self.streams.partitions(stream)
        except UnknownStream:
            return False
        self._created.add(stream)
        return True

    def read_range(self, stream: str, start: int, limit: int) -> list[Any]:
        """The records of ``stream`` from ``start`` up to index ``start + limit`` (those there:
        retention may have removed some), in order. A pull may return fewer while more are
        there — a stream service answers at most ``max_pull_bytes`` (8 MiB) or
        ``MAX_PULL_MESSAGES`` a pull, a JetStream fetch its batch — so the range is pulled on
        from where the last pull ended until it is read or a pull returns nothing. Why: the
        publisher's replay batch (``ReadRange``) was one pull, and what it did not return was
        never replayed (2,000 events of 5 KB through ``loglake serve``: 1,600-odd read)."""
        if not self.exists(stream):
            return []
        end = start + limit
        out = self.streams.pull(stream, start, limit)
        while out and out[-1].index + 1 < end:
            more = self.streams.pull(stream, out[-1].index + 1, end - out[-1].index - 1)
            if not more:
                break
            out += more
        return out

    def payloads(self, stream: str) -> Iterator[tuple[int, bytes]]:
        """Every ``(index, data)`` of ``stream`` from its start (nothing if it does not exist)."""
        pos = 0
        while True:
            chunk = self.read_range(stream, pos, READ_BATCH)
            if not chunk:
                return
            for m in chunk:
                yield m.index, m.data
            pos = chunk[-1].index + 1

    def bounds(self, stream: str) -> tuple[int, int]:
        """``(first index kept, next index)``; ``(0, 0)`` when the stream does not exist."""
        if not self.exists(stream):
            return 0, 0
        return self.streams.bounds(stream)

    def head(self, stream: str) -> int:
        return self.bounds(stream)[1]


class ReplayJobs(Protocol):
    """What performs a replay's job actions (``loglake.pipeline.jobs.replay.SparkReplayJobs``:
    events imports nothing from pipeline; the adapter is handed one)."""

    def start(self, spec: ReplayJobSpec) -> None: ...
    def cancel(self, replay_id: int) -> None: ...
    def running(self) -> bool: ...
    def finished(self) -> list[tuple[int, Any]]: ...
    def read(self, output: str, offset: int, limit: int) -> list[Any]: ...


def perform_job(jobs: ReplayJobs | None, a: JobAction) -> Any:
    """Perform one job action (blocking for ``ReadJobOutput``: run it off an event loop)."""
    if jobs is None:
        raise RuntimeError(f"{a!r} needs a replay job runner, and the adapter has none")
    if isinstance(a, StartReplayJob):
        jobs.start(a.spec)
        return None
    if isinstance(a, CancelReplayJob):
        jobs.cancel(a.replay_id)
        return None
    if isinstance(a, ReadJobOutput):
        return jobs.read(a.output, a.offset, a.limit)
    raise TypeError(f"not a job action: {a!r}")


def orchestrator_streams(journal_name: str = "main", ledger_name: str = "main") -> tuple[str, str]:
    """The streams only the orchestrator writes — its journal and its ledger: on a cluster
    shared by several nodes, the ones its ``StreamsStore`` appends to through the fence of the
    journal's lease, so a node that lost the lease writes neither."""
    return journal_stream(journal_name), ledger_stream(ledger_name)


def open_ledger(store: StreamsStore, name: str = "main", fee: int = 10) -> Ledger:
    """A ledger core with the balances of every record in ``loglake.ledger.<name>``."""
    led = Ledger(ledger_stream(name), fee)
    led.restore(data for _, data in store.payloads(led.stream))
    return led


def open_orchestrator(
    store: StreamsStore,
    principal: Principal,
    broadcasters: list[Principal],
    quotas: Quotas | None = None,
    ledger: Ledger | None = None,
    homes: dict[bytes, Principal] | None = None,
    relay_replays: bool = False,
    journal_name: str = "main",
    job_threshold: int | None = None,
) -> Orchestrator:
    """An orchestrator core rebuilt from its journal (``JournalError`` if a record is bad),
    system-message numbering continuing from the system namespaces' streams."""
    orch = Orchestrator(
        principal,
        broadcasters,
        quotas,
        ledger,
        homes=homes,
        relay_replays=relay_replays,
        journal_name=journal_name,
        job_threshold=job_threshold,
    )
    records = [(i, data) for i, data in store.payloads(journal_stream(journal_name))]
    orch.restore(records)
    orch.continue_numbering({ns: store.head(ns) for ns in orch.system_namespaces()})
    return orch
