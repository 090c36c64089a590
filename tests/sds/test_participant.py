"""The participant against the spec's protocol steps, one test per rule
(specs/sds-scalable-data-sync.txt, "Protocol Steps"), with @waku/sds's choices where noted."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loglake.sds import errors
from loglake.sds.codec import UINT64_MAX, decode, encode, encode_message_fast
from loglake.sds.errors import DropReason, SdsLocalError
from loglake.sds.events import (
    EphemeralReceived,
    MessageAcknowledged,
    MessageDelivered,
    MessageDropped,
    MessagePossiblyAcknowledged,
    MessagesLost,
    MessagesMissing,
    SyncReceived,
)
from loglake.sds.messages import HistoryEntry, MessageKind, SdsMessage, message_id_of
from loglake.sds.participant import Participant

mid = message_id_of


def content(
    sender: str, body: bytes, lamport: int, history: tuple[HistoryEntry, ...] = ()
) -> SdsMessage:
    """A content message under its true id (the SHA-256 of its content)."""
    return SdsMessage(sender, mid(body), "chan", lamport, history, None, (), body)


def test_lamport_starts_at_clock_and_send_uses_max_now_or_plus_one(make, clock) -> None:
    a = make("a")
    assert a.lamport == clock.t
    m1 = decode(a.send(b"1").to_send[0].data)
    assert m1.lamport_timestamp == clock.t + 1  # current + 1 > now
    clock.advance(1000)
    m2 = decode(a.send(b"2").to_send[0].data)
    assert m2.lamport_timestamp == clock.t  # now > current + 1


def test_delivery_raises_lamport_to_received(make, clock) -> None:
    a, b = make("a"), make("b")
    clock.advance(5000)
    data = a.send(b"x").to_send[0].data
    clock.t -= 5000
    b.lamport = clock.t
    b.receive(data)
    assert b.lamport == decode(data).lamport_timestamp


def test_a_peers_largest_lamport_holds_ours_there_instead_of_wrapping(make, clock) -> None:
    # A peer's lamport 2^64 - 1 is a valid uint64 and raises our clock to it. Our next sends
    # stay at 2^64 - 1: what peers read is what we log. Before, the next send was 2^64, which
    # the fast encoder wrote as an 11-byte varint that readers cut to 0 (our later messages
    # ordered before the whole channel by every peer, last in our own log). (With the
    # default max_lamport_lead_ms the clock does not follow a peer there at all.)
    a, b = make("a", max_lamport_lead_ms=None), make("b", max_lamport_lead_ms=None)
    evil = SdsMessage("mallory", message_id_of(b"hi"), "chan", UINT64_MAX, (), None, (), b"hi")
    a.receive(encode(evil))
    b.receive(encode(evil))
    assert a.lamport == UINT64_MAX
    for text in (b"1", b"2"):
        data = a.send(text).to_send[0].data
        sent = decode(data)
        assert sent.lamport_timestamp == UINT64_MAX
        assert a.log.records[sent.message_id].lamport_timestamp == UINT64_MAX
        b.receive(data)
        assert b.log.records[sent.message_id].lamport_timestamp == UINT64_MAX


def test_both_encoders_refuse_a_lamport_past_uint64(make) -> None:
    msg = SdsMessage("a", "m", "chan", UINT64_MAX + 1, (), None, (), b"x")
    with pytest.raises(ValueError, match="not a uint64"):
        encode(msg)
    with pytest.raises(ValueError, match="not a uint64"):
        encode_message_fast(msg)


def test_made_up_dependencies_keep_the_buffers_bounded(make, clock) -> None:
    # With no lost-message timeout (the default), what a message waited for left only when it
    # came: a peer naming 1,000 made-up ids a message had 20,000 sought after 20 messages,
    # and its messages waited for good. Past ``max_missing`` the oldest sought ids are given
    # up as the timeout would: reported lost, their dependents delivered.
    a = make("a", max_missing=2_500)
    lost, delivered = [], []
    for i in range(20):
        ghosts = tuple(HistoryEntry(f"ghost-{i}-{j}") for j in range(1000))
        out = a.receive(encode(content("mallory", b"m%d" % i, clock.t, ghosts)))
        lost += [e.message_id for ev in out.of(MessagesLost) for e in ev.entries]
        delivered += [e.message_id for e in out.of(MessageDelivered)]
        assert len(a.missing) <= 2_500 and len(a._waiters) <= 2_500 + 1000
    assert len(lost) == 20_000 - len(a.missing) and lost[:3] == [
        "ghost-0-0",
        "ghost-0-1",
        "ghost-0-2",
    ]
    assert delivered == [mid(b"m%d" % i) for i in range(len(delivered))] and len(delivered) >= 17
    assert set(a.pending) == {mid(b"m%d" % i) for i in range(len(delivered), 20)}


def test_the_incoming_buffer_is_bounded_in_messages_and_bytes(make, clock) -> None:
    # Messages waiting for dependencies that do not come: past ``max_pending`` messages, or
    # ``max_pending_bytes`` of them, the oldest is delivered without them (reported lost).
    a = make("a", max_pending=50)
    for i in range(200):
        gone = (HistoryEntry(f"never-{i}"),)
        a.receive(encode(content("b", b"m%d" % i, clock.t, gone)))
        assert len(a.pending) <= 50
    assert set(a.pending) == {mid(b"m%d" % i) for i in range(150, 200)}
    assert {f"never-{i}" for i in range(150)} <= set(a.lost)
    # in bytes; and the messages that waited for what is given up go with the oldest
    b = make("b", max_pending_bytes=1_000_000)
    never = (HistoryEntry("never-sent"),)
    for i in range(30):
        body = b"%d" % i + b"." * 50_000
        out = b.receive(encode(content("c", body, clock.t, never)))
        assert b._pending_bytes <= 1_000_000
        if out.of(MessagesLost):
            assert not b.pending and len(out.of(MessageDelivered)) == i + 1
            break
    else:
        raise AssertionError("never given up")
    out = b.receive(encode(content("c", b"late", clock.t, never)))
    # lost: not waited for
    assert [e.message_id for e in out.of(MessageDelivered)] == [mid(b"late")]


def test_the_ids_remembered_as_lost_are_bounded(make, clock) -> None:
    a = make("a", max_missing=1, max_lost=100)
    for i in range(300):
        a.receive(
            encode(
                SdsMessage("b", f"s{i}", "chan", clock.t, (HistoryEntry(f"g{i}"),), None, (), None)
            )
        )
    assert len(a.lost) == 100 and "g298" in a.lost and "g0" not in a.lost


def test_content_message_carries_history_bloom_and_content(make) -> None:
    a, b = make("a"), make("b")
    d1 = a.send(b"one").to_send[0].data
    b.receive(d1, b"hint-1")
    m = decode(b.send(b"two").to_send[0].data)
    assert m.kind is MessageKind.CONTENT
    assert m.causal_history == (HistoryEntry(message_id_of(b"one"), b"hint-1", "a"),)
    assert m.bloom_filter is not None and len(m.bloom_filter) == 18_752
    assert m.message_id == message_id_of(b"two") and m.content == b"two"


def test_causal_history_is_the_last_n_in_log_order(make) -> None:
    a = make("a", causal_history_size=2)
    for i in range(5):
        a.send(b"%d" % i)
    m = decode(a.send(b"x").to_send[0].data)
    assert [e.message_id for e in m.causal_history] == a.log_ids()[3:5]


def test_local_log_orders_by_lamport_then_message_id(make) -> None:
    c = make("c")
    msgs = [
        SdsMessage("a", message_id_of(b"p"), "chan", 10, content=b"p"),
        SdsMessage("b", message_id_of(b"q"), "chan", 10, content=b"q"),
        SdsMessage("b", message_id_of(b"r"), "chan", 5, content=b"r"),
    ]
    for m in msgs:
        c.receive(encode(m))
    expected = sorted((m.lamport_timestamp, m.message_id) for m in msgs)
    assert c.log_ids() == [mid for _, mid in expected]


def test_unmet_dependencies_buffer_then_deliver_in_order(make) -> None:
    a, b = make("a"), make("b")
    d1 = a.send(b"1").to_send[0].data
    d2 = a.send(b"2").to_send[0].data
    out = b.receive(d2)
    assert not out.of(MessageDelivered)
    (missing,) = out.of(MessagesMissing)
    assert [e.message_id for e in missing.entries] == [message_id_of(b"1")]
    assert missing.entries[0].sender_id == "a"
    out = b.receive(d1)
    assert [e.content for e in out.of(MessageDelivered)] == [b"1", b"2"]
    assert b.log_ids() == a.log_ids()
    assert not b.pending and not b.missing


def test_dependency_in_incoming_buffer_is_waited_for_not_missing(make) -> None:
    a, b = make("a"), make("b")
    d1, d2, d3 = (a.send(b"%d" % i).to_send[0].data for i in (1, 2, 3))
    b.receive(d2)
    out = b.receive(d3)  # depends on 1 (missing) and 2 (buffered)
    assert not out.of(MessageDelivered)
    (missing,) = out.of(MessagesMissing)
    assert [e.message_id for e in missing.entries] == [message_id_of(b"1")]  # not 2
    out = b.receive(d1)
    assert [e.content for e in out.of(MessageDelivered)] == [b"1", b"2", b"3"]


def test_causal_history_acknowledges(make) -> None:
    a, b = make("a"), make("b")
    d = a.send(b"x").to_send[0]
    b.receive(d.data)
    out = a.receive(b.send(b"y").to_send[0].data)
    assert out.of(MessageAcknowledged) == [MessageAcknowledged(d.message_id)]
    assert a.outgoing_ids() == []


def test_bloom_filter_possibly_acknowledges_until_threshold(make) -> None:
    a, b, c = make("a"), make("b", causal_history_size=0), make("c", causal_history_size=0)
    d = a.send(b"x").to_send[0]
    c.receive(d.data)
    s1 = c.make_sync("s1")  # no causal history, only a bloom filter
    assert s1.to_send == []  # @waku/sds: nothing to carry without history → not sent
    c2 = c.send(b"from c").to_send[0].data
    out = a.receive(c2)
    assert out.of(MessagePossiblyAcknowledged) == [MessagePossiblyAcknowledged(d.message_id, 1)]
    b.receive(d.data)
    out = a.receive(b.send(b"from b").to_send[0].data)
    assert out.of(MessageAcknowledged) == [MessageAcknowledged(d.message_id, True)]
    assert a.outgoing_ids() == []


def test_sync_message_processed_but_not_stored(make) -> None:
    a, b = make("a"), make("b")
    b.receive(a.send(b"x").to_send[0].data)
    sync = b.make_sync()
    (o,) = sync.to_send
    m = decode(o.data)
    assert m.kind is MessageKind.SYNC and m.content is None and m.message_id.startswith("sync-")
    before = b.log_ids()
    out = a.receive(o.data)
    assert out.of(SyncReceived) and out.of(MessageAcknowledged)
    assert a.log_ids() == before and not a.bloom.lookup(m.message_id)
    assert b.outgoing_ids() == []


def test_ephemeral_has_no_lamport_history_or_bloom_and_is_not_stored(make) -> None:
    a, b = make("a"), make("b")
    a.send(b"x")
    (o,) = a.send_ephemeral(b"typing").to_send
    m = decode(o.data)
    assert (m.lamport_timestamp, m.causal_history, m.bloom_filter) == (None, (), None)
    out = b.receive(o.data)
    assert out.of(EphemeralReceived) == [EphemeralReceived(m.message_id, "a", b"typing")]
    assert b.log_ids() == [] and m.message_id not in a.outgoing_ids()


def test_own_duplicate_and_wrong_channel_are_dropped_with_reasons(make) -> None:
    a, b, x = make("a"), make("b"), make("x", channel="other")
    d = a.send(b"x").to_send[0].data
    assert a.receive(d).of(MessageDropped)[0].reason is DropReason.OWN_MESSAGE
    b.receive(d)
    assert b.receive(d).of(MessageDropped)[0].reason is DropReason.DUPLICATE
    assert x.receive(d).of(MessageDropped)[0].reason is DropReason.WRONG_CHANNEL


def _state(p: Participant):
    return (
        p.lamport,
        p.log_ids(),
        p.bloom.to_bytes(),
        copy.deepcopy(p.unacked),
        copy.deepcopy(p.possibly_acked),
        set(p.pending),
        dict(p.missing),
        len(p.repair.outgoing),
        len(p.repair.incoming),
    )


def test_wrong_length_bloom_filter_is_dropped_state_unchanged(make) -> None:
    a, b = make("a"), make("b")
    b.receive(a.send(b"x").to_send[0].data)
    b.send(b"mine")
    before = _state(b)
    bad = SdsMessage("a", message_id_of(b"y"), "chan", 99, bloom_filter=bytes(100), content=b"y")
    (ev,) = b.receive(encode(bad)).events
    assert ev.reason is DropReason.BAD_BLOOM_FILTER
    assert _state(b) == before


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=300))
def test_any_bytes_leave_state_unchanged_or_are_a_valid_message(make, data: bytes) -> None:
    a, b = make("a"), make("b")
    b.receive(a.send(b"x").to_send[0].data)
    before = _state(b)
    out = b.receive(data)
    dropped = out.of(MessageDropped)
    if dropped:
        assert out.events == dropped and out.to_send == []
        assert _state(b) == before


def test_mutated_valid_message_never_corrupts_state(make) -> None:
    a, b = make("a"), make("b")
    good = a.send(b"x").to_send[0].data
    for i in range(0, len(good), 97):
        mutated = good[:i] + bytes([good[i] ^ 0xFF]) + good[i + 1 :]
        before = _state(b)
        out = b.receive(mutated)
        if out.of(MessageDropped):
            assert _state(b) == before


def test_irretrievably_lost_after_timeout_then_dependents_delivered(make, clock) -> None:
    a, b = make("a"), make("b", timeout_for_lost_messages_ms=10_000)
    a.send(b"1")
    d2 = a.send(b"2").to_send[0].data
    b.receive(d2)
    assert not b.tick().events
    clock.advance(10_001)
    out = b.tick()
    (lost,) = out.of(MessagesLost)
    assert [e.message_id for e in lost.entries] == [message_id_of(b"1")]
    assert [e.content for e in out.of(MessageDelivered)] == [b"2"]


def test_resend_unacknowledged_after_period(make, clock) -> None:
    a = make("a", resend_unacked_ms=5_000)
    d = a.send(b"x").to_send[0]
    assert a.tick().to_send == []
    clock.advance(5_000)
    (o,) = a.tick().to_send
    assert o.data == d.data and o.reason == "resend"
    # @waku/sds: sending the same payload again while unacked resends the same bytes
    (o2,) = a.send(b"x").to_send
    assert o2.data == d.data


def test_sending_content_already_in_the_log_raises_and_changes_nothing(make, clock) -> None:
    """The spec: a message id MUST be globally unique; ids are the content's SHA-256, so a
    second message with content someone already sent is dropped by every peer that has the
    first (``DropReason.DUPLICATE``). Sending it raises instead of emitting it."""
    a, b, c = make("a"), make("b"), make("c")
    x = a.send(b"ok").to_send[0]
    b.receive(x.data)
    c.receive(x.data)
    before = (b.lamport, b.log_ids(), b.outgoing_ids(), b.bloom.to_bytes())
    clock.advance(1)
    with pytest.raises(SdsLocalError) as raised:
        b.send(b"ok")  # someone else's content
    assert isinstance(raised.value, errors.DuplicateContent)
    assert (raised.value.message_id, raised.value.sender_id) == (x.message_id, "a")
    assert (b.lamport, b.log_ids(), b.outgoing_ids(), b.bloom.to_bytes()) == before
    # a's own message, once acknowledged, is no retry either
    a.receive(b.send(b"seen").to_send[0].data)
    assert not a.outgoing_ids()
    with pytest.raises(errors.DuplicateContent):
        a.send(b"ok")
    # content waiting in the incoming buffer (its dependency absent) is known too
    dep = content("d", b"dep", clock.t)
    c.receive(encode(content("d", b"waits", clock.t + 1, (HistoryEntry(dep.message_id),))))
    assert mid(b"waits") in c.pending
    with pytest.raises(errors.DuplicateContent) as raised:
        c.send(b"waits")
    assert raised.value.sender_id == "d"
    # what stays possible: a retry of an own unacknowledged message (the same bytes)
    first = c.send(b"mine").to_send[0]
    (again,) = c.send(b"mine").to_send
    assert (again.data, again.reason) == (first.data, "resend")


def test_set_retrieval_hint_flows_into_next_history(make) -> None:
    a = make("a")
    d = a.send(b"x").to_send[0]
    a.set_retrieval_hint(d.message_id, b"\x01hint")
    m = decode(a.send(b"y").to_send[0].data)
    assert m.causal_history == (HistoryEntry(d.message_id, b"\x01hint", "a"),)


def test_oversized_fields_are_dropped_state_unchanged(make) -> None:
    from loglake.sds.codec import Limits

    a = make("a")
    b = make("b", limits=Limits(max_content_bytes=10, max_causal_history=3))
    b.receive(a.send(b"x").to_send[0].data)
    before = _state(b)
    big = encode(SdsMessage("a", message_id_of(b"y" * 11), "chan", 5, content=b"y" * 11))
    long_history = encode(
        SdsMessage("a", "m", "chan", 5, tuple(HistoryEntry(f"h{i}") for i in range(4)), None)
    )
    for data in (big, long_history):
        (ev,) = b.receive(data).events
        assert ev.reason is DropReason.OVERSIZED
    assert _state(b) == before


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(order=st.permutations(list(range(8))), history=st.sampled_from([1, 2, 200]))
def test_any_arrival_order_converges_to_the_same_log(make, clock, order, history) -> None:
    """Spec: all participants eventually reflect the same entries in the same order."""
    a, b = make("a", causal_history_size=history), make("b", causal_history_size=history)
    datas = []
    for i in range(8):
        clock.advance(1)
        s, d = (a, b) if i % 3 else (b, a)
        data = s.send(b"msg %d" % i).to_send[0].data
        d.receive(data)
        datas.append(data)
    c = make("c", causal_history_size=history)
    delivered = []
    for i in order:
        delivered += [e.message_id for e in c.receive(datas[i]).of(MessageDelivered)]
    assert sorted(delivered) == sorted(a.log_ids())
    assert c.log_ids() == a.log_ids() == b.log_ids()
    assert not c.pending and not c.missing


_ids = st.sampled_from([message_id_of(b"%d" % i) for i in range(6)] + ["x", "y"])
_entries = st.builds(
    HistoryEntry, _ids, st.none() | st.binary(max_size=4), st.none() | st.sampled_from(["a", "b"])
)
_messages = st.builds(
    SdsMessage,
    st.sampled_from(["a", "b", "c", "me"]),
    _ids,
    st.sampled_from(["chan", "chan", "other"]),
    st.none() | st.integers(0, 2**64 - 1),
    st.lists(_entries, max_size=4).map(tuple),
    st.none() | st.sampled_from([bytes(18_752), b"\xff" * 18_752, bytes(10)]),
    st.lists(_entries, max_size=3).map(tuple),
    st.none() | st.binary(max_size=3),
)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(msgs=st.lists(_messages, max_size=12), ticks=st.lists(st.integers(0, 200_000), max_size=3))
def test_arbitrary_message_sequences_keep_the_invariants(make, clock, msgs, ticks) -> None:
    p = make("me", timeout_for_lost_messages_ms=50_000)
    p.send(b"own")
    for m in msgs:
        if m.kind is None:
            continue
        p.receive(encode(m), b"hint")
        clock.advance(1000)
    for t in ticks:
        clock.advance(t)
        p.tick()
    keys = [(p.log.records[i].lamport_timestamp, i) for i in p.log_ids()]
    assert keys == sorted(keys) and len(set(p.log_ids())) == len(keys)
    assert not set(p.pending) & set(p.log_ids())
    assert not set(p.missing) & set(p.log_ids())
    for pid, pend in p.pending.items():
        assert pend.waiting and pid not in pend.waiting


def test_forged_dependency_cycle_is_broken_by_the_timeout(make, clock) -> None:
    c = make("c", timeout_for_lost_messages_ms=5_000)
    ia, ib = message_id_of(b"A"), message_id_of(b"B")
    a = SdsMessage("x", ia, "chan", 10, (HistoryEntry(ib),), content=b"A")
    b = SdsMessage("x", ib, "chan", 11, (HistoryEntry(ia),), content=b"B")
    selfref = SdsMessage(
        "x", message_id_of(b"S"), "chan", 12, (HistoryEntry(message_id_of(b"S")),), content=b"S"
    )
    assert c.receive(encode(selfref)).of(MessageDelivered)  # cannot wait for itself
    c.receive(encode(a))
    c.receive(encode(b))
    assert set(c.pending) == {ia, ib}
    clock.advance(5_001)
    out = c.tick()
    assert sorted(d.content for d in out.of(MessageDelivered)) == [b"A", b"B"]
    assert c.log_ids() == [ia, ib, selfref.message_id] and not c.pending


def test_restore_own_takes_back_only_own_content_messages_not_in_the_log(make, clock):
    """``restore_own`` (a participant resumed from the channel's store) puts its own content
    messages back into its log and wakes what waited for them; anything else leaves the state
    as it was."""
    old = make("alice")
    sent = [old.send(b"a%d" % i).to_send[0] for i in range(2)]
    sync = old.make_sync().to_send[0]
    ephemeral = old.send_ephemeral(b"e").to_send[0]
    other = make("alice", channel="elsewhere").send(b"x").to_send[0]
    bob = make("bob")
    for o in sent:
        bob.receive(o.data)
    reply = bob.send(b"names them").to_send[0]

    new = make("alice")
    got = new.receive(reply.data)  # before its own messages are back: it waits for them
    assert not got.of(MessageDelivered) and set(new.missing) == {o.message_id for o in sent}
    before = (new.log_ids(), new.lamport)
    for data in (sync.data, ephemeral.data, other.data, reply.data, b"\xff\x00 not sds", b""):
        assert new.restore_own(data).events == [] and (new.log_ids(), new.lamport) == before
    assert new.restore_own(sent[0].data).events == []  # the reply still waits for the other
    out = new.restore_own(sent[1].data)
    assert [d.content for d in out.of(MessageDelivered)] == [b"names them"]
    assert new.log_ids() == [*(o.message_id for o in sent), reply.message_id]
    assert not new.missing and not new.pending and not new.unacked
    assert new.restore_own(sent[0].data).events == [] and len(new.log_ids()) == 3  # once


@given(st.binary(max_size=300))
@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_restore_own_never_raises_on_any_bytes(make, data):
    p = make("alice")
    assert p.restore_own(data).events == [] and p.log_ids() == []
