"""``Log.read_tables``: the records of ``read`` as tables in the lake's schema, built from the
segments' bytes where they are plain records, row by row everywhere else — the same rows
either way, and the same errors as ``read`` on damage."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.log import CorruptSegment, Entry, MemoryLog, StreamConfig, open_log
from loglake.log.lake import records_table
from loglake.log.lake_schema import LAKE_SCHEMA
from loglake.log.partition import Partition
from loglake.log.record_codec import FRAME_HEAD


def _table(log, start: int = 0, end: int | None = None, **kw) -> pa.Table:
    tables = list(log.read_tables("s", start, end, **kw))
    assert all(t.schema == LAKE_SCHEMA for t in tables)
    return pa.concat_tables(tables) if tables else LAKE_SCHEMA.empty_table()


def _rows(log, start: int = 0, end: int | None = None) -> pa.Table:
    return records_table(list(log.iter_records("s", start, end)), "s", 0)


def _fill(log, n: int, every_keyed: int = 0, at: int = 0) -> None:
    for i in range(at, at + n, 10):
        entries = [
            Entry(
                b"d%05d" % j * (1 + j % 7),
                key=b"k%d" % j if every_keyed and j % every_keyed == 0 else None,
                headers=(("h", b"%d" % j),) if every_keyed and j % every_keyed == 1 else (),
                timestamp_ns=1_000 + j,
            )
            for j in range(i, min(i + 10, at + n))
        ]
        log.append_many("s", entries)


@settings(max_examples=40, deadline=None)
@given(
    start=st.integers(0, 320),
    length=st.integers(0, 320),
    max_bytes=st.sampled_from([1, 700, 5_000, 1 << 20]),
)
def test_any_range_equals_the_rows_of_read(tmp_path_factory, start, length, max_bytes):
    d = tmp_path_factory.mktemp("log")
    with open_log(d) as log:
        log.create_stream("s", StreamConfig(segment_bytes=4_000, seal_to_lake=False))
        _fill(log, 300)
        part = log._partition("s", 0)
        got = pa.concat_tables(
            [LAKE_SCHEMA.empty_table(), *part.read_tables(start, start + length, max_bytes)]
        )
        assert got.equals(_rows(log, start, start + length))


def test_plain_records_are_columns_and_keyed_ones_rows_in_one_answer(tmp_path, monkeypatch):
    built = []
    real = Partition.read

    def read(self, *a, **kw):
        built.append(a)
        return real(self, *a, **kw)

    monkeypatch.setattr(Partition, "read", read)
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=3_000, seal_to_lake=False))
        _fill(log, 200)  # plain: no row-by-row read at all
        assert _table(log).equals(_rows(log))
        built.clear()
        assert _table(log).num_rows == 200 and built == []
        _fill(log, 100, every_keyed=9, at=200)  # keys and headers among them: rows there
        assert _table(log).equals(_rows(log))
        assert built  # the keyed segments took the row path


def test_a_range_across_the_lake_and_the_segments(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=800, retention_records=5))
        _fill(log, 120)
        log.wait_for_seals()
        log.enforce_retention()
        assert log._partition("s", 0).segments[0].base > 0  # the start is in the lake only
        assert _table(log).equals(_rows(log))
        assert _table(log, 7, 111).equals(_rows(log, 7, 111))


def test_a_reader_sees_the_durable_prefix_only(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=1 << 20, seal_to_lake=False))
        _fill(log, 50)
        with open_log(tmp_path, readonly=True) as reader:
            assert _table(reader).equals(_rows(reader))
            assert _table(reader).num_rows == 50
        log.append_many("s", [Entry(b"late")])
        with open_log(tmp_path, readonly=True) as reader:
            assert _table(reader)["data"][-1].as_py() == b"late"


def test_damage_raises_what_read_raises(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=600, seal_to_lake=False))
        _fill(log, 60)
    first = sorted((tmp_path / "streams").rglob("*.seg"))[0]
    raw = bytearray(first.read_bytes())
    pos = FRAME_HEAD.size + FRAME_HEAD.unpack_from(raw, 0)[0]  # the second record
    raw[pos + FRAME_HEAD.size + 3] ^= 0x01
    first.write_bytes(bytes(raw))
    with open_log(tmp_path) as log:
        with pytest.raises(CorruptSegment) as rows:
            log.read("s", 0, limit=10)
        with pytest.raises(CorruptSegment) as tables:
            _table(log)
        assert (tables.value.path, tables.value.offset) == (rows.value.path, rows.value.offset)


def test_every_log_has_it():
    log = MemoryLog()
    log.create_stream("s")
    _fill(log, 30, every_keyed=4)
    assert _table(log, 3, 25).equals(_rows(log, 3, 25))


def test_one_large_record_among_small_ones(tmp_path):
    """Frames of very different sizes in one chunk (the data is gathered another way there:
    the C slice would size its output by the largest)."""
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(seal_to_lake=False))
        log.append_payloads("s", [b"x"] * 200 + [bytes(range(256)) * 400] + [b"yz"] * 50)
        assert _table(log).equals(_rows(log))
        assert _table(log)["data"][200].as_py() == bytes(range(256)) * 400
