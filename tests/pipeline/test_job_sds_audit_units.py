"""``job sds-audit``'s decode stage reads the channel as units (``loglake.pipeline.units``):
sealed lake files through pyarrow and the live tail through the log, in plain tasks that write
``_work/decoded`` themselves. On a channel partly sealed into lake files: the decoded rows equal
those of one decode over the whole channel read from the log, also after ``job compact``
replaced the planned files; the audit equals the simulator's ground truth."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loglake.log import open_log
from loglake.log.lake import write_lake_table
from loglake.log.lake_schema import lake_partition_dir
from loglake.pipeline.jobs import sds_audit
from loglake.pipeline.jobs.sds_audit import (
    BLOOMS_SCHEMA,
    CODED,
    DECODE_COLUMNS,
    DECODED_SCHEMA,
    SdsAuditOptions,
    _decode_task,
    _ids_path,
    _sender_blooms,
    _work_batches,
    _work_schema,
    decode_batches,
    run,
    table,
)
from loglake.pipeline.units import Unit, plan_units, read_unit_columns, read_unit_pieces
from tests.sds.records import readable

from .test_job_sds_audit import CFG, STREAM, expected_from_truth, simulated

CHANNEL = "sim"
DECODED = [n for n in DECODED_SCHEMA.names if n != "bloom_filter"]
"""What a decoded file gives back (``causal_new`` from its codes and ids file)."""


def _seal(data_dir: Path, first: int, last: int) -> Path:
    """Records ``first..last`` of the stored channel as one lake file (what sealing or a
    compaction writes)."""
    with open_log(data_dir, readonly=True) as log:
        t = pa.concat_tables(log.read_tables(STREAM, first, last + 1))
    return write_lake_table(lake_partition_dir(data_dir, STREAM, 0), t).path


def _whole(data_dir: Path) -> list[dict]:
    """One decode over the whole channel read from the log: what the task must produce."""
    with open_log(data_dir, readonly=True) as log:
        batches = [
            b
            for t in log.read_tables(STREAM, 0, None)
            for b in t.select(list(DECODE_COLUMNS)).to_batches()
        ]
    return readable(decode_batches(CHANNEL)(iter(batches)))


@pytest.mark.parametrize(("batch", "piece"), [(10_000, 1_000), (6, 3), (8, 1)])
def test_a_task_decodes_lake_files_and_the_live_tail_and_a_compacted_file(
    tmp_path, monkeypatch, batch, piece
):
    """Also with batches of several pieces (the decoder takes a piece at a time, the file
    keeps the batches ``read_unit_columns`` cuts): the same rows, in the same batches."""
    monkeypatch.setattr(sds_audit, "DECODE_BATCH", batch)
    monkeypatch.setattr(sds_audit, "DECODE_PIECE", piece)
    data = tmp_path / "data"
    sim = simulated(data)
    n = len(sim.channel)
    small = [_seal(data, 0, 19), _seal(data, 20, 39)]
    units = plan_units(str(data), {0: STREAM}, 0)[0]
    assert [(u.start, u.end, bool(u.path)) for u in units] == [
        (0, 20, True),
        (20, 40, True),
        (40, n, False),
    ]
    want = _whole(data)
    assert len(want) == n and sum(r["ok"] for r in want) == n

    out = tmp_path / "decoded"
    out.mkdir()
    task = _decode_task(str(data), CHANNEL, str(out))
    path, rows, reasons, sweep, senders = task((0, units))
    got = list(_work_batches(path, DECODED))
    assert rows == n and reasons == {}
    assert all(
        b.schema
        == _work_schema(DECODED)
        == DECODED_SCHEMA.remove(DECODED_SCHEMA.get_field_index("bloom_filter"))
        for b in got
    )
    assert readable(got) == _without_blooms(want)
    sizes = [
        b.num_rows
        for u in units
        for b in read_unit_columns(str(data), u, DECODE_COLUMNS, batch_rows=batch)
    ]
    assert [b.num_rows for b in got] == sizes
    _assert_bloom_file(sweep, senders, want)
    # no temporary file left
    files = [Path(path).name, Path(sweep).name, *(Path(_ids_path(path, c)).name for c in CODED)]
    assert sorted(p.name for p in out.iterdir()) == sorted(files)

    # job compact replaced the planned files by one covering them: read from that one
    _seal(data, 0, 39)
    for f in small:
        f.unlink()
    path, rows, _, sweep, senders = task((1, units))
    got = list(_work_batches(path, DECODED))
    assert readable(got) == _without_blooms(want)
    _assert_bloom_file(sweep, senders, want)
    assert [b.num_rows for b in got] == [
        b.num_rows
        for u in units
        for b in read_unit_columns(str(data), u, DECODE_COLUMNS, batch_rows=batch)
    ]


def _without_blooms(rows: list[dict]) -> list[dict]:
    """Decoded rows as a decoded file keeps them: the bloom filters are in the bloom file."""
    return [{k: v for k, v in r.items() if k != "bloom_filter"} for r in rows]


def _assert_bloom_file(path: str, senders: list[str], want: list[dict]) -> None:
    """The bloom file holds the filter of every decoded content and sync message that has
    one, its batches each one sender's (``senders``) in index order."""
    with pa.OSFile(path) as f:
        reader = pa.ipc.open_file(f)
        assert reader.schema == BLOOMS_SCHEMA and reader.num_record_batches == len(senders)
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    by_sender: dict[str, list[dict]] = {}
    for name, b in zip(senders, batches, strict=True):
        assert b.num_rows
        by_sender.setdefault(name, []).extend(b.to_pylist())
    expect: dict[str, list[dict]] = {}
    for r in want:
        if r["ok"] and r["kind"] in ("content", "sync") and r["bloom_filter"] is not None:
            row = {"index": r["index"], "bloom_filter": r["bloom_filter"]}
            expect.setdefault(r["sender"], []).append(row)
    assert expect  # the simulated channel's messages carry filters
    assert by_sender == expect


def test_pieces_make_the_batches_read_unit_columns_cuts(tmp_path):
    """``read_unit_pieces``: a lake file of several row groups (iter_batches crosses them),
    the live tail and an empty unit; each batch's pieces, concatenated, are the batch, and
    none is over ``piece_rows``."""
    data = tmp_path / "data"
    sim = simulated(data)
    n = len(sim.channel)
    with open_log(data, readonly=True) as log:
        t = pa.concat_tables(log.read_tables(STREAM, 0, 30))
    lake = tmp_path / "groups.parquet"
    pq.write_table(t, lake, row_group_size=7)
    units = [Unit(STREAM, str(lake), 0, 30), Unit(STREAM, "", 30, n), Unit(STREAM, "", 5, 5)]
    cols = list(DECODE_COLUMNS)
    for batch, piece in [(12, 4), (12, 12), (5, 1), (10_000, 1_000)]:
        for u in units:
            want = list(read_unit_columns(str(data), u, cols, batch_rows=batch))
            got = list(read_unit_pieces(str(data), u, cols, batch, piece))
            assert len(got) == len(want)
            for g, w in zip(got, want, strict=True):
                assert all(0 < p.num_rows <= piece for p in g)
                assert pa.Table.from_batches(g).equals(pa.Table.from_batches([w]))
    with pytest.raises(ValueError, match="multiple"):
        next(read_unit_pieces(str(data), units[0], cols, 10, 4))


@pytest.mark.spark
@pytest.mark.slow  # one audit: ~15-25 s
def test_the_audit_of_a_partly_sealed_channel_equals_the_ground_truth(spark, tmp_path):
    data = tmp_path / "data"
    sim = simulated(data)
    _seal(data, 0, 24)
    _seal(data, 25, 44)
    exp = expected_from_truth(sim)
    summary = run(spark, SdsAuditOptions(str(data), STREAM, str(tmp_path / "out")).validate())
    out = str(tmp_path / "out")
    assert summary.records == len(sim.channel) and summary.rejects == 0
    assert summary.content_messages == CFG.messages
    got_acks = {
        (r["message_id"], r["participant"]): (r["ack_index"], r["latency_ms"])
        for r in table(spark, out, "acks").collect()
    }
    assert got_acks == exp["acks"] and got_acks
    parts = {r["participant"]: r.asDict() for r in table(spark, out, "participants").collect()}
    for pid, want in exp["participants"].items():
        for k, v in want.items():
            assert parts[pid][k] == v, (pid, k)
    assert not (tmp_path / "out" / "_work").exists()


def test_a_part_file_the_driver_cannot_see_fails_the_job_naming_it(tmp_path):
    """Both jobs that write where the records lie need one filesystem for the driver and the
    executors; a part file the driver cannot see is ``JobFailed`` saying so."""
    from loglake.pipeline.errors import JobFailed
    from loglake.pipeline.units import require_visible

    here = tmp_path / "part-00000.zstd.parquet"
    here.write_bytes(b"x")
    require_visible(str(here), "sds-audit", "--out")  # visible: nothing to say
    gone = str(tmp_path / "elsewhere" / "part-00001.zstd.parquet")
    with pytest.raises(JobFailed, match=r"part-00001.*not visible to the driver: sds-audit"):
        require_visible(gone, "sds-audit", "--out (and the data dir)")


def test_a_senders_filters_come_from_its_batches_of_every_bloom_file(tmp_path):
    """``_sender_blooms``: the filters of one sender's messages at the indexes asked for, from
    its batches in each bloom file (the other senders' batches unread), null where a message
    has none; None for a sender with no filter at all."""

    def bloom_file(name: str, batches: list[tuple[str, list[int]]]) -> tuple[str, list[str]]:
        path = str(tmp_path / name)
        with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, BLOOMS_SCHEMA) as w:
            for _, idx in batches:
                filters = [b"%d" % i * 3 for i in idx]
                w.write_batch(pa.record_batch([idx, filters], schema=BLOOMS_SCHEMA))
        return path, [s for s, _ in batches]

    files = [
        bloom_file("a.arrow", [("s", [1, 4]), ("t", [2]), ("s", [6])]),
        bloom_file("b.arrow", [("t", [9]), ("s", [11])]),
    ]
    got = _sender_blooms(files, "s", pa.chunked_array([[1, 3, 4], [6, 11, 12]], pa.int64()))
    assert got is not None
    assert got.to_pylist() == [b"111", None, b"444", b"666", b"111111", None]
    assert _sender_blooms(files, "u", pa.chunked_array([[1]], pa.int64())) is None


def _messages_of(tmp_path: Path, name: str, decoded: str, figures: str) -> tuple[Path, pa.Table]:
    """``_messages_task`` run here on a decoded file and its figures: the part file it wrote
    and its rows."""
    out = tmp_path / name
    out.mkdir()
    path, _ = sds_audit._messages_task(str(out), [], [])((decoded, figures))
    return Path(path), pq.read_table(path)


def test_messages_past_the_writers_dictionary_limit_are_written_from_strings(tmp_path, monkeypatch):
    """The histories go to Parquet's writer dictionary-encoded, and the file is the one the
    writer makes from strings, only while a batch's dictionary stays under the writer's
    dictionary page limit: past it, the writer goes on in plain encoding from strings but
    keeps a given dictionary whole. A batch past the limit (lowered here: the channel is
    small) has the whole file written again from strings. Either way the rows are the same
    and the bytes are pyarrow's own from strings, a row group a batch."""
    data = tmp_path / "data"
    simulated(data)
    units = plan_units(str(data), {0: STREAM})[0]
    dec = tmp_path / "decoded"
    dec.mkdir()
    decoded = _decode_task(str(data), CHANNEL, str(dec))((0, units))[0]
    rows = sds_audit._read_work(decoded, ["index", "ok", "message_id"])
    first: dict[str, int] = {}
    cols = [rows.column(c).to_pylist() for c in ("index", "ok", "message_id")]
    for i, ok, mid in zip(*cols, strict=True):
        if ok:
            first.setdefault(mid, i)
    n = len(first)
    figures = pa.table(
        {
            "first_index": pa.array(sorted(first.values()), pa.int64()),
            **{c: pa.array([0] * n, pa.int64()) for c in sds_audit.MESSAGE_FIGURES},
        }
    )
    fig_path = str(tmp_path / "figures.arrow")
    with pa.ipc.new_file(fig_path, figures.schema) as w:
        w.write_table(figures)

    coded, want = _messages_of(tmp_path, "coded", decoded, fig_path)
    monkeypatch.setattr(sds_audit, "DICTIONARY_PAGE_LIMIT", 1)  # every batch past it
    strings, got = _messages_of(tmp_path, "strings", decoded, fig_path)
    assert got.equals(want) and want.num_rows == n
    for f in (coded, strings):
        src = pq.ParquetFile(f)
        assert src.schema_arrow == sds_audit.MESSAGES_SCHEMA
        again = tmp_path / f"again-{f.parent.name}.parquet"
        with pq.ParquetWriter(again, sds_audit.MESSAGES_SCHEMA, compression="zstd") as w:
            for i in range(src.num_row_groups):
                w.write_table(src.read_row_group(i))
        assert again.read_bytes() == f.read_bytes(), f


def test_the_dictionary_limit_is_the_writers():
    """``DICTIONARY_PAGE_LIMIT`` is where pyarrow's writer stops dictionary-encoding a column
    of strings: a dictionary just under it written as a dictionary is the file strings make,
    one just past it is not (which is why the task goes back to strings there)."""
    import base64
    import hashlib
    import io

    from loglake.sds import HISTORY_DICTIONARY, dictionary_reference

    plain = pa.schema([("h", pa.list_(pa.string()))])
    coded = pa.schema([("h", HISTORY_DICTIONARY)])

    def written(schema: pa.Schema, lists: pa.Array) -> bytes:
        buf = io.BytesIO()
        stored = schema == plain
        with pq.ParquetWriter(buf, schema, compression="zstd", store_schema=stored) as w:
            w.write_batch(pa.record_batch([lists], schema=schema))
            if not stored:
                form = base64.b64encode(plain.serialize().to_pybytes())
                w.add_key_value_metadata({b"ARROW:schema": form})
        return buf.getvalue()

    each = 4 + 64  # a 64-character id, PLAIN-encoded
    for count, same in (
        (sds_audit.DICTIONARY_PAGE_LIMIT // each - 50, True),
        (sds_audit.DICTIONARY_PAGE_LIMIT // each + 200, False),
    ):
        ids = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(count)]
        lists = pa.array([ids[i : i + 4] for i in range(0, count, 4)], pa.list_(pa.string()))
        as_dict = dictionary_reference(lists)
        size = sds_audit._dictionary_bytes(as_dict.values.dictionary)
        assert (size < sds_audit.DICTIONARY_PAGE_LIMIT) == same
        assert (written(coded, as_dict) == written(plain, lists)) == same, count
