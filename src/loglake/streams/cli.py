"""``loglake stream …``: talk to a running stream service (``loglake serve``) from the shell.

Every subcommand connects with ``StreamClient`` to ``--host``/``--port``, prints rich tables for
people and, with ``--json``, one JSON document for scripts. Message data is shown as UTF-8 when it
decodes, else as hex (``--json`` always gives ``data`` as text and ``data_hex``).

TLS (docs/security.md): ``--tls-ca`` (the CA that signed the service's certificate), and for mutual
TLS ``--tls-cert``/``--tls-key``; each also from ``LOGLAKE_TLS_CA``/``_CERT``/``_KEY``. ``--tls``
alone trusts the system's CAs.

``--server-max-frame``: a server does not announce its ``--limits-max-frame``, so a push larger
than the default's 32 MiB is refused by the client (``PushTooLarge``) unless told the server's.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from loglake.clitools import PORT, POSITIVE_SECONDS, Renamed
from loglake.streams.client import DEFAULT_PORT, SERVER_MAX_FRAME, PushTooLarge, StreamClient
from loglake.streams.limits import ServerLimits, limit_fields, parse_limit
from loglake.streams.service import MAX_PARTITIONS
from loglake.streams.tls import client_context
from loglake.wire.ockam import route_text

DEFAULT_TIMEOUT = 30.0
TIMEOUT_HELP = "Seconds to wait for the service to connect and to answer each request."


def _client(ctx: click.Context) -> StreamClient:
    obj = ctx.ensure_object(dict)
    tls = None
    if obj.get("tls") or obj.get("tls_ca") or obj.get("tls_cert"):
        tls = client_context(obj.get("tls_ca"), obj.get("tls_cert"), obj.get("tls_key"))
    client = StreamClient(
        obj["host"],
        obj["port"],
        tls=tls,
        server_hostname=obj.get("server_name"),
        server_max_frame=obj.get("server_max_frame") or SERVER_MAX_FRAME,
        timeout=obj.get("timeout") or DEFAULT_TIMEOUT,
    )
    ctx.call_on_close(client.close)
    return client


class FrameSize(click.ParamType):
    """``--server-max-frame``: bytes, written as the server's ``--limits-max-frame`` takes them
    (``67108864`` or ``64MiB``), so an operator copies the server's value as it is; at least
    that limit's minimum and at most what the 4-byte frame length can state."""

    name = "bytes"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            raw: Any = value
        else:
            raw = str(value)
        [field] = [f for f in limit_fields() if f.name == "max_frame"]
        try:  # the limit's own range: at most what the frame length's 4 bytes can state
            return int(parse_limit(field, raw))
        except ValueError as e:
            self.fail(f"{e}, got {raw!r}", param, ctx)


SERVER_MAX_FRAME_HELP = (
    "The largest push frame the server takes: the server's --limits-max-frame (bytes, or "
    f"e.g. 64MiB; default {ServerLimits().max_frame // 2**20}MiB, the server's default). A "
    "larger push is refused before it is sent."
)


def _out(ctx: click.Context, as_json: bool, doc: object, table: Table | str) -> None:
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        Console().print(table)


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.hex()


INDEX = click.IntRange(0, 2**64 - 1)
"""An index or a count on the wire: a BARE ``uint`` (u64). Outside it, ``pull --from -1``,
``--limit -1`` and ``index --save -1`` were ``BareEncodeError`` tracebacks."""

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
partition_option = click.option(
    "-p",
    "--partition",
    type=click.IntRange(0, MAX_PARTITIONS - 1),  # -1: a KeyError traceback from push and pull
    default=0,
    show_default=True,
    help="Partition number.",
)


def _override(ctx: click.Context, param: click.Parameter, value: object) -> None:
    """A connection option given after the subcommand wins over the group's."""
    if value is not None:  # the subcommand's context shares the group's obj dict
        ctx.ensure_object(dict)[str(param.name)] = value


class ConnectionGroup(click.Group):
    """``--host``/``--port`` belong to the group (``loglake stream --port 4001 pull s``), and
    every subcommand takes them after its name too (``loglake stream pull s --port 4001``), as
    the ``cardinal`` and ``sds`` commands do: one place for them in every command line."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            _with_connection(cmd)
        return cmd


def _with_connection(cmd: click.Command) -> None:
    if getattr(cmd, "_connection_options", False):
        return
    cmd._connection_options = True  # type: ignore[attr-defined]
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _with_connection(sub)
        return
    cmd.params += [
        click.Option(
            ["--host"], callback=_override, expose_value=False, help="Stream service host."
        ),
        click.Option(
            ["--port"], type=PORT, callback=_override, expose_value=False, help="Its port."
        ),
        click.Option(
            ["--timeout"],
            type=POSITIVE_SECONDS,
            callback=_override,
            expose_value=False,
            help=TIMEOUT_HELP,
        ),
    ]


@click.group(cls=ConnectionGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="127.0.0.1", show_default=True, help="Stream service host.")
@click.option("--port", type=PORT, default=DEFAULT_PORT, show_default=True, help="Its port.")
@click.option(
    "--timeout",
    type=POSITIVE_SECONDS,
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help=TIMEOUT_HELP,
)
@click.option("--tls", is_flag=True, help="Connect over TLS (trusting the system's CAs).")
@click.option(
    "--tls-ca",
    type=click.Path(dir_okay=False, exists=True),
    envvar="LOGLAKE_TLS_CA",
    help="Connect over TLS, trusting this CA (PEM) for the service's certificate.",
)
@click.option(
    "--tls-cert",
    type=click.Path(dir_okay=False, exists=True),
    envvar="LOGLAKE_TLS_CERT",
    help="Mutual TLS: this client certificate (PEM).",
)
@click.option(
    "--tls-key",
    type=click.Path(dir_okay=False, exists=True),
    envvar="LOGLAKE_TLS_KEY",
    help="Mutual TLS: the client certificate's key (PEM).",
)
@click.option(
    "--server-name", help="The name the service's certificate must carry (default: --host)."
)
@click.option("--server-max-frame", type=FrameSize(), metavar="BYTES", help=SERVER_MAX_FRAME_HELP)
@click.pass_context
def command(
    ctx: click.Context,
    host: str,
    port: int,
    tls: bool = False,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    server_name: str | None = None,
    server_max_frame: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> None:
    """Create, push to, pull from and inspect streams of a running stream service."""
    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together")
    ctx.ensure_object(dict).update(
        host=host,
        port=port,
        tls=tls,
        tls_ca=tls_ca,
        tls_cert=tls_cert,
        tls_key=tls_key,
        server_name=server_name,
        server_max_frame=server_max_frame,
        timeout=timeout,
    )


@command.command()
@click.argument("name", required=False)
@click.option(
    "--partitions",
    type=click.IntRange(1, MAX_PARTITIONS),  # past it: the server's "Invalid request", exit 1
    default=1,
    show_default=True,
    help="Partition count.",
)
@json_option
@click.pass_context
def create(ctx: click.Context, name: str | None, partitions: int, as_json: bool) -> None:
    """Create stream NAME (a random name if omitted), or open it if it exists."""
    c = _client(ctx)
    name = c.create_stream(name, partitions)
    # an existing stream keeps its partitions: found from outside, one of 5 opened with
    # --partitions 2 listed partitions 0-1 only. Opened again with its own count, every
    # partition's address is listed, and a note says the count differs from --partitions
    [info] = c.info(name)
    have = len(info.partitions)
    if have > partitions:
        c.create_stream(name, have)
    addrs = {p: route_text(a) for (s, p), a in sorted(c.addresses.map.items()) if s == name}
    table = Table("partition", "worker address", title=f"stream {name}")
    for p, a in addrs.items():
        table.add_row(str(p), a)
    doc: dict[str, Any] = {"stream": name, "addresses": addrs}
    if have != partitions:
        doc["partitions"] = have
        table.caption = (
            f"stream has {have} partitions (it existed: --partitions {partitions} ignored)"
        )
    _out(ctx, as_json, doc, table)


@command.command()
@click.argument("stream")
@click.argument("messages", nargs=-1)
@partition_option
@click.option("--stdin", is_flag=True, help="Push each line of standard input.")
@click.option(
    "--server-max-frame",
    type=FrameSize(),
    metavar="BYTES",
    callback=_override,
    expose_value=False,
    help=SERVER_MAX_FRAME_HELP,
)
@json_option
@click.pass_context
def push(
    ctx: click.Context,
    stream: str,
    messages: tuple[str, ...],
    partition: int,
    stdin: bool,
    as_json: bool,
) -> None:
    """Push MESSAGES (text) to STREAM; print the index each got."""
    datas = [m.encode() for m in messages]
    if stdin:
        datas += [line.rstrip("\n").encode() for line in sys.stdin]
    if not datas:
        raise click.UsageError("nothing to push: give MESSAGES or --stdin")
    try:
        indexes = _client(ctx).push_many(stream, datas, partition)
    except PushTooLarge as e:  # nothing was sent; say which option lifts the client's limit
        raise click.ClickException(
            f"{e}; if the server takes larger frames, pass its --limits-max-frame as "
            "--server-max-frame"
        ) from e
    table = Table("index", "data", title=f"pushed to {stream}/{partition}")
    for i, d in zip(indexes, datas, strict=True):
        table.add_row(str(i), _text(d))
    _out(ctx, as_json, {"stream": stream, "partition": partition, "indexes": indexes}, table)


@command.command()
@click.argument("stream")
@partition_option
@click.option(
    "--from",
    "--index",
    "index",
    cls=Renamed,
    old=("--index",),
    type=INDEX,
    default=0,
    show_default=True,
    help="First index to read.",
)
@click.option("--limit", type=INDEX, default=100, show_default=True, help="At most this many.")
@json_option
@click.pass_context
def pull(
    ctx: click.Context, stream: str, partition: int, index: int, limit: int, as_json: bool
) -> None:
    """Pull at most LIMIT messages of STREAM from INDEX on."""
    msgs = _client(ctx).pull(stream, index, limit, partition)
    table = Table("index", "data", title=f"{stream}/{partition} from {index}")
    for m in msgs:
        table.add_row(str(m.index), _text(m.data))
    doc = [{"index": m.index, "data": _text(m.data), "data_hex": m.data.hex()} for m in msgs]
    _out(ctx, as_json, {"stream": stream, "partition": partition, "messages": doc}, table)


class _GetByDefault(click.Group):
    """``loglake stream index CLIENT_ID STREAM`` (the get it always was) stays valid beside
    ``index reset``/``index delete``: arguments that do not start with a subcommand's name are
    a ``get``'s. A client id spelled like a subcommand is read with ``index get``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["get", *args]
        return super().parse_args(ctx, args)


@command.group(cls=_GetByDefault)
def index() -> None:
    """Consumer indexes: get or save (get), and an operator's reset or delete.

    \b
    loglake stream index CLIENT_ID STREAM [--save N]   same as: index get ...
    loglake stream index reset CLIENT_ID STREAM [--to N]
    loglake stream index delete CLIENT_ID STREAM
    """


def _show_index(
    ctx: click.Context, as_json: bool, client_id: str, stream: str, partition: int, stored: object
) -> None:
    doc = {"client_id": client_id, "stream": stream, "partition": partition, "index": stored}
    shown = "deleted" if stored is None else f"index [bold]{stored}[/]"
    text = f"consumer [bold]{client_id}[/] on {stream}/{partition}: {shown}"
    _out(ctx, as_json, doc, text)


@index.command(name="get")
@click.argument("client_id")
@click.argument("stream")
@partition_option
@click.option("--save", type=INDEX, default=None, help="Save this index (monotonic).")
@json_option
@click.pass_context
def index_get(
    ctx: click.Context,
    client_id: str,
    stream: str,
    partition: int,
    save: int | None,
    as_json: bool,
) -> None:
    """Get (or --save) the consumer index of CLIENT_ID on STREAM."""
    c = _client(ctx)
    stored = (
        c.get_index(client_id, stream, partition)
        if save is None
        else c.save_index(client_id, stream, save, partition)
    )
    _show_index(ctx, as_json, client_id, stream, partition, stored)


@index.command(name="reset")
@click.argument("client_id")
@click.argument("stream")
@partition_option
@click.option(
    "--to",
    "to",
    type=INDEX,
    default=0,
    show_default=True,
    help="The index to set, lower than the stored one or not.",
)
@json_option
@click.pass_context
def index_reset(
    ctx: click.Context, client_id: str, stream: str, partition: int, to: int, as_json: bool
) -> None:
    """Set CLIENT_ID's index on STREAM to --to, even if lower (indexes otherwise only go up).

    For a consumer stuck too high, or one to replay from the start. Needs the admin grant on
    STREAM when the service has an access file; the consumer keeps its owner.
    """
    stored = _client(ctx).reset_index(client_id, stream, to, partition)
    _show_index(ctx, as_json, client_id, stream, partition, stored)


@index.command(name="delete")
@click.argument("client_id")
@click.argument("stream")
@partition_option
@json_option
@click.pass_context
def index_delete(
    ctx: click.Context, client_id: str, stream: str, partition: int, as_json: bool
) -> None:
    """Forget CLIENT_ID's index on STREAM and its owner (the next get starts it at 0, the
    next save under an access file owns it). Needs the admin grant on STREAM."""
    stored = _client(ctx).reset_index(client_id, stream, None, partition)
    _show_index(ctx, as_json, client_id, stream, partition, stored)


@command.command(name="list")
@json_option
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """List the streams with their partition count and record count."""
    infos = _client(ctx).info()
    table = Table("stream", "partitions", "records", title="streams")
    doc = []
    for s in infos:
        records = sum(p.next_index - p.first_index for p in s.partitions)
        table.add_row(s.stream_name, str(len(s.partitions)), str(records))
        doc.append({"stream": s.stream_name, "partitions": len(s.partitions), "records": records})
    _out(ctx, as_json, doc, table)


@command.command()
@click.argument("stream")
@json_option
@click.pass_context
def info(ctx: click.Context, stream: str, as_json: bool) -> None:
    """Show STREAM's partitions: first and next index, bytes."""
    s = _client(ctx).info(stream)[0]
    table = Table("partition", "first index", "next index", "bytes", title=f"stream {stream}")
    doc = []
    for p in s.partitions:
        table.add_row(str(p.partition), str(p.first_index), str(p.next_index), str(p.bytes))
        doc.append(
            {
                "partition": p.partition,
                "first_index": p.first_index,
                "next_index": p.next_index,
                "bytes": p.bytes,
            }
        )
    _out(ctx, as_json, {"stream": stream, "partitions": doc}, table)
