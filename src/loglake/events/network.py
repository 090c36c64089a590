"""Runs role cores in one process: a deterministic, in-order message router.

The in-process adapter of the sans-I/O cores (the model is STYLE.md's "simulate before you
trust"): it drains each role's outbox in FIFO order, passes every argument and result through
the same Candid codec the HTTP adapter uses (so a message that would not survive the wire fails
here too), dispatches to the target core with the sender as caller, and feeds replies back.
Storage actions are performed at once, in order, on the role's ``StreamsStore`` (given to
:meth:`InProcessNetwork.add`), and their results fed back before the next action of the outbox — the
same order the HTTP adapter keeps. Time is whatever ``clock`` returns (tests pass a fake clock).

With :class:`Faults` the network misbehaves the ways the HTTP adapter can, drawn from one seeded
``random.Random`` so a run replays exactly from its seed (TigerBeetle's simulator, STYLE.md): a
call is lost on the way (the caller's reply is a ``ConnectionError``), runs but its reply is lost
(the same error, after the callee acted — a timeout), runs twice (a redelivery whose second
reply nobody reads), or is held back while later calls overtake it. What the HTTP adapter
guarantees is kept: one sender's ordered calls are delivered in the order it queued them (its
sender waits for every reply before the next), and its unordered calls to one target in the
order it queued them; an unordered call may overtake or be overtaken by its sender's other
calls.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from icp_principal import Principal

from loglake.events.actions import Call, JobAction, StartReplayJob
from loglake.events.codec import METHODS
from loglake.events.orchestrator import Orchestrator
from loglake.events.resend import CallRefused, NoAddress
from loglake.events.role import Role
from loglake.events.store import ReplayJobs, StreamsStore, perform_job


@dataclass
class Faults:
    """Seeded misbehaviour of :class:`InProcessNetwork`; each field is a per-call probability."""

    seed: int
    drop: float = 0.0
    """The call never reaches its target; the caller's reply is a ``ConnectionError``."""
    drop_reply: float = 0.0
    """The target handles the call, the reply is lost: the caller sees a ``ConnectionError``."""
    duplicate: float = 0.0
    """The call is delivered again later; the copy's reply is discarded."""
    delay: float = 0.0
    """Another sender's call (if one is queued) is delivered first."""
    rng: random.Random = field(init=False, repr=False)
    counts: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.counts = dict.fromkeys(("drop", "drop_reply", "duplicate", "delay"), 0)

    def hit(self, kind: str) -> bool:
        p: float = getattr(self, kind)
        if p and self.rng.random() < p:
            self.counts[kind] += 1
            return True
        return False


class InProcessNetwork:
    def __init__(
        self,
        clock: Callable[[], int],
        jobs: ReplayJobs | None = None,
        faults: Faults | None = None,
        max_body_bytes: int | None = None,
    ) -> None:
        self.clock = clock
        self.faults = faults
        """None: a perfect in-order network (the default)."""
        self.max_body_bytes = max_body_bytes
        """A call whose encoded argument is longer is answered as ``HttpRoleServer`` answers
        it (413: a ``ConnectionError`` to the caller) and never reaches its target; None: no
        limit."""
        self.jobs = jobs
        """Performs replay job actions; their ends go to the orchestrator that
        started them, when the network is otherwise idle."""
        self._job_owner: dict[int, Orchestrator] = {}
        self.roles: dict[bytes, Role] = {}
        self.stores: dict[bytes, StreamsStore] = {}
        self.queue: deque[tuple[Role, Call]] = deque()
        self._ghosts: dict[int, Call] = {}
        """``id()`` → queued duplicate call: their replies go nowhere. The call is held so its
        ``id`` cannot be reused: a ghost taken off the queue unstepped (a crashed role's calls)
        left its id behind, and a later call that got the same id lost its reply."""
        self.delivered = 0
        self.dropped: list[Call] = []

    def add(self, role: Role, store: StreamsStore | None = None) -> Role:
        """Route calls to ``role``; ``store`` performs its storage actions (a role without
        one must not queue any)."""
        self.roles[role.principal.bytes] = role
        if isinstance(role, Orchestrator):  # a replay for a subscriber not added is refused
            role.reachable = self._added
        if store is not None:
            self.stores[role.principal.bytes] = store
        return role

    def _added(self, p: Principal) -> bool:
        return p.bytes in self.roles

    def call(self, caller: Principal, target: Principal, method: str, arg: Any) -> Any:
        """A call from outside (a user or a test), through the codec. Calls it causes stay
        queued until :meth:`step` / :meth:`run`."""
        m = METHODS[method]
        role = self.roles[target.bytes]
        ret = role.dispatch(caller, method, m.decode_arg(m.encode_arg(arg)), self.clock())
        self._collect(role)
        return m.decode_ret(m.encode_ret(ret))

    def _collect(self, role: Role) -> None:
        work = deque(role.take_outbox())
        while work:
            a = work.popleft()
            if isinstance(a, Call):
                self.queue.append((role, a))
                continue
            if isinstance(a, JobAction):
                if isinstance(a, StartReplayJob) and isinstance(role, Orchestrator):
                    self._job_owner[a.spec.replay_id] = role
                role.on_result(a, perform_job(self.jobs, a), self.clock())
                work.extendleft(reversed(role.take_outbox()))
                continue
            store = self.stores.get(role.principal.bytes)
            if store is None:
                raise RuntimeError(f"{type(role).__name__} queued {a!r} and has no store")
            role.on_result(a, store.perform(a), self.clock())
            work.extendleft(reversed(role.take_outbox()))  # its consequences come first

    def step(self) -> bool:
        """Deliver one queued call. When nothing is queued: collect what the roles queued on
        their own (a publisher's ``register`` or ``publish``), else pump them."""
        if not self.queue:
            for role in list(self.roles.values()):
                if role.outbox:
                    self._collect(role)
            if self.queue:
                return True
            progressed = False
            for role in list(self.roles.values()):
                if role.pump(self.clock()):
                    self._collect(role)
                    progressed = True
            return progressed or self._jobs_step()
        src, c = self._next()
        ghost = self._ghosts.pop(id(c), None) is c
        f = self.faults
        if f is not None and not ghost and f.hit("duplicate"):
            copy = Call(c.target, c.method, c.arg, c.token, c.ordered, c.waits)
            self._ghosts[id(copy)] = copy
            self.queue.append((src, copy))
        target = self.roles.get(c.target.bytes)
        lost: ConnectionError | None = None
        if target is None:
            lost = NoAddress(c.target)  # the HTTP adapter: not in the directory
        elif f is not None and f.hit("drop"):
            lost = ConnectionError(f"{c.method} to {c.target}: lost on the way")
        if lost is not None:
            if ghost:
                return True
            self.dropped.append(c)
            src.on_reply(c, lost, self.clock())
            self._collect(src)
            return True
        assert target is not None  # a missing role was answered as lost above
        m = METHODS[c.method]
        body = m.encode_arg(c.arg)
        if self.max_body_bytes is not None and len(body) > self.max_body_bytes:
            if not ghost:
                src.on_reply(c, CallRefused(c.method, 413, b"%d bytes" % len(body)), self.clock())
                self._collect(src)
            return True
        try:
            ret = target.dispatch(src.principal, c.method, m.decode_arg(body), self.clock())
            reply: Any = m.decode_ret(m.encode_ret(ret))
        except Exception as e:  # a failing callee is the caller's reply, as over HTTP
            reply = e
        self.delivered += 1
        self._collect(target)
        if ghost:
            return True
        if f is not None and f.hit("drop_reply"):
            reply = ConnectionError(f"{c.method} to {c.target}: no reply (timed out)")
        src.on_reply(c, reply, self.clock())
        self._collect(src)
        return True

    def _next(self) -> tuple[Role, Call]:
        """The next call to deliver: the oldest, or with ``delay`` faults a later one the HTTP
        adapter could deliver first (``Call.ordered``) — never an ordered call queued behind
        an earlier ordered call of the same sender (nor an unordered one that ``waits``), nor
        an unordered one behind an earlier call of the same sender to the same target, nor
        anything of a sender queued after an
        ordered call that waits for an earlier one (the adapter takes nothing more from the
        sender's queue until that one is answered)."""
        f = self.faults
        if f is None or len(self.queue) < 2 or not f.hit("delay"):
            return self.queue.popleft()
        first: dict[int, tuple[bytes, str]] = {}  # a sender's first queued ordered call
        blocked: set[int] = set()
        lanes: set[tuple[int, bytes]] = set()  # (sender, target) with a call queued
        movable = []
        for k, (src, c) in enumerate(self.queue):
            s, key = id(src), (c.target.bytes, c.method)
            if s in blocked:
                continue
            lane = (s, c.target.bytes)
            if c.ordered:
                if s not in first:
                    movable.append(k)
                    first[s] = key
                elif first[s] != key:  # waits for the first one's answer, and so does the rest
                    blocked.add(s)
            elif lane not in lanes and not (c.waits and s in first):
                movable.append(k)
            lanes.add(lane)
        k = f.rng.choice(movable)
        item = self.queue[k]
        del self.queue[k]
        return item

    def _jobs_step(self) -> bool:
        """Idle: hand finished jobs to their orchestrators; wait while one still runs."""
        if self.jobs is None:
            return False
        done = self.jobs.finished()
        for rid, result in done:
            orch = self._job_owner.pop(rid, None)
            if orch is not None:
                orch.job_finished(rid, result, self.clock())
                self._collect(orch)
        if done:
            return True
        if self.jobs.running():
            time.sleep(0.02)
            return True
        return False

    def run(self, max_steps: int = 1_000_000) -> int:
        steps = 0
        while steps < max_steps and self.step():
            steps += 1
        return steps
