"""The loglake binding: a stream as broadcast channel and store node (loglake.sds.channel)."""

from __future__ import annotations

import pytest

from loglake.log import MemoryLog
from loglake.sds.channel import SdsChannel, decode_hint, encode_hint
from loglake.sds.chat import ChatSession
from loglake.sds.events import MessageAcknowledged, MessageDelivered, MessagesMissing
from loglake.streams.api import LocalStreams
from tests.waiting import wait_until


def test_hint_bytes_are_version_name_partition_index() -> None:
    # the layout documented in channel.py / docs/sds.md
    assert encode_hint("sds.c", 2, 7).hex() == "01" + "0005" + b"sds.c".hex() + "00000002" + (
        "0000000000000007"
    )
    assert decode_hint(encode_hint("sds.room", 0, 2**40)) == ("sds.room", 0, 2**40)


@pytest.mark.parametrize("hint", [None, b"", b"\x02abc", b"\x01\x00\x05sds", bytes(32)])
def test_foreign_hints_are_not_ours(hint) -> None:
    assert decode_hint(hint) is None


@pytest.fixture
def streams() -> LocalStreams:
    return LocalStreams(MemoryLog())


def test_messages_travel_on_the_stream_with_position_hints(streams, clock) -> None:
    alice = SdsChannel(streams, "room", "alice", clock=clock)
    bob = SdsChannel(streams, "room", "bob", clock=clock)
    m = alice.send(b"hello").to_send[0]
    (d,) = bob.poll().of(MessageDelivered)
    assert d.content == b"hello" and decode_hint(d.retrieval_hint) == ("sds.room", 0, 0)
    bob.send(b"hi alice")
    out = alice.poll()
    assert MessageAcknowledged(m.message_id) in out.of(MessageAcknowledged)
    assert alice.participant.log_ids() == bob.participant.log_ids()


def test_late_joiner_fetches_missing_history_by_hint(streams, clock) -> None:
    alice = SdsChannel(streams, "room", "alice", clock=clock)
    for i in range(5):
        clock.advance(1)
        alice.send(b"old %d" % i)
    carol = SdsChannel(streams, "room", "carol", clock=clock, from_index=None)  # live tail
    assert carol.next_index == 5
    alice.send(b"new")
    out = carol.poll()
    assert out.of(MessagesMissing)
    assert [d.content for d in out.of(MessageDelivered)] == [
        b"old 0",
        b"old 1",
        b"old 2",
        b"old 3",
        b"old 4",
        b"new",
    ]
    assert carol.participant.log_ids() == alice.participant.log_ids()
    assert not carol.participant.missing and not carol.participant.pending


def test_chat_session_shows_delivery_and_ack_state(streams, clock) -> None:
    a = ChatSession(SdsChannel(streams, "room", "alice", clock=clock))
    b = ChatSession(SdsChannel(streams, "room", "bob", clock=clock))
    a.say("hi bob")
    (row,) = a.take_changes()
    assert (row.sender, row.text, row.state) == ("alice", "hi bob", "sent")
    b.step()
    (seen,) = b.take_changes()
    assert (seen.sender, seen.text, seen.state) == ("alice", "hi bob", "delivered")
    b.say("hi alice")
    a.step()
    rows = {r.text: r.state for r in a.ordered()}
    assert rows == {"hi bob": "acknowledged", "hi alice": "delivered"}
    assert [r.text for r in a.ordered()] == [r.text for r in b.ordered()]


def test_chat_over_a_running_stream_server(clock) -> None:
    from loglake.streams.client import StreamClient
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    with (
        BackgroundServer(StreamService(MemoryLog())) as srv,
        StreamClient("127.0.0.1", srv.port) as c1,
        StreamClient("127.0.0.1", srv.port) as c2,
    ):
        a = ChatSession(SdsChannel(c1, "tcp", "alice", clock=clock))
        b = ChatSession(SdsChannel(c2, "tcp", "bob", clock=clock))
        a.say("over tcp")
        b.step()
        b.say("ack")
        a.step()
        assert {r.text: r.state for r in a.ordered()} == {
            "over tcp": "acknowledged",
            "ack": "delivered",
        }


@pytest.mark.slow
def test_loglake_sds_chat_command_end_to_end() -> None:
    """`loglake sds chat` as a process, talking to a Python participant through a server."""
    import os
    import subprocess
    import sys
    import threading

    from loglake.streams.client import StreamClient
    from loglake.streams.server import BackgroundServer
    from loglake.streams.service import StreamService

    with (
        BackgroundServer(StreamService(MemoryLog())) as srv,
        StreamClient("127.0.0.1", srv.port) as client,
    ):
        bob = ChatSession(SdsChannel(client, "cli", "bob"))
        args = ["sds", "chat", "--channel", "cli", "--id", "alice", "--port", str(srv.port)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "loglake.cli", *args, "--interval", "0.1"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # each printed row arrives at once
        )
        out_lines: list[str] = []
        err_lines: list[str] = []
        readers = [
            threading.Thread(target=lambda f=f, into=into: into.extend(f), daemon=True)
            for f, into in ((proc.stdout, out_lines), (proc.stderr, err_lines))
        ]
        for r in readers:
            r.start()

        def alice_running() -> None:
            assert proc.poll() is None, f"chat exited early: {''.join(err_lines)}"

        def bob_has_hello() -> bool:
            alice_running()
            bob.step()
            return any(r.text == "hello from cli" for r in bob.rows.values())

        def alice_printed(*rows: str) -> bool:
            alice_running()
            out = "".join(out_lines)
            return all(row in out for row in rows)

        try:
            assert proc.stdin is not None
            proc.stdin.write("hello from cli\n")
            proc.stdin.flush()
            wait_until(bob_has_hello, 30, "bob receiving alice's line")
            bob.say("hi cli")
            wait_until(
                lambda: alice_printed("bob: hi cli (delivered)", "hello from cli (acknowledged)"),
                30,
                "alice delivering bob's reply, which acknowledges her line",
            )
            proc.stdin.write("/quit\n")
            proc.stdin.flush()
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for r in readers:
            r.join(timeout=10)
    out, err = "".join(out_lines), "".join(err_lines)
    assert proc.returncode == 0, err
    assert "alice: hello from cli (sent)" in out
    assert "alice: hello from cli (acknowledged)" in out
    assert "bob: hi cli (delivered)" in out


def test_periodic_sync_after_silence_acknowledges(streams, clock) -> None:
    alice = SdsChannel(streams, "room", "alice", clock=clock, sync_interval_ms=5_000)
    bob = SdsChannel(streams, "room", "bob", clock=clock, sync_interval_ms=5_000)
    m = alice.send(b"anyone?").to_send[0]
    bob.poll()
    assert bob.tick().to_send == []  # not silent long enough
    clock.advance(5_000)
    (sync,) = bob.tick().to_send
    assert sync.kind.value == "sync"
    assert alice.poll().of(MessageAcknowledged) == [MessageAcknowledged(m.message_id)]
    assert bob.tick().to_send == []  # the sync itself counts as activity


def test_history_survives_in_the_durable_log(tmp_path, clock) -> None:
    """The store node is the embedded, crash-safe log: a participant joining after a restart
    recovers the channel from it."""
    from loglake.log import open_log

    log = open_log(tmp_path)
    try:
        alice = SdsChannel(LocalStreams(log), "room", "alice", clock=clock)
        for i in range(3):
            clock.advance(1)
            alice.send(b"kept %d" % i)
        expected = alice.participant.log_ids()
    finally:
        log.close()
    log = open_log(tmp_path)
    try:
        carol = SdsChannel(LocalStreams(log), "room", "carol", clock=clock)
        out = carol.poll()
        assert [d.content for d in out.of(MessageDelivered)] == [b"kept 0", b"kept 1", b"kept 2"]
        assert carol.participant.log_ids() == expected
    finally:
        log.close()


def _settle(streams: LocalStreams, clock, chans: list[SdsChannel], seconds: int) -> int:
    """Run node-like rounds (every participant polls then ticks, 200 ms apart) for ``seconds``
    of the fake clock; return how many records the channel's stream holds afterwards."""
    for _ in range(seconds * 5):
        for ch in chans:
            ch.poll()
            ch.tick()
        clock.advance(200)
    return len(streams.pull("sds.room", 0, 100_000))


@pytest.mark.parametrize("only_when_needed", [True, False])
def test_a_settled_channel_stops_syncing_only_when_asked(streams, clock, only_when_needed) -> None:
    """A node's two participants wrote a ~19 kB sync record every 2 s forever after one 9-byte
    message. With ``sync_only_when_needed`` they sync until every message is acknowledged and
    every ack given, then the stream stays still; without it the spec's periodic sync goes on."""
    chans = [
        SdsChannel(
            streams, "room", p, clock=clock, sync_interval_ms=2000,
            sync_only_when_needed=only_when_needed,
        )
        for p in ("alice", "bob")
    ]  # fmt: skip
    (sent,) = chans[0].send(b"hi bob, 9").to_send
    settled = _settle(streams, clock, chans, 20)
    assert not chans[0].participant.unacked and not chans[0].participant.possibly_acked
    assert sent.message_id in chans[1].participant.log_ids()
    later = _settle(streams, clock, chans, 60)
    if only_when_needed:
        assert later == settled <= 4  # the message and at most a few syncs carrying the acks
    else:
        assert later >= settled + 25  # a sync every interval (a peer's sync backs the other off)
    # the quiet channel wakes up for new content and settles again
    chans[1].send(b"and again")
    again = _settle(streams, clock, chans, 20)
    assert not chans[1].participant.unacked and not chans[1].participant.possibly_acked
    if only_when_needed:
        assert _settle(streams, clock, chans, 20) == again <= settled + 4


def test_a_participant_resumed_from_the_stream_takes_its_own_messages_back(streams, clock):
    """A node taking a participant over (its former node died, its state with it) starts it
    from the channel's stream: its own earlier messages go back into its local log (they are
    its history: the spec's log holds every message of the channel), so a message naming
    one of them is delivered at once, not left waiting for a dependency it would drop as its
    own when fetched, until marked lost; and its next message names them and goes on from
    their Lamport timestamps."""
    alice = SdsChannel(streams, "room", "alice", clock=clock)
    bob = SdsChannel(streams, "room", "bob", clock=clock)
    clock.advance(1)
    mine = [alice.send(b"alice %d" % i).to_send[0].message_id for i in range(3)]
    bob.poll()
    clock.advance(1)
    reply = bob.send(b"bob names alice's messages").to_send[0]
    high = alice.participant.lamport
    clock.t -= 60_000  # the new node's clock is behind the old one's

    resumed = SdsChannel(streams, "room", "alice", clock=clock)  # new state, from index 0
    out = resumed.poll()
    assert [d.content for d in out.of(MessageDelivered)] == [b"bob names alice's messages"]
    assert not out.of(MessagesMissing) and not resumed.participant.missing
    assert resumed.participant.log_ids() == [*mine, reply.message_id]
    assert resumed.participant.lamport > high
    nxt = resumed.send(b"alice again").to_send[0]
    (d,) = bob.poll().of(MessageDelivered)
    assert d.content == b"alice again"
    from loglake.sds.codec import parse, parse_entry

    pb = parse(nxt.data)
    assert [parse_entry(e).message_id for e in pb.causal_history][-4:] == [
        *mine,
        reply.message_id,
    ]
    assert pb.lamport_timestamp > high
    assert not resumed.participant.unacked.keys() & set(mine)  # resending is not its work


def test_a_participant_resumed_at_the_tail_fetches_its_own_messages_into_its_log(streams, clock):
    """Resumed from the stream's tail instead, it finds its own earlier messages missing when
    a later message names them, fetches them by hint like any dependency, and takes them
    back: the message that named them is delivered on the same poll."""
    alice = SdsChannel(streams, "room", "alice", clock=clock)
    bob = SdsChannel(streams, "room", "bob", clock=clock)
    mine = [alice.send(b"alice %d" % i).to_send[0].message_id for i in range(2)]
    resumed = SdsChannel(streams, "room", "alice", clock=clock, from_index=None)
    bob.poll()
    clock.advance(1)
    bob.send(b"bob names them")
    out = resumed.poll()
    assert {e.message_id for ev in out.of(MessagesMissing) for e in ev.entries} == set(mine)
    assert [d.content for d in out.of(MessageDelivered)] == [b"bob names them"]
    assert not resumed.participant.missing and not resumed.participant.pending
    assert set(mine) <= set(resumed.participant.log_ids())


def test_records_retention_removed_are_skipped_with_a_warning(streams, clock, caplog) -> None:
    alice = SdsChannel(streams, "room", "alice", clock=clock)
    for i in range(5):
        clock.advance(1)
        alice.send(b"m %d" % i)
    bob = SdsChannel(streams, "room", "bob", clock=clock)  # from index 0
    streams.log.truncate_before("sds.room", 3)  # retention took records 0-2
    with caplog.at_level("WARNING", "loglake.sds.channel"):
        bob.poll()
    assert bob.next_index == 5
    [r] = [r for r in caplog.records if "no longer kept" in r.getMessage()]
    assert (r.fields["first_missing"], r.fields["next_kept"]) == (0, 3)
