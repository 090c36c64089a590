"""The state behind ``loglake sds chat``: what each message's line shows.

Kept apart from the terminal so it can be tested without one: ``ChatSession.say`` sends a line,
``ChatSession.step`` polls and ticks the channel, and ``ChatSession.rows`` is what the screen
shows — one row per message with its state (own messages: sent → possibly acknowledged (n) →
acknowledged; others: delivered), plus notices for missing and lost messages.

A line is not sent as its bytes: an SDS message id is the SHA-256 of the content (as
@waku/sds's ``getMessageId``), so a line someone already said ("ok") would have an id already
taken, and every peer would drop it as a duplicate (and a member could block a predictable
line by sending it first). Each line goes in an envelope that makes it unique::

    00 4c 4c 43          magic: NUL "LLC" (no text line starts with NUL)
    01                   version
    u64 big-endian       send time, ms since the epoch (the channel's clock)
    16 bytes             random nonce (``secrets``)
    u16 big-endian n     length of the sender id in bytes
    n bytes              sender id, UTF-8 (the message's SDS sender id)
    rest                 the line, UTF-8

A received payload that is not such an envelope, or whose sender id is not the message's (any
other SDS application on the channel, the node API's text), is shown as its bytes read as UTF-8
(invalid bytes as U+FFFD) on a row marked ``plain``. ``printable`` is what the terminal gets of
any peer-supplied string: control characters a terminal would act on, made visible.
"""

from __future__ import annotations

import re
import secrets
import struct
from dataclasses import dataclass, field

from loglake.sds.channel import SdsChannel
from loglake.sds.events import (
    EphemeralReceived,
    MessageAcknowledged,
    MessageDelivered,
    MessageDropped,
    MessagePossiblyAcknowledged,
    MessageSent,
    MessagesLost,
    MessagesMissing,
    Output,
)

ENVELOPE_MAGIC = b"\x00LLC"
ENVELOPE_VERSION = 1
NONCE_BYTES = 16
_HEAD = struct.Struct(">BQ16sH")  # version, send time, nonce, sender id length


@dataclass(frozen=True, slots=True)
class Envelope:
    """One chat line as sent: who, when, a nonce that makes it unique, and the text."""

    sender_id: str
    sent_ms: int
    nonce: bytes
    text: str


def encode_envelope(sender_id: str, text: str, sent_ms: int, nonce: bytes | None = None) -> bytes:
    """The payload of one chat line (a fresh random nonce unless one is given)."""
    nonce = secrets.token_bytes(NONCE_BYTES) if nonce is None else nonce
    sender = sender_id.encode()
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"the nonce must be {NONCE_BYTES} bytes")
    if len(sender) > 0xFFFF:
        raise ValueError("sender id too long for a chat envelope")
    head = _HEAD.pack(ENVELOPE_VERSION, sent_ms, nonce, len(sender))
    return ENVELOPE_MAGIC + head + sender + text.encode()


def decode_envelope(payload: bytes) -> Envelope | None:
    """The envelope in ``payload``, or None if it is not a version-1 chat envelope."""
    if not payload.startswith(ENVELOPE_MAGIC):
        return None
    start = len(ENVELOPE_MAGIC)
    if len(payload) < start + _HEAD.size:
        return None
    version, sent_ms, nonce, n = _HEAD.unpack_from(payload, start)
    start += _HEAD.size
    if version != ENVELOPE_VERSION or len(payload) < start + n:
        return None
    try:
        sender = payload[start : start + n].decode()
    except UnicodeDecodeError:
        return None
    text = payload[start + n :].decode(errors="replace")
    return Envelope(sender, sent_ms, nonce, text)


_CONTROLS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every C0 control but tab, DEL and every C1 control (U+0080–U+009F)
    written as a visible ``\\xNN``, and the bidirectional controls (U+200E, U+200F,
    U+202A–U+202E, U+2066–U+2069) and line and paragraph separators (U+2028, U+2029) as
    ``\\uNNNN``: what a terminal would act on (ESC sequences, the 8-bit CSI U+009B, newlines
    that fake a row, a right-to-left override that reverses how a line reads) shown instead.
    Apply before any markup escaping."""
    return _CONTROLS.sub(_visible, text)


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}"


def text_of(sender_id: str, content: bytes) -> tuple[str, bool]:
    """(the text to show, whether it is plain: not a chat envelope of ``sender_id``)."""
    env = decode_envelope(content)
    if env is not None and env.sender_id == sender_id:
        return env.text, False
    return content.decode(errors="replace"), True


@dataclass
class ChatRow:
    message_id: str
    sender: str
    text: str
    state: str  # sent | possibly acknowledged (n) | acknowledged | delivered
    lamport: int = 0
    plain: bool = False  # not a chat envelope: the payload's bytes as UTF-8 (module docstring)


@dataclass
class ChatSession:
    channel: SdsChannel
    rows: dict[str, ChatRow] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)

    @property
    def me(self) -> str:
        return self.channel.participant.participant_id

    def apply(self, out: Output, texts: dict[str, bytes] | None = None) -> None:
        for e in out.events:
            if isinstance(e, MessageSent):
                text, plain = text_of(self.me, (texts or {}).get(e.message_id, b""))
                self.rows[e.message_id] = ChatRow(
                    e.message_id, self.me, text, "sent", e.lamport_timestamp, plain
                )
            elif isinstance(e, MessageDelivered):
                text, plain = text_of(e.sender_id, e.content)
                self.rows[e.message_id] = ChatRow(
                    e.message_id, e.sender_id, text, "delivered", e.lamport_timestamp, plain
                )
            elif isinstance(e, MessagePossiblyAcknowledged):
                if e.message_id in self.rows:
                    self.rows[e.message_id].state = f"possibly acknowledged ({e.count})"
            elif isinstance(e, MessageAcknowledged):
                if e.message_id in self.rows:
                    self.rows[e.message_id].state = "acknowledged"
            elif isinstance(e, EphemeralReceived):
                self.notices.append(f"{e.sender_id}: {text_of(e.sender_id, e.content)[0]}")
                continue
            elif isinstance(e, MessagesMissing):
                self.notices.append(f"missing {len(e.entries)} message(s); fetching")
                continue
            elif isinstance(e, MessagesLost):
                self.notices.append(f"{len(e.entries)} message(s) irretrievably lost")
                continue
            elif isinstance(e, MessageDropped):
                self.notices.append(f"dropped a message: {e.reason.value}")
                continue
            else:
                continue
            self.changed.append(e.message_id)

    def say(self, text: str) -> None:
        """Send one line, in an envelope (module docstring): the same line said twice, or by
        two participants, is two messages."""
        data = encode_envelope(self.me, text, int(self.channel.clock()))
        out = self.channel.send(data)
        self.apply(out, {o.message_id: data for o in out.to_send})

    def step(self) -> None:
        self.apply(self.channel.poll())
        self.apply(self.channel.tick())

    def ordered(self) -> list[ChatRow]:
        """Rows in the SDS log order (lamport, message id)."""
        return sorted(self.rows.values(), key=lambda r: (r.lamport, r.message_id))

    def take_changes(self) -> list[ChatRow]:
        ids, self.changed = self.changed, []
        return [self.rows[i] for i in dict.fromkeys(ids)]  # each once, first change first
