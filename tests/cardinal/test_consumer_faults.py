"""A consumer survives what an outside review threw at it: a Reorg naming a reorg channel that
does not exist, a round that fails partway, an interrupted ``consume``, and a checkpoint whose
index-service record was lost."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from loglake.cardinal.avro import int_bytes
from loglake.cardinal.blocks import ChainUpdate, ReorgEvent
from loglake.cardinal.cli import command, consume_topic
from loglake.cardinal.codec import encode
from loglake.cardinal.errors import UndeliveredUpdates
from loglake.cardinal.messages import ZERO_HASH, Batch, BatchRecord
from loglake.cardinal.ordering import Checkpoint
from loglake.cardinal.producer import BlockPayload, Producer
from loglake.cardinal.transport import (
    StreamConsumer,
    StreamProducer,
    StreamTransport,
    envelope,
)
from loglake.log import MemoryLog, open_log
from loglake.streams.api import LocalStreams
from loglake.streams.client import StreamServiceError
from tests.cardinal.helpers import ChainModel

START = Checkpoint.starting_at(-1, ZERO_HASH, 0)


def linear(n: int, start: int = 0, parent: bytes = ZERO_HASH) -> list[BlockPayload]:
    out = []
    for i in range(start, start + n):
        h = hashlib.sha256(b"block %d" % i).digest()
        out.append(BlockPayload(i, h, parent, i, {f"k/{i % 5}": b"v%d" % i, "x/a": b"y"}))
        parent = h
    return out


def send(streams: LocalStreams, blocks: list[BlockPayload]) -> None:
    StreamProducer(StreamTransport(streams), Producer("chain")).send_blocks(blocks)


def hostile_reorg(streams: LocalStreams, key: bytes, value: bytes, partition: int = 0) -> None:
    """Well-formed bytes on the default topic; the reorg channel they name was never made."""
    streams.push_many("chain", [envelope(key, value)], partition)


def applied(events: list[ChainUpdate | ReorgEvent]) -> ChainModel:
    model = ChainModel([])
    for ev in events:
        model.apply(ev)
    return model


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (b"\x05" + hashlib.sha256(b"nowhere").digest(), int_bytes(3)),  # an unknown ancestor
        (b"\x05", b""),  # names the channel ``chain-re-``
    ],
)
def test_a_reorg_without_its_channel_is_dropped_and_consume_goes_on(tmp_path, key, value):
    # Found from outside: `cardinal consume` died with "unknown stream 'chain-re-…'" at every
    # restart (the Reorg sat before the committed offset); the honest chain never came out.
    blocks = linear(30)
    with open_log(tmp_path / "d") as log:
        streams = LocalStreams(log)
        send(streams, blocks[:10])
        hostile_reorg(streams, key, value)
        send(streams, blocks[10:])
    events: list[ChainUpdate | ReorgEvent] = []
    for _ in range(2):  # and a restart reads it again after the commit
        with open_log(tmp_path / "d") as log:
            c = consume_topic(LocalStreams(log), "chain", "app", on_event=events.append)
    model = applied(events)
    assert model.chain == [b.hash for b in blocks]
    assert c.core.head is not None and c.core.head.hash == blocks[-1].hash
    assert c.errors >= 1  # told, as a dropped message


def test_a_missing_stream_reads_as_no_deliveries():
    t = StreamTransport(LocalStreams(MemoryLog()))
    assert t.fetch("chain-re-00:0", 0, 10) == []
    assert t.sources("absent") == []


class FailingChannel(StreamTransport):
    """The broker fails once (a connection lost) when a reorg channel is read: in the middle of
    a round, after the blocks before the Reorg were assembled."""

    fail = True

    def fetch(self, source, offset, limit):
        if self.fail and "-re-" in source:
            self.fail = False
            raise StreamServiceError("connection lost")
        return super().fetch(source, offset, limit)


def test_updates_assembled_before_a_round_fails_come_with_the_next_poll():
    # Found from outside: the core's head moved to #9 while the application's stayed at #4;
    # #5..#9 were never delivered and the next block came on top of #4.
    streams = LocalStreams(MemoryLog())
    blocks = linear(12)
    send(streams, blocks[:5])
    c = StreamConsumer(FailingChannel(streams), ["chain"], "app", start=START)
    events = c.run()
    c.commit()
    send(streams, blocks[5:10])
    hostile_reorg(streams, b"\x05", b"", partition=3)  # the last source, after the blocks
    with pytest.raises(StreamServiceError):
        c.poll()
    assert c.core.head is not None and c.core.head.number == 9  # assembled, not handed over
    # a commit now would checkpoint past what the application has not seen
    with pytest.raises(UndeliveredUpdates):
        c.commit()
    again = StreamConsumer(StreamTransport(streams), ["chain"], "app", start=START)
    resumed = again.run()
    assert [b.number for ev in resumed if isinstance(ev, ChainUpdate) for b in ev.added] == [
        5,
        6,
        7,
        8,
        9,
    ]
    send(streams, blocks[10:])
    events += c.run()
    model = applied(events)
    assert model.chain == [b.hash for b in blocks]


def test_updates_given_back_come_first_and_hold_the_commit_back():
    streams = LocalStreams(MemoryLog())
    blocks = linear(6)
    send(streams, blocks)
    start = START
    c = StreamConsumer(StreamTransport(streams), ["chain"], "app", start=start)
    first = c.poll()
    assert first
    c.give_back(first)
    with pytest.raises(UndeliveredUpdates):
        c.commit()
    assert applied(c.poll()).chain == [b.hash for b in blocks]
    c.commit()
    again = StreamConsumer(StreamTransport(streams), ["chain"], "app", start=start)
    assert again.run() == []


def test_ctrl_c_in_consume_commits_what_it_handed_over(tmp_path):
    # Found from outside: Ctrl-C skipped the last commit; the restart printed 497 blocks again.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in `loglake`
    blocks = linear(400)
    with open_log(tmp_path / "d") as log:
        send(LocalStreams(log), blocks)
    seen: list[ChainUpdate | ReorgEvent] = []

    def ctrl_c_at_150(ev: ChainUpdate | ReorgEvent) -> None:
        seen.append(ev)
        if sum(len(e.added) for e in seen if isinstance(e, ChainUpdate)) == 150:
            os.kill(os.getpid(), signal.SIGINT)

    try:
        with open_log(tmp_path / "d") as log, pytest.raises(KeyboardInterrupt):
            consume_topic(
                LocalStreams(log),
                "chain",
                "app",
                on_event=ctrl_c_at_150,
                commit_seconds=float("inf"),  # no commit inside the loop: only the way out's
                idle_seconds=30,
            )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert 150 <= sum(len(e.added) for e in seen if isinstance(e, ChainUpdate)) < 400
    with open_log(tmp_path / "d") as log:
        consume_topic(LocalStreams(log), "chain", "app", on_event=seen.append)
    model = applied(seen)  # asserts no block is added twice
    assert model.chain == [b.hash for b in blocks]


def test_an_update_the_application_refused_is_handed_again_after_a_restart(tmp_path):
    blocks = linear(300)
    with open_log(tmp_path / "d") as log:
        send(LocalStreams(log), blocks)
    added: list[int] = []

    def fail_at_100(ev: ChainUpdate | ReorgEvent) -> None:
        if isinstance(ev, ChainUpdate) and any(b.number == 100 for b in ev.added):
            raise RuntimeError("the application's database is gone")
        if isinstance(ev, ChainUpdate):
            added.extend(b.number for b in ev.added)

    with open_log(tmp_path / "d") as log, pytest.raises(RuntimeError):
        consume_topic(LocalStreams(log), "chain", "app", on_event=fail_at_100)
    assert 100 not in added
    resumed: list[ChainUpdate | ReorgEvent] = []
    with open_log(tmp_path / "d") as log:
        consume_topic(LocalStreams(log), "chain", "app", on_event=resumed.append)
    again = [b.number for ev in resumed if isinstance(ev, ChainUpdate) for b in ev.added]
    assert again[-1] == 299 and 100 in again  # from the round that failed on: nothing skipped
    assert sorted(set(added) | set(again)) == list(range(300))


def test_an_interrupt_inside_a_round_leaves_the_last_commit_standing(tmp_path):
    blocks = linear(300)
    with open_log(tmp_path / "d") as log:
        send(LocalStreams(log), blocks)
    seen: list[ChainUpdate | ReorgEvent] = []

    class InterruptedAt(StreamTransport):
        fetches = 0

        def fetch(self, source, offset, limit):
            self.fetches += 1
            if self.fetches == 7:  # the second round, after its first sources' blocks
                raise KeyboardInterrupt
            return super().fetch(source, offset, limit)

    start = START
    with open_log(tmp_path / "d") as log:
        c = StreamConsumer(InterruptedAt(LocalStreams(log)), ["chain"], "app", start=start)
        seen += c.poll()
        c.commit()
        with pytest.raises(KeyboardInterrupt):
            c.poll()
        with pytest.raises(UndeliveredUpdates):
            c.commit()
    with open_log(tmp_path / "d") as log:
        consume_topic(LocalStreams(log), "chain", "app", on_event=seen.append)
    assert applied(seen).chain == [b.hash for b in blocks]


def _consumed_dir(tmp_path: Path) -> Path:
    d = tmp_path / "d"
    with open_log(d) as log:
        streams = LocalStreams(log)
        send(streams, linear(50))
        consume_topic(streams, "chain", "app")
    return d


@pytest.mark.parametrize("damage", ["deleted", "emptied"])
def test_a_lost_index_service_resumes_from_the_checkpoint_records(tmp_path, damage):
    # Found from outside: with consumers.* gone the consumer read "no checkpoint" and
    # re-emitted the whole chain, though cardinal.ckpt.<client> held its checkpoints.
    d = _consumed_dir(tmp_path)
    files = [p for p in d.iterdir() if p.name.startswith("consumers.")]
    assert files
    for p in files:
        if damage == "deleted":
            p.unlink()
        else:
            p.write_bytes(b"")
    with open_log(d) as log:
        streams = LocalStreams(log)
        send(streams, linear(3, start=50, parent=linear(50)[-1].hash))
        events: list[ChainUpdate | ReorgEvent] = []
        c = consume_topic(streams, "chain", "app", on_event=events.append)
    added = [b.number for ev in events if isinstance(ev, ChainUpdate) for b in ev.added]
    assert added == [50, 51, 52]  # only what came after the last checkpoint
    assert c.core.head is not None and c.core.head.number == 52


def test_a_crash_before_the_first_index_save_resumes_from_that_record():
    streams = LocalStreams(MemoryLog())
    blocks = linear(10)
    send(streams, blocks)
    c = StreamConsumer(StreamTransport(streams), ["chain"], "app", start=START)
    got = c.run()
    # the record of a first commit, appended; the process died before its index was saved
    streams.create_stream("cardinal.ckpt.app", 1)
    streams.push("cardinal.ckpt.app", c.core.checkpoint().to_bytes())
    again = StreamConsumer(StreamTransport(streams), ["chain"], "app", start=START)
    assert applied(got).chain == [b.hash for b in blocks]
    assert again.run() == []  # handed over before the crash: not again


def test_a_conflicting_batch_for_a_pending_block_is_reported(caplog, tmp_path):
    # Found from outside: a forged Batch (an honest block's hash, count 3 per prefix) sent
    # before the honest one held the chain at #5 of 300 for good, and nothing said so.
    blocks = linear(40)
    forged_for = blocks[5]
    (batch,) = [
        m for m in Producer("chain").block_messages(forged_for)["chain"] if isinstance(m, Batch)
    ]
    forged = replace(batch, updates={k: BatchRecord(count=3) for k in batch.updates})
    with open_log(tmp_path / "d") as log:
        streams = LocalStreams(log)
        send(streams, blocks[:5])
        k, v = encode(forged)
        streams.push_many("chain", [envelope(k, v)], 0)
        send(streams, blocks[5:])
    with caplog.at_level(logging.ERROR, logger="loglake.cardinal.consumer"):
        r = CliRunner().invoke(
            command, ["consume", "--topic", "chain", "--data-dir", str(tmp_path / "d"), "--quiet"]
        )
    assert r.exit_code == 0, r.output
    assert "head #4 " in r.output  # the first Batch is kept, as in the reference
    assert "1 Batch(es) conflicted with a pending block's first Batch" in r.output
    assert any(
        "conflicting Batch" in rec.getMessage() and rec.fields["hash"] == forged_for.hash.hex()
        for rec in caplog.records
    )


def test_identical_batch_copies_are_no_conflict():
    streams = LocalStreams(MemoryLog())
    blocks = linear(20)
    send(streams, blocks)
    send(streams, blocks)  # a redundant producer
    c = StreamConsumer(StreamTransport(streams), ["chain"], "app", start=START)
    assert applied(c.run()).chain == [b.hash for b in blocks]
    assert c.core.consumer.stats.conflicting == 0


def test_consume_refuses_a_data_dir_that_does_not_exist(tmp_path):
    # Found from outside: a mistyped --data-dir made a fresh log and printed "head #-1 0000…"
    typo = tmp_path / "typo"
    r = CliRunner().invoke(command, ["consume", "--topic", "chain", "--data-dir", str(typo)])
    assert r.exit_code == 2
    assert "is not a data directory" in r.output
    assert not typo.exists()


def test_consume_says_no_blocks_yet_and_names_an_unknown_topic(tmp_path):
    d = tmp_path / "d"
    with open_log(d) as log:
        send(LocalStreams(log), linear(3))
    r = CliRunner().invoke(command, ["consume", "--topic", "nosuch", "--data-dir", str(d)])
    assert r.exit_code == 0, r.output
    assert "no blocks yet" in r.output and "#-1" not in r.output
    assert "topic 'nosuch' does not exist (yet)" in r.output
    r = CliRunner().invoke(command, ["consume", "--topic", "chain", "--data-dir", str(d)])
    assert "head #2 " in r.output and "does not exist" not in r.output


def test_run_keeps_the_rounds_before_the_one_that_failed():
    streams = LocalStreams(MemoryLog())
    blocks = linear(200)
    send(streams, blocks)
    hostile_reorg(streams, b"\x05", b"", partition=3)  # read in a later round than the first
    c = StreamConsumer(FailingChannel(streams), ["chain"], "app", start=START)
    with pytest.raises(StreamServiceError):
        c.run()
    assert applied(c.run()).chain == [b.hash for b in blocks]
