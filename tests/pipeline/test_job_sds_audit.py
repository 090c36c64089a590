"""``loglake job sds-audit`` (issue 12 §2): the audit of a stored SDS channel equals the ground
truth of the seeded simulator that produced it (loss, a healing partition, a late joiner, an
offline participant), malformed records land in ``rejects`` while the job goes on, dependencies
never stored are named, options are checked before any work, and the report is one
self-contained HTML page."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from loglake.log import Entry, open_log
from loglake.pipeline.errors import BadOption
from loglake.pipeline.jobs.sds_audit import (
    MESSAGES_COLUMNS,
    MESSAGES_SCHEMA,
    SdsAuditOptions,
    nearest_rank,
    run,
    table,
)
from loglake.sds.bloom import BloomFilter
from loglake.sds.codec import decode, encode, parse
from loglake.sds.messages import HistoryEntry, SdsMessage
from loglake.sds.sim import SimConfig, Simulation, store_channel

pytestmark = [pytest.mark.spark]

STREAM = "sds.sim"
CFG = SimConfig(
    participants=10,
    messages=40,
    seed=12,
    loss=0.15,
    send_window_ms=40_000,
    settle_ms=30_000,
    partition=(10_000, 20_000, 0.3),
    late_joiners=1,
    offline=1,
    causal_history_size=5,
    record_channel=True,
    closing_sync=True,
)


def simulated(
    data_dir: Path,
    cfg: SimConfig = CFG,
    drop: set[int] = frozenset(),  # type: ignore[assignment]
    hostile: Callable[[Simulation], dict[int, bytes]] | None = None,
) -> Simulation:
    """``cfg`` run and its channel stored, but for the records at ``drop``; ``hostile(sim)``:
    records of an outside member to put on it (``put_before``)."""
    sim = Simulation(cfg)
    sim.run()
    if hostile is not None:
        put_before(sim, hostile(sim))
    kept = [c for k, c in enumerate(sim.channel) if k not in drop]
    with open_log(data_dir) as log:
        full = sim.channel
        sim.channel = kept
        store_channel(sim, log, STREAM)
        sim.channel = full
    return sim


OUTSIDER = -1
"""The participant number of a record put on the channel by a member outside the simulation
(``put_before``)."""


def put_before(sim: Simulation, records: dict[int, bytes]) -> None:
    """Each of ``records`` put on the simulated channel before the record at that position, at
    its time, as sent by a member the simulation does not run (``OUTSIDER``); the positions
    the ground truth names move with their records. What a participant holds is the same as
    if it had received them, for the records these tests put: a content message whose id is
    not its content's hash is dropped before any state changes, and a sync holds no message."""
    channel: list[tuple[int, int, bytes]] = []
    moved: dict[int, int] = {}
    for pos, (t, i, data) in enumerate(sim.channel):
        if pos in records:
            channel.append((t, OUTSIDER, records[pos]))
        moved[pos] = len(channel)
        channel.append((t, i, data))
    sim.channel = channel
    sim.held_at = {key: moved[pos] for key, pos in sim.held_at.items()}


def expected_from_truth(sim: Simulation) -> dict:
    """The audit's numbers, from what the simulator knows (docs/sds.md "Auditing a channel")."""
    truth = sim.ground_truth()
    ids = truth["participants"]
    sent = truth["sent"]
    t_of = {pos: t for pos, (t, _, _) in enumerate(sim.channel)}
    first_pos: dict[str, int] = {}
    last_own: dict[str, int] = {}
    for pos, (_, i, data) in enumerate(sim.channel):
        if i == OUTSIDER:
            continue
        first_pos.setdefault(parse(data).message_id, pos)
        if parse(data).sender_id == ids[i]:
            last_own[ids[i]] = pos
    acks = {}
    parts = {}
    for pid in ids:
        held = truth["held"][pid]
        lats = []
        for mid, pos in held.items():
            lat = float(t_of[pos] - t_of[first_pos[mid]])
            acks[(mid, pid)] = (pos, lat)
            lats.append(lat)
        lats.sort()
        expected = sum(
            1
            for m, v in sent.items()
            if v["sender"] != pid and pid in last_own and first_pos[m] < last_own[pid]
        )
        parts[pid] = {
            "acknowledged": len(held),
            "expected": expected,
            "delivery_ratio": len(held) / expected if expected else None,
            "ack_p50_ms": nearest_rank(lats, 0.5),
            "ack_p90_ms": nearest_rank(lats, 0.9),
            "ack_p99_ms": nearest_rank(lats, 0.99),
            "messages_sent": sum(1 for v in sent.values() if v["sender"] == pid),
        }
    return {"acks": acks, "participants": parts, "truth": truth}


def audit(spark, data_dir: Path, out: Path, **kw):
    opts = SdsAuditOptions(str(data_dir), STREAM, str(out), **kw).validate()
    return run(spark, opts)


def assert_messages_as_pyarrow_writes_them(out: Path, scratch: Path) -> None:
    """Each ``messages`` part file says it holds ``MESSAGES_SCHEMA`` and has the very bytes
    pyarrow's own writer makes from its rows, histories as plain strings, a row group at a
    time: the job hands the writer the histories dictionary-encoded (``history_dictionary``,
    or ``dictionary_reference`` where it read the ids or left rows out), and that must be
    only a faster way to the same file."""
    files = sorted((out / "messages").glob("*.parquet"))
    assert files
    for f in files:
        src = pq.ParquetFile(f)
        assert src.schema_arrow == MESSAGES_SCHEMA
        again = scratch / f"again-{f.name}"
        with pq.ParquetWriter(again, MESSAGES_SCHEMA, compression="zstd") as w:
            for i in range(src.num_row_groups):
                w.write_table(src.read_row_group(i))
        assert again.read_bytes() == f.read_bytes(), f.name


def mallorys_records(sim: Simulation) -> dict[int, bytes]:
    """Two records a member can send that a participant does not take as what they claim: a
    content message under the id of the fifth content message, put before it (its content is
    other than the one the id hashes), and, before the last record, a sync whose bloom filter
    has every bit set (it "contains" every id)."""
    contents = [k for k, (_, _, d) in enumerate(sim.channel) if parse(d).content]
    victim = parse(sim.channel[contents[4]][2])
    t = victim.lamport_timestamp
    forged = SdsMessage("mallory", victim.message_id, "sim", t, content=b"not what was said")
    full = b"\xff" * BloomFilter().n_bytes
    saturated = SdsMessage("mallory", "sync-mallory", "sim", t, bloom_filter=full)
    return {contents[4]: encode(forged), len(sim.channel) - 1: encode(saturated)}


def test_audit_equals_the_simulators_ground_truth(spark, tmp_path):
    # with an outside member's records the participants do not take for what they claim (as
    # a participant: loglake.sds.participant, differences 8 and 10): a forged copy put before
    # a message is a reject, not its first copy, and a filter with every bit set acknowledges
    # nothing; the audit then equals the ground truth of the participants the run had
    sim = simulated(tmp_path / "data", hostile=mallorys_records)
    exp = expected_from_truth(sim)
    truth = exp["truth"]
    summary = audit(spark, tmp_path / "data", tmp_path / "out")
    out = str(tmp_path / "out")

    assert summary.records == len(sim.channel)
    forged = [k for k, (_, i, d) in enumerate(sim.channel) if i == OUTSIDER and parse(d).content]
    rejects = {r["index"]: r["reason"] for r in table(spark, out, "rejects").collect()}
    assert rejects == {forged[0]: "bad-message-id"}
    assert summary.rejects == 1
    assert summary.content_messages == len(truth["sent"]) == CFG.messages
    assert summary.participants == len(truth["participants"]) + 1  # mallory sent a sync

    got_acks = {
        (r["message_id"], r["participant"]): (r["ack_index"], r["latency_ms"])
        for r in table(spark, out, "acks").collect()
    }
    assert got_acks == exp["acks"]
    # the run was lossy enough to matter: not everyone got everything by the partition's end
    assert len(got_acks) > 0

    parts = {r["participant"]: r.asDict() for r in table(spark, out, "participants").collect()}
    assert parts["mallory"]["acknowledged"] == 0 < parts["mallory"]["expected"]
    for pid, want in exp["participants"].items():
        got = parts[pid]
        for k, v in want.items():
            assert got[k] == v, (pid, k, got[k], v)
        # what it held at the end includes everything the participant delivered
        delivered_others = {m for m in truth["delivered"][pid] if truth["sent"][m]["sender"] != pid}
        assert delivered_others <= set(truth["held"][pid])
        assert got["unresolved"] == 0  # the store node resolved every dependency

    msgs = {r["message_id"]: r for r in table(spark, out, "messages").collect()}
    for mid, v in truth["sent"].items():
        m = msgs[mid]
        assert m["kind"] == "content"
        assert m["sender"] == v["sender"]
        assert m["first_timestamp_ns"] == v["t_ms"] * 1_000_000
        assert m["acknowledged_by"] == sum(1 for (x, _) in exp["acks"] if x == mid)
        assert m["never_delivered_deps"] == []
    # lamport times and causal histories are the messages' own
    for _, i, data in sim.channel:
        pb = parse(data)
        if pb.content and i != OUTSIDER:
            assert msgs[pb.message_id]["lamport"] == pb.lamport_timestamp
            assert msgs[pb.message_id]["causal_history"] == [
                e.message_id for e in decode(data).causal_history
            ]
    assert_messages_as_pyarrow_writes_them(tmp_path / "out", tmp_path)
    repairs = table(spark, out, "repairs").collect()
    assert summary.repair_requests == len(repairs)
    report = (tmp_path / "out" / "report.html").read_text()
    assert report.count("<svg") == 3
    assert not re.search(r"<script|https?://(?!www\.w3\.org/2000/svg)", report)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["acks"] == len(got_acks)


def test_rejects_and_never_delivered_dependencies(spark, tmp_path):
    """Malformed records, another channel, a bad bloom filter: rejected at their positions with
    a reason, counted, and the rest audited; content messages missing from the store are named as
    dependencies never delivered and as unresolved for the participants that held dependents."""
    cfg = SimConfig(
        participants=5,
        messages=20,
        seed=4,
        loss=0.0,
        send_window_ms=20_000,
        settle_ms=10_000,
        causal_history_size=5,
        record_channel=True,
        closing_sync=True,
    )
    probe = Simulation(cfg)
    probe.run()
    contents = [k for k, (_, _, d) in enumerate(probe.channel) if parse(d).content and k > 3]
    drop = {contents[3], contents[8]}
    dropped_ids = {parse(probe.channel[k][2]).message_id for k in drop}
    data_dir = tmp_path / "data"
    sim = simulated(data_dir, cfg, drop)
    n_good = len(sim.channel) - len(drop)
    bad = [
        b"\xff\xff\xff not protobuf",
        encode(SdsMessage("x", "m1", "other-channel", 5, content=b"hi")),
        encode(SdsMessage("x", "m2", "sim", 5, bloom_filter=b"\x00" * 10, content=b"hi")),
        encode(SdsMessage("x", "m3", "sim", None)),
        encode(SdsMessage("x", "m4", "sim", 7, causal_history=(HistoryEntry(""),))),
    ]
    with open_log(data_dir) as log:
        positions = log.append_many(STREAM, [Entry(b) for b in bad])
    summary = audit(spark, data_dir, tmp_path / "out")
    out = str(tmp_path / "out")
    assert summary.records == n_good + len(bad)
    assert summary.rejects == len(bad)
    rejects = {r["index"]: r["reason"] for r in table(spark, out, "rejects").collect()}
    assert rejects == dict(
        zip(
            positions,
            ["malformed", "wrong-channel", "bad-bloom-filter", "unknown-kind", "missing-field"],
            strict=True,
        )
    )
    assert summary.reject_reasons == {r: 1 for r in rejects.values()}
    never = set()
    for r in table(spark, out, "messages").collect():
        never |= set(r["never_delivered_deps"] or ())
    assert never == dropped_ids
    assert summary.never_delivered == 2
    parts = {r["participant"]: r for r in table(spark, out, "participants").collect()}
    assert any(set(p["unresolved_deps"]) == dropped_ids for p in parts.values())
    assert all(set(p["unresolved_deps"]) <= dropped_ids for p in parts.values())
    assert "Rejected records" in (tmp_path / "out" / "report.html").read_text()


def test_later_copies_of_a_message_are_counted_and_not_audited_again(spark, tmp_path):
    """Records that repeat an earlier message (a resend, an SDS-R repair response): the message
    is its first copy (its index, its time), ``copies`` counts every record of it, and the
    later ones acknowledge nothing: ``acks`` is the audit's of the channel without them."""
    cfg = SimConfig(
        participants=4,
        messages=12,
        seed=7,
        loss=0.0,
        send_window_ms=12_000,
        settle_ms=10_000,
        causal_history_size=5,
        record_channel=True,
    )
    plain, copied = tmp_path / "plain", tmp_path / "copied"
    sim = simulated(plain, cfg)
    simulated(copied, cfg)
    contents = [(k, d) for k, (_, _, d) in enumerate(sim.channel) if parse(d).content]
    again = [contents[0][1], contents[4][1], contents[0][1], sim.channel[-1][2]]
    with open_log(copied) as log:
        log.append_many(STREAM, [Entry(d) for d in again])
    want = audit(spark, plain, tmp_path / "out-plain", report=False)
    got = audit(spark, copied, tmp_path / "out-copied", report=False)
    assert got.records == want.records + len(again)
    assert (got.content_messages, got.acks) == (want.content_messages, want.acks)

    def rows(out: Path, name: str) -> list[dict]:
        return sorted(
            (r.asDict(recursive=True) for r in table(spark, str(out), name).collect()),
            key=lambda r: tuple(str(v) for v in r.values()),
        )

    assert rows(tmp_path / "out-copied", "acks") == rows(tmp_path / "out-plain", "acks")
    n_again = {parse(d).message_id: again.count(d) for d in again}
    first = {parse(d).message_id: k for k, (_, _, d) in reversed(list(enumerate(sim.channel)))}
    for r in table(spark, str(tmp_path / "out-copied"), "messages").collect():
        assert r["copies"] == 1 + n_again.get(r["message_id"], 0), r["message_id"]
        assert r["first_index"] == first[r["message_id"]]
    # rows left out (the later copies) and none: the same bytes as pyarrow's writer's
    assert_messages_as_pyarrow_writes_them(tmp_path / "out-copied", tmp_path)
    assert_messages_as_pyarrow_writes_them(tmp_path / "out-plain", tmp_path)


def test_a_channel_of_bad_records_only_gives_empty_tables_with_their_columns(spark, tmp_path):
    """Nothing decodes: every record is a reject, and ``messages`` (written by the job's own
    tasks, not Spark's writer) is still a table with its columns and no rows."""
    data_dir = tmp_path / "data"
    with open_log(data_dir) as log:
        log.create_stream(STREAM)
        positions = log.append_many(
            STREAM, [Entry(b"\xff\xff not protobuf %d" % i) for i in range(3)]
        )
    summary = audit(spark, data_dir, tmp_path / "out", report=False)
    assert summary.rejects == 3 and summary.content_messages == 0
    out = str(tmp_path / "out")
    assert sorted(r["index"] for r in table(spark, out, "rejects").collect()) == positions
    messages = table(spark, out, "messages")
    assert messages.count() == 0
    assert messages.columns == list(MESSAGES_COLUMNS)


def test_options_are_checked_before_any_work(tmp_path):
    data = tmp_path / "data"
    with open_log(data) as log:
        log.create_stream(STREAM)
    with pytest.raises(BadOption, match="--data-dir"):
        SdsAuditOptions(str(tmp_path / "nope"), STREAM, str(tmp_path / "o")).validate()
    with pytest.raises(BadOption, match="--stream"):
        SdsAuditOptions(str(data), "no/such", str(tmp_path / "o")).validate()
    with pytest.raises(BadOption, match="--stream"):
        SdsAuditOptions(str(data), "sds.absent", str(tmp_path / "o")).validate()
    with pytest.raises(BadOption, match="--partition"):
        SdsAuditOptions(str(data), STREAM, str(tmp_path / "o"), partition=-1).validate()
    (tmp_path / "file").write_text("x")
    with pytest.raises(BadOption, match="--out"):
        SdsAuditOptions(str(data), STREAM, str(tmp_path / "file")).validate()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "precious").write_text("x")
    with pytest.raises(BadOption, match="--out"):
        SdsAuditOptions(str(data), STREAM, str(tmp_path / "full")).validate()
    assert SdsAuditOptions(str(data), STREAM, str(tmp_path / "o")).validate().channel == "sim"
