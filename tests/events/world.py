"""A whole ICRC-72/77 system in one process on a fake clock (shared by the core tests)."""

from __future__ import annotations

from dataclasses import dataclass, field

from icp_principal import Principal

from loglake.events.broadcaster import Broadcaster
from loglake.events.identity import Identity
from loglake.events.messages import C_PRICING, C_REPLAY, Ok, Registration, ReplayRegistration
from loglake.events.network import InProcessNetwork
from loglake.events.orchestrator import Quotas
from loglake.events.publisher import Publisher
from loglake.events.store import StreamsStore, open_ledger, open_orchestrator
from loglake.events.subscriber import Subscriber
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from loglake.wire.icrc16 import Property

NS = "com.example.orders"


@dataclass
class FakeClock:
    now: int = 1_700_000_000_000_000_000

    def __call__(self) -> int:
        self.now += 1_000  # every read advances 1 µs: deterministic, monotonic
        return self.now


def blob(i: int, size: int) -> bytes:
    """Event ``i``'s data in ``World.publish_blobs``: its number, repeated to ``size`` bytes."""
    return i.to_bytes(4, "big") * (size // 4)


def seeded(n: int) -> Identity:
    return Identity.from_seed(bytes([n]) * 32)


@dataclass
class World:
    quotas: Quotas = field(default_factory=Quotas)
    batch_size: int = 100
    max_unconfirmed: int = 200_000
    homes: dict[str, str] = field(default_factory=dict)
    """Subscriber name → broadcaster name serving its replays ("bc" or "bc2")."""
    relay_replays: bool = False
    relay_window: int = 10_000
    replay_rate: float | None = None
    max_body_bytes: int | None = None
    """Calls over this many bytes are refused as the HTTP servers refuse them (413)."""
    subscriber: type[Subscriber] = Subscriber
    """alice's and bob's class (a test's misbehaving subscriber)."""

    def __post_init__(self) -> None:
        self.clock = FakeClock()
        self.net = InProcessNetwork(self.clock, max_body_bytes=self.max_body_bytes)
        self.ids = {
            name: seeded(i + 1)
            for i, name in enumerate(["orch", "bc", "pub", "alice", "bob", "bc2"])
        }
        p = {k: v.principal for k, v in self.ids.items()}
        self.p = p
        self.orch_log, self.pub_log = MemoryLog(), MemoryLog()
        orch_store = StreamsStore(LocalStreams(self.orch_log))
        self.ledger = open_ledger(orch_store, fee=1)
        two = bool(self.homes) or self.relay_replays
        self.orch = self.net.add(
            open_orchestrator(
                orch_store,
                p["orch"],
                [p["bc"], p["bc2"]] if two else [p["bc"]],
                self.quotas,
                self.ledger,
                homes={p[s].bytes: p[b] for s, b in self.homes.items()},
                relay_replays=self.relay_replays,
            ),
            orch_store,
        )
        self.bc = self.net.add(
            Broadcaster(p["bc"], p["orch"], self.max_unconfirmed, self.relay_window)
        )
        self.bc2 = self.net.add(
            Broadcaster(p["bc2"], p["orch"], self.max_unconfirmed, self.relay_window)
        )
        self.pub = self.net.add(
            Publisher(p["pub"], p["orch"], self.batch_size, replay_rate=self.replay_rate),
            StreamsStore(LocalStreams(self.pub_log)),
        )
        self.alice = self.net.add(self.subscriber(p["alice"], p["orch"]))
        self.bob = self.net.add(self.subscriber(p["bob"], p["orch"]))

    def use_pub_log(self, log) -> None:
        """The publisher's namespaces live in ``log`` from now on."""
        self.pub_log = log
        self.net.stores[self.p["pub"].bytes] = StreamsStore(LocalStreams(log))

    def call(self, who: str | Principal, method: str, arg, target: str = "orch"):
        caller = self.p[who] if isinstance(who, str) else who
        out = self.net.call(caller, self.p[target], method, arg)
        return out

    def settle(self, rounds: int = 5, seconds: float = 5.0) -> None:
        """Run until quiet, ``rounds`` times, the clock moved ``seconds`` between: resends
        after a back-off (``Busy``, failed calls) go out."""
        for _ in range(rounds):
            self.net.run()
            self.clock.now += int(seconds * 1e9)
        self.net.run()

    def register_publication(self, config=None) -> None:
        cfg = config if config is not None else [(C_REPLAY, {"Bool": True})]
        self.pub.register(NS, cfg)
        self.net._collect(self.pub)
        self.net.run()
        assert self.pub.registration_results[NS] == Ok(1)

    def priced(self, per_event: int) -> None:
        self.register_publication(
            [
                (C_REPLAY, {"Bool": True}),
                (
                    C_PRICING,
                    {
                        "Class": [
                            Property("perEvent", {"Nat": per_event}),
                            Property("currency", {"Text": "icrc1:loglake"}),
                        ]
                    },
                ),
            ]
        )

    def subscribe(self, who: str, config=None) -> None:
        [r] = self.call(who, "icrc72_register_subscription", [Registration(NS, config or [])])
        assert r.value >= 1, r
        self.net.run()

    def publish(self, n: int, start: int = 0) -> None:
        for lo in range(start, start + n, 1000):
            self._publish_call(
                [
                    ({"Map": [("i", {"Nat": i}), ("kind", {"Text": "ab"[i % 2]})]}, None)
                    for i in range(lo, min(start + n, lo + 1000))
                ]
            )

    def publish_blobs(self, n: int, size: int, per_call: int) -> None:
        """``n`` #Blob events of ``size`` bytes (event i: ``blob(i, size)``), ``per_call`` a
        publish."""
        for lo in range(0, n, per_call):
            self._publish_call(
                [({"Blob": blob(i, size)}, None) for i in range(lo, min(n, lo + per_call))]
            )

    def _publish_call(self, items) -> None:
        self.pub.publish(NS, items, self.clock())
        self.net._collect(self.pub)
        self.net.run()

    def replay(self, who: str, start: int, end: int | None, config=None, memo=b""):
        [r] = self.call(
            who, "icrc77_register_replay", [ReplayRegistration(NS, start, end, config or [], memo)]
        )
        return r

    def status(self, who: str, rid: int):
        from loglake.events.messages import GetReplays

        return {s.replay_id: s for s in self.call(who, "icrc77_get_replays", GetReplays())}[rid]
