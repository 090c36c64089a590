"""The ``loglake`` command.

Each part that has commands ships ``loglake/<part>/cli.py`` exposing a ``click`` object named
``command`` (a group or a command); this module mounts it under the part's name. Keeping the
commands beside their part means a part's CLI changes never touch this file. A part listed here
whose CLI fails to import fails the whole command loudly rather than vanishing from --help.
"""

from __future__ import annotations

import importlib
import logging
import sys

import click

from loglake import __version__
from loglake.clitools import CONTEXT_SETTINGS, TypedErrorGroup

# (module, command name) in help order; None mounts a group's commands flat (`serve`, `job`).
PART_COMMANDS = (
    ("loglake.node.cli", None),
    ("loglake.node.command", "node"),
    ("loglake.log.cli", "log"),
    ("loglake.streams.cli", "stream"),
    ("loglake.events.cli", "events"),
    ("loglake.cardinal.cli", "cardinal"),
    ("loglake.archives.cli", "archives"),
    ("loglake.sds.cli", "sds"),
    ("loglake.pipeline.cli", None),
)


@click.group(cls=TypedErrorGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="loglake")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("--log-json", is_flag=True, help="Log as JSON lines (for machines).")
def main(verbose: int, log_json: bool) -> None:
    """loglake keeps the history of message streams and gives it back to whoever missed it."""
    from loglake.logs import configure_logging

    configure_logging(logging.WARNING - 10 * min(verbose, 2), json=log_json)


def _mount() -> None:
    for module, name in PART_COMMANDS:
        obj = importlib.import_module(module).command
        if isinstance(obj, click.Group) and name is None:
            for sub in obj.commands.values():  # flat commands such as `serve`, `job`
                main.add_command(sub)
        else:
            main.add_command(obj, name or obj.name)


_mount()

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
