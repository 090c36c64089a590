"""A subscriber's inbox is read at least once, in replies of bounded size.

``loglake_inbox`` removed the notifications it returned before its reply was encoded and sent:
a reply the reader could not take (over the client's ``MAX_REPLY_BYTES`` — 1,000 events of up
to 1 MB each — a failed encoding, a dropped connection) lost them. Now a reply holds at most
``max_inbox_reply_bytes`` of notifications (at least one), and a notification is removed only
when a later call acknowledges the cursor of the reply that carried it. The core first (no
I/O), then a real subscriber server on loopback read by the real client.
"""

from __future__ import annotations

import socket
import time

import pytest
from icp_principal import Principal

from loglake.events import fastcodec
from loglake.events.client import (
    MAX_REPLY_BYTES,
    BadReply,
    CallRejected,
    HttpEventsClient,
    InboxReader,
    post_raw,
)
from loglake.events.codec import METHODS
from loglake.events.identity import Identity
from loglake.events.messages import EventNotification
from loglake.events.server import MAX_INBOX_REPLY_BYTES, HttpRoleServer
from loglake.events.subscriber import InboxCursorError, Subscriber
from tests.events.served import serve

NS = "com.example.inbox"
BC = Principal(bytes(range(29)))
KB = 1024


def _note(eid: int, size: int = 10) -> EventNotification:
    return EventNotification(eid + 1000, eid, None, 5, NS, {"Blob": bytes(size)}, None, BC)


def _subscriber(keep: int = 2_000_000, principal: Principal | None = None) -> Subscriber:
    sub = Subscriber(principal or Principal.anonymous(), Principal.anonymous(), keep=keep)
    sub.valid[NS] = {BC.bytes}  # what the orchestrator's broadcaster:add says
    return sub


def _ids(notes: list[EventNotification]) -> list[int]:
    return [n.event_id for n in notes]


def _size(n: EventNotification) -> int:
    return len(fastcodec.notification_bytes(n))


# -- the core ---------------------------------------------------------------------------------
def test_a_budget_takes_what_fits_and_the_rest_stays():
    sub = _subscriber()
    sub.handle_notification(BC, [_note(i, 100 * KB) for i in range(10)], 0)
    one = _size(_note(0, 100 * KB))
    got = sub.take(1000, max_bytes=3 * one + one // 2, size=_size)
    assert _ids(got) == [0, 1, 2]  # the fourth would pass the budget: it stays
    assert _ids(sub.take(2, max_bytes=10 * one, size=_size)) == [3, 4]  # n still counts
    assert _ids(sub.take(1000, max_bytes=1, size=_size)) == [5]  # at least one, over budget
    assert _ids(sub.take()) == [6, 7, 8, 9]
    assert sub.take() == [] and sub.inbox_first == sub.inbox_seq == 10


def test_peek_leaves_and_acknowledge_removes_by_number():
    sub = _subscriber()
    sub.handle_notification(BC, [_note(i) for i in range(5)], 0)
    assert _ids(sub.peek(3)) == [0, 1, 2]
    assert _ids(sub.peek(3)) == [0, 1, 2]  # still there
    assert sub.acknowledge(2) == 2 and sub.inbox_first == 2
    assert sub.acknowledge(1) == 0  # already removed: an old cursor removes nothing more
    with pytest.raises(InboxCursorError, match="cursor 6 is past the 5"):
        sub.acknowledge(6)
    assert _ids(sub.peek()) == [2, 3, 4]  # the refused acknowledgement removed nothing
    sub.handle_notification(BC, [_note(3), _note(5)], 0)  # a duplicate is not numbered
    assert sub.inbox_seq == 6 and _ids(sub.peek()) == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="go together"):
        sub.peek(1, max_bytes=10)


def test_a_batch_is_numbered_and_read_without_building_it_twice():
    sub = _subscriber()
    raw = fastcodec.encode_notifications([_note(i) for i in range(4)])
    batch = fastcodec.decode_notification_batch(raw)
    assert type(batch) is fastcodec.NotificationBatch
    sub.handle_notification(BC, batch, 0)
    assert sub.inbox_seq == 4
    assert _ids(sub.peek(2)) == [0, 1]
    sub.acknowledge(3)
    assert _ids(sub.take()) == [3]


def test_notifications_pushed_out_by_keep_are_still_numbered():
    sub = _subscriber(keep=3)
    sub.handle_notification(BC, [_note(i) for i in range(5)], 0)
    assert (sub.inbox_first, sub.inbox_seq) == (2, 5)
    assert sub.acknowledge(1) == 0  # a cursor below what keep dropped
    assert sub.acknowledge(3) == 1 and _ids(sub.peek()) == [3, 4]


# -- a real server on loopback ----------------------------------------------------------------
class Served:
    """A subscriber's ``HttpRoleServer`` on loopback, with the broadcaster it accepts."""

    def __init__(self, **kw) -> None:
        self.me, bc = Identity.generate(), Identity.generate()
        self.core = Subscriber(self.me.principal, Identity.generate().principal)
        self.core.valid[NS] = {bc.principal.bytes}
        port, self._stop = serve(HttpRoleServer(self.core, self.me, {}, **kw))  # confirms: nowhere
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        self.bc = HttpEventsClient(self.url, bc, timeout=30)

    def deliver(self, ids: range, size: int) -> None:
        """``icrc72_handle_notification`` calls from the broadcaster, 5 notifications a call
        (well under the 8 MiB body limit)."""
        for at in range(ids.start, ids.stop, 5):
            notes = [_note(i, size) for i in range(at, min(at + 5, ids.stop))]
            assert self.bc.call("icrc72_handle_notification", notes) == len(notes)

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None

    def reader(self) -> InboxReader:
        return InboxReader(HttpEventsClient(self.url, self.me, timeout=30))


@pytest.fixture
def served():
    made: list[Served] = []

    def make(**kw) -> Served:
        made.append(Served(**kw))
        return made[-1]

    yield make
    for s in made:
        s.stop()


def test_many_large_notifications_are_drained_in_bounded_replies_each_once(served):
    assert MAX_INBOX_REPLY_BYTES * 4 <= MAX_REPLY_BYTES  # the default, well under the cap
    budget = 1024 * KB
    s = served(max_inbox_reply_bytes=budget)
    s.deliver(range(40), 200 * KB)  # 8 MB; asked for 1,000 at once, as the node's reader does
    reader, pages = s.reader(), []
    while page := reader.read(1000):
        pages.append(page)
    got = [n for p in pages for n in p]
    assert _ids(got) == list(range(40))  # each once, in order
    assert all(1 <= len(p) <= 5 and sum(map(_size, p)) <= budget for p in pages), pages
    assert len(pages) == 8
    assert len(s.core.inbox) == 0  # the last read acknowledged the last page


def test_a_single_notification_over_the_budget_goes_alone(served):
    s = served(max_inbox_reply_bytes=10 * KB)
    s.deliver(range(3), 50 * KB)
    reader = s.reader()
    assert [_ids(reader.read(1000)) for _ in range(4)] == [[0], [1], [2], []]


def _signed_inbox_request(s: Served, ack: int, n: int) -> bytes:
    body = METHODS["loglake_inbox"].encode_arg((ack, n))
    head = ["POST /api/loglake_inbox HTTP/1.1", f"Host: 127.0.0.1:{s.port}"]
    head += [f"{k}: {v}" for k, v in s.me.sign_call("loglake_inbox", body, time.time_ns()).items()]
    head += ["Content-Type: application/candid", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def test_a_reply_that_never_reached_the_reader_is_sent_again(served):
    s = served()
    s.deliver(range(6), 100 * KB)
    # (a) the reader refuses a reply over its cap (as the client does past MAX_REPLY_BYTES)
    body = METHODS["loglake_inbox"].encode_arg((0, 1000))
    headers = s.me.sign_call("loglake_inbox", body, time.time_ns())
    with pytest.raises(BadReply, match="over the limit"):
        post_raw(s.url, "loglake_inbox", body, headers, 30, max_reply_bytes=50 * KB)
    # (c) the connection drops once the reply started: its status line read, then closed
    with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
        sock.sendall(_signed_inbox_request(s, 0, 1000))
        assert sock.recv(12) == b"HTTP/1.1 200"
    assert len(s.core.inbox) == 6  # neither reply removed anything
    reader = s.reader()
    assert _ids(reader.read(1000)) == list(range(6))
    assert reader.read(1000) == [] and len(s.core.inbox) == 0


def test_a_cursor_from_an_earlier_run_acknowledges_nothing_and_a_bogus_one_is_refused(served):
    first = served()
    first.deliver(range(2), 10)
    old = first.reader()
    assert _ids(old.read(10)) == [0, 1]
    first.stop()
    s = served()  # a restarted subscriber: a new inbox, numbered from a later clock
    s.deliver(range(10, 13), 10)
    client = HttpEventsClient(s.url, s.me, timeout=30)
    page = client.call("loglake_inbox", (old.cursor, 10))
    assert _ids(page.notes) == [10, 11, 12]
    with pytest.raises(CallRejected, match=r"InboxCursorError: inbox cursor \d+ is past") as e:
        client.call("loglake_inbox", (page.cursor + 1, 10))
    assert e.value.status == 400 and len(s.core.inbox) == 3
    assert client.call("loglake_inbox", (page.cursor, 10)).notes == []
    assert len(s.core.inbox) == 0


def test_a_reader_whose_cursor_is_refused_reads_from_the_start(served, caplog):
    """A reader holding a cursor past the inbox's numbers (its subscriber restarted with the
    clock set back) was refused on every read; it starts over from acknowledging nothing."""
    s = served()
    s.deliver(range(3), 10)
    reader = s.reader()
    assert _ids(reader.read(2)) == [0, 1]
    reader.cursor += 10**12  # as if numbered by a clock 1,000 s ahead of this run's
    with caplog.at_level("WARNING", "loglake.events"):
        assert _ids(reader.read(10)) == [0, 1, 2]  # nothing was acknowledged: all again
    assert any("refused" in r.getMessage() for r in caplog.records)
    assert reader.read(10) == [] and len(s.core.inbox) == 0


def test_events_received_shows_each_notification_and_then_acknowledges_it(served, tmp_path):
    import json

    from click.testing import CliRunner

    from loglake.events.cli import command

    s = served(max_inbox_reply_bytes=3 * _size(_note(0, 10)))
    s.deliver(range(5), 10)
    key = tmp_path / "sub.key"
    key.write_text(s.me.seed.hex())
    args = ["received", "--url", s.url, "--key-file", str(key), "--json"]
    runs = [CliRunner().invoke(command, args) for _ in range(3)]
    assert all(r.exit_code == 0 for r in runs), [r.output for r in runs]
    shown = [[json.loads(line)["event_id"] for line in r.output.splitlines()] for r in runs]
    assert shown == [[0, 1, 2], [3, 4], []]
