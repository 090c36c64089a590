"""The sds-audit decoder reads a causal history against the one before it (``DecodeState``: the
previous history's tail found in the record's bytes, only what follows it parsed). These tests
hold it to the straightforward computation — every entry parsed with ``parse_entry``,
``causal_new`` by set difference with the sender's previous good message — on arbitrary input:
sliding windows, reordered and interleaved fields, unknown fields, duplicated entries, entry
bytes hidden in the content, bad entries, junk, and any split into batches. No Spark."""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loglake.sds.codec import (
    TAG_BLOOM_FILTER,
    TAG_CHANNEL_ID,
    TAG_CONTENT,
    TAG_LAMPORT,
    TAG_MESSAGE_ID,
    TAG_REPAIR_REQUEST,
    TAG_SENDER_ID,
    encode_history_entry,
    parse,
    parse_entry,
)
from loglake.sds.columnar import (
    DecodeState,
    decode_batches,
    dictionary_reference,
    history_dictionary,
    history_lists,
)
from loglake.sds.errors import DropReason, SdsDecodeError
from loglake.sds.messages import HistoryEntry, message_id_of
from loglake.wire.varint import encode_uleb
from tests.sds.records import BLOOM, CHANNEL, ld, sliding_window

ENTRIES = [
    encode_history_entry(HistoryEntry(f"m{i}", b"\x01hint%d" % i if i % 3 else None, "s"))
    for i in range(12)
] + [
    encode_history_entry(HistoryEntry("m1")),  # the same id, another encoding
    encode_history_entry(HistoryEntry("")),  # a bad entry (empty id)
]
# m0's entry with a non-minimal length varint: the same body, other bytes
ENTRIES.append(ENTRIES[0][:1] + bytes([ENTRIES[0][1] | 0x80, 0]) + ENTRIES[0][2:])


@st.composite
def records(draw) -> list[bytes | None]:
    out: list[bytes | None] = []
    hist: list[bytes] = []
    for k in range(draw(st.integers(1, 14))):
        shape = draw(st.sampled_from(["slide", "slide", "slide", "random", "junk", "none"]))
        if shape == "none":
            out.append(None)
            continue
        if shape == "junk":
            out.append(draw(st.binary(max_size=30)))
            continue
        if shape == "slide" and hist:
            drop = draw(st.integers(0, len(hist)))
            add = draw(st.lists(st.sampled_from(ENTRIES), max_size=4))
            hist = hist[drop:] + add
        else:
            hist = draw(st.lists(st.sampled_from(ENTRIES), max_size=8))
        sender = draw(st.sampled_from(["a", "b", "c"]))
        content = draw(st.sampled_from([b"hi", b"", b"x" + ENTRIES[0], ENTRIES[2], ENTRIES[0]]))
        mid = b"id%d" % k  # for a content message, mostly its content's hash (as a sender's)
        if content and draw(st.integers(0, 3)):
            mid = message_id_of(content).encode()
        head = [
            ld(TAG_SENDER_ID, sender.encode()),
            ld(TAG_MESSAGE_ID, mid),
            ld(
                TAG_CHANNEL_ID, draw(st.sampled_from([CHANNEL, CHANNEL, CHANNEL, "other"])).encode()
            ),
            TAG_LAMPORT + encode_uleb(draw(st.sampled_from([5, 7, 2**63 + 1]))),
        ]
        tail = [ld(TAG_CONTENT, content)] if content or draw(st.booleans()) else []
        if draw(st.integers(0, 9)) == 0:
            tail.append(ld(TAG_BLOOM_FILTER, b"\x00" * draw(st.sampled_from([BLOOM, 3]))))
        for e in draw(st.lists(st.sampled_from(ENTRIES), max_size=2)):
            tail.append(TAG_REPAIR_REQUEST + e[1:])
        if draw(st.booleans()):
            tail.append(b"\x78\x01")  # unknown field 15, varint
        entries = list(hist)
        fields = head + entries + tail
        if draw(st.integers(0, 3)) == 0:  # fields out of canonical order
            others = head + tail
            fields = list(entries)
            for f in others:
                fields.insert(draw(st.integers(0, len(fields))), f)
        data = b"".join(fields)
        if draw(st.integers(0, 15)) == 0:
            data = data[: draw(st.integers(0, len(data)))]
        out.append(data)
    return out


def reference(datas: list[bytes | None]) -> list[dict]:
    """Every entry parsed; causal_new by set difference with the sender's previous message
    whose history read whole (kept even when its lamport is then rejected)."""
    previous: dict[str, set[bytes]] = {}
    rows = []
    for data in datas:
        row: dict[str, Any] = {
            "ok": False,
            "reason": None,
            "history": None,
            "new": None,
            "requests": None,
        }
        rows.append(row)
        try:
            if data is None:
                raise SdsDecodeError(DropReason.MALFORMED, "no data")
            pb = parse(data)
            if pb.channel_id != CHANNEL:
                raise ValueError("wrong-channel")
            if pb.HasField("bloom_filter") and len(pb.bloom_filter) != BLOOM:
                raise ValueError("bad-bloom-filter")
            bodies = list(pb.causal_history)
            ids = [parse_entry(b).message_id for b in bodies]
            reqs = [parse_entry(b).message_id for b in pb.repair_request]
            content = pb.HasField("lamport_timestamp") and pb.content
            if content and pb.message_id != message_id_of(content):
                raise ValueError("bad-message-id")
        except SdsDecodeError as e:
            row["reason"] = e.reason.value
            continue
        except ValueError as e:
            row["reason"] = str(e)
            continue
        prev = previous.get(pb.sender_id)
        row["new"] = [i for i, b in zip(ids, bodies, strict=True) if prev is None or b not in prev]
        previous[pb.sender_id] = set(bodies)
        if pb.lamport_timestamp >= 1 << 63:
            row["reason"], row["new"] = "oversized", None
            continue
        row.update(ok=True, history=ids, requests=reqs, mid=pb.message_id)
    return rows


def decoded(
    datas: list[bytes | None], cuts: list[int], batched: bool = True
) -> tuple[list[dict], DecodeState]:
    state = DecodeState(CHANNEL, BLOOM, batched=batched)
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(datas)}), len(datas)]
    rows: list[dict] = []
    for a, b in itertools.pairwise(bounds):
        batch = pa.RecordBatch.from_pydict(
            {
                "partition": pa.array([0] * (b - a), pa.int32()),
                "index": pa.array(range(a, b), pa.int64()),
                "timestamp_ns": pa.array(range(a, b), pa.int64()),
                "data": pa.array(datas[a:b], pa.binary()),
            }
        )
        out = state.decode(batch)
        hist = history_lists(out).to_pylist()
        for r, h in zip(out.to_pylist(), hist, strict=True):
            rows.append(
                {
                    "ok": r["ok"],
                    "reason": r["reason"],
                    "history": h,
                    "new": r["causal_new"],
                    "requests": r["repair_request"],
                    **({"mid": r["message_id"]} if r["ok"] else {}),
                }
            )
    return rows, state


@pytest.mark.slow  # hypothesis: 4-10 s
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(datas=records(), cuts=st.lists(st.integers(0, 14), max_size=3))
def test_history_decode_equals_the_straightforward_one(datas, cuts):
    assert decoded(datas, cuts)[0] == reference(datas)
    assert decoded(datas, cuts, batched=False)[0] == reference(datas)


def test_sliding_windows_are_read_against_the_previous_history():
    """Senders taking turns over one window (the benchmark's channel): on the per-record path
    (the batch path's fallback) every history after the first is read against a base, and the
    result is the straightforward one."""
    datas = sliding_window(60, senders=4, keep=20)
    got, state = decoded(datas, [25], batched=False)
    assert got == reference(datas)
    assert state.whole <= 2 and state.fast >= 57
    assert decoded(datas, [25])[0] == got


def test_stored_histories_read_back_from_a_slice():
    """A batch's stored histories (no runs) read back as they were from any slice of it: its
    dictionary then holds ids the slice's rows do not (the writer's dictionary does not)."""
    lists = pa.array([["a", "bc"], None, [], ["défg", ""], ["x", "a"]], pa.list_(pa.string()))
    zero = pa.array([0] * len(lists), pa.int32())
    batch = pa.RecordBatch.from_arrays(
        [dictionary_reference(lists), zero, zero, zero],
        names=["history_stored", "history_back", "history_from", "history_run"],
    )
    for a, b in ((0, 5), (1, 4), (2, 2), (3, 2), (5, 0)):
        rows = batch.slice(a, b)
        assert history_lists(rows).to_pylist() == lists.to_pylist()[a : a + b]
        got = history_dictionary(rows)
        assert got.equals(dictionary_reference(lists.slice(a, b)))
        assert got.values.dictionary.equals(
            dictionary_reference(lists.slice(a, b)).values.dictionary
        )


def test_decode_batches_is_the_state_per_task():
    datas = [
        ld(TAG_SENDER_ID, b"a")
        + ld(TAG_MESSAGE_ID, b"m")
        + ld(TAG_CHANNEL_ID, CHANNEL.encode())
        + ld(TAG_CONTENT, b"x")
    ]
    batch = pa.RecordBatch.from_pydict(
        {
            "partition": pa.array([0], pa.int32()),
            "index": pa.array([0], pa.int64()),
            "timestamp_ns": pa.array([0], pa.int64()),
            "data": pa.array(datas, pa.binary()),
        }
    )
    (out,) = decode_batches(CHANNEL)(iter([batch]))
    assert out.column("kind").to_pylist() == ["ephemeral"]


def test_entry_bytes_elsewhere_in_the_record_are_not_taken_for_the_history():
    """The previous history's tail found in the content, while the real entry (a non-minimal
    length varint: the same entry, other bytes) is earlier: the bytes before the found tail hold
    an entry, so the record is read entry by entry."""
    m0, m0_long = ENTRIES[0], ENTRIES[-1]
    head = ld(TAG_CHANNEL_ID, CHANNEL.encode()) + TAG_LAMPORT + encode_uleb(3)
    datas: list[bytes | None] = [
        ld(TAG_SENDER_ID, b"a") + ld(TAG_MESSAGE_ID, b"x1") + head + m0 + ENTRIES[1],
        ld(TAG_SENDER_ID, b"a")
        + ld(TAG_MESSAGE_ID, message_id_of(m0 + ENTRIES[1]).encode())
        + head
        + m0_long
        + ENTRIES[2]
        + ld(TAG_CONTENT, m0 + ENTRIES[1]),
    ]
    for batched in (True, False):
        got, _ = decoded(datas, [], batched)
        assert got == reference(datas)
        assert [r["history"] for r in got] == [["m0", "m1"], ["m0", "m2"]]
