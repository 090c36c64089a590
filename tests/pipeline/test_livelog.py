"""The live tail as the Spark source sees it (``livelog.DirSource``, ``options.resolve_stream``):
only what the writer fsynced (issue 17 item 8), and a broken log import is an error, not an empty
stream (issue 18). No Spark: these are the calls the source makes on the driver and executors."""

from __future__ import annotations

import logging
import sys
import threading

import pyarrow as pa
import pytest

from loglake.log import Entry, StreamConfig, fs, open_log
from loglake.pipeline import livelog
from loglake.pipeline.errors import LiveHistoryGone
from loglake.pipeline.livelog import DirSource, UrlSource
from loglake.pipeline.options import parse_options, resolve_stream

WAIT = 30.0


def _rows(src: DirSource, end: int) -> list[bytes]:
    batches = list(src.read("s", 0, 0, end))
    return pa.Table.from_batches(batches).column("data").to_pylist() if batches else []


def test_a_reader_does_not_see_records_appended_but_not_yet_fsynced(tmp_path, monkeypatch):
    """A ``batch`` writer has written three records and is inside the group commit's fsync:
    they are not acknowledged, a crash could take them back and a later append would reuse their
    indexes, so neither the source's layout nor its reads may include them."""
    writer = open_log(tmp_path)
    try:
        writer.create_stream("s", StreamConfig(durability="batch"))
        writer.append_many("s", [Entry(b"acked-%d" % i) for i in range(5)])
        in_fsync, release = threading.Event(), threading.Event()
        real = fs.fdatasync

        def held_fdatasync(fd):
            if threading.current_thread().name == "late-append":
                in_fsync.set()
                assert release.wait(WAIT), "the test never released the fsync"
            real(fd)

        monkeypatch.setattr(fs, "fdatasync", held_fdatasync)
        late = threading.Thread(
            target=lambda: writer.append_many("s", [Entry(b"late")] * 3), name="late-append"
        )
        late.start()
        try:
            assert in_fsync.wait(WAIT), "the late append reached its fsync"
            src = DirSource(str(tmp_path))
            assert src.partitions("s") == {0: (0, 5)}
            assert _rows(src, 8) == [b"acked-%d" % i for i in range(5)]
            layout = resolve_stream(parse_options({"data_dir": str(tmp_path), "stream": "s"}))
            assert layout.live == {0: (0, 5)}
        finally:
            release.set()
            late.join(WAIT)
        assert DirSource(str(tmp_path)).partitions("s") == {0: (0, 8)}  # acknowledged now
        assert _rows(DirSource(str(tmp_path)), 8)[5:] == [b"late"] * 3
    finally:
        writer.close()


def test_the_live_log_is_never_taken_for_absent(tmp_path, monkeypatch):
    """The source used to import the log lazily and answer "no stream" when that failed, so a
    broken install read as an empty stream. Now the log is a plain import (a broken one fails
    loudly when the source loads), and an error opening it is raised, not swallowed."""
    log = open_log(tmp_path)
    log.create_stream("s")
    log.append_many("s", [Entry(b"x")])
    log.close()
    monkeypatch.setitem(sys.modules, "loglake.log", None)  # a lazy import would fail now
    assert DirSource(str(tmp_path)).partitions("s") == {0: (0, 1)}
    monkeypatch.setattr(livelog, "open_log", _broken_open_log)
    with pytest.raises(OSError, match="unreadable"):
        DirSource(str(tmp_path)).partitions("s")
    with pytest.raises(OSError, match="unreadable"):
        list(DirSource(str(tmp_path)).read("s", 0, 0, 1))


def _broken_open_log(*a, **k):
    raise OSError("data dir unreadable")


def _sixty_records(log) -> None:
    """A stream ``s`` of records 0..59 in ``log`` (no lake), in small segments so retention
    removes some of them."""
    log.create_stream("s", StreamConfig(segment_bytes=512, seal_to_lake=False))
    for i in range(6):
        log.append_many("s", [Entry(b"r%d" % (i * 10 + j)) for j in range(10)])
    log.flush()


def _sixty_records_retention_cut_below_40(path) -> int:
    """A stream ``s`` of records 0..59 in the data dir at ``path`` (no lake), whose head
    retention removed up to 40: the first index it still holds."""
    log = open_log(path)
    try:
        _sixty_records(log)
        log.truncate_before("s", 40)
        return log.stream_info("s").partitions[0].first_index
    finally:
        log.close()


def test_a_range_retention_removed_is_live_history_gone_not_a_gap(tmp_path):
    # the log reads from its first index: a read of [0, 60) after retention removed 0..39
    # returned 40..59 alone, and a streaming query resumed at 0 skipped 0..39 without a word
    first = _sixty_records_retention_cut_below_40(tmp_path)
    assert 0 < first <= 40
    src = DirSource(str(tmp_path))
    with pytest.raises(LiveHistoryGone, match=f"indexes 0..{first - 1} are in neither"):
        list(src.read("s", 0, 0, 60))
    with pytest.raises(LiveHistoryGone, match=f"indexes 1..{first - 1} "):
        list(src.read("s", 0, 1, first))  # nothing of it held at all
    kept = pa.Table.from_batches(list(src.read("s", 0, first, 60))).column("index").to_pylist()
    assert kept == list(range(first, 60))


def test_the_jobs_reader_of_a_removed_live_range_is_live_history_gone(tmp_path):
    # pipeline/units.py (replay, archives-build, sds-audit) read the embedded log directly:
    # a unit planned at 0..59 whose head retention removed before the task gave 40..59 alone
    from loglake.pipeline.units import Unit, read_unit_columns

    first = _sixty_records_retention_cut_below_40(tmp_path)
    with pytest.raises(LiveHistoryGone, match=f"indexes 0..{first - 1} are in neither"):
        list(read_unit_columns(str(tmp_path), Unit("s", "", 0, 60)))
    got = pa.Table.from_batches(list(read_unit_columns(str(tmp_path), Unit("s", "", first, 60))))
    assert got.column("index").to_pylist() == list(range(first, 60))


def test_a_range_the_servers_retention_removed_is_live_history_gone_over_url(tmp_path):
    # a pull answers from the first index the server keeps: a read of [0, 60) over ``url``
    # after retention removed 0..39 returned 40..59 alone, the same silent gap as DirSource's
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    first = _sixty_records_retention_cut_below_40(tmp_path)
    log = open_log(tmp_path)
    try:
        with BackgroundServer(StreamService(log)) as srv:
            src = UrlSource(f"loglake://127.0.0.1:{srv.port}")
            assert src.partitions("s") == {0: (first, 60)}
            with pytest.raises(LiveHistoryGone, match=f"indexes 0..{first - 1} are in neither"):
                list(src.read("s", 0, 0, 60))
            with pytest.raises(LiveHistoryGone, match=f"indexes 1..{first - 1} "):
                list(src.read("s", 0, 1, first))  # nothing of it held at all
            got = pa.Table.from_batches(list(src.read("s", 0, first, 60)))
            assert got.column("index").to_pylist() == list(range(first, 60))
            assert list(src.read("s", 0, 60, 70)) == []  # past the end: not written yet
    finally:
        log.close()


def test_starting_offsets_below_the_first_kept_index_is_live_history_gone(tmp_path):
    # a JSON offset retention removed started at the first kept index: 0..39 skipped without a
    # word. Kafka's source fails here (failOnDataLoss, default true), as a removed range does
    from loglake.pipeline.datasource import LoglakeDataSource

    first = _sixty_records_retention_cut_below_40(tmp_path)

    def initial(offsets: str) -> dict:
        opts = {"data_dir": str(tmp_path), "stream": "s", "startingOffsets": offsets}
        return LoglakeDataSource(opts).streamReader(None).initialOffset()

    with pytest.raises(LiveHistoryGone, match=f"indexes 3..{first - 1} are in neither"):
        initial('{"0": 3}')
    assert initial(f'{{"0": {first}}}') == {"0": first}
    assert initial(f'{{"0": {first + 5}}}') == {"0": first + 5}
    assert initial('{"0": -2}') == {"0": first}  # earliest: from what is kept, as asked
    assert initial('{"0": -1}') == {"0": 60}


def test_retention_overtaking_a_url_read_between_pulls_is_live_history_gone(tmp_path, monkeypatch):
    # a read pulls READ_BATCH records at a time: retention removing the next ones between two
    # pulls made the next pull answer from the first kept index, a gap in the middle
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    monkeypatch.setattr(livelog, "READ_BATCH", 10)
    log = open_log(tmp_path)
    try:
        _sixty_records(log)
        with BackgroundServer(StreamService(log)) as srv:
            batches = UrlSource(f"loglake://127.0.0.1:{srv.port}").read("s", 0, 0, 60)
            assert next(batches).column("index").to_pylist() == list(range(10))
            log.truncate_before("s", 40)
            first = log.stream_info("s").partitions[0].first_index
            assert 10 < first <= 40
            with pytest.raises(LiveHistoryGone, match=f"indexes 10..{first - 1} are in neither"):
                next(batches)
    finally:
        log.close()


def _lost_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "loglake.pipeline.datasource"
    ]


def test_fail_on_data_loss_false_skips_a_removed_range_with_a_warning(tmp_path, caplog):
    # Spark's Kafka source, failOnDataLoss=false: the lost offsets are logged and the read goes
    # on from the earliest still held. Default (true): LiveHistoryGone, as before
    from loglake.pipeline.datasource import RangeSplit, read_range

    first = _sixty_records_retention_cut_below_40(tmp_path)
    base = {"data_dir": str(tmp_path), "stream": "s"}
    with pytest.raises(LiveHistoryGone, match=f"indexes 0..{first - 1} are in neither"):
        list(read_range(parse_options(base), RangeSplit(0, 0, 60)))
    assert _lost_warnings(caplog) == []
    opts = parse_options({**base, "failOnDataLoss": "false"})
    with caplog.at_level(logging.WARNING, logger="loglake.pipeline.datasource"):
        got = pa.Table.from_batches(list(read_range(opts, RangeSplit(0, 0, 60))))
    assert got.column("index").to_pylist() == list(range(first, 60))
    assert got.column("data").to_pylist() == [b"r%d" % i for i in range(first, 60)]
    (warning,) = _lost_warnings(caplog)
    assert f"stream 's' partition 0: indexes 0..{first - 1} are in neither" in warning
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.fields == {  # type: ignore[attr-defined]
        "stream": "s",
        "partition": 0,
        "lost_first": 0,
        "lost_last": first - 1,
    }
    caplog.clear()  # a range wholly lost reads nothing, and says so
    with caplog.at_level(logging.WARNING, logger="loglake.pipeline.datasource"):
        assert list(read_range(opts, RangeSplit(0, 2, 7))) == []
    assert ["indexes 2..6 are in neither" in w for w in _lost_warnings(caplog)] == [True]


def test_fail_on_data_loss_false_skips_a_gap_retention_made_between_pulls(
    tmp_path, monkeypatch, caplog
):
    # the lost range in the middle of a read (over url, between two pulls): the rows before and
    # after it, each once, and the warning names only what is gone
    from loglake.pipeline.datasource import RangeSplit, read_range
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    monkeypatch.setattr(livelog, "READ_BATCH", 10)
    log = open_log(tmp_path)
    try:
        _sixty_records(log)
        with BackgroundServer(StreamService(log)) as srv:
            opts = parse_options(
                {"url": f"loglake://127.0.0.1:{srv.port}", "stream": "s", "failOnDataLoss": "FALSE"}
            )
            batches = read_range(opts, RangeSplit(0, 0, 60))
            rows = next(batches).column("index").to_pylist()
            log.truncate_before("s", 40)
            first = log.stream_info("s").partitions[0].first_index
            with caplog.at_level(logging.WARNING, logger="loglake.pipeline.datasource"):
                rows += [i for b in batches for i in b.column("index").to_pylist()]
    finally:
        log.close()
    assert rows == [*range(10), *range(first, 60)]
    (warning,) = _lost_warnings(caplog)
    assert f"indexes 10..{first - 1} are in neither" in warning


def test_fail_on_data_loss_false_starts_a_query_at_the_first_kept_index(tmp_path, caplog):
    # Kafka's source with failOnDataLoss=false: a starting offset out of range is reported as a
    # warning and the query starts at the earliest offset still held
    from loglake.pipeline.datasource import LoglakeDataSource

    first = _sixty_records_retention_cut_below_40(tmp_path)
    opts = {"data_dir": str(tmp_path), "stream": "s", "startingOffsets": '{"0": 3}'}
    reader = LoglakeDataSource({**opts, "failOnDataLoss": "false"}).streamReader(None)
    with caplog.at_level(logging.WARNING, logger="loglake.pipeline.datasource"):
        assert reader.initialOffset() == {"0": first}
    (warning,) = _lost_warnings(caplog)
    assert f"stream 's' partition 0: indexes 3..{first - 1} are in neither" in warning


def test_fail_on_data_loss_false_starts_a_batch_read_at_the_first_kept_index(tmp_path, caplog):
    # format("loglake"): a startIndex below the first kept index, planned on the driver, is
    # LiveHistoryGone, or with failOnDataLoss=false a warning and splits from the first kept
    from loglake.pipeline.datasource import LoglakeDataSource

    first = _sixty_records_retention_cut_below_40(tmp_path)
    opts = {"data_dir": str(tmp_path), "stream": "s", "startIndex": "3"}
    source = LoglakeDataSource(opts)
    with pytest.raises(LiveHistoryGone, match=f"indexes 3..{first - 1} are in neither"):
        source.reader(source.schema()).partitions()
    source = LoglakeDataSource({**opts, "failOnDataLoss": "false"})
    with caplog.at_level(logging.WARNING, logger="loglake.pipeline.datasource"):
        (split,) = source.reader(source.schema()).partitions()
    assert (split.start, split.end) == (first, 60)  # type: ignore[attr-defined]
    (warning,) = _lost_warnings(caplog)
    assert f"stream 's' partition 0: indexes 3..{first - 1} are in neither" in warning


def test_fail_on_data_loss_false_goes_on_from_the_end_of_a_stream_behind_its_checkpoint(
    tmp_path, caplog
):
    # a checkpoint at 90 over a stream of 60 records whose head retention removed: default
    # StreamBehindCheckpoint; false: the batch ends at the stream's end (60) with a warning
    # naming the checkpoint's offset and what is not read, as Kafka's "offset was changed"
    from loglake.pipeline.datasource import LoglakeDataSource
    from loglake.pipeline.errors import StreamBehindCheckpoint

    first = _sixty_records_retention_cut_below_40(tmp_path)
    opts = {"data_dir": str(tmp_path), "stream": "s"}
    with pytest.raises(StreamBehindCheckpoint, match=r"ends at index 60, below .* offset 90"):
        LoglakeDataSource(opts).streamReader(None).latestOffset({"0": 90}, None)
    reader = LoglakeDataSource({**opts, "failOnDataLoss": "false"}).streamReader(None)
    with caplog.at_level(logging.WARNING, logger="loglake.pipeline.datasource"):
        assert reader.latestOffset({"0": 90}, None) == {"0": 60}
        assert reader.partitions({"0": 90}, {"0": 60}) == []
    (warning,) = _lost_warnings(caplog)
    assert "stream 's' partition 0 ends at index 60, below the checkpoint's offset 90" in warning
    assert f"indexes 60..89 the checkpoint counted are gone and {first}..59 held now" in warning
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.fields == {  # type: ignore[attr-defined]
        "stream": "s",
        "partition": 0,
        "checkpoint_offset": 90,
        "next_index": 60,
        "unread_first": first,
    }
