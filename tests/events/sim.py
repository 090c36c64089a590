"""A deterministic simulation of a whole ICRC-72/77 system under faults, with a checker.

The log is trusted because it is simulated (STYLE.md, "simulate before you trust"); events are
simulated the same way: one :class:`~tests.events.world.World` (orchestrator with its journal
and ledger, broadcaster, publisher, two subscribers) on a fake clock, an
:class:`~loglake.events.network.InProcessNetwork` with seeded :class:`Faults`, and a driver that
from the same seed publishes, registers and cancels replays and crashes the orchestrator (a new
core rebuilt from its journal; the calls it had not sent are lost). After every step
:func:`check` verifies what must hold whatever the faults:

- a subscriber never receives an event twice (ICRC-72 at-least-once is deduplicated by the
  subscriber by event id), nor one that was never published;
- the orchestrator's state rebuilt from its journal equals the live state — publications,
  subscriptions, replays (status, cancel requests, progress) and the ledger — so a crash at
  any step loses nothing the core had answered;
- quotas hold: no subscriber has more unfinished replays than allowed; with a price, the
  ledger has no negative balance or allowance, balances plus burnt fees equal what was minted,
  and the publisher holds exactly the cost of the accepted replays.

When the faults stop, the system must settle: every replay ends (completed, canceled or errored)
and a replay that completed with ``n`` events delivered every one of them, except those its
broadcaster still holds as unconfirmed (a lost notification is visible, never silent).

Every run is a function of its seed; a failure message names it, and
``python benchmarks/events_sim.py --seed N`` replays it.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from loglake.events.ledger import account
from loglake.events.messages import Ok
from loglake.events.network import Faults
from loglake.events.orchestrator import Orchestrator, Quotas
from loglake.events.store import StreamsStore, open_ledger, open_orchestrator
from loglake.streams.api import LocalStreams
from tests.events.world import NS, World

SUBSCRIBERS = ("alice", "bob")


class SimFailure(AssertionError):
    """An invariant broke; the message names the seed and step that replay it."""


@dataclass
class SimConfig:
    seed: int
    steps: int = 400
    drop: float = 0.02
    drop_reply: float = 0.02
    duplicate: float = 0.03
    delay: float = 0.2
    crash: float = 0.01
    """Per step: the orchestrator crashes and restarts from its journal."""
    events: int = 120
    """Events published before the run (more are published during it)."""
    check_every: int = 1
    price: int = 0
    """Per event: with a price every replay is paid through the orchestrator's ledger."""


@dataclass
class SimReport:
    seed: int
    steps: int = 0
    crashes: int = 0
    replays: int = 0
    completed: int = 0
    errored: int = 0
    canceled: int = 0
    delivered: int = 0
    faults: dict[str, int] = field(default_factory=dict)


def snapshot(orch: Orchestrator) -> dict[str, Any]:
    """What a restart must keep: everything but request-rate windows and system numbering."""
    reps = {}
    for rid, r in orch.replays.items():
        reps[rid] = (
            r.subscriber.bytes,
            r.namespace,
            r.start,
            r.end,
            repr(r.config),
            r.publisher.bytes,
            r.broadcaster.bytes,
            r.expected,
            r.cost,
            r.created,
            r.status,
            r.cancel_requested,
            r.sent,
            None if r.relay is None else r.relay.bytes,
            r.job,
        )
    pubs = {
        ns: (p.id, p.publisher.bytes, p.broadcaster.bytes, repr(p.config), p.head)
        for ns, p in orch.publications.items()
    }
    subs = {k: (s.id, repr(s.config)) for k, s in orch.subscriptions.items()}
    led = orch.ledger
    ledger = None if led is None else (dict(led.balances), dict(led.allowances), led.blocks)
    return {"pubs": pubs, "subs": subs, "replays": reps, "ledger": ledger}


class Simulation:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.report = SimReport(cfg.seed)
        self.w = World(batch_size=10, quotas=Quotas(max_concurrent_per_subscriber=3))
        self.faults = Faults(
            cfg.seed,
            drop=cfg.drop,
            drop_reply=cfg.drop_reply,
            duplicate=cfg.duplicate,
            delay=cfg.delay,
        )
        self.got: dict[str, set[int]] = {s: set() for s in SUBSCRIBERS}
        self.ranges: dict[int, tuple[str, int, int | None]] = {}
        self.published = 0
        self.step_no = 0
        # set up without faults: a registration that fails is not what the run is about
        self.minted = 0
        if cfg.price:
            self.w.priced(cfg.price)
            for s in SUBSCRIBERS:
                self.w.ledger.mint(account(self.w.p[s]), 100_000, self.w.clock())
                self.minted += 100_000
                self.w.net._collect(self.w.orch)
                assert isinstance(self.w.call(s, "icrc2_approve", (self.w.p["orch"], 90_000)), Ok)
        else:
            self.w.register_publication()
        self.mints = len(SUBSCRIBERS) if cfg.price else 0
        for s in SUBSCRIBERS:
            self.w.subscribe(s)
        self.publish(cfg.events)
        self.w.net.faults = self.faults

    # -- driving -------------------------------------------------------------------------------
    def fail(self, what: str) -> None:
        raise SimFailure(
            f"seed {self.cfg.seed}, step {self.step_no}: {what} "
            f"(replay: python benchmarks/events_sim.py --seed {self.cfg.seed})"
        )

    def publish(self, n: int) -> None:
        items = [
            ({"Map": [("i", {"Nat": i}), ("kind", {"Text": "ab"[i % 2]})]}, None)
            for i in range(self.published, self.published + n)
        ]
        self.w.pub.publish(NS, items, self.w.clock())
        self.published += n

    def crash_orchestrator(self) -> None:
        """The process dies: its unsent calls are gone, a new core reads the journal."""
        w = self.w
        old = w.orch
        w.net.queue = deque((src, c) for src, c in w.net.queue if src is not old)
        old.outbox.clear()
        store = StreamsStore(LocalStreams(w.orch_log))
        w.orch = w.net.add(
            open_orchestrator(
                store, w.p["orch"], list(old.broadcasters), w.quotas, open_ledger(store, fee=1)
            ),
            store,
        )
        self.report.crashes += 1

    def act(self) -> None:
        """One random outside action, drawn from the seed."""
        r = self.rng.random()
        w = self.w
        if r < 0.04:
            who = self.rng.choice(SUBSCRIBERS)
            start = self.rng.randrange(0, self.published)
            end = (
                None
                if self.rng.random() < 0.2
                else self.rng.randrange(start, min(self.published, start + 80) + 1)
            )
            res = w.replay(who, start, end)
            if isinstance(res, Ok):
                self.ranges[res.value] = (who, start, end)
                self.report.replays += 1
        elif r < 0.05 and self.ranges:
            rid = self.rng.choice(sorted(self.ranges))
            w.call(self.ranges[rid][0], "icrc77_cancel_replay", [rid])
        elif r < 0.07:
            self.publish(self.rng.randrange(1, 12))
        elif r < 0.07 + self.cfg.crash:
            self.crash_orchestrator()

    def run(self) -> SimReport:
        for _ in range(self.cfg.steps):
            self.step_no += 1
            self.act()
            self.w.net._collect(self.w.pub)
            self.w.net.step()
            if self.step_no % self.cfg.check_every == 0:
                self.check()
        # the network heals: everything must settle
        self.w.net.faults = None
        for _ in range(40):  # resends back off up to 10 s: let the fake clock pass them
            self.w.net.run(200_000)
            self.check()
            self.w.clock.now += 1_000_000_000
        self.check_settled()
        self.report.steps = self.step_no
        self.report.faults = dict(self.faults.counts)
        return self.report

    # -- the checker -------------------------------------------------------------------------
    def check(self) -> None:
        w = self.w
        for s in SUBSCRIBERS:
            got = self.got[s]
            sub = getattr(w, s)
            for n in sub.take():
                if n.namespace != NS:
                    continue
                if not 0 <= n.event_id < self.published:
                    self.fail(f"{s} received event {n.event_id}, never published")
                if n.event_id in got:
                    self.fail(f"{s} received event {n.event_id} twice")
                got.add(n.event_id)
                self.report.delivered += 1
        live = w.orch
        restored = self.restored()
        a, b = snapshot(live), snapshot(restored)
        if a != b:
            for k in a:
                if a[k] != b[k]:
                    live_k, rest_k = a[k], b[k]
                    if isinstance(live_k, dict) and isinstance(rest_k, dict):
                        keys = live_k.keys() | rest_k.keys()
                        key = next(x for x in keys if live_k.get(x) != rest_k.get(x))
                        live_k, rest_k = live_k.get(key), rest_k.get(key)
                        k = f"{k}[{key!r}]"
                    self.fail(f"restored {k} differ from live: {rest_k!r} != {live_k!r}")
        active: dict[bytes, int] = {}
        for r in live.replays.values():
            if not r.status.final:
                active[r.subscriber.bytes] = active.get(r.subscriber.bytes, 0) + 1
        cap = w.quotas.max_concurrent_per_subscriber
        for who, n in active.items():
            if n > cap:
                self.fail(f"subscriber {who.hex()} has {n} unfinished replays (quota {cap})")
        led = live.ledger
        if led is not None:
            if any(v < 0 for v in led.balances.values()):
                self.fail(f"negative balance in {led.balances}")
            if any(v < 0 for v in led.allowances.values()):
                self.fail(f"negative allowance in {led.allowances}")
            # every block but a mint pays the fee; what is not burnt is in some account
            burnt = led.fee * (led.blocks - self.mints)
            if sum(led.balances.values()) + burnt != self.minted:
                self.fail(f"ledger: {sum(led.balances.values())} + {burnt} fees != minted")
            # the publisher was paid exactly what the accepted replays cost
            paid = led.balance_of(account(w.p["pub"]))
            cost = sum(r.cost for r in live.replays.values())
            if paid != cost:
                self.fail(f"publisher holds {paid}, the replays cost {cost}")

    def restored(self) -> Orchestrator:
        w = self.w
        store = StreamsStore(LocalStreams(w.orch_log))
        return open_orchestrator(
            store, w.p["orch"], list(w.orch.broadcasters), w.quotas, open_ledger(store, fee=1)
        )

    def check_settled(self) -> None:
        w = self.w
        unconfirmed = {
            s: sum(1 for p in w.bc.pending.values() if p.subscriber == w.p[s]) for s in SUBSCRIBERS
        }
        for rid, (who, start, _end) in sorted(self.ranges.items()):
            st = w.orch.replays[rid].status
            if not st.final:
                self.fail(f"replay {rid} never ended: {st}")
            self.report.completed += st.tag == "completed"
            self.report.errored += st.tag == "errored"
            self.report.canceled += st.tag == "canceled"
            if st.tag == "completed":
                want = set(range(start, start + int(st.value or 0)))
                missing = want - self.got[who]
                if len(missing) > unconfirmed[who]:
                    self.fail(
                        f"replay {rid} completed({st.value}) but {who} lacks "
                        f"{sorted(missing)[:10]} and its broadcaster holds only "
                        f"{unconfirmed[who]} unconfirmed"
                    )


def simulate(cfg: SimConfig) -> SimReport:
    return Simulation(cfg).run()
