"""Runs role cores in one process: a deterministic, in-order message router.

The in-process adapter of the sans-I/O cores (the model is STYLE.md's "simulate before you
trust"): it drains each role's outbox in FIFO order, passes every argument and result through
the same Candid codec the HTTP adapter uses (so a message that would not survive the wire fails
here too), dispatches to the target core with the sender as caller, and feeds replies back.
Storage actions are performed at once, in order, on the role's ``StreamsStore`` (given to
:meth:`InProcessNetwork.add`), and their results fed back before the next action of the outbox — the
same order the HTTP adapter keeps. Time is whatever ``clock`` returns (tests pass a fake clock).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from icp_principal import Principal

from loglake.events.actions import Call, JobAction, StartReplayJob
from loglake.events.codec import METHODS
from loglake.events.orchestrator import Orchestrator
from loglake.events.role import Role
from loglake.events.store import ReplayJobs, StreamsStore, perform_job


class InProcessNetwork:
    def __init__(self, clock: Callable[[], int], jobs: ReplayJobs | None = None) -> None:
        self.clock = clock
        self.jobs = jobs
        """Performs replay job actions; their ends go to the orchestrator that
        started them, when the network is otherwise idle."""
        self._job_owner: dict[int, Orchestrator] = {}
        self.roles: dict[bytes, Role] = {}
        self.stores: dict[bytes, StreamsStore] = {}
        self.queue: deque[tuple[Role, Call]] = deque()
        self.delivered = 0
        self.dropped: list[Call] = []

    def add(self, role: Role, store: StreamsStore | None = None) -> Role:
        """Route calls to ``role``; ``store`` performs its storage actions (a role without
        one must not queue any)."""
        self.roles[role.principal.bytes] = role
        if store is not None:
            self.stores[role.principal.bytes] = store
        return role

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
        src, c = self.queue.popleft()
        target = self.roles.get(c.target.bytes)
        if target is None:
            self.dropped.append(c)
            src.on_reply(c, ConnectionError(f"no role {c.target}"), self.clock())
            self._collect(src)
            return True
        m = METHODS[c.method]
        try:
            ret = target.dispatch(
                src.principal, c.method, m.decode_arg(m.encode_arg(c.arg)), self.clock()
            )
            reply: Any = m.decode_ret(m.encode_ret(ret))
        except Exception as e:  # a failing callee is the caller's reply, as over HTTP
            reply = e
        self.delivered += 1
        self._collect(target)
        src.on_reply(c, reply, self.clock())
        self._collect(src)
        return True

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
