"""A seeded, deterministic simulation of many SDS participants (TigerBeetle VOPR style).

Every participant is a real ``Participant`` (the sans-I/O core) on one virtual clock. The network
broadcasts each message to every other participant with per-link loss and a log-normal latency;
partitions cut the group in two for a while and heal; late joiners start empty; offline
participants miss everything for a while. A store node (what a loglake stream is in
``loglake.sds.channel``) keeps every broadcast content message; a participant that reports a
missing dependency fetches it by retrieval hint after a store round trip. SDS-R runs as well
(repair requests ride on outgoing messages; responders rebroadcast).

Reported per run, with the spec's targets (specs/sds-scalable-data-sync.txt gives no numbers;
the issue's targets, with S = the periodic sync interval ``sync_interval_ms``):

- delivery ratio: delivered (participant, message) pairs / expected pairs at the end;
- time to acknowledgement: send → first ack at the sender; target: p90 within S;
- time to detect a missing message: for each pair whose broadcast was lost, from when the
  participant could first have had it (send time, or its join/return time, or the partition's
  heal time) to the first
  ``MessagesMissing`` naming it (or its delivery); target: ≥ 90% within 3S;
- time to consistency: per message, until the last participant delivered it, each
  participant counted from the same reference time as above; target: every message within 6S.

Periodic sync follows the spec's back-off option: a participant's sync timer fires every S
(with jitter) and it sends only if it heard nothing on the channel since its previous timer, or
if it has a repair request due (spec "SDS-R Periodic Sync Message").

A run is a pure function of its ``SimConfig`` (seed included): the same seed replays the same
run; ``SimReport.seed`` is printed with the results.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from dataclasses import dataclass, field

from loglake.log.api import Entry, Log
from loglake.sds.events import MessageAcknowledged, MessageDelivered, MessagesMissing, Output
from loglake.sds.participant import Participant, ParticipantOptions
from loglake.sds.repair import RepairConfig, num_response_groups_for

T0 = 1_700_000_000_000


@dataclass(frozen=True)
class SimConfig:
    participants: int = 20
    messages: int = 40
    seed: int = 1
    send_window_ms: int = 60_000
    loss: float = 0.05  # per link, per broadcast
    latency_median_ms: float = 80.0  # log-normal
    latency_sigma: float = 0.6
    sync_interval_ms: int = 5_000  # S
    tick_ms: int = 500
    store_rtt_ms: int = 200  # round trip to the store node for a fetch by hint
    store: bool = True
    causal_history_size: int = 20
    repair: bool = True
    repair_t_min_ms: int = 30_000
    repair_t_max_ms: int = 120_000
    partition: tuple[int, int, float] | None = None  # (start, end, fraction on side B)
    late_joiners: int = 0  # join at a random time in the first half of the send window
    offline: int = 0  # each offline for a random third of the send window
    settle_ms: int = 60_000  # run on after the last send
    # For audits (``loglake job sds-audit``): keep every broadcast in channel order
    # (``Simulation.channel``, ``store_channel``) and what each participant held at each of its
    # own broadcasts (``ground_truth``); ``closing_sync`` has every participant send one last
    # sync at the end, so its final state is on the channel. Off by default: no cost, same runs.
    record_channel: bool = False
    closing_sync: bool = False


@dataclass
class SimReport:
    seed: int
    participants: int
    messages: int
    sync_interval_ms: int
    delivery_ratio: float
    ack_ms: list[float] = field(default_factory=list)
    unacked: int = 0
    detect_ms: list[float] = field(default_factory=list)
    missed: int = 0
    consistency_ms: list[float] = field(default_factory=list)
    inconsistent: int = 0
    broadcasts: int = 0
    receives: int = 0
    fetches: int = 0
    repairs: int = 0

    @staticmethod
    def _pct(xs: list[float], p: float) -> float:
        if not xs:
            return math.nan
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    @property
    def ack_p90_ms(self) -> float:
        # unacked messages count as never acknowledged
        return self._pct(self.ack_ms + [math.inf] * self.unacked, 0.9)

    @property
    def detected_within_3s(self) -> float:
        s3 = 3 * self.sync_interval_ms
        if not self.missed:
            return 1.0
        return sum(1 for d in self.detect_ms if d <= s3) / self.missed

    @property
    def consistent_within_6s(self) -> float:
        s6 = 6 * self.sync_interval_ms
        total = len(self.consistency_ms) + self.inconsistent
        return sum(1 for c in self.consistency_ms if c <= s6) / total if total else 1.0

    def targets(self) -> dict[str, bool]:
        s = self.sync_interval_ms
        return {
            "ack p90 <= S": self.ack_p90_ms <= s,
            ">= 90% of missed detected within 3S": self.detected_within_3s >= 0.9,
            "all messages consistent within 6S": self.consistent_within_6s == 1.0,
        }

    def summary(self) -> str:
        def ms(xs: list[float]) -> str:
            if not xs:
                return "n/a"
            return (
                f"p50 {statistics.median(xs):.0f} ms, p90 {self._pct(xs, 0.9):.0f} ms, "
                f"max {max(xs):.0f} ms"
            )

        lines = [
            f"seed {self.seed}: {self.participants} participants, {self.messages} messages, "
            f"S = {self.sync_interval_ms} ms",
            f"  delivery ratio       {self.delivery_ratio:.4f}",
            f"  time to ack          {ms(self.ack_ms)} ({self.unacked} never acked)",
            f"  time to detect miss  {ms(self.detect_ms)} ({self.missed} missed pairs, "
            f"{self.detected_within_3s:.1%} within 3S)",
            f"  time to consistency  {ms(self.consistency_ms)} ({self.inconsistent} "
            f"inconsistent, {self.consistent_within_6s:.1%} within 6S)",
            f"  traffic              {self.broadcasts} broadcasts, {self.receives} receives, "
            f"{self.fetches} store fetches, {self.repairs} repair responses",
        ]
        for name, ok in self.targets().items():
            lines.append(f"  target {name}: {'PASS' if ok else 'FAIL'}")
        return "\n".join(lines)


class Simulation:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.now = T0
        self._q: list[tuple[int, int, str, tuple]] = []
        self._seq = 0
        n = cfg.participants
        self.ids = [f"p{i:04d}" for i in range(n)]
        rng = self.rng
        # who joins late / goes offline / sits on side B of a partition
        order = list(range(n))
        rng.shuffle(order)
        self.join_at = [T0] * n
        for i in order[: cfg.late_joiners]:
            self.join_at[i] = T0 + rng.randrange(cfg.send_window_ms // 2)
        self.offline: list[tuple[int, int] | None] = [None] * n
        rest = order[cfg.late_joiners :]
        for i in rest[: cfg.offline]:
            start = T0 + rng.randrange(cfg.send_window_ms * 2 // 3)
            self.offline[i] = (start, start + cfg.send_window_ms // 3)
        self.side_b = [False] * n
        if cfg.partition:
            for i in order[: int(n * cfg.partition[2])]:
                self.side_b[i] = True
        opts = ParticipantOptions(
            causal_history_size=cfg.causal_history_size,
            enable_repair=cfg.repair,
            repair=RepairConfig(
                cfg.repair_t_min_ms,
                cfg.repair_t_max_ms,
                num_response_groups_for(n),
            ),
        )
        self.opts = opts
        self.parts: list[Participant | None] = [None] * n
        self.heard_since_timer = [False] * n
        self.store: list[bytes] = []
        self.sent: dict[str, tuple[int, int]] = {}  # mid -> (sender, t)
        self.acked: dict[str, int] = {}
        self.delivered: dict[tuple[int, str], int] = {}
        self.missed: dict[tuple[int, str], int] = {}  # pair -> reference time
        self.detected: dict[tuple[int, str], int] = {}
        self.report = SimReport(cfg.seed, n, cfg.messages, cfg.sync_interval_ms, 0.0)
        # record_channel: (time ms, broadcaster, bytes) per broadcast, and, per (participant,
        # message id), the channel position of its first own broadcast made while it held the
        # message (in its log or its incoming buffer: what its bloom filter covers)
        self.channel: list[tuple[int, int, bytes]] = []
        self.held_at: dict[tuple[int, str], int] = {}

    # -- plumbing -----------------------------------------------------------------------------
    def _push(self, t: int, kind: str, args: tuple) -> None:
        self._seq += 1
        heapq.heappush(self._q, (t, self._seq, kind, args))

    def _online(self, i: int, t: int) -> bool:
        if t < self.join_at[i]:
            return False
        off = self.offline[i]
        return not (off and off[0] <= t < off[1])

    def _online_since(self, i: int, t: int) -> int:
        """When participant i could first have received something broadcast at t."""
        ref = max(t, self.join_at[i])
        off = self.offline[i]
        if off and off[0] <= ref < off[1]:
            ref = off[1]
        return ref

    def _cut(self, a: int, b: int, t: int) -> bool:
        p = self.cfg.partition
        return bool(p and p[0] <= t - T0 < p[1] and self.side_b[a] != self.side_b[b])

    def _latency(self) -> int:
        c = self.cfg
        return max(1, int(c.latency_median_ms * math.exp(self.rng.gauss(0.0, c.latency_sigma))))

    def _participant(self, i: int) -> Participant:
        p = self.parts[i]
        if p is None:
            p = Participant("sim", self.ids[i], lambda: self.now, self.opts)
            self.parts[i] = p
        return p

    # -- actions ------------------------------------------------------------------------------
    def _record(self, i: int, data: bytes, reason: str) -> None:
        pos = len(self.channel)
        self.channel.append((self.now, i, data))
        p = self.parts[i]
        if reason in ("send", "sync") and p is not None:  # bytes built from i's state just now
            for mid in (*p.log.records, *p.pending):
                self.held_at.setdefault((i, mid), pos)

    def _broadcast(self, i: int, out: Output) -> None:
        for o in out.to_send:
            if self.cfg.record_channel:
                self._record(i, o.data, o.reason)
            hint = None
            if o.kind.value == "content":
                self.store.append(o.data)
                hint = (len(self.store) - 1).to_bytes(8, "big")
                if o.reason == "send":
                    self._participant(i).set_retrieval_hint(o.message_id, hint)
                    self.sent[o.message_id] = (i, self.now)
                if o.reason == "repair":
                    self.report.repairs += 1
            self.report.broadcasts += 1
            for j in range(self.cfg.participants):
                if j == i:
                    continue
                lost = (
                    not self._online(j, self.now)
                    or self._cut(i, j, self.now)
                    or self.rng.random() < self.cfg.loss
                )
                if o.reason == "send" and lost:
                    ref = self._online_since(j, self.now)
                    if self._cut(i, j, self.now):  # could first have had it once healed
                        assert self.cfg.partition is not None
                        ref = max(ref, T0 + self.cfg.partition[1])
                    self.missed[(j, o.message_id)] = ref
                if not lost:
                    self._push(self.now + self._latency(), "deliver", (j, o.data, hint))
        self._observe(i, out)

    def _observe(self, i: int, out: Output) -> None:
        for e in out.events:
            if isinstance(e, MessageDelivered):
                self.delivered.setdefault((i, e.message_id), self.now)
                self.detected.setdefault((i, e.message_id), self.now)
            elif isinstance(e, MessageAcknowledged):
                self.acked.setdefault(e.message_id, self.now)
            elif isinstance(e, MessagesMissing):
                for entry in e.entries:
                    self.detected.setdefault((i, entry.message_id), self.now)
                    if self.cfg.store and entry.retrieval_hint is not None:
                        self.report.fetches += 1
                        self._push(
                            self.now + self.cfg.store_rtt_ms,
                            "fetch",
                            (i, int.from_bytes(entry.retrieval_hint, "big")),
                        )

    def _receive(self, i: int, data: bytes, hint: bytes | None) -> None:
        if not self._online(i, self.now):
            return
        self.report.receives += 1
        self.heard_since_timer[i] = True
        out = self._participant(i).receive(data, hint)
        if out.to_send:
            self._broadcast(i, out)
        else:
            self._observe(i, out)

    # -- run ----------------------------------------------------------------------------------
    def run(self) -> SimReport:
        c, rng = self.cfg, self.rng
        n = c.participants
        for k in range(c.messages):
            t = T0 + rng.randrange(c.send_window_ms)
            self._push(t, "send", (k,))
        for i in range(n):
            self._push(self.join_at[i] + rng.randrange(c.sync_interval_ms), "sync", (i,))
        end = T0 + c.send_window_ms + c.settle_ms
        t = T0
        while t <= end:
            self._push(t, "tick", ())
            t += c.tick_ms
        while self._q:
            t, _, kind, args = heapq.heappop(self._q)
            if t > end:
                break
            self.now = t
            if kind == "deliver":
                self._receive(*args)
            elif kind == "fetch":
                i, index = args
                self._receive(i, self.store[index], index.to_bytes(8, "big"))
            elif kind == "send":
                online = [i for i in range(n) if self._online(i, t)]
                if not online:  # everyone late or offline: sent by the first one back (a
                    self._push(t + c.tick_ms, "send", args)  # randrange() traceback before)
                    continue
                i = online[rng.randrange(len(online))]
                self._broadcast(i, self._participant(i).send(b"msg %d from %d" % (args[0], i)))
            elif kind == "sync":
                (i,) = args
                p = self.parts[i]
                repair_due = p is not None and p.repair_request_due(t)
                if self._online(i, t) and (repair_due or not self.heard_since_timer[i]):
                    self._broadcast(i, self._participant(i).make_sync())
                self.heard_since_timer[i] = False
                jitter = rng.randrange(c.sync_interval_ms // 5 + 1)
                self._push(t + c.sync_interval_ms + jitter, "sync", (i,))
            elif kind == "tick":
                for i in range(n):
                    p = self.parts[i]
                    if p is not None and self._online(i, t):
                        out = p.tick()
                        if out.to_send:
                            self._broadcast(i, out)
                        elif out.events:
                            self._observe(i, out)
        if c.closing_sync:
            self.now = end
            for i in range(n):
                if self._online(i, end):
                    for o in self._participant(i).make_sync().to_send:
                        self._record(i, o.data, o.reason)
        return self._finish()

    def ground_truth(self) -> dict:
        """What the simulator knows (needs ``record_channel``), JSON-able: per content message
        its sender and send time; per participant the message ids it held at each of its own
        broadcasts (the channel position of the first one; its own messages left out), what it
        delivered, and when each sender saw its message acknowledged."""
        ids = self.ids
        held: dict[str, dict[str, int]] = {pid: {} for pid in ids}
        for (i, mid), pos in self.held_at.items():
            if mid in self.sent and self.sent[mid][0] != i:
                held[ids[i]][mid] = pos
        delivered: dict[str, list[str]] = {pid: [] for pid in ids}
        for i, mid in self.delivered:
            delivered[ids[i]].append(mid)
        return {
            "channel_id": "sim",
            "participants": list(ids),
            "sent": {m: {"sender": ids[s], "t_ms": t} for m, (s, t) in self.sent.items()},
            "held": held,
            "delivered": {k: sorted(v) for k, v in delivered.items()},
            "acked_at_sender_ms": dict(self.acked),
        }

    def _finish(self) -> SimReport:
        r, n = self.report, self.cfg.participants
        expected = 0
        got = 0
        per_msg: dict[str, list[float]] = {}
        incomplete: set[str] = set()
        for mid, (sender, t_sent) in self.sent.items():
            if mid in self.acked:
                r.ack_ms.append(self.acked[mid] - t_sent)
            else:
                r.unacked += 1
            for j in range(n):
                if j == sender:
                    continue
                expected += 1
                d = self.delivered.get((j, mid))
                if d is None:
                    incomplete.add(mid)
                    continue
                got += 1
                ref = self.missed.get((j, mid)) or self._online_since(j, t_sent)
                per_msg.setdefault(mid, []).append(d - ref)
        for mid in self.sent:
            if mid in incomplete:
                r.inconsistent += 1
            else:
                r.consistency_ms.append(max(per_msg.get(mid, [0.0])))
        for pair, ref in self.missed.items():
            r.missed += 1
            d = self.detected.get(pair)
            if d is not None:
                r.detect_ms.append(max(0, d - ref))
        r.delivery_ratio = got / expected if expected else 1.0
        return r


def simulate(cfg: SimConfig) -> SimReport:
    return Simulation(cfg).run()


def store_channel(sim: Simulation, log: Log, stream: str, partition: int = 0) -> int:
    """Append a ``record_channel`` run's broadcasts to ``stream`` (created if absent) in order,
    each stamped with its simulated time: the stored channel ``loglake job sds-audit`` reads.
    Returns the number of records."""
    if not log.has_stream(stream):
        log.create_stream(stream)
    entries = [Entry(data, timestamp_ns=t * 1_000_000) for t, _, data in sim.channel]
    for k in range(0, len(entries), 1000):
        log.append_many(stream, entries[k : k + 1000], partition=partition)
    return len(entries)
