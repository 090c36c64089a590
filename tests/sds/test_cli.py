"""``loglake sds chat``'s printing (``loglake.sds.cli._show``): what a hostile member sends
reaches the terminal as visible text, never as control sequences the terminal acts on."""

from __future__ import annotations

import io
import re
from contextlib import ExitStack

from rich.console import Console

from loglake.log import MemoryLog
from loglake.sds.channel import SdsChannel
from loglake.sds.chat import ChatSession
from loglake.sds.cli import _show
from loglake.streams.client import StreamClient
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService

CONTROLS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")

HOSTILE = {
    b"\x1bc": "\\x1bc",  # RIS: full terminal reset
    b"\x1bM\x1bM\x1bM": "\\x1bM\\x1bM\\x1bM",  # reverse index
    "\u009b2J".encode(): "\\x9b2J",  # the 8-bit CSI: clear screen
    b"\x1b]52;c;cm0gLXJmIH4K\x1b\\.": "\\x1b]52;c;cm0gLXJmIH4K\\x1b\\.",  # OSC 52 clipboard
    b"\x1b[1A\x1b[2Kbob: run this": "\\x1b[1A\\x1b[2Kbob: run this",  # rewrite a line
    b"ok\r\nbob: run this (delivered)": "ok\\x0d\\x0abob: run this (delivered)",  # fake a row
    b"bell\x07 del\x7f nul\x00": "bell\\x07 del\\x7f nul\\x00",
}


def test_peer_supplied_text_is_printed_without_terminal_controls(clock) -> None:
    with ExitStack() as stack:
        srv = stack.enter_context(BackgroundServer(StreamService(MemoryLog())))

        def join(pid: str) -> SdsChannel:
            client = stack.enter_context(StreamClient("127.0.0.1", srv.port))
            return SdsChannel(client, "room", pid, clock=clock)

        mallory_id = "mallory\x1b[8m\u009b"  # a concealing sender id
        mallory = join(mallory_id)
        alice = ChatSession(join("alice"))
        for payload in HOSTILE:
            clock.advance(1)
            mallory.send(payload)
        clock.advance(1)
        ChatSession(mallory).say("in an envelope \x1b]0;title\x07")
        mallory.send_ephemeral(b"typing\x1b]0;x\x07")
        buf = io.StringIO()
        console = Console(file=buf, force_terminal=True, color_system=None, width=300)
        alice.step()
        _show(console, alice)
    out = buf.getvalue()
    lines = out.splitlines()
    assert len(lines) == len(HOSTILE) + 2  # one line a row and a notice: no injected rows
    assert not CONTROLS.search(out.replace("\n", ""))
    for shown in HOSTILE.values():
        assert f"mallory\\x1b[8m\\x9b: {shown} (plain) (delivered)" in out
    assert "mallory\\x1b[8m\\x9b: in an envelope \\x1b]0;title\\x07 (delivered)" in out
    assert lines[-1] == "* mallory\\x1b[8m\\x9b: typing\\x1b]0;x\\x07"
