"""The checkpoint stream ``cardinal.ckpt.<client>`` stays bounded (follow-up F4 item 2).

A record is appended only when the window or the set of sources changed, and on an embedded
log the records below the last one are dropped (``Log.truncate_before``): each record is a
whole checkpoint, so the last is sufficient to resume."""

from __future__ import annotations

from loglake.cardinal.messages import ZERO_HASH
from loglake.cardinal.ordering import Checkpoint
from loglake.cardinal.synthetic import synthetic_chain, topics_for
from loglake.cardinal.transport import StreamConsumer, StreamTransport
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from tests.cardinal.helpers import ChainModel
from tests.cardinal.test_transport import apply_all, produce

CKPT = "cardinal.ckpt.c1"


def _consumer(streams, transport=None):
    return StreamConsumer(
        transport or StreamTransport(streams, 3),
        topics_for("chain"),
        "c1",
        8,
        start=Checkpoint.starting_at(-1, ZERO_HASH, 0),
    )


def _appended(streams) -> int:
    """How many checkpoint records were ever appended (the stream's next index)."""
    return streams.log.next_index(CKPT)


def test_no_record_when_nothing_changed():
    streams = LocalStreams(MemoryLog())
    produce(streams, synthetic_chain(30))
    c = _consumer(streams)
    apply_all(ChainModel([]), c.run())
    c.commit()
    assert _appended(streams) == 1
    for _ in range(50):  # an idle consumer committing every round
        assert c.poll() == []
        c.commit()
    assert _appended(streams) == 1
    # ... and a restart does not write either: the loaded record is the last one.
    again = _consumer(streams)
    again.commit()
    assert _appended(streams) == 1


def test_records_grow_with_window_changes_only_and_resume_is_exact():
    streams = LocalStreams(MemoryLog())
    chain = synthetic_chain(60)
    produce(streams, chain)
    c = _consumer(streams)
    model = ChainModel([])
    heads = set()
    commits = 0
    while True:
        events = c.poll(limit=7)
        apply_all(model, events)
        c.commit()
        commits += 1
        heads.add(c.core.ordering.chain)
        if not events and c.poll(limit=7) == []:
            c.commit()
            commits += 1
            break
    assert _appended(streams) <= len(heads) + 1  # +1: a new source (never here, but allowed)
    assert _appended(streams) < commits
    resumed = _consumer(streams)
    assert resumed.core.head == c.core.head
    apply_all(model, resumed.run())
    assert model.chain == [b.hash for b in chain.canonical]


def test_embedded_log_keeps_only_the_last_record():
    log = MemoryLog()
    streams = LocalStreams(log)
    chain = synthetic_chain(60)
    produce(streams, chain)
    c = _consumer(streams)
    model = ChainModel([])
    for _ in range(30):
        apply_all(model, c.poll(limit=5))
        c.commit()
    assert _appended(streams) > 3  # the window moved many times ...
    assert log.stream_info(CKPT).records == 1  # ... and one record is kept
    resumed = _consumer(streams)
    assert resumed.core.head == c.core.head
    apply_all(model, resumed.run())
    assert model.chain == [b.hash for b in chain.canonical]


def test_segment_log_checkpoint_stream_is_truncated(tmp_path):
    from loglake.log import StreamConfig, open_log

    log = open_log(tmp_path / "data")
    try:
        # tiny segments, so segment-granular truncation has something to drop
        streams = LocalStreams(log, StreamConfig(segment_bytes=512, seal_to_lake=False))
        chain = synthetic_chain(60)
        produce(streams, chain)
        c = _consumer(streams)
        model = ChainModel([])
        for _ in range(30):
            apply_all(model, c.poll(limit=5))
            c.commit()
        info = log.stream_info(CKPT)
        assert info.partitions[0].next_index > 5
        assert info.records < info.partitions[0].next_index  # older segments dropped
        resumed = _consumer(streams)
        assert resumed.core.head == c.core.head
        apply_all(model, resumed.run())
        assert model.chain == [b.hash for b in chain.canonical]
    finally:
        log.close()
