"""The archive builder (sans-I/O) and the torrent: windows, append-only data, v1 metainfo.

Scenarios mirror status-go's tests (protocol/communities/manager_test.go:
TestCreateHistoryArchiveTorrent_ShouldCreateArchive / _ShouldCreateMultipleArchives /
_WithoutMessages / _ShouldAppendArchives): start 2020-01-01, 7-day partitions, messages at
+1 h, +2 h, +8 days, +14 days."""

from __future__ import annotations

import hashlib
import itertools
import warnings

import libtorrent as lt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loglake.archives.builder import WINDOW_NS, ArchiveBuilder, plan_windows
from loglake.archives.layout import NS, PIECE_LENGTH, get_layout
from loglake.archives.torrent import PieceHashes, bencode

SG = get_layout("status-go")
SPEC = get_layout("spec")
TOPIC = bytes.fromhex("d7a5d2c3")
START = 1577836800 * NS
HOUR, DAY = 3600 * NS, 86400 * NS
NAME = "0x02" + "ab" * 32


def msg(layout, at_ns, payload=b"\x01", n=0):
    sg = layout.name == "status-go"
    topic = TOPIC if sg else "/status/1/chat/proto"
    extra = {"sig": b"\x01", "padding": b"\x01", "hash": bytes([n])} if sg else {}
    return layout.decode_record(
        layout.make_record(payload=payload, topic=topic, timestamp_ns=at_ns, **extra)
    )


def test_plan_windows_counts_from_start_not_calendar_weeks():
    start = START + 5 * HOUR
    assert plan_windows(start, start + 3 * WINDOW_NS + DAY) == [
        (start + k * WINDOW_NS, start + (k + 1) * WINDOW_NS) for k in range(3)
    ]


def test_catch_up_after_30_days_offline_builds_4_archives_in_order():
    # spec "Serving archives for missed messages": offline 30 days -> 4 archives
    windows = plan_windows(START, START + 30 * DAY)
    assert len(windows) == 4
    b = ArchiveBuilder(SG, NAME)
    msgs = [msg(SG, START + d * DAY + HOUR, n=d) for d in range(30)]
    r = b.build(windows, msgs)
    assert [a.entry.metadata.from_ns for a in r.archives] == [w[0] for w in windows]
    assert [a.entry.offset for a in r.archives] == sorted(a.entry.offset for a in r.archives)
    assert r.end_ns == START + 28 * DAY


def test_partial_window_like_status_go_on_demand():
    assert plan_windows(START, START + 10 * DAY, partial=True)[-1] == (
        START + 7 * DAY,
        START + 10 * DAY,
    )


def test_should_create_multiple_archives_like_status_go():
    msgs = [
        msg(SG, START + HOUR, n=1),
        msg(SG, START + 2 * HOUR, n=2),
        msg(SG, START + 8 * DAY, n=3),
        msg(SG, START + 14 * DAY, n=4),
        msg(SG, START + 22 * DAY, n=5),  # after endDate: not archived
    ]
    b = ArchiveBuilder(SG, NAME)
    r = b.build(plan_windows(START, START + 21 * DAY), msgs, [TOPIC])
    counts = {}
    data = b"".join(a.data_bytes() for a in r.archives)
    for e in SG.decode_index(r.index, len(data)):
        counts[e.metadata.from_ns // NS] = len(
            SG.decode_archive(data[e.offset : e.offset + e.size], e)
        )
    s = START // NS
    assert counts == {s: 2, s + 7 * 86400: 1, s + 14 * 86400: 1}


def test_without_messages_no_archive_and_no_torrent():
    b = ArchiveBuilder(SG, NAME)
    r = b.build(plan_windows(START, START + 7 * DAY), [])
    assert r.archives == [] and r.torrent is None and r.end_ns == START + 7 * DAY


def test_messages_on_other_topics_are_not_exported():
    b = ArchiveBuilder(SG, NAME)
    other = SG.decode_record(SG.make_record(payload=b"x", topic=b"\x00" * 4, timestamp_ns=START))
    r = b.build(plan_windows(START, START + 7 * DAY), [other, msg(SG, START + HOUR)], [TOPIC])
    assert len(SG.decode_archive(r.archives[0].data_bytes(), r.archives[0].entry)) == 1


@pytest.mark.parametrize("layout", [SPEC, SG], ids=lambda x: x.name)
def test_appending_weeks_2_and_3_keeps_every_earlier_piece_hash(layout):
    b = ArchiveBuilder(layout, NAME)
    data = b""
    piece_hashes: list[list[bytes]] = []
    for week in range(3):
        frm = START + week * WINDOW_NS
        msgs = [msg(layout, frm + i * 60 * NS, payload=bytes([week]) * 300) for i in range(1500)]
        r = b.build([(frm, frm + WINDOW_NS)], msgs)
        data += b"".join(a.data_bytes() for a in r.archives)
        hashes = [
            hashlib.sha1(data[i : i + PIECE_LENGTH]).digest()
            for i in range(0, len(data), PIECE_LENGTH)
        ]
        assert b.hashes.hashes == hashes
        info = lt.bdecode(r.torrent.info)
        assert info[b"pieces"][: 20 * len(hashes)] == b"".join(hashes)
        piece_hashes.append(hashes)
    assert len(piece_hashes[0]) < len(piece_hashes[1]) < len(piece_hashes[2])
    for earlier, later in itertools.pairwise(piece_hashes):
        assert later[: len(earlier)] == earlier  # append-only: earlier pieces unchanged


def test_torrent_is_a_v1_multi_file_torrent_libtorrent_loads():
    b = ArchiveBuilder(SG, NAME, announce=("http://127.0.0.1:1/announce",))
    r = b.build(
        plan_windows(START, START + 14 * DAY), [msg(SG, START + d * DAY) for d in range(14)]
    )
    meta = r.torrent.metainfo()
    ti = lt.torrent_info(lt.bdecode(meta))
    assert str(ti.info_hashes().v1) == r.torrent.info_hash
    assert ti.piece_length() == PIECE_LENGTH == 102400
    assert ti.name() == NAME
    with warnings.catch_warnings():  # the python binding marks files() deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        fs = ti.files()
    assert [fs.file_path(i) for i in range(fs.num_files())] == [f"{NAME}/data", f"{NAME}/index"]
    assert fs.file_size(0) == b.data_size and fs.file_size(1) == len(r.index)
    assert not any(fs.file_flags(i) & fs.flag_pad_file for i in range(fs.num_files()))
    info = lt.bdecode(r.torrent.info)
    assert sorted(info) == [b"files", b"name", b"piece length", b"pieces"]
    assert bencode(info) == r.torrent.info  # canonical: keys sorted, no extra fields
    magnet = r.torrent.magnet(NAME, ("127.0.0.1:6881",))
    assert magnet.startswith(f"magnet:?xt=urn:btih:{r.torrent.info_hash}&dn={NAME}&tr=http")
    atp = lt.parse_magnet_uri(magnet)
    assert str(atp.info_hashes.v1) == r.torrent.info_hash
    assert [tuple(p) for p in atp.peers] == [("127.0.0.1", 6881)]


def test_bencode_vectors():
    # BEP 3 examples
    assert bencode(b"spam") == b"4:spam"
    assert bencode(3) == b"i3e" and bencode(-3) == b"i-3e"
    assert bencode([b"spam", b"eggs"]) == b"l4:spam4:eggse"
    assert bencode({"spam": [b"a", b"b"], "cow": b"moo"}) == b"d3:cow3:moo4:spaml1:a1:bee"


def test_status_go_chunks_a_window_at_30_mb_of_payload():
    layout = type(SG)()
    layout.max_archive_bytes = 1000
    msgs = [msg(layout, START + i * NS, payload=b"p" * 299) for i in range(10)]  # 300 B each
    msgs.append(msg(layout, START + 20 * NS, payload=b"p" * 2000))  # above the cap: dropped
    r = ArchiveBuilder(layout, NAME).build([(START, START + WINDOW_NS)], msgs)
    sizes = [len(layout.decode_archive(a.data_bytes(), a.entry)) for a in r.archives]
    assert sizes == [3, 3, 3, 1]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=300), max_size=60),
    st.integers(min_value=1, max_value=40),
    st.integers(min_value=0, max_value=3),
)
def test_piece_hashes_from_parts_equal_hashes_of_the_joined_bytes(parts, piece, extra):
    length = sum(map(len, parts))
    zeros = (-length) % piece + extra * piece
    a, b = PieceHashes(piece), PieceHashes(piece)
    a.extend_parts(list(parts), length, zeros)
    b.extend(b"".join(parts) + bytes(zeros))
    assert a.hashes == b.hashes


def _status_go_chunks(sizes, cap):
    """The loop of manager_archive_file.go createHistoryArchiveTorrent, transcribed."""
    chunks, cur, size = [], [], 0
    for i, s in enumerate(sizes):
        if s > cap:
            continue
        if size + s > cap:
            chunks.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += s
    chunks.append(cur)
    return chunks


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=120), max_size=80), st.integers(1, 100))
def test_status_go_chunking_matches_the_reference_loop(sizes, cap):
    layout = type(SG)()
    layout.max_archive_bytes = cap
    msgs = [(i, TOPIC, b"", s) for i, s in enumerate(sizes)]
    got = [[m[0] for m in c] for c in layout.chunk(msgs)]
    assert got == _status_go_chunks(sizes, cap)


def test_a_partial_window_ends_on_the_layouts_time_unit():
    assert plan_windows(START, START + 12_500_000_000, partial=True, unit_ns=NS) == [
        (START, START + 12 * NS)
    ]
    assert plan_windows(START, START + 400_000_000, partial=True, unit_ns=NS) == []
    assert plan_windows(START, START + 5, partial=True) == [(START, START + 5)]


def test_a_build_that_fails_leaves_the_builder_as_it_was(monkeypatch):
    # Its end moved before the windows were encoded, and entries and piece hashes grew in
    # place: a retry after a failure skipped the windows it had failed on.
    layout = get_layout("spec")
    b = ArchiveBuilder(layout, "0x02" + "11" * 32, announce=())
    msgs = [
        (
            START + k * WINDOW_NS,
            "/t",
            layout.make_record(payload=b"x", topic="/t", timestamp_ns=START + k * WINDOW_NS),
            1,
        )
        for k in range(3)
    ]
    b.build(plan_windows(START, START + WINDOW_NS), msgs[:1])
    before = (b.end_ns, list(b.entries), list(b.hashes.hashes))
    real, calls = layout.encode_archive, []

    def fails_on_the_second(meta, raws, offset):
        calls.append(meta)
        if len(calls) == 2:
            raise ValueError("injected")
        return real(meta, raws, offset)

    monkeypatch.setattr(layout, "encode_archive", fails_on_the_second)
    with pytest.raises(ValueError, match="injected"):
        b.build(plan_windows(START + WINDOW_NS, START + 3 * WINDOW_NS), msgs[1:])
    assert (b.end_ns, b.entries, b.hashes.hashes) == before
    monkeypatch.setattr(layout, "encode_archive", real)
    assert (
        len(b.build(plan_windows(START + WINDOW_NS, START + 3 * WINDOW_NS), msgs[1:]).archives) == 2
    )
