"""The durable parts under test, each as a small workload with its own invariants (issue 15 §3).

Why one module for both the crash tests and the fault tests: a part is exercised the same way in
both — operations that each end in an *acknowledgement* (the call returned, so the caller may
rely on it) — and judged by the same invariants after a restart. Only what ends a life differs:
a SIGKILL (``tests/faults/crash.py``) or an injected disk fault followed by a power loss
(``tests/faults/faultfs.py``).

A part has: ``setup(root)`` (once, before the first life: e.g. a filled community stream),
``open(root, life)`` (start the part as its program does, running its recovery), ``step(rnd)``
(one operation; returns its acknowledgement line, printed only after the call returned),
``close()``, and ``check(root, acks)`` (reopen and hold the part to every acknowledgement;
raises ``AssertionError`` naming the broken invariant; returns how many things it checked).
An acknowledgement is a short ASCII line without a newline.

Every part keeps its state in a loglake data dir (``root / "data"``), through ``loglake.log.fs``:
the consumer store directly, the ICRC journal and ledger, Cardinal checkpoints and SDS channels
as records of streams. The archives control node also writes ``data``/``index``/torrent files
(through ``fs``) and keeps a SQLite working store (``root / "store.sqlite"``, outside ``fs``).
"""

from __future__ import annotations

import contextlib
import random
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from loglake.streams.api import LocalStreams

DATA = "data"


def _hash(n: int) -> bytes:
    return zlib.crc32(b"%d" % n).to_bytes(4, "big") * 8


class Part:
    name: ClassVar[str] = ""
    ops_per_step_s: ClassVar[float] = 0.0
    """Extra pause per step in a crash life (keeps the amount of work per life bounded)."""

    def setup(self, root: Path) -> None:
        from loglake.log import fs

        fs.makedirs_durable(root / DATA)  # durable: a simulated power loss keeps it

    def open(self, root: Path, life: int) -> None:
        raise NotImplementedError

    def step(self, rnd: random.Random) -> str | None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def check(self, root: Path, acks: list[str]) -> int:
        raise NotImplementedError


# -- consumer indexes (log/consumer_store.py) ------------------------------------------------
class ConsumerIndexes(Part):
    """Ockam index saves. Invariants: a client's stored index is at least the highest
    acknowledged save (no acknowledged save lost) and never moves back between restarts
    (monotonic, spec "storage MUST be monotonic")."""

    name = "consumer-index"
    CLIENTS = 5

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def open(self, root: Path, life: int) -> None:
        from loglake.log import StreamConfig, open_log

        self.log = open_log(root / DATA)
        if not self.log.has_stream("s"):
            self.log.create_stream("s", StreamConfig())
        self.cur = {f"c{c}": self.log.get_index(f"c{c}", "s") or 0 for c in range(self.CLIENTS)}

    def step(self, rnd: random.Random) -> str:
        c = f"c{rnd.randrange(self.CLIENTS)}"
        v = self.cur[c] + rnd.randint(1, 5)
        self.log.save_index(c, "s", v)
        self.cur[c] = v
        return f"{c} {v}"

    def close(self) -> None:
        self.log.close()

    def check(self, root: Path, acks: list[str]) -> int:
        from loglake.log import open_log

        best: dict[str, int] = {}
        for a in acks:
            c, v = a.split()
            best[c] = max(best.get(c, 0), int(v))
        with open_log(root / DATA) as log:
            for c in (f"c{i}" for i in range(self.CLIENTS)):
                got = log.get_index(c, "s") if log.has_stream("s") else None
                got = got or 0
                assert got >= best.get(c, 0), f"{c}: acknowledged index {best[c]} lost (got {got})"
                assert got >= self.seen.get(c, 0), f"{c}: index moved back to {got}"
                self.seen[c] = got
        return len(best)


# -- ICRC-72/77 orchestrator journal (events/journal.py) --------------------------------------
def _principal(k: int, tag: int) -> Any:
    from icp_principal import Principal

    return Principal(k.to_bytes(4, "big") + bytes([tag]) * 25)


class _Orchestrated(Part):
    def _open_store(self, root: Path) -> None:
        from loglake.events.store import StreamsStore
        from loglake.streams.api import LocalStreams

        self.streams = LocalStreams.open(root / DATA)
        self.store = StreamsStore(self.streams)

    def _perform(self, actions: list[Any]) -> list[Any]:
        """What the role's adapter does (``events/server.py``): perform the storage actions in
        order before any reply leaves; the calls to other roles are not sent here."""
        from loglake.events.actions import Call, JobAction

        return self.store.perform_many([a for a in actions if not isinstance(a, Call | JobAction)])

    def close(self) -> None:
        self.streams.close()


class OrchestratorJournal(_Orchestrated):
    """Publications and subscriptions registered on an orchestrator. Invariants: the journal
    replays (``open_orchestrator`` raises no ``JournalError``: no torn or partial record is
    visible), every acknowledged registration is there with the id it was answered with, and
    ids are never reused."""

    name = "icrc-journal"

    def _orch(self) -> Any:
        from loglake.events.orchestrator import Quotas
        from loglake.events.store import open_ledger, open_orchestrator

        return open_orchestrator(
            self.store,
            _principal(0, 1),
            [_principal(0, 2)],
            Quotas(),
            open_ledger(self.store),
        )

    def open(self, root: Path, life: int) -> None:
        self._open_store(root)
        self.orch = self._orch()
        known = [
            int.from_bytes(s.subscriber.bytes[:4], "big") for s in self.orch.subscriptions.values()
        ]
        known += [int(ns.rsplit(".", 1)[1]) for ns in self.orch.publications if ns.startswith("p.")]
        self.next = max(known, default=-1) + 1

    def step(self, rnd: random.Random) -> str:
        from loglake.events.messages import Registration

        k = self.next
        self.next += 1
        if k % 2:
            ns = f"p.{k}"
            [r] = self.orch.dispatch(
                _principal(k, 4), "icrc72_register_publication", [Registration(ns, [])], 0
            )
        else:
            ns = f"ns.{k % 3}"
            [r] = self.orch.dispatch(
                _principal(k, 3), "icrc72_register_subscription", [Registration(ns, [])], 0
            )
        self._perform(self.orch.take_outbox())
        return f"{k} {ns} {r.value}"

    def check(self, root: Path, acks: list[str]) -> int:
        self._open_store(root)
        try:
            orch = self._orch()
            subs = {s.subscriber.bytes: s for s in orch.subscriptions.values()}
            sub_ids = [s.id for s in orch.subscriptions.values()]
            assert len(sub_ids) == len(set(sub_ids)), "a subscription id was reused"
            for a in acks:
                k_, ns, v = a.split()
                k = int(k_)
                if k % 2:
                    assert ns in orch.publications, f"acknowledged publication {ns} lost"
                    assert orch.publications[ns].id == int(v), f"publication {ns} changed id"
                else:
                    s = subs.get(_principal(k, 3).bytes)
                    assert s is not None, f"acknowledged subscription {k} lost"
                    assert (s.namespace, s.id) == (ns, int(v)), f"subscription {k} changed"
            return len(acks)
        finally:
            self.close()


# -- ICRC-1/2 ledger (events/ledger.py) -------------------------------------------------------
class Ledger(_Orchestrated):
    """Mints and transfers. Invariants: blocks are numbered from 0 without gaps; every
    acknowledged block is stored byte for byte at its index; replaying the stream gives
    balances that are never negative and sum to what was minted less the fees."""

    name = "icrc-ledger"
    ACCOUNTS = 6

    def open(self, root: Path, life: int) -> None:
        from loglake.events.store import open_ledger

        self._open_store(root)
        self.ledger = open_ledger(self.store, fee=1)
        self.ledger.writes = []

    def step(self, rnd: random.Random) -> str:
        from loglake.events.ledger import account

        led = self.ledger
        accts = [account(_principal(i, 5)) for i in range(self.ACCOUNTS)]
        rich = [a for a in accts if led.balance_of(a) >= 3]
        if not rich or rnd.random() < 0.2:
            block = led.mint(rnd.choice(accts), rnd.randint(10, 100), 0)
        else:
            frm = rnd.choice(rich)
            amt = rnd.randint(1, led.balance_of(frm) - 1)
            block = led.transfer(frm, rnd.choice(accts), amt, 0)
        [record] = [w.record for w in led.writes]
        try:
            self._perform(led.writes)
        finally:
            led.writes.clear()
        return f"{block} {zlib.crc32(record)}"

    def check(self, root: Path, acks: list[str]) -> int:
        import cbor2

        from loglake.events.ledger import ledger_stream

        self._open_store(root)
        try:
            stored = list(self.store.payloads(ledger_stream()))
            assert [i for i, _ in stored] == list(range(len(stored))), "gap in ledger blocks"
            for a in acks:
                b, crc = map(int, a.split())
                assert b < len(stored), f"acknowledged block {b} lost ({len(stored)} stored)"
                assert zlib.crc32(stored[b][1]) == crc, f"block {b} is not the acknowledged one"
            from loglake.events.ledger import Ledger as Core

            led = Core(fee=1)
            led.restore(d for _, d in stored)
            minted = fees = 0
            for _, d in stored:
                op = cbor2.loads(d)
                minted += op["amt"] if op["op"] == "mint" else 0
                fees += op.get("fee", 0)
            assert all(v >= 0 for v in led.balances.values()), "a negative balance"
            assert sum(led.balances.values()) == minted - fees, "tokens created or destroyed"
            return len(stored)
        finally:
            self.close()


# -- Cardinal checkpoints (cardinal/transport.py) ---------------------------------------------
def _checkpoint(seq: int) -> Any:
    from loglake.cardinal.blocks import BlockRef
    from loglake.cardinal.ordering import Checkpoint

    chain = tuple(
        BlockRef(n, _hash(n), _hash(n - 1), n * 10) for n in range(max(0, seq - 2), seq + 1)
    )
    return Checkpoint(chain, {"t:0": seq * 3, "t:1": seq * 2})


class CardinalCheckpoints(Part):
    """Checkpoint commits of one consumer. Invariants: the loaded checkpoint decodes, is one
    that was saved, no older than the last acknowledged one (its chain head, its offsets), and
    never older than what an earlier restart loaded."""

    name = "cardinal-checkpoint"

    def __init__(self) -> None:
        self.seen = 0

    def setup(self, root: Path) -> None:
        from loglake.streams.api import LocalStreams

        super().setup(root)
        s = LocalStreams.open(root / DATA)
        try:
            s.create_stream("t", 2)
        finally:
            s.close()

    def _load(self, root: Path) -> Any:
        from loglake.cardinal.transport import StreamTransport
        from loglake.streams.api import LocalStreams

        self.streams = LocalStreams.open(root / DATA)
        self.tr = StreamTransport(self.streams)
        return self.tr.load_checkpoint("c")

    def open(self, root: Path, life: int) -> None:
        ck = self._load(root)
        self.seq = ck.chain[-1].number if ck is not None else 0

    def step(self, rnd: random.Random) -> str:
        self.seq += 1
        self.tr.save_checkpoint("c", _checkpoint(self.seq))
        return f"{self.seq}"

    def close(self) -> None:
        self.streams.close()

    def check(self, root: Path, acks: list[str]) -> int:
        try:
            ck = self._load(root)
        finally:
            self.close()
        last = max((int(a) for a in acks), default=0)
        if ck is None:
            assert last == 0, f"checkpoint {last} acknowledged, none loaded"
            return 0
        s = ck.chain[-1].number
        want = _checkpoint(s)
        assert ck.chain == want.chain, f"loaded chain is not the one saved as {s}"
        assert s >= last, f"acknowledged checkpoint {last} lost (loaded {s})"
        assert s >= self.seen, f"checkpoint moved back from {self.seen} to {s}"
        low = _checkpoint(last)
        for src, off in ck.offsets.items():
            assert low.offsets[src] <= off <= want.offsets[src], f"{src} offset {off} not in range"
        self.seen = s
        return 1


# -- SDS channel state (sds/channel.py) --------------------------------------------------------
class SdsChannelState(Part):
    """Messages sent on an SDS channel (each life a new participant that first catches up).
    Invariants: the channel's stream replays to a fresh participant with every acknowledged
    message delivered exactly once and no record refused (malformed, oversized, …)."""

    name = "sds-channel"

    def open(self, root: Path, life: int) -> None:
        from loglake.sds.channel import SdsChannel
        from loglake.streams.api import LocalStreams

        self.streams = LocalStreams.open(root / DATA)
        self.ch = SdsChannel(self.streams, "chan", f"p{life}", clock=_ticks())
        self.ch.poll()
        self.life, self.n = life, 0

    def step(self, rnd: random.Random) -> str:
        content = f"l{self.life}m{self.n}"
        self.n += 1
        self.ch.send(content.encode())
        if rnd.random() < 0.2:
            self.ch.poll()
        return content

    def close(self) -> None:
        self.streams.close()

    def check(self, root: Path, acks: list[str]) -> int:
        from loglake.sds.channel import SdsChannel
        from loglake.sds.errors import DropReason
        from loglake.sds.events import MessageDelivered, MessageDropped
        from loglake.streams.api import LocalStreams

        self.streams = LocalStreams.open(root / DATA)
        try:
            ch = SdsChannel(self.streams, "chan", "checker", clock=_ticks())
            got: list[bytes] = []
            while True:
                out = ch.poll()
                got += [e.content for e in out.of(MessageDelivered)]
                bad = [e for e in out.of(MessageDropped) if e.reason is not DropReason.DUPLICATE]
                assert not bad, f"records the participant refused in the channel: {bad[:3]}"
                if ch.next_index >= ch._end_index():
                    break
            assert len(got) == len(set(got)), "a message delivered twice"
            missing = set(a.encode() for a in acks) - set(got)
            assert not missing, (
                f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:3]}"
            )
            return len(got)
        finally:
            self.close()


def _ticks() -> Callable[[], int]:
    n = [1_700_000_000_000]

    def clock() -> int:
        n[0] += 1
        return n[0]

    return clock


# -- Status community archives (archives/control.py, archives/store.py) ------------------------
def _community_config() -> Any:
    from loglake.log import StreamConfig

    # small segments, no lake: prune really drops records, which must then be in archives
    return StreamConfig(segment_bytes=8192, seal_to_lake=False)


class _Archives(Part):
    WEEK_MSGS = 12
    PRUNE = False

    def _payload(self, w: int, i: int) -> bytes:
        return b"w%di%d|" % (w, i) + random.Random(w * 1000 + i).randbytes(200)

    def _record(self, w: int, i: int) -> bytes:
        from tests.archives.helpers import START, WEEK, record

        return record(
            self.layout, START + w * WEEK + i * (WEEK // self.WEEK_MSGS), self._payload(w, i)
        )

    def __init__(self) -> None:
        from loglake.archives.layout import get_layout

        self.layout = get_layout("spec")

    def _node(self, root: Path) -> Any:
        from coincurve import PrivateKey

        from loglake.archives.control import ControlNode
        from loglake.archives.store import MessageStore
        from tests.faults.sqlite_vfs import shared_vfs

        key = PrivateKey(bytes.fromhex("33" * 32))
        # the store's file data through loglake.log.fs too: faults and power losses reach it
        store = MessageStore(root / "store.sqlite", vfs=shared_vfs().name)
        try:
            return ControlNode(root / "archives", key, self.layout, store)
        except BaseException:
            # closed now, not when collected: by then the power loss has closed its file
            # descriptors and their numbers belong to other files
            store.close()
            raise

    def open(self, root: Path, life: int) -> None:
        from loglake.log import open_log

        self.node = None  # first: close() after a failure anywhere below must not trip on it
        self.log = open_log(root / DATA)
        if not self.log.has_stream("community"):
            self.log.create_stream("community", _community_config())
        self.node = self._node(root)
        self.node.ingest_streams(LocalStreams(self.log), "community")

    def close(self) -> None:
        try:
            if self.node is not None:
                self.node.store.close()
        finally:
            self.log.close()

    def _weeks_built(self) -> int:
        from tests.archives.helpers import START, WEEK

        end = self.node.builder.end_ns
        return 0 if end is None else (end - START) // WEEK

    def _verify(self, root: Path, acks: list[str], weeks_appended: int) -> int:
        """Reopen the node (its recovery runs), then: the index's archives tile the weeks from
        0 without gap or overlap, ``data`` ends where the index does, each archive holds exactly
        the records of its week, no record is in two archives, and every record of every
        acknowledged week is in an archive or still in the live stream."""
        from tests.archives.helpers import START, WEEK

        self.open(root, -1)
        try:
            entries = self.node.entries
            data = self.node.data_path.read_bytes() if self.node.data_path.exists() else b""
            end = entries[-1].offset + entries[-1].size if entries else 0
            assert len(data) == end, f"data is {len(data)} bytes, its index ends at {end}"
            archived: list[bytes] = []
            for k, e in enumerate(entries):
                assert (e.metadata.from_ns, e.metadata.to_ns) == (
                    START + k * WEEK,
                    START + (k + 1) * WEEK,
                ), f"archive {k} covers the wrong window"
                got = self.node.layout.decode_archive(data[e.offset : e.offset + e.size], e)
                want = {self._record(k, i) for i in range(self.WEEK_MSGS)}
                assert set(got) == want, f"archive {k} does not hold exactly week {k}"
                archived += got
            assert len(archived) == len(set(archived)), "a record archived twice"
            if entries:
                want_torrent = self.node.torrent().metainfo()
                assert self.node.torrent_path.read_bytes() == want_torrent, "stale torrent file"
            built = max((int(a.split()[1]) for a in acks if a.startswith("built")), default=0)
            assert len(entries) >= built, (
                f"{built} weeks acknowledged as built, {len(entries)} indexed"
            )
            live = {r.data for r in self.log.iter_records("community")}
            everything = set(archived) | live
            for w in range(weeks_appended):
                for i in range(self.WEEK_MSGS):
                    assert self._record(w, i) in everything, f"record {w}/{i} lost"
            return len(archived) + len(live)
        finally:
            self.close()


class ArchiveBuild(_Archives):
    """Weekly archive builds over a filled community stream (starting over once every week is
    built). Invariants: see ``_Archives._verify``; the working store may lag the files and is
    repaired on open (re-flag from the archives)."""

    name = "archive-build"
    WEEKS = 30

    def setup(self, root: Path) -> None:
        from loglake.log import Entry, open_log

        super().setup(root)
        with open_log(root / DATA) as log:
            log.create_stream("community", _community_config())
            for w in range(self.WEEKS):
                log.append_many(
                    "community", [Entry(self._record(w, i)) for i in range(self.WEEK_MSGS)]
                )

    def step(self, rnd: random.Random) -> str | None:
        from tests.archives.helpers import START, WEEK

        k = self._weeks_built()
        if k >= self.WEEKS:
            return None
        self.node.build(START + (k + 1) * WEEK)
        return f"built {len(self.node.entries)}"

    def check(self, root: Path, acks: list[str]) -> int:
        n = self._verify(root, acks, self.WEEKS)
        self.open(root, -1)
        done = self._weeks_built() >= self.WEEKS
        self.close()
        if done:  # start over, so later lives build (and get killed building) again
            import shutil

            shutil.rmtree(root / "archives", ignore_errors=True)
            for p in root.glob("store.sqlite*"):
                p.unlink()
            acks.clear()
        return n


class ArchivePrune(_Archives):
    """A community that grows a week at a time: append the week, ingest, build, prune what is
    archived and older than 30 days. Invariants: ``_Archives._verify`` — above all, no record
    is ever lost between the live stream and the archives."""

    name = "archive-prune"

    def step(self, rnd: random.Random) -> str:
        from loglake.log import Entry
        from tests.archives.helpers import START, WEEK

        nxt = self.log.stream_info("community").partitions[0].next_index
        weeks = -(-nxt // self.WEEK_MSGS)  # a week is one append; a power loss may cut one
        if nxt % self.WEEK_MSGS or self._weeks_built() >= weeks:
            w = weeks - 1 if nxt % self.WEEK_MSGS else weeks
            first = nxt % self.WEEK_MSGS
            self.log.append_many(
                "community", [Entry(self._record(w, i)) for i in range(first, self.WEEK_MSGS)]
            )
            return f"appended {w + 1}"
        self.node.ingest_streams(LocalStreams(self.log), "community")
        now = START + weeks * WEEK
        self.node.build(now)
        got = self.node.prune(now)
        return f"built {len(self.node.entries)} pruned {got.log_records}"

    def check(self, root: Path, acks: list[str]) -> int:
        appended = max((int(a.split()[1]) for a in acks if a.startswith("appended")), default=0)
        return self._verify(root, acks, appended)


PARTS: dict[str, type[Part]] = {
    p.name: p
    for p in (
        ConsumerIndexes,
        OrchestratorJournal,
        Ledger,
        CardinalCheckpoints,
        SdsChannelState,
        ArchiveBuild,
        ArchivePrune,
    )
}


def preload() -> None:
    """Import everything the parts use (see ``tests/faults/crash.py``: forked lives)."""
    import importlib

    for m in (
        "cbor2",
        "coincurve",
        "loglake.archives.control",
        "loglake.archives.layout",
        "loglake.archives.store",
        "loglake.cardinal.transport",
        "loglake.events.store",
        "loglake.log",
        "loglake.sds.channel",
        "loglake.streams.api",
        "tests.archives.helpers",
    ):
        importlib.import_module(m)


def close_quietly(part: Part) -> None:
    with contextlib.suppress(Exception):
        part.close()
