"""The ``loglake`` command.

Each part that has commands ships ``loglake/<part>/cli.py`` exposing a ``click`` object named
``command`` (a group or a command); this module mounts it under the part's name. Keeping the
commands beside their part means a part's CLI changes never touch this file. A part is imported
when its command runs; one whose CLI fails to import fails that command and ``--help`` loudly
rather than vanishing from the list.
"""

from __future__ import annotations

import importlib
import logging
import sys

import click

from loglake import __version__
from loglake.clitools import CONTEXT_SETTINGS, TypedErrorGroup

# command name → (module whose ``command`` it is, the subcommand of that group mounted flat, or
# None to mount the module's ``command`` itself). tests/test_cli.py checks this table against
# the modules, so it cannot drift from what they define.
PART_COMMANDS: dict[str, tuple[str, str | None]] = {
    "serve": ("loglake.node.cli", "serve"),
    "demo": ("loglake.node.cli", "demo"),
    "node": ("loglake.node.command", None),
    "log": ("loglake.log.cli", None),
    "stream": ("loglake.streams.cli", None),
    "events": ("loglake.events.cli", None),
    "cardinal": ("loglake.cardinal.cli", None),
    "archives": ("loglake.archives.cli", None),
    "sds": ("loglake.sds.cli", None),
    "job": ("loglake.pipeline.cli", "job"),
}


class PartsGroup(TypedErrorGroup):
    """Imports a part's commands only when they run (or when --help lists them).

    Why: importing every part (JetStream's client, Spark's data source API, aiohttp, numpy)
    took 1.2-1.9 s before any command started; a command now pays for its own part only.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(PART_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in PART_COMMANDS:
            return None
        module, sub = PART_COMMANDS[cmd_name]
        obj = importlib.import_module(module).command
        if sub is None:
            return obj
        assert isinstance(obj, click.Group), f"{module}.command is not a group"
        return obj.commands[sub]


@click.group(cls=PartsGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="loglake")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("--log-json", is_flag=True, help="Log as JSON lines (for machines).")
def main(verbose: int, log_json: bool) -> None:
    """loglake keeps the history of message streams and gives it back to whoever missed it."""
    from loglake.structured_logging import configure_logging

    configure_logging(logging.WARNING - 10 * min(verbose, 2), json=log_json)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
