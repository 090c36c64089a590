"""``loglake sds chat``'s session (``loglake.sds.chat``): each line is a message of its own, and
payloads of other applications show as their text, over a running loglake stream server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from loglake.log import MemoryLog
from loglake.sds import chat
from loglake.sds.channel import SdsChannel
from loglake.sds.chat import ChatSession
from loglake.sds.events import MessageDropped
from loglake.streams.client import StreamClient
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService

Join = Callable[[str], SdsChannel]
MAGIC = b"\x00LLC"


def envelope(sender: str, text: str, version: int = 1, sent_ms: int = 5) -> bytes:
    """A chat envelope built by hand from the layout in ``loglake.sds.chat``'s docstring."""
    head = bytes([version]) + sent_ms.to_bytes(8, "big") + bytes(16)
    return MAGIC + head + len(sender.encode()).to_bytes(2, "big") + sender.encode() + text.encode()


@pytest.fixture
def join(clock) -> Iterator[Join]:
    """Participants of the channel ``room``, each with its own TCP client of one server."""
    with ExitStack() as stack:
        srv = stack.enter_context(BackgroundServer(StreamService(MemoryLog())))

        def _join(pid: str) -> SdsChannel:
            client = stack.enter_context(StreamClient("127.0.0.1", srv.port))
            return SdsChannel(client, "room", pid, clock=clock)

        yield _join


def rows(session: ChatSession) -> list[tuple[str, str]]:
    return [(r.sender, r.text) for r in session.ordered()]


def plain(session: ChatSession) -> list[bool]:
    return [r.plain for r in session.ordered()]


def test_a_line_said_again_or_by_another_member_is_a_message_of_its_own(join, clock) -> None:
    alice, bob, carol = (ChatSession(join(p)) for p in ("alice", "bob", "carol"))
    sessions = (alice, bob, carol)
    dropped: list[MessageDropped] = []

    def step_all() -> None:
        for s in sessions:
            clock.advance(10)
            out = s.channel.poll()
            dropped.extend(out.of(MessageDropped))
            s.apply(out)

    for who in (alice, bob, bob, carol):
        clock.advance(10)
        who.say("ok")
        step_all()
    said = [("alice", "ok"), ("bob", "ok"), ("bob", "ok"), ("carol", "ok")]
    for s in sessions:
        assert rows(s) == said
    assert not dropped  # no "duplicate" anywhere
    assert len({r.message_id for r in alice.ordered()}) == 4
    assert alice.channel.participant.log_ids() == carol.channel.participant.log_ids()
    # bob's own rows both stayed his and alice's stayed hers in his view
    states = ["delivered", "acknowledged", "acknowledged", "delivered"]
    assert [r.state for r in bob.ordered()] == states
    assert plain(alice) == plain(bob) == plain(carol) == [False] * 4


def test_a_member_who_sends_a_predictable_line_first_does_not_block_it(join, clock) -> None:
    mallory = join("mallory")
    alice, bob = ChatSession(join("alice")), ChatSession(join("bob"))
    for line in ("yes", "no", "ok"):  # the bare payloads, and envelopes guessed without nonce
        mallory.send(line.encode())
        mallory.send(envelope("alice", line, sent_ms=clock()))
    bob.step()
    clock.advance(10)
    alice.say("ok")
    bob.step()
    assert ("alice", "ok") in rows(bob)
    # mallory's bare lines show as plain text; her envelopes naming alice are not alice's
    assert ("mallory", "ok") in rows(bob)
    alices = [r for r in bob.ordered() if r.sender == "alice"]
    assert [(r.text, r.plain) for r in alices] == [("ok", False)]


def test_envelope_round_trip_and_layout() -> None:
    data = chat.encode_envelope("alice", "hé\tllo", 1_700_000_000_123, bytes(range(16)))
    assert chat.ENVELOPE_MAGIC == MAGIC
    assert data == (
        MAGIC
        + b"\x01"
        + (1_700_000_000_123).to_bytes(8, "big")
        + bytes(range(16))
        + b"\x00\x05alice"
        + "hé\tllo".encode()
    )
    assert envelope("alice", "hé\tllo", sent_ms=1_700_000_000_123) == data.replace(
        bytes(range(16)), bytes(16)
    )
    env = chat.decode_envelope(data)
    assert env is not None
    assert (env.sender_id, env.sent_ms, env.nonce, env.text) == (
        "alice",
        1_700_000_000_123,
        bytes(range(16)),
        "hé\tllo",
    )
    assert chat.encode_envelope("a", "x", 0) != chat.encode_envelope("a", "x", 0)  # fresh nonce


@pytest.mark.parametrize(
    ("payload", "shown"),
    [
        (b"plain text from another app", "plain text from another app"),
        (b"\xff\xfe not utf-8", "\ufffd\ufffd not utf-8"),
        (MAGIC, "\x00LLC"),  # truncated: the header is missing
        (MAGIC + b"\x01" + bytes(8), "\x00LLC\x01" + "\x00" * 8),
        (envelope("mallory", "v2", version=2), None),  # not a version we read
        # a sender id length past the end, and one that is not UTF-8
        (MAGIC + b"\x01" + bytes(24) + b"\xff\xff" + b"x", None),
        (MAGIC + b"\x01" + bytes(24) + b"\x00\x01" + b"\xff" + b"hi", None),
        (envelope("alice", "i am alice"), None),  # another member's envelope under mallory's id
    ],
)
def test_payloads_that_are_not_our_envelope_show_as_plain_text(
    join, clock, payload: bytes, shown: str | None
) -> None:
    mallory = join("mallory")
    alice = ChatSession(join("alice"))
    mallory.send(payload)
    mallory.send(envelope("mallory", "after it"))
    alice.step()
    expected = payload.decode(errors="replace") if shown is None else shown
    assert rows(alice) == [("mallory", expected), ("mallory", "after it")]
    assert plain(alice) == [True, False]


def test_printable_shows_bidi_overrides_and_line_separators() -> None:
    # a right-to-left override makes "exe.txt" read as "txt.exe" on a terminal that honours it
    assert chat.printable("a\u202etxt.exe\u2066b\u2069\u2028c\u200f") == (
        "a\\u202etxt.exe\\u2066b\\u2069\\u2028c\\u200f"
    )
    hebrew = "\u05e9\u05dc\u05d5\u05dd"
    assert chat.printable(hebrew) == hebrew  # right-to-left text itself shows as is


def test_printable_shows_terminal_controls_and_keeps_text() -> None:
    assert chat.printable("a\tb é € 😀 \u00a0[x]") == "a\tb é € 😀 \u00a0[x]"
    assert chat.printable("\x1bc\x1b[2J\n\r\x07\x00\x7f\u0085\u009b2J") == (
        "\\x1bc\\x1b[2J\\x0a\\x0d\\x07\\x00\\x7f\\x85\\x9b2J"
    )
