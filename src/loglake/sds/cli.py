"""``loglake sds``: a terminal group chat over a running ``loglake serve`` (the demo of SDS).

``loglake sds chat --channel NAME --id ALICE`` joins the SDS channel ``NAME`` whose messages
travel on the stream ``sds.NAME`` of the node at ``--host``/``--port``. Each line typed is sent;
each message shows its delivery/acknowledgement state as it changes. The logic lives in
``loglake.sds.chat`` (tested without a terminal); this module only reads stdin and prints.
"""

from __future__ import annotations

import select
import sys
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.markup import escape

from loglake.clitools import MAX_SECONDS, MILLISECONDS, PORT, POSITIVE_SECONDS, Number
from loglake.sds.codec import DEFAULT_LIMITS

if TYPE_CHECKING:
    from loglake.sds.chat import ChatSession

STATE_STYLE = {"sent": "yellow", "acknowledged": "green", "delivered": "cyan"}
PROBABILITY = Number(0, 1, "a probability")
SYNC_MS = click.IntRange(0, MAX_SECONDS * 1000)
"""A sync interval in milliseconds, at most a year (``clitools.MAX_SECONDS``), as every other
duration; any integer was taken."""
MAX_PARTICIPANTS = 10_000
"""``sim --participants`` at most (and ``--late-joiners``, ``--offline``, which are among them):
every broadcast goes to every participant, each of which holds a whole SDS state (log, bloom
filter, buffers) in the one simulating process."""
MAX_MESSAGES = 10**8
"""``sim --messages`` at most: each is sent, delivered and acknowledged in the one process."""
MAX_HISTORY = DEFAULT_LIMITS.max_causal_history
"""``sim --history`` at most: a participant drops a message with a longer causal history as
oversized (``codec.Limits.max_causal_history``): with 1,001, a run of 1,300 messages delivered
77% of them, those sent once the log held more than 1,000 were dropped."""


@click.group(name="sds", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """SDS (Scalable Data Sync) over loglake streams."""


@command.command()
@click.option("--channel", required=True, help="SDS channel id (stream sds.<channel>).")
@click.option("--id", "participant_id", required=True, help="Your participant id.")
@click.option("--host", default="127.0.0.1", show_default=True, help="loglake serve host.")
@click.option("--port", default=None, type=PORT, help="loglake serve port (default: its default).")
@click.option("--history/--no-history", default=True, help="Replay the channel's history first.")
@click.option(
    "--interval",
    type=POSITIVE_SECONDS,  # nan, inf, -1: a traceback from select(); 0: a busy loop
    default=0.5,
    show_default=True,
    help="Seconds between polls.",
)
@click.option(
    "--sync-ms",
    type=SYNC_MS,
    default=5000,
    show_default=True,
    help="Sync after this much silence (0: never).",
)
def chat(
    channel: str,
    participant_id: str,
    host: str,
    port: int | None,
    history: bool,
    interval: float,
    sync_ms: int,
) -> None:
    """A minimal group chat: type a line and press Enter; /sync sends a sync, /quit leaves."""
    from loglake.sds.channel import SdsChannel
    from loglake.sds.chat import ChatSession
    from loglake.streams.client import StreamClient  # the TCP client, imported only when used

    console = Console()
    client = StreamClient(host, port) if port else StreamClient(host)
    with client:
        session = ChatSession(
            SdsChannel(
                client,
                channel,
                participant_id,
                from_index=0 if history else None,
                sync_interval_ms=sync_ms or None,
            )
        )
        console.print(
            f"[bold]sds chat[/] channel [bold]{_safe(channel)}[/] as "
            f"[bold]{_safe(participant_id)}[/] on {_safe(host)}; /quit to leave"
        )
        while True:
            session.step()
            _show(console, session)
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
            # at once, before the next poll: a reply read by that poll would otherwise show
            # the line already "acknowledged", never "sent"
            _show(console, session)


def _safe(text: str) -> str:
    """A peer-supplied string as printed: its terminal controls made visible
    (``chat.printable``: ``rich``'s ``escape`` escapes only markup), then its markup escaped."""
    from loglake.sds.chat import printable

    return escape(printable(text))


def _show(console: Console, session: ChatSession) -> None:
    """Print the rows that changed since the last call (each with its state now) and the
    notices; every string a peer chose (ids, text, notices) goes through ``_safe``."""
    for row in session.take_changes():
        style = STATE_STYLE.get(row.state.split(" ")[0], "magenta")
        plain = " [dim](plain)[/]" if row.plain else ""
        console.print(
            f"[dim]{_safe(row.message_id[:8])}[/] [bold]{_safe(row.sender)}[/]: "
            f"{_safe(row.text)}{plain} [{style}]({row.state})[/]",
            soft_wrap=True,
        )
    for notice in session.notices:
        console.print(f"[dim]* {_safe(notice)}[/]", soft_wrap=True)
    session.notices.clear()


@command.command()
@click.option(
    "--participants",
    type=click.IntRange(1, MAX_PARTICIPANTS),
    default=50,
    show_default=True,
    help="Number of participants.",
)
@click.option(
    "--messages",
    type=click.IntRange(0, MAX_MESSAGES),
    default=40,
    show_default=True,
    help="Content messages to send.",
)
@click.option("--seed", default=1, show_default=True, help="Random seed (replays a run).")
@click.option(
    "--loss", type=PROBABILITY, default=0.05, show_default=True, help="Per-link loss probability."
)
@click.option(
    "--latency-ms",
    type=MILLISECONDS,  # nan, inf: a traceback converting to int
    default=80.0,
    show_default=True,
    help="Median link latency.",
)
@click.option(
    "--sync-ms",
    type=click.IntRange(1, MAX_SECONDS * 1000),  # 0, -1: a randrange() traceback
    default=5000,
    show_default=True,
    help="Sync interval S.",
)
@click.option(
    "--history",
    type=click.IntRange(0, MAX_HISTORY),
    default=20,
    show_default=True,
    help="Causal history size.",
)
@click.option("--partition", default=None, help="START_MS:END_MS:FRACTION of a healing split.")
@click.option(
    "--late-joiners",
    type=click.IntRange(0, MAX_PARTICIPANTS),
    default=0,
    show_default=True,
    help="Participants that join mid-run.",
)
@click.option(
    "--offline",
    type=click.IntRange(0, MAX_PARTICIPANTS),
    default=0,
    show_default=True,
    help="Participants that go offline mid-run.",
)
@click.option("--no-store", is_flag=True, help="No store node: rely on SDS-R only.")
@click.option(
    "--store-channel",
    "store_dir",
    default=None,
    help="Also write every broadcast (and a closing sync per participant) to the stream "
    "sds.sim of this data dir, for `loglake job sds-audit`.",
)
@click.option(
    "--ground-truth",
    "truth_file",
    default=None,
    help="With --store-channel: write what the simulator knows (JSON) to this file.",
)
def sim(
    participants: int,
    messages: int,
    seed: int,
    loss: float,
    latency_ms: float,
    sync_ms: int,
    history: int,
    partition: str | None,
    late_joiners: int,
    offline: int,
    no_store: bool,
    store_dir: str | None,
    truth_file: str | None,
) -> None:
    """Simulate SDS participants on a seeded lossy network and check the targets."""
    from loglake.sds.sim import SimConfig, Simulation, store_channel

    if truth_file and not store_dir:
        raise click.BadParameter("needs --store-channel", param_hint="--ground-truth")

    part = None
    if partition:
        try:
            a, b, f = partition.split(":")
            part = (int(a), int(b), float(f))
            if not (0 <= part[0] <= part[1] and 0 <= part[2] <= 1):  # nan too
                raise ValueError(partition)
        except ValueError:
            raise click.BadParameter(
                "use START_MS:END_MS:FRACTION, 0 <= START_MS <= END_MS, FRACTION from 0 to 1",
                param_hint="'--partition'",
            ) from None
    simulation = Simulation(
        SimConfig(
            participants=participants,
            messages=messages,
            seed=seed,
            loss=loss,
            latency_median_ms=latency_ms,
            sync_interval_ms=sync_ms,
            causal_history_size=history,
            partition=part,
            late_joiners=late_joiners,
            offline=offline,
            store=not no_store,
            record_channel=store_dir is not None,
            closing_sync=store_dir is not None,
        )
    )
    report = simulation.run()
    Console().print(report.summary(), highlight=False, soft_wrap=True)
    if store_dir:
        import json

        from loglake.log import open_log

        with open_log(store_dir) as log:
            n = store_channel(simulation, log, "sds.sim")
        Console().print(f"  stored {n} records in {store_dir}, stream sds.sim", highlight=False)
        if truth_file:
            with open(truth_file, "w") as fh:
                json.dump(simulation.ground_truth(), fh)
