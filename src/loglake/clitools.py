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

Ctrl-C (SIGINT), which reaches a command as ``KeyboardInterrupt``, ends it with the one line
``interrupted`` and exit status 130 (``INTERRUPTED_EXIT``), after the clean-ups registered with
``on_interrupt`` (a Spark session stopped). click's own handling was ``Aborted!`` and status 1,
a failure's. The servers (``serve``, ``node``, ``events serve``) catch SIGINT themselves and end
with ``stopped`` and status 0: for them it is the way to stop.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NoReturn

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


INTERRUPTED_EXIT = 130
"""The exit status of a command ended by Ctrl-C: 128 + SIGINT, what a shell reports for a
process SIGINT ended, so a script can tell an interrupted run from a failed one (1)."""

_INTERRUPT_CLEANUPS: list[Callable[[], None]] = []


def on_interrupt(cleanup: Callable[[], None]) -> None:
    """Run ``cleanup()`` when a command ends on Ctrl-C, before ``interrupted`` is printed (once
    however often it is registered). Its errors are ignored: the command is ending anyway. Why:
    what the command left running must stop before the process reports and exits (a Spark
    session: ``loglake.pipeline.session``)."""
    if cleanup not in _INTERRUPT_CLEANUPS:
        _INTERRUPT_CLEANUPS.append(cleanup)


def interrupted() -> NoReturn:
    """End the command on Ctrl-C: the ``on_interrupt`` cleanups, the line ``interrupted`` on
    stderr, exit status ``INTERRUPTED_EXIT``. A second Ctrl-C skips the cleanups left."""
    for cleanup in list(_INTERRUPT_CLEANUPS):
        try:
            cleanup()
        except KeyboardInterrupt:
            break
        except Exception:
            logging.getLogger("loglake").debug("cleanup after Ctrl-C failed", exc_info=True)
    click.echo("interrupted", err=True)
    raise click.exceptions.Exit(INTERRUPTED_EXIT)


def _unwinding_an_interrupt(e: BaseException) -> bool:
    """``e`` was raised while a ``KeyboardInterrupt`` unwound the command (a ``finally`` or an
    ``except`` on its way): Ctrl-C is what happened, whatever broke after it."""
    seen: set[int] = set()
    cause = e.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__context__
    return False


class TypedErrorGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted()
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise  # click's own: a message and a status already (an inner group's interrupted)
        except Exception as e:
            if _unwinding_an_interrupt(e):  # a clean-up failed on the way out of a Ctrl-C
                logging.getLogger("loglake").debug("error after Ctrl-C", exc_info=True)
                interrupted()
            # a Spark task's typed error arrives wrapped in Spark's exception: read back
            err = e if isinstance(e, (LoglakeError, OSError)) else task_error(e)
            if isinstance(err, LoglakeError):
                raise click.ClickException(str(err)) from e
            if not isinstance(err, OSError) or err.errno not in ENVIRONMENT_ERRNOS:
                raise
            logging.getLogger("loglake").debug("file system error", exc_info=True)
            raise click.ClickException(environment_error_message(err)) from e


INT64_MAX = 2**63 - 1
"""The largest count, size or index an integer option takes where nothing smaller bounds it:
what the values become (the log's indexes, the lake's int64 columns, JetStream's ``max_bytes``
and ``max_msgs``, Spark's row limits) holds no more. Why a ceiling at all: click's ``IntRange``
with only a minimum took any integer, which went on to fail later or to mean nothing, instead
of being a usage error naming the option."""

TIME_NS_MAX = INT64_MAX
"""The latest time an option takes: int64 ns (2262), what the archives' store and index hold
and the node's archives API puts on ``now_ns``."""


def time_ns(text: str) -> int:
    """A time option's value (Unix seconds or ISO 8601, UTC unless it says otherwise) as Unix
    ns, from 1970 to ``TIME_NS_MAX``; else ``ValueError`` with the reason. The one parser of
    ``archives build --now``, ``archives fetch --since/--until`` and ``job archives-build
    --now``. Why bounded: ``inf`` or ``1e300`` ended in an ``OverflowError`` traceback, and
    ``--now 1e13`` planned a 7-day window at a time up to then (2.8 GB, 9 s)."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError("expected Unix seconds or ISO 8601") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        ns = int(dt.timestamp()) * 1_000_000_000
    else:
        # bounded before the product: 1e300 * 1e9 is inf; nan and inf fail the comparison too
        ns = int(seconds * 1_000_000_000) if 0 <= seconds <= TIME_NS_MAX / 1e9 else -1
    if not 0 <= ns <= TIME_NS_MAX:
        raise ValueError("expected a time from 1970 to 2262 (int64 ns)")
    return ns


class Time(click.ParamType):
    """A time option (``archives build --now``, ``fetch --since/--until``): ``time_ns``, else
    click's usage error."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return time_ns(str(value))
        except ValueError as e:
            self.fail(f"{str(value)!r}: {e}", param, ctx)


TIME = Time()


MAX_SECONDS = 365 * 86_400
"""The longest a duration may be, on the command line or in a node's config: a year. Why a
ceiling at all: the commands wait on threads, selectors and event loops, which count in integer
milli- or nanoseconds, so ``archives follow --wait 1e300`` (and a node's ``sync_interval =
1e300``) was an ``OverflowError`` traceback, and ``events serve --throttle-ms 1e300`` a
publisher whose replays never moved."""


MAX_RATE = 10**9
"""The highest rate (things a second) an option or a node's key takes: ``events serve
--replay-rate``, ``[events] replay_rate``. More than a process sends at all, so a larger one
limits nothing; ``inf`` passed click's ``FloatRange``."""


class Number(click.FloatRange):
    """A number option: finite, from ``lo`` to ``hi`` (``lo`` itself refused when ``above``),
    ``what`` naming it in the error (``seconds``, ``milliseconds``, ``a probability``), else
    click's one-line usage error naming the option (exit 2). Why not click's ``float`` or
    ``FloatRange``: both take ``nan`` and ``inf`` (``FloatRange`` with only a minimum takes
    ``inf``; ``nan`` passes any range), which reached the code as sleeps and deadlines: in the
    archives commands ``follow --wait nan`` was a ``ValueError`` traceback, ``--wait inf`` an
    ``OverflowError`` one, ``--poll -1`` a ``ValueError`` from ``time.sleep`` after the first
    poll, ``run --check-every nan`` or ``-1`` a loop without a pause, ``--duration nan`` a loop
    that never ran. A ``FloatRange`` still, so ``--help`` shows the range."""

    def __init__(
        self,
        lo: float,
        hi: float,
        what: str = "seconds",
        *,
        above: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__(lo, hi, min_open=above)
        self.lo, self.hi, self.what, self.above = lo, hi, what, above
        self.name = name or what.removeprefix("a ")  # the metavar: SECONDS, PROBABILITY

    @property
    def expected(self) -> str:
        """``seconds from 0 to 31536000``, ``seconds above 0, at most 31536000``."""
        if self.above:
            return f"{self.what} above {self.lo:g}, at most {self.hi:.0f}"
        return f"{self.what} from {self.lo:g} to {self.hi:.0f}"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            v = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number: expected {self.expected}", param, ctx)
        low = v > self.lo if self.above else v >= self.lo
        if not (low and v <= self.hi):  # nan fails both, inf the second
            self.fail(f"{value!r}: expected {self.expected}", param, ctx)
        return v


SECONDS = Number(0, MAX_SECONDS)
"""A duration where 0 means something (no wait, at once)."""
POSITIVE_SECONDS = Number(0, MAX_SECONDS, above=True)
"""A period or a wait that must pass some time: 0 would be a loop without a pause."""
MILLISECONDS = Number(0, MAX_SECONDS * 1000, "milliseconds")
"""A pause in milliseconds (``events serve --throttle-ms``), up to a year as well."""


class HostPort(click.ParamType):
    """``host:port`` of a peer to dial (``127.0.0.1`` when the host is left out), the port
    1-65535: ``archives --connect host:abc`` and ``seed --peer foo`` were ``ValueError``
    tracebacks."""

    name = "host:port"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value
        host, sep, port = str(value).rpartition(":")
        if not sep or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
            self.fail(f"{value!r}: expected host:port, the port 1-65535", param, ctx)
        return host.removeprefix("[").removesuffix("]") or "127.0.0.1", int(port)


HOST_PORT = HostPort()
