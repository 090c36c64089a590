"""The sds-audit decoder alone (no Spark): a batch's history entries are parsed once per distinct
body, and the per-record outcome is the participant's — rejects with the first failing check's
reason (a content message's id not its content's hash among them), ``causal_new`` relative to
the sender's previous good message, across batches too, and over-full bloom filters read as
none."""

from __future__ import annotations

import pyarrow as pa

from loglake.sds.bloom import DEFAULT_CAPACITY, DEFAULT_ERROR_RATE, BloomFilter, max_honest_bits
from loglake.sds.codec import encode
from loglake.sds.columnar import DECODED_SCHEMA, DecodeState, decode_batches
from loglake.sds.messages import HistoryEntry, SdsMessage, message_id_of
from tests.sds.records import readable


def _msg(sender: str, mid: str, hist: list[str], **kw) -> bytes:
    kw.setdefault("content", b"c-" + mid.encode())
    return encode(
        SdsMessage(sender, mid, "room", kw.pop("lamport", 5), tuple(map(HistoryEntry, hist)), **kw)
    )


def _decode(
    records: list[bytes | None], split: int | None = None, verify_message_ids: bool = False
) -> list[dict]:
    """``records`` decoded, cut at ``split``. The id check is off by default: ``RECORDS`` name
    their messages (``m1``...) rather than hash their content; it has its own test."""
    n = len(records)
    cut = [(0, split), (split, n)] if split else [(0, n)]
    batches = [
        pa.RecordBatch.from_pydict(
            {
                "partition": pa.array([0] * (b - a), pa.int32()),
                "index": pa.array(range(a, b), pa.int64()),
                "timestamp_ns": pa.array([1_000 * i for i in range(a, b)], pa.int64()),
                "data": pa.array(records[a:b], pa.binary()),
            }
        )
        for a, b in cut
    ]
    out = list(decode_batches("room", verify_message_ids)(iter(batches)))
    assert all(b.schema == DECODED_SCHEMA for b in out)
    return readable(out)


RECORDS = [
    _msg("a", "m1", ["x", "y"]),
    _msg("b", "m2", ["x", "y", "m1"]),
    _msg("a", "m3", ["y", "m1", "m2"]),
    _msg("a", "bad1", ["m2", ""]),  # an entry with an empty id: rejected, not a "previous"
    _msg("a", "bad2", ["m3"], repair_request=(HistoryEntry(""),)),
    _msg("a", "big", ["m3", "m9"], lamport=2**63 + 5),  # rejected, but read as a's previous
    b"\xff\xff not protobuf",
    None,
    encode(SdsMessage("c", "w", "elsewhere", 5, content=b"hi")),
    _msg("a", "m4", ["m1", "m2", "m3", "m9"], repair_request=(HistoryEntry("m1"),)),
    _msg("b", "m5", [], content=b""),  # a sync message
]


def test_decoded_rows_and_rejects():
    rows = _decode(RECORDS)
    got = [(r["ok"], r["reason"], r["message_id"], r["kind"]) for r in rows]
    assert got == [
        (True, None, "m1", "content"),
        (True, None, "m2", "content"),
        (True, None, "m3", "content"),
        (False, "missing-field", None, None),
        (False, "missing-field", None, None),
        (False, "oversized", None, None),
        (False, "malformed", None, None),
        (False, "malformed", None, None),
        (False, "wrong-channel", None, None),
        (True, None, "m4", "content"),
        (True, None, "m5", "sync"),
    ]
    assert rows[3]["detail"] == "history entry with empty message_id"
    assert rows[5]["detail"] == "lamport_timestamp over 2^63 - 1"
    assert [r["causal_history"] for r in rows] == [
        ["x", "y"],
        ["x", "y", "m1"],
        ["y", "m1", "m2"],
        *[None] * 6,
        ["m1", "m2", "m3", "m9"],
        [],
    ]
    # new against the sender's previous message that read whole: m3 for bad1/bad2, then "big"
    # (its lamport is rejected after its history was read), so m4 adds m1 and m2
    assert [r["causal_new"] for r in rows] == [
        ["x", "y"],
        ["x", "y", "m1"],
        ["m1", "m2"],
        *[None] * 6,
        ["m1", "m2"],
        [],
    ]
    assert rows[9]["repair_request"] == ["m1"]
    assert rows[0]["repair_request"] == []


def test_the_same_across_batch_boundaries():
    whole = _decode(RECORDS)
    for split in range(1, len(RECORDS)):
        assert _decode(RECORDS, split) == whole, split


def _filter(bits: int) -> bytes:
    """A bloom filter of the default size with its first ``bits`` bits set."""
    whole, rest = divmod(bits, 8)
    head = b"\xff" * whole + (bytes([(1 << rest) - 1]) if rest else b"")
    return head + bytes(BloomFilter().n_bytes - len(head))


def test_what_a_participant_does_not_take_for_what_it_claims_on_every_path():
    # A content message whose id is not its content's SHA-256 is dropped by a participant
    # (participant.py, difference 8) and a filter with more bits set than the default
    # capacity sets acknowledges nothing (difference 10): the audit took the first as the
    # message it names and counted the second as containing every id.
    most = max_honest_bits(DEFAULT_CAPACITY, DEFAULT_ERROR_RATE)
    real = b"what was said"
    records = [
        encode(SdsMessage("a", message_id_of(real), "room", 5, content=real)),
        encode(SdsMessage("m", message_id_of(real), "room", 6, content=b"not what was said")),
        encode(SdsMessage("m", "m1", "room", 7, content=b"an id that is a name")),
        encode(SdsMessage("m", "s1", "room", 8, bloom_filter=_filter(most))),
        encode(SdsMessage("m", "s2", "room", 9, bloom_filter=_filter(most + 1))),
        encode(SdsMessage("m", "s3", "room", 9, bloom_filter=_filter(8 * BloomFilter().n_bytes))),
        encode(SdsMessage("m", "e1", "room", None, content=b"ephemeral: no id check")),
    ]
    batch = pa.RecordBatch.from_pydict(
        {
            "partition": pa.array([0] * len(records), pa.int32()),
            "index": pa.array(range(len(records)), pa.int64()),
            "timestamp_ns": pa.array(range(len(records)), pa.int64()),
            "data": pa.array(records, pa.binary()),
        }
    )
    for path in ({}, {"kernel": False}, {"batched": False}):
        rows = readable([DecodeState("room", BloomFilter().n_bytes, **path).decode(batch)])
        got = [(r["ok"], r["reason"], r["kind"]) for r in rows]
        assert got == [
            (True, None, "content"),
            (False, "bad-message-id", None),
            (False, "bad-message-id", None),
            (True, None, "sync"),
            (True, None, "sync"),
            (True, None, "sync"),
            (True, None, "ephemeral"),
        ], path
        assert rows[1]["detail"] == "message_id is not the SHA-256 of the content"
        assert [r["bloom_filter"] for r in rows[3:6]] == [_filter(most), None, None], path
        # a channel whose ids are not content hashes (ParticipantOptions.verify_message_ids)
        lax = DecodeState("room", BloomFilter().n_bytes, verify_message_ids=False, **path)
        assert lax.decode(batch).column("ok").to_pylist() == [True] * len(records), path
