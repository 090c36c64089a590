"""What a role core asks its adapter to do: the actions (h11's events, in the other direction).

A core never performs I/O (DESIGN.md principle 1). A method of a core changes the core's
in-memory state and queues actions in its ``outbox``; an adapter (``network.py`` in one process,
``server.py`` over HTTP) takes them in order and performs them:

- :class:`Call` — call ``method`` on another role (a system notification to a broadcaster, a
  publish to a broadcaster, a status report to the orchestrator …). Its reply goes back to the
  core with ``Role.on_reply``.
- :class:`AppendEvents` — append payloads to a stream (a namespace's events, a system
  namespace's audit copy). Result: the indexes assigned, in order.
- :class:`JournalWrite` — append one durable state record (the orchestrator's journal, the
  ledger). Result: its index.
- :class:`ReadRange` — read at most ``limit`` messages of a stream from index ``start`` (the
  Publisher's procurement). Result: ``list[StreamMessage]``.
- :class:`ReadBounds` — the first index still kept and the next index of a stream. Result:
  ``(first, head)``; ``(0, 0)`` for a stream that does not exist.

Storage results go back to the core with ``Role.on_result``, which may queue more actions; an
adapter performs those before the rest of the batch, so the order of effects is the order in
which the core asked for them. Adapters keep one rule that makes "journalled before it takes
effect" true from outside: nothing queued after a storage action (a reply to the caller, a
call to another role) leaves the process before that storage action has been performed.

Actions compare by identity (``eq=False``): two appends of the same bytes are two appends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from icp_principal import Principal


@dataclass(eq=False)
class Call:
    """A call of ``method`` on the role whose principal is ``target``."""

    target: Principal
    method: str
    arg: Any
    token: Any = None
    """Opaque to adapters; returned with the reply to :meth:`Role.on_reply`."""
    ordered: bool = True
    """True: the call leaves once the role's ordered calls to other roles are answered, and
    its reply reaches the core in call order (a role that tells one role something, then
    another, knows the first has handled it). False: the call neither waits for nor holds up
    any ordered call (it shares only its target's connection with them); it keeps its place
    only among the unordered calls to its own target (sent in queue order, two unanswered at
    a time; its reply reaches the core after theirs, as soon as it comes). For calls nothing
    else waits on — a notification to a subscriber, a replay's progress — so one slow target
    stalls no other."""
    waits: bool = False
    """For an unordered call: True, it leaves only once the ordered calls queued before it are
    answered, as an ordered call would, though no call waits for it. For the orchestrator's
    system notifications to publishers and subscribers: the broadcaster still hears first,
    and a publisher or subscriber slow to answer holds up nothing."""


@dataclass(eq=False)
class AppendEvents:
    stream: str
    payloads: list[bytes]
    token: Any = None


@dataclass(eq=False)
class JournalWrite:
    stream: str
    record: bytes


@dataclass(eq=False)
class ReadRange:
    stream: str
    start: int
    limit: int
    token: Any = None


@dataclass(eq=False)
class ReadBounds:
    stream: str
    token: Any = None


@dataclass(frozen=True)
class ReplayJobSpec:
    """What a replay job procures: ``[start, end)`` of ``namespace`` (partition
    0, as the Publisher stores it), skip then filter (loglake's definitions, ``filters.py``),
    encoded as replay ``replay_id``'s notifications with ``source`` = the Publisher.
    ``open_ended``: the events carry ``icrc77:replay:end_id = end - 1``."""

    replay_id: int
    namespace: str
    start: int
    end: int
    source: bytes
    filter: str | None
    skip: tuple[int, int] | None
    open_ended: bool


@dataclass(eq=False)
class StartReplayJob:
    """Orchestrator: run procurement of ``spec`` as a Spark job (asynchronous: the adapter
    reports the end with ``Orchestrator.job_finished``). Result: None."""

    spec: ReplayJobSpec


@dataclass(eq=False)
class CancelReplayJob:
    """Orchestrator: stop replay ``replay_id``'s job (cancel). Result: None."""

    replay_id: int


@dataclass(eq=False)
class ReadJobOutput:
    """Broadcaster: at most ``limit`` notification parts of a finished job's ``output``, from
    the ``offset``-th, in event-id order. Result: ``list[(event_id, a, b, c)]``."""

    output: str
    offset: int
    limit: int
    token: Any = None


JobAction = StartReplayJob | CancelReplayJob | ReadJobOutput
StorageAction = AppendEvents | JournalWrite | ReadRange | ReadBounds | JobAction
Action = Call | StorageAction
