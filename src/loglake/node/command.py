"""``loglake node``: run the node (``--config loglake.toml``), or ``loglake node walkthrough``.

Every key of the config (``node/config.py`` ``OPTIONS``) is also a flag here, generated from
the same table (``[http] port`` → ``--http-port``, env ``LOGLAKE_HTTP_PORT``), so ``--help``
lists them all with their variables. A flag wins over the environment, which wins over the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from loglake.clitools import CONTEXT_SETTINGS, PORT, TypedErrorGroup
from loglake.node.config import (
    OPTIONS,
    Option,
    default_data_dir,
    load_config,
    unknown_variables,
)
from loglake.streams import eventloop
from loglake.streams.nats_url import backend_url

SHORT_FLAGS = {"streams.backend": "--backend", "streams.replicas": "--replicas"}
"""Flags that also go by the name ``loglake serve`` gives the same setting."""


def _flags_of(o: Option) -> list[str]:
    if o.is_bool:
        return [o.flag, f"--no-{o.flag[2:]}"]
    return [o.flag, *([SHORT_FLAGS[o.name]] if o.name in SHORT_FLAGS else [])]


def _flag(o: Option) -> Any:
    default = o.default if not isinstance(o.default, tuple) else ",".join(o.default) or "none"
    if o.name == "data_dir":
        default = default_data_dir()
    elif o.name == "archives.trackers":  # None there means "the layout's", not "none"
        default = "the layout's"
    elif default is None:
        default = "none"
    help_ = f"{o.help} [{o.where}; env {o.env}; default {default}]"
    param = o.name.replace(".", "__")
    if o.is_bool:
        return click.option("/".join(_flags_of(o)), param, default=None, help=help_)
    return click.option(*_flags_of(o), param, default=None, metavar="VALUE", help=help_)


_FLAG_OF = {o.name.replace(".", "__"): "/".join(_flags_of(o)) for o in OPTIONS}
"""A flag's parameter name → its flags, for the error naming it."""


def _with_option_flags(f: Any) -> Any:
    for o in reversed(OPTIONS):
        f = _flag(o)(f)
    return f


@click.group(
    cls=TypedErrorGroup,
    context_settings=CONTEXT_SETTINGS,
    invoke_without_command=True,
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="LOGLAKE_CONFIG",
    help="TOML config file (env LOGLAKE_CONFIG); flags and LOGLAKE_* variables override it.",
)
@_with_option_flags
@click.pass_context
def command(ctx: click.Context, config_path: Path | None, **flags: Any) -> None:
    """Run a loglake node: the stream service, ICRC roles, archives, SDS, the HTTP API,
    /metrics and the web console, as the config says (docs/node.md).

    The API and console need the bearer token printed at first start (kept in
    <data dir>/node.token, mode 0600). `loglake node walkthrough` runs a node on a temp dir and
    walks through all five protocols against it.
    """
    if ctx.invoked_subcommand is not None:
        given = [n for n, v in flags.items() if v is not None]
        if given or config_path is not None:
            # they would be silently ignored: `loglake node --backend X walkthrough` walked
            # through on the embedded log
            names = ["--config"] if config_path is not None else []
            names += [_FLAG_OF[n] for n in given]
            raise click.UsageError(
                f"{', '.join(names)}: options of `loglake node` itself, not of "
                f"`{ctx.invoked_subcommand}`; give its own after it "
                f"(`loglake node {ctx.invoked_subcommand} --help`)"
            )
        return
    from loglake.node.runner import run_until_signalled

    for warning in unknown_variables():
        click.echo(warning, err=True)
    config = load_config(config_path, {k.replace("__", "."): v for k, v in flags.items()})
    eventloop.run(run_until_signalled(config, say=lambda s: click.echo(s, err=True)))


@command.command()
@click.option("--keep", is_flag=True, help="Keep the node running afterwards (Ctrl-C stops it).")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the node's data here (default: a temporary directory, removed afterwards).",
)
@click.option("--http-port", type=PORT, default=0, help="HTTP port (default: any free port).")
@click.option(
    "--backend",
    metavar="[nats://H1,H2,H3]",
    is_flag=False,
    flag_value="local",
    callback=lambda ctx, p, v: v if v == "local" else backend_url(ctx, p, v),
    help="Keep the node's streams in this NATS JetStream cluster (default: the embedded log); "
    "--backend alone starts a local 3-node cluster (loopback, temp dirs, R3) for the "
    "walkthrough and stops it at the end.",
)
@click.option(
    "--replicas",
    type=click.IntRange(1, 5),
    default=1,
    show_default=True,
    help="With --backend: replicas of each stream.",
)
def walkthrough(
    keep: bool, data_dir: Path | None, http_port: int, backend: str | None, replicas: int
) -> None:
    """Start a node (embedded default: every part on) and walk through all five protocols
    against it: a partitioned stream, an ICRC publish and replay, a Cardinal chain with a
    reorg, an SDS exchange with a lost message repaired, a weekly archive built and fetched
    by a member; print a summary and the console URL, then stop (--keep: keep it running)."""
    from loglake.node.walkthrough import run_walkthrough

    run_walkthrough(
        keep=keep, data_dir=data_dir, http_port=http_port, backend=backend, replicas=replicas
    )
