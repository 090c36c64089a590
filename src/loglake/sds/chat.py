"""The state behind ``loglake sds chat``: what each message's line shows.

Kept apart from the terminal so it can be tested without one: ``ChatSession.say`` sends a line,
``ChatSession.step`` polls and ticks the channel, and ``ChatSession.rows`` is what the screen
shows — one row per message with its state (own messages: sent → possibly acknowledged (n) →
acknowledged; others: delivered), plus notices for missing and lost messages.
"""

from __future__ import annotations

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


@dataclass
class ChatRow:
    message_id: str
    sender: str
    text: str
    state: str  # sent | possibly acknowledged (n) | acknowledged | delivered
    lamport: int = 0


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
                text = (texts or {}).get(e.message_id, b"").decode(errors="replace")
                self.rows[e.message_id] = ChatRow(
                    e.message_id, self.me, text, "sent", e.lamport_timestamp
                )
            elif isinstance(e, MessageDelivered):
                self.rows[e.message_id] = ChatRow(
                    e.message_id,
                    e.sender_id,
                    e.content.decode(errors="replace"),
                    "delivered",
                    e.lamport_timestamp,
                )
            elif isinstance(e, MessagePossiblyAcknowledged):
                if e.message_id in self.rows:
                    self.rows[e.message_id].state = f"possibly acknowledged ({e.count})"
            elif isinstance(e, MessageAcknowledged):
                if e.message_id in self.rows:
                    self.rows[e.message_id].state = "acknowledged"
            elif isinstance(e, EphemeralReceived):
                self.notices.append(f"{e.sender_id}: {e.content.decode(errors='replace')}")
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
        data = text.encode()
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
