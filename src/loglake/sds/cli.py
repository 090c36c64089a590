"""``loglake sds``: a terminal group chat over a running ``loglake serve`` (the demo of SDS).

``loglake sds chat --channel NAME --id ALICE`` joins the SDS channel ``NAME`` whose messages
travel on the stream ``sds.NAME`` of the node at ``--host``/``--port``. Each line typed is sent;
each message shows its delivery/acknowledgement state as it changes. The logic lives in
``loglake.sds.chat`` (tested without a terminal); this module only reads stdin and prints.
"""

from __future__ import annotations

import select
import sys

import click
from rich.console import Console

STATE_STYLE = {"sent": "yellow", "acknowledged": "green", "delivered": "cyan"}


@click.group(name="sds", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """SDS (Scalable Data Sync) over loglake streams."""


@command.command()
@click.option("--channel", required=True, help="SDS channel id (stream sds.<channel>).")
@click.option("--id", "participant_id", required=True, help="Your participant id.")
@click.option("--host", default="127.0.0.1", show_default=True, help="loglake serve host.")
@click.option("--port", default=None, type=int, help="loglake serve port (default: its default).")
@click.option("--history/--no-history", default=True, help="Replay the channel's history first.")
@click.option("--interval", default=0.5, show_default=True, help="Seconds between polls.")
def chat(
    channel: str, participant_id: str, host: str, port: int | None, history: bool, interval: float
) -> None:
    """A minimal group chat: type a line and press Enter; /sync sends a sync, /quit leaves."""
    from loglake.sds.channel import SdsChannel
    from loglake.sds.chat import ChatSession
    from loglake.streams.client import StreamClient  # the TCP client, imported only when used

    console = Console()
    client = StreamClient(host, port) if port else StreamClient(host)
    with client:
        session = ChatSession(
            SdsChannel(client, channel, participant_id, from_index=0 if history else None)
        )
        console.print(
            f"[bold]sds chat[/] channel [bold]{channel}[/] as [bold]{participant_id}[/] "
            f"on {host}; /quit to leave"
        )
        while True:
            session.step()
            for row in session.take_changes():
                style = STATE_STYLE.get(row.state.split(" ")[0], "magenta")
                console.print(
                    f"[dim]{row.message_id[:8]}[/] [bold]{row.sender}[/]: {row.text} "
                    f"[{style}]({row.state})[/]"
                )
            for notice in session.notices:
                console.print(f"[dim]* {notice}[/]")
            session.notices.clear()
            ready, _, _ = select.select([sys.stdin], [], [], interval)
            if not ready:
                continue
            line = sys.stdin.readline()
            if not line or line.strip() == "/quit":
                return
            if line.strip() == "/sync":
                session.apply(session.channel.sync())
            elif line.strip():
                session.say(line.rstrip("\n"))
