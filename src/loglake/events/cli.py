"""``loglake events``: run a role, publish, subscribe, and manage ICRC-77 replays.

Every command that talks to a role signs its calls with an Ed25519 key file (``keygen``
writes one); the caller's principal is what the orchestrator authorises.

``serve`` keeps the orchestrator's journal and ledger and the publisher's namespaces in a
durable store, through the ``Streams`` API: an embedded log in ``--data-dir`` (``LocalStreams``
over ``open_log``; default: ``<user data dir>/events/<principal>``), or a ``loglake serve`` node
(``--streams-host``/``--streams-port``, which several roles may share). Never in memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from loglake.clitools import (
    CONTEXT_SETTINGS,
    INT64_MAX,
    MAX_RATE,
    MILLISECONDS,
    PORT,
    POSITIVE_SECONDS,
    SECONDS,
    Number,
    Renamed,
    TypedErrorGroup,
)
from loglake.errors import LoglakeError
from loglake.events.client import URL_FORM, HttpEventsClient, InboxReader, url_problem
from loglake.events.identity import Identity, principal_from_text
from loglake.events.messages import (
    C_SUB_STOPPED,
    GetReplays,
    Ok,
    OrchestrationFilter,
    Registration,
    ReplayRegistration,
    ReplayStatus,
)
from loglake.events.orchestrator import MAX_TAKE, Quotas
from loglake.events.publisher import (
    BATCH_SIZE,
    EVENT_OVERHEAD,
    MAX_MESSAGE_BYTES,
    publication_config,
)
from loglake.events.subscriber import INBOX_KEEP
from loglake.streams.service import MAX_PULL_MESSAGES

console = Console()

NAT = click.IntRange(min=0)
"""An event id, an amount, a price: a Candid ``nat``, which has no maximum (the role answers
for a value it cannot use). A negative one was taken and failed later: ``replay --from -1`` at
the orchestrator. Counts and sizes have their own ceilings below."""

MAX_PUBLISH_COUNT = 10**9
"""``publish --count`` at most: the events are made and sent a call at a time, so this bounds
the run, not its memory."""
MAX_PUBLISH_BATCH = MAX_MESSAGE_BYTES // EVENT_OVERHEAD
"""``publish --batch`` at most (10,000): a call is also cut at ``MAX_MESSAGE_BYTES`` of its
events, each counted with ``EVENT_OVERHEAD`` bytes besides its data, as the publisher cuts its own
calls, so no call carries more events than this whatever --batch says."""
MAX_LISTED_REPLAYS = MAX_TAKE * Quotas().max_queries_per_window
"""``replays --take`` at most (600,000): the listing reads ``MAX_TAKE`` replays a call, and past
this many calls in a window the orchestrator's default query quota refuses the next."""
MAX_UNCONFIRMED = 1_000_000
"""``serve --max-unconfirmed`` at most, five times the default: each unconfirmed notification
is an entry of the broadcaster's pending table until its subscriber confirms it, so the window
is memory one subscriber that stops confirming may pin."""
MAX_BODY_BYTES_CEILING = 1 << 30
"""``serve --max-body-bytes`` at most (1 GiB): a body is read whole into memory before it is
decoded, by as many clients at once as call; the default is 8 MiB (``server.MAX_BODY_BYTES``)."""


class CliError(LoglakeError):
    pass


def load_identity(path: str) -> Identity:
    try:
        seed = bytes.fromhex(Path(path).read_text().strip())
        return Identity.from_seed(seed)
    except (OSError, ValueError) as e:
        raise CliError(f"cannot read key file {path}: {e}") from e


def _config(filter_: str | None, skip: tuple[int, ...] | None, prefix: str = "") -> list:
    cfg: list = []
    if filter_:
        cfg.append((f"{prefix}filter", {"Text": filter_}))
    if skip:  # parsed and checked by _checked_skip
        cfg.append((f"{prefix}skip", {"Array": [{"Nat": n} for n in skip]}))
    return cfg


def _checked_skip(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> tuple[int, ...] | None:
    """``--skip MOD[,OFFSET]`` as (MOD,) or (MOD, OFFSET), parsed once here: whole numbers,
    MOD at least 1, OFFSET not negative, else a usage error. A MOD of 0 went to the
    orchestrator, which refused it; a negative one failed in the Candid codec; ``abc`` was an
    error of exit status 1."""
    if value is None:
        return None
    try:
        nums = [int(x) for x in value.split(",")]
    except ValueError:
        nums = []
    if not 1 <= len(nums) <= 2 or nums[0] < 1 or min(nums) < 0:
        raise click.BadParameter(
            f"{value!r}: expected MOD[,OFFSET], MOD 1 or more, OFFSET 0 or more"
        )
    return tuple(nums)


def _checked_mint(
    _ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]
) -> list[tuple[str, int]]:
    """``--mint PRINCIPAL=AMOUNT`` as (PRINCIPAL, AMOUNT) pairs, parsed once here, the amount a
    whole number, not negative: ``=nan`` or ``=abc`` was a ``ValueError`` traceback."""
    out = []
    for v in values:
        who, sep, amount = v.partition("=")
        try:
            n = int(amount) if sep else -1
        except ValueError:
            n = -1
        if n < 0:
            raise click.BadParameter(f"{v!r}: expected PRINCIPAL=AMOUNT, AMOUNT 0 or more")
        out.append((who, n))
    return out


def _unwrap(result: object, what: str) -> int:
    if isinstance(result, Ok):
        return result.value
    raise CliError(f"{what} refused: {result}")


key_opt = click.option(
    "--key-file",
    "--key",
    "key",
    cls=Renamed,
    old=("--key",),
    required=True,
    envvar="LOGLAKE_EVENTS_KEY",
    help="Ed25519 key file (keygen).",
)


class RoleUrl(click.ParamType):
    """A role's URL, ``http(s)://host:port`` (``client.url_problem``), kept as given; else
    click's usage error naming the option (exit 2). ``--url notaurl`` and ``--url
    'http://[::1'`` were urllib ``ValueError`` tracebacks."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if url_problem(str(value)) is not None:
            self.fail(f"{str(value)!r}: expected {URL_FORM}", param, ctx)
        return str(value)


url_opt = click.option(
    "--url",
    type=RoleUrl(),
    required=True,
    envvar="LOGLAKE_EVENTS_URL",
    help="The role to call, e.g. http://127.0.0.1:8701 (the orchestrator for most commands).",
)


CALL_TIMEOUT = "loglake.events.call_timeout"
"""``ctx.meta`` key of ``--call-timeout``, read by :func:`_client`."""


@click.group(cls=TypedErrorGroup, context_settings=CONTEXT_SETTINGS)
@click.option(
    "--call-timeout",
    type=POSITIVE_SECONDS,
    default=30.0,
    show_default=True,
    envvar="LOGLAKE_EVENTS_CALL_TIMEOUT",
    help="Seconds one call to a role may take; a role that does not answer by then is an "
    "error naming its URL.",
)
@click.pass_context
def command(ctx: click.Context, call_timeout: float) -> None:
    """ICRC-72 pub/sub with ICRC-77 event replay."""
    ctx.meta[CALL_TIMEOUT] = call_timeout


def _client(url: str, ident: Identity) -> HttpEventsClient:
    """The signed client of a command; a role it cannot reach is ``RoleUnreachable`` (the
    URL and why: refused, timed out, not resolved), one line and exit 1 through
    ``TypedErrorGroup``, not urllib's ``URLError`` traceback."""
    return HttpEventsClient(url, ident, timeout=click.get_current_context().meta[CALL_TIMEOUT])


@command.command()
@click.argument("path", type=click.Path(dir_okay=False))
def keygen(path: str) -> None:
    """Write a new Ed25519 key (32-byte seed, hex) to PATH and print its principal."""
    ident = Identity.generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(ident.seed.hex())
    console.print(ident.principal.to_str())


@command.command()
@key_opt
def whoami(key: str) -> None:
    """Print the principal of a key file."""
    console.print(load_identity(key).principal.to_str())


@command.command()
@click.option(
    "--role",
    type=click.Choice(["orchestrator", "broadcaster", "publisher", "subscriber"]),
    required=True,
    help="Which ICRC-72 role this process plays.",
)
@key_opt
@click.option("--port", type=PORT, required=True, help="HTTP port to serve the role on.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--directory", required=True, help="JSON {principal: url} of every role.")
@click.option("--orchestrator", help="The orchestrator's principal (all roles but itself).")
@click.option("--broadcaster", "broadcasters", multiple=True, help="(orchestrator) broadcasters.")
@click.option(
    "--home",
    "homes",
    multiple=True,
    help="(orchestrator) SUBSCRIBER=BROADCASTER: the broadcaster serving that subscriber's "
    "replays (a relay is assigned when it is not the publication's).",
)
@click.option(
    "--relay-replays",
    is_flag=True,
    help="(orchestrator) send every replay through a relay to another broadcaster.",
)
@click.option(
    "--data-dir",
    help="(orchestrator, publisher) embedded log directory for the role's streams; default "
    "<user data dir>/events/<principal>. One process per directory.",
)
@click.option(
    "--streams-host",
    help="(orchestrator, publisher) keep the role's streams on this `loglake serve` node "
    "instead of an embedded log.",
)
@click.option(
    "--streams-port",
    type=PORT,
    help="Port of that node (default: loglake serve's).",
)
@click.option("--register", "register_ns", help="(publisher) namespace to register at start.")
@click.option("--price-per-event", type=NAT, default=0, help="(publisher) icrc77:pricing.")
@click.option(
    "--mint",
    multiple=True,
    callback=_checked_mint,
    help="(orchestrator) PRINCIPAL=AMOUNT on the ledger.",
)
@click.option(
    "--max-events-per-replay",
    type=click.IntRange(1, INT64_MAX),  # compared with ranges of the log's int64 indexes
    default=5_000_000,
    show_default=True,
    help="(orchestrator) quota: a longer range is refused with RangeTooLarge.",
)
@click.option(
    "--batch-size",
    # 0: a replay stayed running for ever, sending nothing; a batch is one pull of the stream
    type=click.IntRange(1, MAX_PULL_MESSAGES),
    default=BATCH_SIZE,
    show_default=True,
    help="(publisher) events procured and sent per replay batch.",
)
@click.option(
    "--throttle-ms",
    type=MILLISECONDS,  # nan, inf, 1e300: the pump stopped, every replay stayed pending
    default=0.0,
    help="(publisher) pause between batches; a throttled replay has one batch in flight at a time.",
)
@click.option(
    "--replay-rate",
    type=Number(0, MAX_RATE, "events a second", above=True, name="rate"),  # nan: a traceback
    default=None,
    help="(publisher) events a second one replay is sent at, at most (default: no limit).",
)
@click.option(
    "--max-unconfirmed",
    type=click.IntRange(1, MAX_UNCONFIRMED),
    default=200_000,
    show_default=True,
    help="(broadcaster) unconfirmed notifications one subscriber may have; events beyond that "
    "are answered Busy and the publisher sends them again later; a subscriber full for 30 s "
    "is left out of live delivery until it confirms.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(1024, MAX_BODY_BYTES_CEILING),
    default=8 * 1024 * 1024,
    show_default=True,
    help="Largest request body read; longer ones get 413 before they are decoded.",
)
def serve(
    role: str,
    key: str,
    port: int,
    host: str,
    directory: str,
    orchestrator: str | None,
    broadcasters: tuple[str, ...],
    homes: tuple[str, ...],
    relay_replays: bool,
    data_dir: str | None,
    streams_host: str | None,
    streams_port: int | None,
    register_ns: str | None,
    price_per_event: int,
    mint: list[tuple[str, int]],
    max_events_per_replay: int,
    batch_size: int,
    throttle_ms: float,
    replay_rate: float | None,
    max_unconfirmed: int,
    max_body_bytes: int,
) -> None:
    """Run one role over HTTP until interrupted."""
    from loglake.events import (
        Broadcaster,
        HttpRoleServer,
        Publisher,
        Quotas,
        StreamsStore,
        Subscriber,
        load_directory,
        open_ledger,
        open_orchestrator,
    )
    from loglake.events.ledger import account
    from loglake.events.server import serve_role

    ident = load_identity(key)
    me = ident.principal
    if role != "orchestrator" and not orchestrator:
        raise CliError("--orchestrator is required for this role")
    orch = principal_from_text(orchestrator) if orchestrator else me
    with contextlib.ExitStack() as stack:
        store = None
        if role in ("orchestrator", "publisher"):
            streams, where = _open_streams(stack, me, data_dir, streams_host, streams_port)
            store = StreamsStore(streams)
        else:
            where = "none (this role keeps no state)"
        core: Any
        if role == "orchestrator":
            assert store is not None
            ledger = open_ledger(store, fee=1)
            for who, amount in mint:
                ledger.mint(account(principal_from_text(who)), amount, time.time_ns())
            store.perform_many(ledger.writes)  # durable before the first request
            ledger.writes.clear()
            try:
                core = open_orchestrator(
                    store,
                    me,
                    [principal_from_text(b) for b in broadcasters],
                    Quotas(max_events_per_replay=max_events_per_replay),
                    ledger,
                    homes=_homes(homes),
                    relay_replays=relay_replays,
                )
            except ValueError as e:
                raise CliError(str(e)) from e
        elif role == "broadcaster":
            core = Broadcaster(me, orch, max_unconfirmed=max_unconfirmed)
        elif role == "publisher":
            # throttled: one batch in flight, then the pause (calls to one role are pipelined,
            # so several batches in flight would leave together and the pause throttle nothing)
            inflight = 1 if throttle_ms > 0 else 4
            core = Publisher(
                me, orch, batch_size=batch_size, max_inflight=inflight, replay_rate=replay_rate
            )
            if register_ns:  # retried with back-off until the orchestrator answers
                core.register(register_ns, publication_config(price_per_event))
        else:
            core = Subscriber(me, orch)
        server = HttpRoleServer(
            core,
            ident,
            load_directory(directory),
            store,
            throttle_s=throttle_ms / 1000,
            max_body_bytes=max_body_bytes,
        )
        banner = f"[bold]{role}[/] {me.to_str()} on http://{host}:{port}; streams: {where}"
        # the banner once the port is bound: a taken port is one line (CannotListen), exit 1
        serve_role(server.app, host, port, listening=lambda: console.print(banner))


def _open_streams(
    stack: contextlib.ExitStack,
    me: Any,
    data_dir: str | None,
    streams_host: str | None,
    streams_port: int | None,
) -> tuple[Any, str]:
    """The durable ``Streams`` a role keeps its state in, closed with ``stack``; and where."""
    if data_dir and (streams_host or streams_port):
        raise CliError("give either --data-dir or --streams-host/--streams-port, not both")
    if streams_host or streams_port:
        from loglake.streams import StreamClient
        from loglake.streams.client import DEFAULT_PORT
        from loglake.streams.retry import RetryingStreams

        h, p = streams_host or "127.0.0.1", streams_port or DEFAULT_PORT
        # reads and index saves wait for a restarting node; a journal push whose outcome a lost
        # connection hid is not repeated (it could be stored twice): the role sees Unavailable
        client = stack.enter_context(RetryingStreams(lambda: StreamClient(h, p)))
        return client, f"loglake serve at {h}:{p}"
    import platformdirs

    from loglake.streams import LocalStreams

    path = Path(data_dir or Path(platformdirs.user_data_dir("loglake")) / "events" / me.to_str())
    streams = LocalStreams.open(path)
    stack.callback(streams.close)  # the orchestrator's journal and ledger, the publisher's history
    return streams, f"embedded log in {path}"


def _homes(items: tuple[str, ...]) -> dict[bytes, Any]:
    out = {}
    for it in items:
        sub, sep, bc = it.partition("=")
        if not sep:
            raise CliError(f"--home expects SUBSCRIBER=BROADCASTER, got {it!r}")
        out[principal_from_text(sub).bytes] = principal_from_text(bc)
    return out


@command.command()
@url_opt
@key_opt
@click.argument("namespace")
@click.option("--text", "texts", multiple=True, help="Publish #Text(TEXT) (repeatable).")
@click.option(
    "--count",
    type=click.IntRange(0, MAX_PUBLISH_COUNT),
    default=0,
    help="Publish COUNT generated #Blob events.",
)
@click.option(
    "--size",
    # the publisher's budget for a call's events: one past it would go alone in a call over it
    type=click.IntRange(0, MAX_MESSAGE_BYTES),
    default=200,
    show_default=True,
    help="Bytes per #Blob.",
)
@click.option(
    "--batch",
    type=click.IntRange(1, MAX_PUBLISH_BATCH),  # 0: a ValueError traceback from range()
    default=1000,
    show_default=True,
    help=f"Events per publish call, at most; a call also stops at {MAX_MESSAGE_BYTES:,} bytes "
    f"of events ({EVENT_OVERHEAD} counted for each besides its data).",
)
def publish(
    url: str,
    key: str,
    namespace: str,
    texts: tuple[str, ...],
    count: int,
    size: int,
    batch: int,
) -> None:
    """Publish events (call the PUBLISHER's URL with the publisher's key)."""
    c = _client(url, load_identity(key))
    n, first, last = 0, 0, 0
    for call in _publish_calls(_publish_items(texts, count, size), batch):
        ids = c.call("loglake_publish", (namespace, call))
        if ids:
            first = first if n else ids[0]
            last = ids[-1]
            n += len(ids)
    if n:
        console.print(f"published {n} events: ids {first}..{last}")


PublishItem = tuple[dict[str, str | bytes], None]


def _publish_items(texts: tuple[str, ...], count: int, size: int) -> Iterator[PublishItem]:
    """The events of ``publish``, made as they are sent: each ``--text``, then ``count``
    #Blobs of ``size`` bytes (the event's number, repeated). Why lazily: all of them were made
    before the first call, so ``--size 1000000000000`` ended in a MemoryError traceback and
    ``--count`` times ``--size`` had to fit in memory."""
    for t in texts:
        yield {"Text": t}, None
    for i in range(count):
        yield {"Blob": (i.to_bytes(8, "big") * (size // 8 + 1))[:size]}, None


def _publish_calls(items: Iterable[PublishItem], batch: int) -> Iterator[list[PublishItem]]:
    """``items`` a call at a time: at most ``batch`` events, and at most ``MAX_MESSAGE_BYTES``
    of them, each counted with ``EVENT_OVERHEAD`` bytes besides its data, as the publisher cuts
    the calls it makes (at least one event a call). Why by bytes too: 1,000 events of 1 MB were
    one call of 1 GB, over any role's body limit (413), and the publisher sends a call's events
    on to the broadcaster in one call."""
    call: list[PublishItem] = []
    used = 0
    for item in items:
        v = next(iter(item[0].values()))
        cost = (len(v) if isinstance(v, bytes) else len(v.encode())) + EVENT_OVERHEAD
        if call and (len(call) == batch or used + cost > MAX_MESSAGE_BYTES):
            yield call
            call, used = [], 0
        call.append(item)
        used += cost
    if call:
        yield call


@command.command()
@url_opt
@key_opt
@click.argument("namespace")
@click.option("--price-per-event", type=NAT, default=0, help="icrc77:pricing (0: free).")
@click.option(
    "--timeout",
    type=SECONDS,  # nan, inf: waited for ever
    default=60.0,
    show_default=True,
    help="Seconds to wait for the orchestrator's answer (the publisher keeps retrying).",
)
def register(url: str, key: str, namespace: str, price_per_event: int, timeout: float) -> None:
    """Register NAMESPACE as a replay-capable publication (call the PUBLISHER's URL with the
    publisher's key). The publisher sends it to the orchestrator, again with back-off until
    the orchestrator answers; this waits for the outcome and prints each state it sees."""
    c = _client(url, load_identity(key))
    state = c.call("loglake_register", (namespace, price_per_event))
    console.print(f"{namespace}: {state}")
    deadline = time.monotonic() + timeout
    seen, error = state, ""
    while state not in ("registered", "refused"):
        if time.monotonic() > deadline:
            raise CliError(
                f"{namespace}: still {state} after {timeout:g} s (the publisher retries)"
            )
        time.sleep(0.2)
        [(_, state, attempts, error)] = c.call("loglake_registrations", [namespace])
        if state != seen:
            console.print(
                f"{namespace}: {state} (attempt {attempts}{'; ' + error if error else ''})"
            )
            seen = state
    if state == "refused":
        raise CliError(f"{namespace}: the orchestrator refused the registration: {error}")


@command.command()
@url_opt
@key_opt
@click.argument("namespace")
@click.option("--filter", "filter_", help='ICRC-16 path filter, e.g. kind == "a".')
@click.option(
    "--skip",
    callback=_checked_skip,
    help="MOD[,OFFSET]: deliver id i iff (i+OFFSET) % MOD == 0.",
)
@click.option("--stopped", is_flag=True, help="Register stopped (no live delivery).")
def subscribe(
    url: str,
    key: str,
    namespace: str,
    filter_: str | None,
    skip: tuple[int, ...] | None,
    stopped: bool,
) -> None:
    """Register a subscription with the orchestrator."""
    cfg = _config(filter_, skip, "icrc72:subscription:")
    if stopped:
        cfg.append((C_SUB_STOPPED, {"Bool": True}))
    [r] = _client(url, load_identity(key)).call(
        "icrc72_register_subscription", [Registration(namespace, cfg)]
    )
    console.print(f"subscription {_unwrap(r, 'subscription')} on {namespace}")


def _replays(
    c: HttpEventsClient, flt: OrchestrationFilter | None = None, limit: int | None = None
) -> Iterator[ReplayStatus]:
    """Every replay this key can see (at most ``limit``), a page at a time (``prev``)."""
    from loglake.events.orchestrator import next_replays_cursor

    prev, n = None, 0
    while limit is None or n < limit:
        page = c.call("icrc77_get_replays", GetReplays(prev, MAX_TAKE, flt))
        for s in page:
            if s is not None and (limit is None or n < limit):
                n += 1
                yield s
        prev = next_replays_cursor(page)
        if len(page) < MAX_TAKE or prev is None:
            return


def _status(c: HttpEventsClient, rid: int) -> ReplayStatus:
    """Replay ``rid``: the page of one after ``rid - 1``. One call, whatever the key's other
    replays (``replay`` asks 5 times a second; each call counts toward the orchestrator's
    ``max_queries_per_window``)."""
    from loglake.events.orchestrator import replay_cursor

    try:
        after = replay_cursor(rid - 1)
    except OverflowError:  # no replay id is negative or past 64 bits
        after = None
    page = [] if after is None else c.call("icrc77_get_replays", GetReplays(after, 1))
    for s in page:
        if s is not None and s.replay_id == rid:
            return s
    raise CliError(f"no replay {rid} visible to this key")


@command.command()
@url_opt
@key_opt
@click.argument("namespace")
@click.option("--from", "start", type=NAT, required=True, help="First event id.")
@click.option("--to", "end", type=NAT, default=None, help="End (exclusive); default: head.")
@click.option("--filter", "filter_", help='ICRC-16 path filter, e.g. kind == "a".')
@click.option("--skip", callback=_checked_skip, help="MOD[,OFFSET]")
@click.option("--no-wait", is_flag=True, help="Return once registered.")
@click.option(
    "--timeout",
    type=SECONDS,  # nan, inf: waited for ever
    default=600.0,
    show_default=True,
    help="Seconds to wait for the replay to end.",
)
def replay(
    url: str,
    key: str,
    namespace: str,
    start: int,
    end: int | None,
    filter_: str | None,
    skip: tuple[int, ...] | None,
    no_wait: bool,
    timeout: float,
) -> None:
    """Register an ICRC-77 replay and show its progress until it ends."""
    ident = load_identity(key)
    c = _client(url, ident)
    [r] = c.call(
        "icrc77_register_replay",
        [ReplayRegistration(namespace, start, end, _config(filter_, skip))],
    )
    rid = _unwrap(r, "replay")
    console.print(f"replay {rid} registered")
    if no_wait:
        return
    st = _status(c, rid)
    expected = next((v["Nat"] for k, v in st.stats if k == "icrc77:replay:expected"), None)
    deadline = time.monotonic() + timeout
    with Progress(
        TextColumn("replay {task.fields[rid]} [bold]{task.fields[state]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("replay", total=expected, rid=rid, state=str(st.status))
        while not st.status.final and time.monotonic() < deadline:
            time.sleep(0.2)
            st = _status(c, rid)
            sent = next((v["Nat"] for k, v in st.stats if k == "icrc77:replay:sent"), 0)
            bar.update(task, completed=sent, state=str(st.status))
        done = st.status.value if isinstance(st.status.value, int) else None
        bar.update(task, completed=done if done is not None else 0, state=str(st.status))
    if st.status.tag != "completed":
        raise CliError(f"replay {rid} ended {st.status}")
    if skip or filter_:
        # completed(n) counts the events the publisher republished; the Broadcaster applies
        # the filter and skip, so the subscriber receives only those they keep
        kept = _skip_keeps(skip, st.start, st.start + done) if done is not None else None
        if kept is not None and not filter_:
            reach = f"the skip lets {kept:,} of them reach the subscriber"
        else:
            rules = "the filter and skip decide" if skip else "the filter decides"
            reach = f"{rules} which reach the subscriber"
        console.print(
            f"{done:,} events of {_range(st)} republished to the Broadcaster; {reach} "
            "(`loglake events received` shows what arrived)"
        )


def _skip_keeps(skip: tuple[int, ...] | None, start: int, end: int) -> int | None:
    """How many ids of ``[start, end)`` ``--skip MOD[,OFFSET]`` keeps (``filters.Skip``)."""
    if not skip:
        return None
    m, o = skip[0], skip[1] if len(skip) > 1 else 0
    first = start + (-(start + o)) % m  # the first id i >= start with (i + o) % m == 0
    return max(0, (end - first + m - 1) // m)


def _range(s: ReplayStatus) -> str:
    """``[10, 20)``; an open-ended replay runs to the head of the log when it starts."""
    return f"[{s.start}, {s.end})" if s.end is not None else f"[{s.start}, head)"


@command.command()
@url_opt
@key_opt
@click.argument("spender")
@click.argument("amount", type=NAT)
def approve(url: str, key: str, spender: str, amount: int) -> None:
    """ICRC-2 approve SPENDER (the orchestrator's principal) to spend AMOUNT for replays."""
    c = _client(url, load_identity(key))
    r = c.call("icrc2_approve", (principal_from_text(spender), amount))
    console.print(f"approved {amount} (block {_unwrap(r, 'approve')})")
    bal = c.call("icrc1_balance_of", (load_identity(key).principal, None))
    console.print(f"balance {bal}")


@command.command(name="replay-status")
@url_opt
@key_opt
@click.argument("replay_id", type=NAT)
def replay_status(url: str, key: str, replay_id: int) -> None:
    """Show one replay's status."""
    st = _status(_client(url, load_identity(key)), replay_id)
    console.print_json(json.dumps(_row(st)))


def _row(s: ReplayStatus) -> dict:
    return {
        "replayId": s.replay_id,
        "namespace": s.namespace,
        "range": [s.start, s.end],
        "status": str(s.status),
        "stats": {k: str(next(iter(v.values()))) for k, v in s.stats},
    }


@command.command()
@url_opt
@key_opt
@click.argument("replay_ids", type=NAT, nargs=-1, required=True)
def cancel(url: str, key: str, replay_ids: tuple[int, ...]) -> None:
    """Cancel replays (sent notifications stay sent). Prints one line per id, ``canceled`` or
    why not (``NotFound``, ``Unauthorized``, ``CannotCancel: …``); exit status 0 when every
    cancel was accepted, 1 when any was refused."""
    refused = 0
    for rid, r in zip(
        replay_ids,
        _client(url, load_identity(key)).call("icrc77_cancel_replay", list(replay_ids)),
        strict=True,
    ):
        console.print(f"{rid}: {'canceled' if isinstance(r, Ok) else r}")
        refused += not isinstance(r, Ok)
    if refused:  # a script must not read a refusal as done
        raise CliError(f"{refused} of {len(replay_ids)} cancel(s) refused")


@command.command()
@url_opt
@key_opt
@click.option("--namespace", help="Only this namespace.")
@click.option(
    "--take",
    type=click.IntRange(0, MAX_LISTED_REPLAYS),
    default=100,
    show_default=True,
    help="At most this many replays.",
)
def replays(url: str, key: str, namespace: str | None, take: int) -> None:
    """List the replays this key can see."""
    flt = OrchestrationFilter("All", slices=(("ByNamespace", namespace),)) if namespace else None
    t = Table("id", "namespace", "range", "status")
    for s in _replays(_client(url, load_identity(key)), flt, take):
        t.add_row(str(s.replay_id), s.namespace, _range(s), str(s.status))
    console.print(t)


@command.command()
@url_opt
@key_opt
@click.option(
    "--take",
    type=click.IntRange(0, INBOX_KEEP),  # a subscriber keeps no more
    default=100,
    show_default=True,
    help="At most this many.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def received(url: str, key: str, take: int, as_json: bool) -> None:
    """Take what a subscriber received, oldest first (call the SUBSCRIBER's URL with the
    subscriber's key): event id, namespace, replay id (replayed events), value. The
    notifications shown are then removed from the subscriber's inbox (acknowledged after they
    are printed): a run cut short before that shows them again, none is lost. Fewer than
    --take when they would make a reply over the subscriber's budget (64 MiB)."""
    reader = InboxReader(_client(url, load_identity(key)))
    rows = [_notification(n) for n in reader.read(take)]
    if as_json:
        for r in rows:
            click.echo(json.dumps(r))
    else:
        t = Table("event", "namespace", "replay", "timestamp", "value")
        for r in rows:
            t.add_row(
                str(r["event_id"]), r["namespace"], str(r["replay_id"] or ""),
                str(r["timestamp"]), json.dumps(r["value"])[:60],
            )  # fmt: skip
        console.print(t)
        console.print(f"{len(rows)} notification(s)")
    if rows:
        reader.acknowledge()


def _hex(v: Any) -> str:
    """A #Blob's bytes (and any other non-JSON value) in JSON."""
    return bytes(v).hex() if isinstance(v, bytes | bytearray | memoryview) else str(v)


def _notification(n: Any) -> dict[str, Any]:
    from loglake.events.messages import H_REPLAY_ID
    from loglake.wire.icrc16 import map_get

    replay = map_get(n.headers or [], H_REPLAY_ID)
    return {
        "event_id": n.event_id,
        "namespace": n.namespace,
        "replay_id": replay["Nat"] if isinstance(replay, dict) else None,
        "timestamp": n.timestamp,
        "value": json.loads(json.dumps(n.data, default=_hex)),  # ICRC-16 as JSON
    }


if __name__ == "__main__":  # pragma: no cover - `python -m loglake.events.cli`
    command()
