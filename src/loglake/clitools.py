"""What every loglake command group shares.

``TypedErrorGroup`` turns a ``LoglakeError`` (a typed error the user can act on: a bad option, a
missing stream, a peer that refused) into click's one-line ``Error: ...`` and exit status 1, so
no part shows a traceback for a mistake, whether it runs under ``loglake`` or alone with
``python -m loglake.<part>.cli``. The same holds for the machine refusing a file operation
(read-only, full or missing data dir, a file where a folder should be, no permission): the
user fixes the machine, not the code, so one line naming the path helps and a traceback does
not (``-vv`` still logs it). Either error raised inside a Spark task reaches the driver wrapped
in Spark's exception; it is read back from there (``loglake.errors.task_error``) and printed the
same. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

import click

from loglake.errors import LoglakeError, task_error

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}

# Every TCP port option: a number outside 0-65535 is refused by click with a one-line error,
# instead of wrapping (70000 listened on 4464) or reaching getaddrinfo ("Servname not supported").
PORT = click.IntRange(0, 65535)

# The errors of the machine rather than of loglake: what the user can fix in the file system.
ENVIRONMENT_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOSPC,
        errno.EDQUOT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.ENOENT,
        errno.EEXIST,
        errno.EMFILE,
        errno.ENFILE,
        errno.ENAMETOOLONG,
        errno.ELOOP,
    }
)


def environment_error_message(e: OSError) -> str:
    """``Read-only file system: /data/node.token`` — the reason, then the path it concerns."""
    reason = e.strerror or str(e)
    paths = [str(p) for p in (e.filename, e.filename2) if p is not None]
    return f"{reason}: {' -> '.join(paths)}" if paths else reason


class Renamed(click.Option):
    """An option whose old spellings keep working but are not shown: one vocabulary across
    commands (``--key-file``, ``--stream``, ``--from``, ``--peer``) without breaking scripts
    that use the old names. ``@click.option("--key-file", "--key", "key", cls=Renamed,
    old=("--key",))``."""

    def __init__(self, *args: Any, old: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.old = frozenset(old)

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        shown, self.opts = self.opts, [o for o in self.opts if o not in self.old]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = shown


class TypedErrorGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as e:
            # a Spark task's typed error arrives wrapped in Spark's exception: read back
            err = e if isinstance(e, (LoglakeError, OSError)) else task_error(e)
            if isinstance(err, LoglakeError):
                raise click.ClickException(str(err)) from e
            if not isinstance(err, OSError) or err.errno not in ENVIRONMENT_ERRNOS:
                raise
            logging.getLogger("loglake").debug("file system error", exc_info=True)
            raise click.ClickException(environment_error_message(err)) from e
