"""The sds-audit decoder's batch kernel in C (``loglake.sds._decode``) on its own: what it
vouches for, that no bytes crash it, that ``causal_new`` is decided by entry bytes and carried
across batches, and that positions it did not make are refused. Its columns against the
per-record reference path on generated and hostile channels: ``test_columnar_batch.py``. The
sweep's id lookup (``id_table``/``id_lookup``) against ``index_in``, and refusing what it did
not make."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.sds import columnar
from loglake.sds.codec import (
    DEFAULT_LIMITS,
    TAG_CHANNEL_ID,
    TAG_CONTENT,
    TAG_LAMPORT,
    TAG_MESSAGE_ID,
    TAG_SENDER_ID,
    encode_history_entry,
)
from loglake.sds.columnar import DecodeState
from loglake.sds.messages import HistoryEntry, message_id_of
from loglake.wire.arrow_offsets import value_offsets
from loglake.wire.varint import encode_uleb
from tests.sds.records import (
    BLOOM,
    CHANNEL,
    STORED_HISTORY,
    ld,
    readable,
    sliding_window,
    window_id,
)

_decode = columnar._decode
# the install builds it where a C compiler is (setup.py; ``make test`` installs gcc first): a
# missing build skips these tests on a developer's machine and fails them under CI=true
pytestmark = pytest.mark.peer(
    "loglake.sds._decode (the decoder's C kernel)",
    _decode is not None,
    "a C compiler and Python's headers: apt-get install gcc python3-dev, then make test",
)

LIMITS = (
    DEFAULT_LIMITS.max_message_bytes,
    DEFAULT_LIMITS.max_id_chars,
    DEFAULT_LIMITS.max_hint_bytes,
    DEFAULT_LIMITS.max_content_bytes,
    DEFAULT_LIMITS.max_causal_history,
    DEFAULT_LIMITS.max_repair_request,
)


def _scan(records: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_decode.scan`` over ``records``: the per-record columns, entries and requests."""
    column = pa.array(records, pa.binary())
    bufs = column.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int32, count=len(records) + 1).astype(np.int64)
    data = bufs[2] if bufs[2] is not None else pa.py_buffer(b"")
    rec = np.zeros((len(records), _decode.R_FIELDS), dtype=np.int64)
    ents, reqs = _decode.scan(offs, data, CHANNEL.encode(), BLOOM, LIMITS, rec)
    return rec, np.frombuffer(ents, np.int64), np.frombuffer(reqs, np.int64)


def _batch(datas: list[bytes | None], first: int = 0) -> pa.RecordBatch:
    n = len(datas)
    return pa.RecordBatch.from_pydict(
        {
            "partition": pa.array([0] * n, pa.int32()),
            "index": pa.array(range(first, first + n), pa.int64()),
            "timestamp_ns": pa.array(range(first, first + n), pa.int64()),
            "data": pa.array(datas, pa.binary()),
        }
    )


GOOD = (
    ld(TAG_SENDER_ID, b"a")
    + ld(TAG_MESSAGE_ID, b"m")
    + ld(TAG_CHANNEL_ID, CHANNEL.encode())
    + TAG_LAMPORT
    + encode_uleb(7)
    + encode_history_entry(HistoryEntry("e1", b"h", "s"))
    + ld(TAG_CONTENT, b"x")
)


def test_the_kernel_vouches_only_for_records_made_of_the_schemas_fields():
    records = [
        GOOD,
        GOOD + b"\x78\x01",  # an unknown field
        GOOD + ld(TAG_MESSAGE_ID, b"n"),  # message_id twice: protobuf keeps the last
        GOOD + b"\x52\x01x",  # lamport_timestamp as length-delimited
        GOOD[:-1],  # truncated
        b"",
        b"\x0a\x81\x00a" + GOOD[3:],  # a non-minimal length: protobuf reads it, the kernel not
        GOOD + b"\x5a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # an 11-octet length
        ld(TAG_SENDER_ID, "é".encode()) + GOOD[3:],  # a non-ASCII id
        GOOD + encode_history_entry(HistoryEntry("")),  # an entry without an id
        GOOD + b"\x5a\x04\x0a\x01e\x20",  # an entry with an unknown field
        GOOD.replace(CHANNEL.encode(), b"moor"),  # another channel
        GOOD + b"\x50\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # lamport 2^63: rejected late
    ]
    rec, ents, _ = _scan(records)
    assert rec[:, 0].tolist() == [0] + [1] * (len(records) - 1)
    # the vouched record's one entry: its body and its id, where they lie in the buffer
    assert len(ents) == 4
    body_at, body_len, id_at, id_len = ents.tolist()
    assert (body_len, id_len, id_at - body_at) == (10, 2, 2)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=120), max_size=12))
def test_any_bytes_are_flagged_or_read_and_never_crash(records):
    rec, ents, reqs = _scan(records)
    assert rec.shape == (len(records), _decode.R_FIELDS)
    flagged = rec[:, 0] == 1
    assert (rec[flagged, 1:9] == 0).all()
    assert len(ents) % 4 == 0 and len(reqs) % 2 == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, len(GOOD) - 1), max_size=4),
    st.lists(st.integers(0, 255), min_size=4, max_size=4),
)
def test_a_record_with_octets_changed_is_read_as_the_reference_reads_it(where, octets):
    data = bytearray(GOOD)
    for at, b in zip(where, octets, strict=False):
        data[at] = b
    batch = _batch([bytes(data), GOOD])
    got = DecodeState(CHANNEL, BLOOM).decode(batch)
    want = DecodeState(CHANNEL, BLOOM, batched=False).decode(batch)
    for name in want.schema.names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name


def test_a_history_repeating_its_senders_earlier_record_is_one_compare_with_the_same_entries():
    """Three senders taking turns, 8-id windows: from a sender's second message with two ids to
    repeat, ``scan`` takes the entries its previous message holds from the first id on as one
    run of bytes (``R_RUN``: 2, 3, 4, then 5 once the window is full; the 3 ids sent since are
    walked), and finds the entries a walk of each record alone finds, where they lie."""
    datas = sliding_window(30, senders=3, keep=8)
    rec, ents, _ = _scan(datas)
    assert (rec[:, 0] == 0).all()
    assert rec[:, columnar._R_RUN].tolist() == [0] * 5 + [2, 3, 4] + [5] * 22
    offs = np.cumsum([0] + [len(d) for d in datas])
    ends = np.concatenate([[0], rec[:, columnar._R_HIST_END]])
    for r, d in enumerate(datas):
        alone_rec, alone, _ = _scan([d])
        assert alone_rec[0, columnar._R_RUN] == 0  # nothing earlier to take a run from
        mine = ents.reshape(-1, 4)[ends[r] : ends[r + 1]] - [offs[r], 0, offs[r], 0]
        assert mine.tolist() == alone.reshape(-1, 4).tolist()


@settings(max_examples=300, deadline=None)
@given(
    st.integers(4, 11),
    st.lists(st.integers(0, 10**6), max_size=4),
    st.lists(st.integers(0, 255), min_size=4, max_size=4),
)
def test_a_run_with_octets_changed_is_read_as_the_reference_reads_it(row, where, octets):
    """A record whose history would be a run of its sender's previous one, with octets changed
    anywhere (in the run's bytes, its entries' lengths, the fields after it): the kernel takes
    the run only while the bytes are the earlier record's, and reads every column as the
    reference does."""
    datas = sliding_window(12, senders=2, keep=6, hint=True)
    data = bytearray(datas[row])
    for at, b in zip(where, octets, strict=False):
        data[at % len(data)] = b
    datas[row] = bytes(data)
    batch = _batch(datas)
    got = DecodeState(CHANNEL, BLOOM).decode(batch)
    want = DecodeState(CHANNEL, BLOOM, batched=False).decode(batch)
    assert readable([got]) == readable([want])


def test_a_runs_entries_count_against_the_histories_limit():
    """Entries taken as a run count as walked ones: with the limit one below the window every
    full record is flagged, run or not; at the window none is."""
    datas = sliding_window(20, senders=2, keep=6)
    column = pa.array(datas, pa.binary())
    offs = np.frombuffer(column.buffers()[1], np.int32, count=len(datas) + 1).astype(np.int64)
    for most, flagged in ((6, [0] * 20), (5, [0] * 6 + [1] * 14)):
        limits = (*LIMITS[:4], most, LIMITS[5])
        rec = np.zeros((len(datas), _decode.R_FIELDS), dtype=np.int64)
        _decode.scan(offs, column.buffers()[2], CHANNEL.encode(), BLOOM, limits, rec)
        assert rec[:, 0].tolist() == flagged


def _causal_of(records: list[bytes], hints: np.ndarray | str | None = "scan"):
    """``_decode.causal`` of ``records`` scanned as one batch (a fresh state), handed scan's
    runs (``"scan"``), ``hints`` or none: the new-entry octets and the runs it writes."""
    rec, ents, _ = _scan(records)
    column = pa.array(records, pa.binary())
    n = len(records)
    sender = np.ascontiguousarray(rec[:, [1, 2]])  # R_SENDER_AT, R_SENDER_LEN
    ends = np.concatenate(([0], rec[:, columnar._R_HIST_END])).astype(np.int64)
    ok = (rec[:, 0] == 0).astype(np.uint8)
    runs = np.zeros((n, 3), dtype=np.int32)
    args = [{}, column.buffers()[2], b"", ok, sender, np.arange(n, dtype=np.int64), ends]
    args += [ents.reshape(-1, 4), runs]
    if isinstance(hints, str):
        hints = rec[:, [columnar._R_RUN_ROW, columnar._R_RUN_FROM, columnar._R_RUN]]
    if hints is not None:
        args.append(np.ascontiguousarray(hints, dtype=np.int64))
    return bytes(_decode.causal(*args)), runs.tolist()


def test_causal_takes_the_runs_scan_found_and_finds_what_it_finds_alone():
    """scan's runs (``R_RUN_ROW``, ``R_RUN_FROM``, ``R_RUN``) handed to causal spare it
    comparing them again; its answer is the one it finds by itself. Hints that are not a run
    of the row's previous message (another row, past its entries, too short) are not taken;
    hints of another length are refused."""
    datas = sliding_window(30, senders=3, keep=8, hint=True)
    alone = _causal_of(datas, None)
    assert alone[1][12] == [3, 3, 5]  # a run: 3 rows back, from its 4th entry, 5 entries
    assert _causal_of(datas) == alone
    rec, _, _ = _scan(datas)
    good = rec[:, [columnar._R_RUN_ROW, columnar._R_RUN_FROM, columnar._R_RUN]]
    shifts = np.eye(3, dtype=np.int64)  # the row, the first entry, the length one off
    for bad in (good + shifts[0], good + shifts[1], good + shifts[2], good * (1 - shifts[2]) + 1):
        assert _causal_of(datas, bad) == alone
    with pytest.raises(ValueError, match="unequal lengths"):
        _causal_of(datas, good[:-1])


@pytest.mark.parametrize("cut", range(1, 12, 2))
def test_causal_new_is_carried_across_batches_by_the_kernel_alone(cut):
    """A sliding window of 3 senders cut anywhere: ``causal_new`` equals the reference's, and
    no record went through the per-record path (the kernel's state carried it)."""
    datas = sliding_window(24, senders=3, keep=5, hint=True)
    fast = DecodeState(CHANNEL, BLOOM)
    slow = DecodeState(CHANNEL, BLOOM, batched=False)
    bounds = [0, *range(cut, 24, cut + 3), 24]
    news = []
    for a, b in itertools.pairwise(bounds):
        batch = _batch(datas[a:b], a)
        got, want = fast.decode(batch), slow.decode(batch)
        assert got.column("causal_new").to_pylist() == want.column("causal_new").to_pylist()
        news += got.column("causal_new").to_pylist()
    assert fast.fast + fast.whole == 0  # every history read by the kernel
    # a sender's second message onwards: only what the others sent since is new
    assert news[6] == [window_id(3), window_id(4), window_id(5)]
    assert len(fast.senders) == 3


def test_entries_of_equal_hash_are_told_apart_by_their_bytes():
    """Two entry bodies equal in the octets the kernel's hash samples (its first, last and
    two middle words) but not elsewhere: the second message's entry is new to its sender."""
    a = "x" * 10 + "A" + "x" * 53
    b = "x" * 10 + "B" + "x" * 53
    first, second = (
        ld(TAG_SENDER_ID, b"s")
        + ld(TAG_MESSAGE_ID, m)
        + ld(TAG_CHANNEL_ID, CHANNEL.encode())
        + TAG_LAMPORT
        + encode_uleb(k)
        + encode_history_entry(HistoryEntry(e))
        for k, (m, e) in enumerate(((b"m1", a), (b"m2", b)), 1)
    )
    for cuts in ([first, second],), ([first], [second]):
        state = DecodeState(CHANNEL, BLOOM)
        got = [state.decode(_batch(part, i)) for i, part in enumerate(cuts)]
        news = [x for g in got for x in g.column("causal_new").to_pylist()]
        assert news == [[a], [b]]


def test_positions_and_state_it_did_not_make_are_refused():
    data = pa.py_buffer(b"abcdef")
    with pytest.raises(ValueError, match="outside"):
        _decode.gather(data, b"", np.array([4], np.int64), np.array([5], np.int64))
    with pytest.raises(ValueError, match="outside"):
        _decode.gather(data, b"xy", np.array([5], np.int64), np.array([2], np.int64))
    assert _decode.gather(data, b"xy", np.array([1, 6], np.int64), np.array([2, 2], np.int64))
    one = np.ones(1, np.uint8)
    sender = np.array([[0, 1]], np.int64)
    ends = np.array([0, 0], np.int64)
    no_entries = np.zeros((0, 4), np.int64)
    index = np.array([5], np.int64)
    runs = np.zeros((1, 3), np.int32)
    for bad in (b"", b"\x00" * 15, b"\x00" * 8 + b"\xff" * 8, 7):
        with pytest.raises(ValueError, match="state"):
            _decode.causal({b"a": bad}, data, b"", one, sender, index, ends, no_entries, runs)
    with pytest.raises(ValueError, match="unequal"):
        _decode.causal({}, data, b"", one, sender, index[:0], ends, no_entries, runs)
    for short in (np.zeros((1, 2), np.int32), np.zeros(3, np.int64)):  # runs: 3 int32 a row
        with pytest.raises(ValueError, match="unequal"):
            _decode.causal({}, data, b"", one, sender, index, ends, no_entries, short)
    with pytest.raises(TypeError):  # written: a read-only buffer is refused
        _decode.causal({}, data, b"", one, sender, index, ends, no_entries, bytes(12))
    with pytest.raises(ValueError, match="cover"):
        _decode.causal(
            {}, data, b"", one, sender, index, np.array([0, 1], np.int64), no_entries, runs
        )
    with pytest.raises(ValueError, match="outside"):
        _decode.lists(data, b"", np.array([[9, 1]], np.int64), 2, np.array([0, 1]), one, b"")


def test_a_large_binary_column_with_nulls_is_read_as_the_reference_reads_it():
    datas = [*sliding_window(6, senders=2, keep=3), None, b""]
    batch = _batch(datas)
    large = batch.set_column(3, "data", batch.column("data").cast(pa.large_binary()))
    want = DecodeState(CHANNEL, BLOOM, batched=False).decode(batch)
    got = DecodeState(CHANNEL, BLOOM).decode(large)
    for name in want.schema.names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name


def _lists_of(records: list[bytes], alloc=None):
    """``_decode.lists`` of ``records``' history ids (all kept), with ``alloc`` or bytes."""
    rec, ents, _ = _scan(records)
    column = pa.array(records, pa.binary())
    data = column.buffers()[2] if column.buffers()[2] is not None else pa.py_buffer(b"")
    ends = np.concatenate(([0], rec[:, 9])).astype(np.int64)  # R_HIST_END
    ok = (rec[:, 0] == 0).astype(np.uint8)
    args = (data, b"", ents.reshape(-1, 4), 4, ends, ok, b"")
    return _decode.lists(*args, alloc) if alloc else _decode.lists(*args)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 40), st.integers(1, 5), st.integers(0, 30), st.integers(0, 3))
def test_outputs_in_the_callers_buffers_are_the_bytes_outputs(n, senders, keep, cut):
    """scan and lists write into ``alloc``'s buffers (the job passes the Arrow pool's) the
    octets they return as bytes without it; scan's arrays kept from the call before (a
    larger batch) leave nothing of that batch in the next one's answer."""
    records = [*sliding_window(n, senders=senders, keep=keep)]
    small = records[: max(1, n // (cut + 1))]
    before = _decode.scan(*_scan_args(small))
    _decode.scan(*_scan_args(records), pa.allocate_buffer)  # a larger batch first
    for alloc in (None, pa.allocate_buffer):
        args = _scan_args(small)
        got = _decode.scan(*args, alloc) if alloc else _decode.scan(*args)
        assert [bytes(x) for x in got] == [bytes(x) for x in before]
        if alloc:
            assert all(isinstance(x, pa.Buffer) for x in got)
    want = _lists_of(records)
    got = _lists_of(records, pa.allocate_buffer)
    assert [bytes(x) for x in got] == [bytes(x) for x in want]
    assert all(isinstance(x, pa.Buffer) for x in got)


def _scan_args(records: list[bytes]) -> tuple:
    column = pa.array(records, pa.binary())
    bufs = column.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int32, count=len(records) + 1).astype(np.int64)
    data = bufs[2] if bufs[2] is not None else pa.py_buffer(b"")
    rec = np.zeros((len(records), _decode.R_FIELDS), dtype=np.int64)
    return offs, data, CHANNEL.encode(), BLOOM, LIMITS, rec


def test_an_allocator_that_fails_or_falls_short_is_an_error_and_the_kernel_goes_on():
    records = [*sliding_window(6, senders=2, keep=3)]

    def boom(n):
        raise MemoryError("no room")

    short = lambda n: pa.allocate_buffer(max(0, n - 1))  # noqa: E731
    frozen = lambda n: bytes(n)  # noqa: E731 - read-only: not a buffer to write into
    for bad, err in ((boom, MemoryError), (short, ValueError), (frozen, BufferError)):
        with pytest.raises(err):
            _decode.scan(*_scan_args(records), bad)
        with pytest.raises(err):
            _lists_of(records, bad)
    want = _decode.scan(*_scan_args(records))
    got = _decode.scan(*_scan_args(records), pa.allocate_buffer)
    assert [bytes(x) for x in got] == [bytes(x) for x in want]


def _from_s(k: int, ids: list[str], between: bytes = b"") -> bytes:
    """Sender s's message k whose history is ``ids`` (hint ``h``), ``between`` after the first."""
    entries = [encode_history_entry(HistoryEntry(i, b"h", "p")) for i in ids]
    content = b"x%d" % k
    head = ld(TAG_SENDER_ID, b"s") + ld(TAG_MESSAGE_ID, message_id_of(content).encode())
    head += ld(TAG_CHANNEL_ID, CHANNEL.encode()) + TAG_LAMPORT + encode_uleb(k)
    return head + entries[0] + between + b"".join(entries[1:]) + ld(TAG_CONTENT, content)


REQUEST = b"\x6a" + encode_history_entry(HistoryEntry("r"))[1:]  # a repair request's entry


@pytest.mark.parametrize(
    ("second", "between", "new", "run"),
    [
        (["id1", "id2", "id3", "id9"], b"", ["id9"], (1, 1, 3)),  # the window slid: a run, a new id
        (["id1", "idX", "id3", "id9"], b"", ["idX", "id9"], (0, 0, 0)),  # one id's bytes not
        (["id3", "id2", "id1"], b"", [], (0, 0, 0)),  # the same ids in another order
        (["id1", "id2", "id3"], REQUEST, [], (0, 0, 0)),
        (["id0", "id1"], b"", [], (1, 0, 2)),  # the previous message's first ids
    ],  # the fourth: a repair request between two entries (not laid out as before)
)
def test_causal_new_from_a_run_of_the_previous_messages_entries_is_exact(second, between, new, run):
    """The kernel compares a row's leading entries with its sender's previous message as one run
    of bytes when they are laid out alike (``same_run``); whatever the layout, causal_new is the
    reference's: the ids not in the previous message. The run is also how the history is
    stored (``history_back``, ``history_from``, ``history_run``: only the ids after it are
    kept), and the history read back is the reference's."""
    first = _from_s(1, ["id0", "id1", "id2", "id3"])
    records = [first, _from_s(2, second, between)]
    got = DecodeState(CHANNEL, BLOOM).decode(_batch(records))
    want = DecodeState(CHANNEL, BLOOM, batched=False).decode(_batch(records))
    assert got.column("causal_new").to_pylist() == want.column("causal_new").to_pylist()
    assert got.column("causal_new").to_pylist()[1] == new
    stored = tuple(got.column(c)[1].as_py() for c in STORED_HISTORY[1:])
    assert stored == run
    assert len(got.column("history_stored")[1].as_py()) == len(second) - run[2]
    assert readable([got]) == readable([want])
    assert readable([got])[1]["causal_history"] == second


IDS = st.text(alphabet="ab\u00e9c", max_size=9)


@settings(max_examples=300, deadline=None)
@given(st.lists(IDS, max_size=40), st.lists(IDS, max_size=60), st.integers(0, 3), st.data())
def test_id_lookup_gives_what_index_in_gives(ids, values, cut, data):
    """Repeated ids in the set (the first position wins), empty and non-ASCII ids, values
    sliced past offset 0, any ranges: the kernel's positions are ``index_in``'s."""
    index = columnar.IdIndex(pa.array(ids, pa.string()))
    assert index._slots is not None  # the kernel's table, not the reference
    vals = pa.array(values, pa.string()).slice(min(cut, len(values)))
    n = len(vals)
    bounds = st.tuples(st.integers(0, n), st.integers(0, n)).map(sorted)
    ranges = data.draw(st.lists(bounds, max_size=6))
    starts = np.array([a for a, _ in ranges], dtype=np.int64)
    ends = np.array([b for _, b in ranges], dtype=np.int64)
    parts = [(vals, starts, ends), (vals, ends[:0], ends[:0])]
    assert index.positions(parts).tolist() == index.reference(parts).tolist()


def test_id_lookup_tells_ids_of_one_hash_slot_apart_by_their_bytes():
    """A set larger than a few slots: many ids share a probe run; each is found at its own
    position and an id of the same length not in the set is not found."""
    ids = pa.array([f"{i:064x}" for i in range(5000)])
    index = columnar.IdIndex(ids)
    vals = pa.array([f"{i:064x}" for i in range(0, 10000, 3)])
    parts = [(vals, np.array([0]), np.array([len(vals)]))]
    got = index.positions(parts)
    assert got.tolist() == [i if i < 5000 else -1 for i in range(0, 10000, 3)]


def test_id_lookup_refuses_tables_ranges_parts_and_outputs_it_did_not_make():
    """Slots of another table (or with no empty slot), ranges past the values, parts that are
    not (offsets, data, starts, ends) or whose offsets leave their data, an output of another
    length: a ValueError each (a TypeError for what is not even a buffer), never a read outside
    the buffers or an endless probe."""
    ids = pa.array(["a", "b"])
    index = columnar.IdIndex(ids)
    vals = pa.array(["a", "c"])
    offs, data = value_offsets(vals), vals.buffers()[2]

    def part(starts: list[int], ends: list[int]) -> tuple:
        return (offs, data, np.array(starts, np.int64), np.array(ends, np.int64))

    def lookup(slots: object, parts: object, out: int) -> np.ndarray:
        got = np.zeros(out, np.int64)
        _decode.id_lookup(slots, index._offs, index._data, parts, got)
        return got

    assert lookup(index._slots, [part([0], [2]), part([1], [2])], 3).tolist() == [0, -1, -1]
    assert lookup(index._slots, [], 0).tolist() == []
    bad_slots = index._slots.copy()
    bad_slots[0] = 7  # not an id of the table
    with pytest.raises(ValueError):
        lookup(bad_slots, [part([0], [2])], 2)
    full = np.zeros_like(index._slots)  # every slot taken: a miss ("c") would probe forever
    with pytest.raises(ValueError, match="none empty"):
        lookup(full, [part([0], [2])], 2)
    with pytest.raises(ValueError):
        lookup(index._slots, [part([0], [2]), part([0], [3])], 5)  # past the values
    with pytest.raises(ValueError):
        lookup(index._slots, [part([1], [0])], 0)  # a range backwards
    with pytest.raises(ValueError):
        lookup(index._slots, [part([0], [2])], 1)  # an output too short
    with pytest.raises(ValueError):
        lookup(index._slots, [part([0], [2])[:3]], 2)  # not four things
    with pytest.raises(ValueError):
        lookup(index._slots, [list(part([0], [2]))], 2)  # not a tuple
    with pytest.raises(ValueError):
        lookup(index._slots, [(offs, data[:1], *part([0], [2])[2:])], 2)  # offsets past data
    with pytest.raises(ValueError):
        lookup(index._slots, [(offs, data, b"\0" * 8, b"\2" * 8)], 2)  # bytes, not int64
    with pytest.raises(TypeError):
        lookup(index._slots, [(offs, data, None, None)], 2)
    with pytest.raises(TypeError):
        lookup(index._slots, 7, 2)  # parts not a sequence
    with pytest.raises(ValueError):
        _decode.id_table(index._offs, index._data, np.zeros(2, np.int32))  # too few slots


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(st.one_of(st.none(), IDS), max_size=30), max_size=4),
    st.integers(0, 3),
    st.data(),
)
def test_first_rows_are_each_ids_first_row(chunks, cut, data):
    """Chunks of any length (empty ones, slices past offset 0), repeated, empty and non-ASCII
    ids, null ids (their own row), few or many repeats (the sorted hashes, or one table of
    all): each row's first row of its id, what a dict of first appearances gives and what
    ``first_rows_reference`` (one ``IdIndex``) gives."""
    arrays = [pa.array(c, pa.string()).slice(min(cut, len(c))) for c in chunks]
    ids = pa.chunked_array(arrays, pa.string())
    if data.draw(st.booleans()) and len(arrays) == 1:
        ids = arrays[0]  # an array, not a chunked one
    flat = ids.to_pylist()
    seen: dict[str, int] = {}
    want = [i if v is None else seen.setdefault(v, i) for i, v in enumerate(flat)]
    assert columnar.first_rows(ids).tolist() == want
    assert columnar.first_rows_reference(ids).tolist() == want


def test_first_rows_tells_ids_of_one_hash_apart_by_their_bytes(monkeypatch):
    """Ids whose 64-bit hashes are equal (the first eight here, the kernel's hash replaced:
    three ids, one of them repeated, and two distinct) are told apart by their bytes: a hash
    shared is a candidate, not a repeat."""
    real = _decode

    class SameHash:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        @staticmethod
        def id_hashes(offs: object, data: object, out: np.ndarray) -> None:
            out[:] = np.arange(len(out), dtype=np.uint64) + 100
            out[:8] = 7

    monkeypatch.setattr(columnar, "_decode", SameHash())
    ids = pa.array([f"{i % 3:064x}" if i < 6 else f"{i:064x}" for i in range(40)])
    want = [i % 3 if i < 6 else i for i in range(40)]
    monkeypatch.setattr(columnar, "first_rows_reference", None)  # not this way
    assert columnar.first_rows(ids).tolist() == want


def test_id_hashes_refuses_offsets_and_outputs_it_did_not_make():
    """Offsets past the data or backwards, an output of another length: a ValueError."""
    vals = pa.array(["a", "bc"])
    offs, data = value_offsets(vals), vals.buffers()[2]
    out = np.zeros(2, np.uint64)
    _decode.id_hashes(offs, data, out)
    assert out[0] != out[1]
    odd = bytearray(17)  # an output at an odd address (found by review: an unaligned store)
    _decode.id_hashes(offs, data, memoryview(odd)[1:])
    assert np.frombuffer(bytes(odd[1:]), np.uint64).tolist() == out.tolist()
    with pytest.raises(ValueError):
        _decode.id_hashes(offs, data[:1], out)
    with pytest.raises(ValueError):
        _decode.id_hashes(offs, data, np.zeros(3, np.uint64))
    with pytest.raises(ValueError):
        _decode.id_hashes(np.array([0, 2, 1], np.int32), data, out)
    with pytest.raises(ValueError):
        _decode.id_hashes(b"", data, np.zeros(0, np.uint64))


def _stored(
    lists: list[list[str] | None], runs: list[tuple[int, int, int]], scrambled: bool = False
) -> pa.RecordBatch:
    """A batch of the decoded rows' history columns: ``lists`` stored, with ``runs``; its
    dictionary in order of first appearance (the decoder's), or ``scrambled``: reversed,
    with an id no row holds (as a filter or a slice of a batch leaves it)."""
    stored = columnar.dictionary_reference(pa.array(lists, pa.list_(pa.string())))
    if scrambled:
        items = stored.values
        n = len(items.dictionary)
        ids = pa.concat_arrays([items.dictionary[::-1], pa.array(["unused"])])
        at = pa.array((n - 1 - items.indices.to_numpy()).astype(np.int32))
        stored = pa.ListArray.from_arrays(
            stored.offsets, pa.DictionaryArray.from_arrays(at, ids), mask=stored.is_null()
        )
    cols = [stored, *(pa.array([r[i] for r in runs], pa.int32()) for i in range(3))]
    return pa.RecordBatch.from_arrays(cols, names=list(STORED_HISTORY))


def _strings(stored: pa.Array) -> pa.ListArray:
    """``history_stored`` as list<string>."""
    return stored.cast(pa.list_(pa.string()))


@st.composite
def histories_with_runs(draw):
    """Whole histories built row by row, a row's starting with a run of an earlier valid row's
    (as the decoder finds them), and what is stored of each: (whole, stored, runs)."""
    whole: list[list[str] | None] = []
    stored: list[list[str] | None] = []
    runs: list[tuple[int, int, int]] = []
    for r in range(draw(st.integers(0, 12))):
        if draw(st.integers(0, 5)) == 0:
            whole.append(None)
            stored.append(None)
            runs.append((0, 0, 0))
            continue
        own = draw(st.lists(IDS, max_size=5))
        bases = [p for p in range(r) if whole[p]]
        run = (0, 0, 0)
        if bases and draw(st.booleans()):
            p = draw(st.sampled_from(bases))
            base = whole[p]
            assert base is not None
            f = draw(st.integers(0, len(base) - 1))
            k = draw(st.integers(1, len(base) - f))
            run = (r - p, f, k)
            whole.append(base[f : f + k] + own)
        else:
            whole.append(own)
        stored.append(own)
        runs.append(run)
    return whole, stored, runs


@settings(max_examples=300, deadline=None)
@given(histories_with_runs(), st.integers(0, 12), st.booleans())
def test_unpack_rebuilds_the_histories_the_runs_were_cut_from(case, cut, scrambled):
    """``history_lists`` (``_decode.unpack``) gives each row's whole history back, as built;
    so does the Python reference; and a prefix of the batch reads as the prefix. Also from a
    dictionary out of the order of first appearance, with an id no row holds."""
    whole, stored, runs = case
    batch = _stored(stored, runs, scrambled)
    assert columnar.history_lists(batch).to_pylist() == whole
    stored_lists = _strings(batch.column(0))
    cols = [np.array([r[i] for r in runs], np.int32) for i in range(3)]
    assert columnar.unpacked_reference(stored_lists, *cols).to_pylist() == whole
    assert columnar.history_lists(batch.slice(0, cut)).to_pylist() == whole[:cut]
    _assert_dictionary_is_the_writers(batch, whole)
    _assert_dictionary_is_the_writers(batch.slice(0, cut), whole[:cut])


def _assert_dictionary_is_the_writers(batch: pa.RecordBatch, whole: list) -> None:
    """``history_dictionary`` (``_decode.unpack_codes``) holds the histories, with the
    dictionary Parquet's writer builds from them: every entry hashed, first appearance first
    (``dictionary_reference``), the same codes and the same dictionary in the same order."""
    got = columnar.history_dictionary(batch)
    assert got.type == columnar.HISTORY_DICTIONARY
    assert got.to_pylist() == whole
    want = columnar.dictionary_reference(columnar.history_lists(batch))
    assert got.equals(want)
    assert got.values.dictionary.equals(want.values.dictionary)


RUN = st.tuples(st.integers(-2, 4), st.integers(-1, 4), st.integers(-1, 4))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(IDS, max_size=3)), max_size=6), st.data())
def test_unpack_refuses_runs_the_reference_refuses(lists, data):
    """Any runs at all, most of them impossible (no base, a null base, past its end, on a
    null row, negative): the kernel raises ValueError exactly where the reference does, and
    otherwise gives what it gives."""
    runs = data.draw(st.lists(RUN, min_size=len(lists), max_size=len(lists)))
    batch = _stored(lists, runs, data.draw(st.booleans()))
    stored = _strings(batch.column(0))
    cols = [np.array([r[i] for r in runs], np.int32) for i in range(3)]
    try:
        want = columnar.unpacked_reference(stored, *cols).to_pylist()
    except ValueError:
        want = None
    if want is None:
        with pytest.raises(ValueError):
            columnar.history_lists(batch)
        with pytest.raises(ValueError):
            columnar.history_dictionary(batch)
    else:
        assert columnar.history_lists(batch).to_pylist() == want
        _assert_dictionary_is_the_writers(batch, want)


def test_unpack_refuses_buffers_it_did_not_make():
    offs = np.array([0, 2, 3], np.int32)
    loffs = np.array([0, 1, 2], np.int32)
    ok = np.ones(2, np.uint8)
    zero = np.zeros(2, np.int32)
    back, start, run = np.array([0, 1], np.int32), zero, np.array([0, 1], np.int32)
    values, voffs, lists = _decode.unpack(offs, b"abc", loffs, ok, back, start, run)
    assert bytes(values) == b"ababc"  # ["ab"], then the first row's "ab" and its own "c"
    assert np.frombuffer(voffs, np.int32).tolist() == [0, 2, 4, 5]
    assert np.frombuffer(lists, np.int32).tolist() == [0, 1, 3]
    for bad in (
        (np.array([0, 2, 9], np.int32), b"abc", loffs, ok, back, start, run),  # past data
        (np.array([0, 2, 1], np.int32), b"abc", loffs, ok, back, start, run),  # decreasing
        (offs, b"abc", np.array([0, 2, 1], np.int32), ok, back, start, run),
        (offs, b"abc", np.array([0, 1, 5], np.int32), ok, back, start, run),  # past the ids
        (offs, b"abc", loffs, ok, np.array([0, 2], np.int32), start, run),  # base before 0
        (offs, b"abc", loffs, ok, zero, start, run),  # a run with no base
        (offs, b"abc", loffs, ok, back, np.array([0, 1], np.int32), run),  # past its base
        (offs, b"abc", loffs, np.array([0, 1], np.uint8), back, start, run),  # a null base
    ):
        with pytest.raises(ValueError):
            _decode.unpack(*bad)
    with pytest.raises(ValueError, match="not int32s"):
        _decode.unpack(b"\0" * 5, b"abc", loffs, ok, back, start, run)
    with pytest.raises(ValueError, match="another length"):
        _decode.unpack(offs, b"abc", loffs[:2], ok, back, start, run)
    with pytest.raises(ValueError, match="another length"):
        _decode.unpack(offs, b"abc", loffs, ok, back[:1], start, run)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, 45), st.booleans()), min_size=1, max_size=12
    ),
    st.randoms(use_true_random=False),
)
def test_lists_takes_each_rows_entries_past_its_skip_and_those_keep_marks(rows, rnd):
    """``_decode.lists`` with ``skip`` (``history_stored``: each row's entries past its
    run) and ``keep`` (causal_new), alone and together, against a plain reading of the same
    spans; runs of kept entries longer than a word, and none, included."""
    counts = [c for c, _, _ in rows]
    skip = np.array([min(k, c) for c, k, _ in rows], dtype=np.int32)
    ok = np.array([o for _, _, o in rows], dtype=np.uint8)
    ends = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    m = int(ends[-1])
    data = bytes(rnd.randrange(97, 123) for _ in range(3 * m + 1))
    spans = np.array([[3 * j, rnd.randrange(0, 4)] for j in range(m)], dtype=np.int64)
    spans = spans.reshape(m, 2)
    keep = bytes(rnd.choice((0, 1, 1)) if rnd.random() < 0.5 else 0 for _ in range(m))
    buf = pa.py_buffer(data)

    def want(use_skip: bool, use_keep: bool) -> list[list[bytes] | None]:
        out: list[list[bytes] | None] = []
        for r in range(len(rows)):
            start = int(ends[r]) + (int(skip[r]) if use_skip else 0)
            ids = [
                data[int(a) : int(a) + int(n)]
                for j, (a, n) in enumerate(spans[start : ends[r + 1]].tolist(), start)
                if not use_keep or keep[j]
            ]
            out.append(ids if ok[r] else None)
        return out

    for use_skip, use_keep in ((True, False), (False, True), (True, True)):
        args = [buf, b"", spans, 2, ends, ok.tobytes(), keep if use_keep else b""]
        values, voffs, loffs, _ = _decode.lists(*args, None, skip if use_skip else b"")
        vo = np.frombuffer(voffs, np.int32)
        lo = np.frombuffer(loffs, np.int32)
        got = [
            [bytes(values)[vo[i] : vo[i + 1]] for i in range(lo[r], lo[r + 1])] if ok[r] else None
            for r in range(len(rows))
        ]
        assert got == want(use_skip, use_keep), (use_skip, use_keep)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 40), st.booleans()), min_size=1, max_size=12),
    st.integers(1, 6),
    st.randoms(use_true_random=False),
)
def test_list_codes_are_the_kept_ids_first_appearances(rows, alphabet, rnd):
    """``_decode.list_codes`` (the decoder's ``causal_new``): the ids ``lists`` keeps, as
    codes into their distinct values in order of first appearance (a dict's), with the same
    row offsets; few distinct ids (many repeats) and many, empty ids, ids that hash alike but
    differ, with and without ``keep``."""
    counts = [c for c, _ in rows]
    ok = np.array([o for _, o in rows], dtype=np.uint8)
    ends = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    m = int(ends[-1])
    data = bytes(rnd.randrange(97, 97 + alphabet) for _ in range(3 * m + 1))
    spans = np.array([[3 * j, rnd.randrange(0, 4)] for j in range(m)], dtype=np.int64)
    spans = spans.reshape(m, 2)
    keep = bytes(rnd.choice((0, 1, 1)) for _ in range(m))
    buf = pa.py_buffer(data)
    for kept in (keep, b""):
        args = [buf, b"", spans, 2, ends, ok.tobytes(), kept]
        values, voffs, loffs, _ = _decode.lists(*args, None)
        vo, lo = np.frombuffer(voffs, np.int32), np.frombuffer(loffs, np.int32)
        want = [
            [bytes(values)[vo[i] : vo[i + 1]] for i in range(lo[r], lo[r + 1])] if ok[r] else []
            for r in range(len(rows))
        ]
        first = list(dict.fromkeys(x for r in want for x in r))
        d_vals, d_offs, codes, c_loffs, distinct, used = _decode.list_codes(*args, None)
        do = np.frombuffer(d_offs, np.int32)
        ids = [bytes(d_vals)[do[i] : do[i + 1]] for i in range(distinct)]
        assert ids == first and used == do[distinct]
        co, clo = np.frombuffer(codes, np.int32), np.frombuffer(c_loffs, np.int32)
        assert clo.tolist() == lo.tolist()
        assert [ids[c] for c in co.tolist()] == [x for r in want for x in r]


def test_list_codes_refuses_what_lists_refuses():
    """Spans past the buffers, ends out of order, arrays of other lengths: a ValueError each,
    named for list_codes."""
    data = pa.py_buffer(b"abcdef")
    spans = np.array([[0, 1], [1, 1], [2, 1]], dtype=np.int64)
    ends = np.array([0, 2, 3], dtype=np.int64)
    ok = b"\x01\x01"
    assert _decode.list_codes(data, b"", spans, 2, ends, ok, b"")[4] == 3
    with pytest.raises(ValueError, match="list_codes: a span outside"):
        _decode.list_codes(data, b"", np.array([[0, 1], [5, 2], [2, 1]]), 2, ends, ok, b"")
    with pytest.raises(ValueError, match="list_codes: a span outside"):
        _decode.list_codes(data, b"", spans, 2, np.array([0, 3, 2], np.int64), ok, b"")
    with pytest.raises(ValueError, match="list_codes: keep of another length"):
        _decode.list_codes(data, b"", spans, 2, ends, ok, b"\x01")
    with pytest.raises(ValueError, match="list_codes: arrays of unequal lengths"):
        _decode.list_codes(data, b"", spans, 2, ends[:2], ok, b"")


def test_lists_and_list_codes_refuse_a_width_past_the_buffers():
    """A width whose octets overflow (found by review: 2^61 killed the process, 2^61 + 1 read
    before the spans): a ValueError, as for any width the spans do not hold."""
    spans, ends = np.zeros((2, 2), np.int64), np.array([0, 1], np.int64)
    for fn in (_decode.lists, _decode.list_codes):
        for width in (2**61, 2**61 + 1, 2**62, 2**63 - 1, 3):
            with pytest.raises(ValueError, match="unequal lengths"):
                fn(b"abcd", b"", spans, width, ends, b"\x01", b"")


def _alike_ids(n: int) -> list[str]:
    """``n`` 64-character ids that differ only in their middle octets (9 to 20): a hash of a
    few words of each gave them all one slot (found by review)."""
    import hashlib

    base = hashlib.sha256(b"x").hexdigest()
    return [f"{base[:9]}{i:012x}{base[21:]}" for i in range(n)]


def test_ids_chosen_alike_take_no_longer_than_random_ones():
    """Bounded attack: 40,000 ids a member chose to differ only where a sampling hash does not
    look, through list_codes, against as many random ones: about as fast (a walk of every
    equal-slot id per probe took 2 s where random ids took 5 ms)."""
    import hashlib
    import time

    def timed(ids: list[str]) -> float:
        data = "".join(ids).encode()
        spans = np.array([[64 * i, 64] for i in range(len(ids))], np.int64)
        ends = np.arange(0, len(ids) + 1, 200, dtype=np.int64)
        t = time.perf_counter()
        out = _decode.list_codes(data, b"", spans, 2, ends, b"\x01" * (len(ends) - 1), b"")
        assert out[4] == len(ids)  # every id distinct
        return time.perf_counter() - t

    random_ids = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(40_000)]
    base = min(timed(random_ids) for _ in range(3))
    assert min(timed(_alike_ids(40_000)) for _ in range(3)) < 10 * base + 0.05


def test_histories_of_entries_chosen_alike_decode_in_bounded_time():
    """Bounded attack through the whole decoder: one sender's records of 1,000 history entries
    each, every entry new (so causal's table holds the previous record's 1,000), their ids
    chosen alike; the decode finishes about as fast as for random ids."""
    import hashlib
    import time

    def timed(make: object) -> float:
        records = [_from_s(k + 1, make(k)) for k in range(20)]  # type: ignore[operator]
        batch = _batch(records)
        t = time.perf_counter()
        got = DecodeState(CHANNEL, BLOOM).decode(batch)
        assert got.column("ok").to_pylist() == [True] * 20
        return time.perf_counter() - t

    alike = _alike_ids(20_000)
    crafted = min(timed(lambda k: alike[1000 * k : 1000 * (k + 1)]) for _ in range(2))

    def random_ids(k: int) -> list[str]:
        return [hashlib.sha256(b"%d-%d" % (k, i)).hexdigest() for i in range(1000)]

    base = min(timed(random_ids) for _ in range(2))
    assert crafted < 10 * base + 0.2


def test_lists_refuses_a_skip_past_its_row_or_of_another_length():
    data = pa.py_buffer(b"abcdef")
    spans = np.array([[0, 1], [1, 1], [2, 1]], dtype=np.int64)
    ends = np.array([0, 2, 3], dtype=np.int64)
    ok = b"\x01\x01"
    for bad in (np.array([3, 0], np.int32), np.array([-1, 0], np.int32)):
        with pytest.raises(ValueError, match=r"outside|order"):
            _decode.lists(data, b"", spans, 2, ends, ok, b"", None, bad)
    with pytest.raises(ValueError, match="skip of another length"):
        _decode.lists(data, b"", spans, 2, ends, ok, b"", None, np.array([0], np.int32))


def test_the_id_check_hashes_contents_of_every_length_as_hashlib_does():
    """The kernel's SHA-256 (``id_of_content``) against ``hashlib``'s, around every block
    boundary (55/56 octets: the length's room in the last block) and over many blocks: a
    content message under its content's id is vouched for, under any other flagged (the
    reference path then names it ``bad-message-id``)."""
    sizes = [*range(1, 200), 1000, 4095, 70_000]
    records = []
    for n in sizes:
        content = bytes((i * 7 + n) % 256 for i in range(n))
        for mid in (message_id_of(content), message_id_of(content + b".")):
            head = ld(TAG_SENDER_ID, b"a") + ld(TAG_MESSAGE_ID, mid.encode())
            head += ld(TAG_CHANNEL_ID, CHANNEL.encode()) + TAG_LAMPORT + encode_uleb(1)
            records.append(head + ld(TAG_CONTENT, content))
    column = pa.array(records, pa.binary())
    bufs = column.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int32, count=len(records) + 1).astype(np.int64)
    rec = np.zeros((len(records), _decode.R_FIELDS), dtype=np.int64)
    _decode.scan(offs, bufs[2], CHANNEL.encode(), BLOOM, LIMITS, rec, None, True, -1)
    assert rec[:, columnar._R_FLAG].tolist() == [0, 1] * len(sizes)
    _decode.scan(offs, bufs[2], CHANNEL.encode(), BLOOM, LIMITS, rec, None, False, -1)
    assert not rec[:, columnar._R_FLAG].any()  # the check off: none flagged


def test_unpack_codes_refuses_what_unpack_refuses_and_codes_out_of_range():
    """``unpack_codes`` checks runs as ``unpack`` does (the same first pass), and each stored
    id's code against the dictionary's size: a bad call is ValueError, never a read out of
    bounds."""
    loffs = np.array([0, 1, 2], np.int32)
    ok = np.ones(2, np.uint8)
    zero = np.zeros(2, np.int32)
    back, start, run = np.array([0, 1], np.int32), zero, np.array([0, 1], np.int32)
    codes = np.array([0, 1], np.int32)
    entries, lists = _decode.unpack_codes(loffs, ok, back, start, run, codes, 2)
    assert np.frombuffer(entries, np.int32).tolist() == [0, 0, 1]  # [a], then a's run and b
    assert np.frombuffer(lists, np.int32).tolist() == [0, 1, 3]
    for bad in (
        (loffs, ok, back, start, run, np.array([0, 2], np.int32), 2),  # a code past the end
        (loffs, ok, back, start, run, np.array([-1, 0], np.int32), 2),  # a negative code
        (np.array([0, 1, 5], np.int32), ok, back, start, run, codes, 2),  # past the ids
        (np.array([0, 2, 1], np.int32), ok, back, start, run, codes, 2),  # decreasing
        (loffs, ok, np.array([0, 2], np.int32), start, run, codes, 2),  # base before 0
        (loffs, ok, zero, start, run, codes, 2),  # a run with no base
        (loffs, ok, back, np.array([0, 1], np.int32), run, codes, 2),  # past its base
        (loffs, np.array([0, 1], np.uint8), back, start, run, codes, 2),  # a null base
        (loffs, ok, back, start, run, b"\0\0\0", 2),  # not int32s
    ):
        with pytest.raises(ValueError):
            _decode.unpack_codes(*bad)
    with pytest.raises(ValueError, match="another length"):
        _decode.unpack_codes(loffs[:2], ok, back, start, run, codes, 2)


def test_dictionary_reference_keeps_rows_in_step_with_their_values():
    """A null row may span values (Arrow allows it) and a slice starts past its array's first
    values: the encoded rows still hold their own ids, and the dictionary only theirs."""
    lists = pa.ListArray.from_arrays(
        pa.array([0, 2, 3, 5], pa.int32()),
        pa.array(list("abcae")),
        mask=pa.array([False, True, False]),
    )
    for x in (lists, lists.slice(1), lists.slice(2)):
        got = columnar.dictionary_reference(x)
        assert got.type == columnar.HISTORY_DICTIONARY
        assert got.to_pylist() == x.to_pylist()
    # the writer's dictionary: the ids of the rows only ("c" is under the null row)
    assert columnar.dictionary_reference(lists).values.dictionary.to_pylist() == ["a", "b", "e"]


def test_stored_histories_of_another_type_are_refused():
    """``history_stored`` whose ids are not dictionary-encoded strings (found by review: large
    strings made ``history_lists`` raise ValueError and ``history_dictionary`` succeed, binary
    made them give strings and bytes): a TypeError from both."""
    lists = [["a", "b"], ["c"]]
    for typ in (pa.large_string(), pa.binary()):
        plain = pa.array(lists, pa.list_(typ))
        for stored in (
            plain,
            pa.ListArray.from_arrays(plain.offsets, plain.values.dictionary_encode()),
        ):
            batch = pa.RecordBatch.from_arrays(
                [stored, *(pa.array([0, 0], pa.int32()) for _ in range(3))],
                names=list(STORED_HISTORY),
            )
            for read in (columnar.history_lists, columnar.history_dictionary):
                with pytest.raises(TypeError):
                    read(batch)


def test_history_dictionary_reads_what_history_lists_reads_without_runs():
    """A batch without runs is its stored lists, for both readers: a zero-row slice past the
    first row, and a null row whose lengths span ids (the decoder writes none such, but
    ``history_lists`` reads it), give ``history_dictionary`` what ``history_lists`` gives."""
    batch = _stored([["a"], ["b", "c"]], [(0, 0, 0), (0, 0, 0)])
    for rows in (batch.slice(1), batch.slice(2)):
        want = columnar.history_lists(rows)
        assert columnar.history_dictionary(rows).equals(columnar.dictionary_reference(want))
    items = pa.DictionaryArray.from_arrays(
        pa.array([0, 1, 2, 3], pa.int32()), pa.array(["a", "b", "x", "c"])
    )
    stored = pa.ListArray.from_arrays(  # the null row spans an id ("x")
        pa.array([0, 2, 3, 4], pa.int32()), items, mask=pa.array([False, True, False])
    )
    spans = pa.RecordBatch.from_arrays(
        [stored, *(pa.array([0, 0, 0], pa.int32()) for _ in range(3))],
        names=list(STORED_HISTORY),
    )
    want = columnar.history_lists(spans)
    got = columnar.history_dictionary(spans)
    assert got.to_pylist() == want.to_pylist() == [["a", "b"], None, ["c"]]
    assert got.equals(columnar.dictionary_reference(want))
