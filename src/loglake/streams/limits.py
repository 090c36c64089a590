"""Every limit the stream service holds a client to, in one place.

Why one place: the bounds that keep one hostile or careless client from taking the server's
memory, descriptors or time (a puller that never reads, thousands of half-sent frames,
connections that go silent) are only useful if an operator can find them, read their defaults
and change them. ``ServerLimits`` is that list: each field carries its default, its unit, its
range and a sentence saying what it bounds (``field.metadata``), and the same table gives
``loglake serve`` its ``--limits-*`` flags, ``loglake node`` its ``[limits]`` config section,
both the ``LOGLAKE_LIMITS_*`` environment variables, and docs/security.md its table.

Defaults keep the server under about 512 MiB whatever the clients do: at most twice
``input_budget`` of partial frames and of requests waiting behind stream service requests
(connections starting large frames in the same instant may pass it once before they wait) and
``output_budget`` of unsent replies across all connections, plus the pulls being read (a few
threads, ``max_pull_bytes`` each).

The storage side's bounds are here too (``max_open_partitions``, the partition quotas): the
server hands them to the embedded log it opens (``log_options``), which enforces them —
a CREATE over a quota is refused atomically under the log's lock, whoever asks.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from loglake.wire.ockam import MAX_WIRE_FRAME

KiB, MiB, GiB = 1024, 1024 * 1024, 1024 * 1024 * 1024

ENV_PREFIX = "LOGLAKE_LIMITS_"
"""``LOGLAKE_LIMITS_<FIELD>``: the same names ``loglake node`` derives for ``[limits] <field>``."""


MAX_TIMEOUT = 86400.0
"""The longest any timeout may be: a day. A connection that may sit on a half-sent frame, or a
shutdown that may wait, for longer than a day is not bounded at all; ``1e300`` was taken."""

MAX_MEMORY = 2**40
"""The most bytes a budget may be: 1 TiB, more memory than the machines a node runs on have
(``[streams] segment_bytes`` has the same ceiling); a larger budget bounds nothing."""

MAX_DESCRIPTORS = 2**20
"""Linux's ceiling on one process's descriptors by default (``fs.nr_open``, 1,048,576): more
connections, or more open partitions (each holds at least one), cannot be open at once."""

MAX_PARTITIONS = 2**24
"""16,777,216 partitions in one data dir: each is a folder with its files, and 4,096 streams of
4,096 partitions (the service's most per stream) already make this many."""


def _limit(default: Any, unit: str, lo: float, hi: float, help: str) -> Any:
    """One limit: ``lo`` and ``hi`` are the smallest and largest values it may take (each
    field says why its ceiling is that one)."""
    return field(default=default, metadata={"unit": unit, "min": lo, "max": hi, "help": help})


class LogLimits(TypedDict):
    """The keyword arguments of ``open_log`` that ``ServerLimits`` sets."""

    max_open_partitions: int | None
    max_partitions_per_stream: int | None
    max_partitions_total: int | None


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """The stream server's bounds (see each field's ``help`` in its metadata)."""

    max_frame: int = _limit(
        32 * MiB,
        "bytes",
        64,
        MAX_WIRE_FRAME,  # a frame's 4-byte length field: no frame a client announces is longer
        "Largest Ockam TCP frame a client may announce; a larger one closes its connection.",
    )
    max_connections: int = _limit(
        1024,
        "count",
        1,
        MAX_DESCRIPTORS,  # each holds a descriptor
        "Open client connections in all; one more is closed at once (logged).",
    )
    max_connections_per_peer: int = _limit(
        256,
        "count",
        1,
        MAX_DESCRIPTORS,
        "Open connections from one peer IP address; one more is closed at once (logged).",
    )
    input_budget: int = _limit(
        64 * MiB,
        "bytes",
        64 * KiB,
        MAX_MEMORY,
        "Bytes of incomplete frames, and of requests waiting behind a stream service request, "
        "held across all connections; over it, connections with an incomplete frame over 64 KiB "
        "stop being read until there is room (their frame timeout runs on); over twice it, the "
        "connections holding the most are closed (logged).",
    )
    output_budget: int = _limit(
        128 * MiB,
        "bytes",
        64 * KiB,
        MAX_MEMORY,
        "Bytes of unsent replies (plus pulls being read) across all connections; over it, "
        "pulls wait before they are read, and the clients not reading their replies that hold "
        "the most are closed (logged).",
    )
    connection_output: int = _limit(
        8 * MiB,
        "bytes",
        16 * KiB,
        MAX_MEMORY,
        "Unsent reply bytes one connection may have; over it, the server stops reading that "
        "connection and holds its pulls until the client reads its replies.",
    )
    max_queued_requests: int = _limit(
        20_000,
        "count",
        1,
        2**24,  # each waits as Python objects of a few hundred bytes: gigabytes already
        "Requests of one connection waiting for their replies; over it, the server stops "
        "reading that connection.",
    )
    frame_timeout: float = _limit(
        30.0,
        "seconds",
        0.1,
        MAX_TIMEOUT,
        "A frame once started (its first length byte) must be complete within this; else the "
        "connection is closed. A connection closed for a protocol error has as long to take its "
        "last replies before it is dropped.",
    )
    idle_timeout: float = _limit(
        0.0,
        "seconds",
        0.0,
        MAX_TIMEOUT,
        "Close a connection that sends nothing and waits for nothing this long (0: never).",
    )
    version_timeout: float = _limit(
        5.0,
        "seconds",
        0.1,
        MAX_TIMEOUT,
        "Once connected (after TLS, if any), a peer must send its protocol version byte within "
        "this, or it is dropped (the Ockam reference's handler.ex waits 5 s).",
    )
    tls_handshake_timeout: float = _limit(
        5.0,
        "seconds",
        0.1,
        MAX_TIMEOUT,
        "A TLS handshake must finish within this (the Ockam reference drops a silent peer after "
        "5 s).",
    )
    shutdown_timeout: float = _limit(
        3.0,
        "seconds",
        0.0,
        MAX_TIMEOUT,
        "On SIGTERM, how long requests already read may take to be answered before the "
        "remaining connections are dropped.",
    )
    max_client_id: int = _limit(
        1024,
        "bytes",
        1,
        0xFFFF,  # the consumer store keeps its length in 2 bytes (consumer_store.py)
        "Longest consumer (client) id in an index request, in UTF-8 bytes; a longer one gets "
        "an error reply.",
    )
    max_open_partitions: int = _limit(
        0,
        "count",
        0,
        MAX_DESCRIPTORS,
        "Partitions the embedded log keeps open at once (each holds up to four descriptors, "
        "plus one per sealed segment being read); opening another closes the least recently "
        "used, after an fsync. 0: an eighth of the process's descriptor limit (ulimit -n), at "
        "least 16.",
    )
    max_partitions_per_stream: int = _limit(
        4096,
        "count",
        1,
        4096,  # the service never allows more (streams/service.py)
        "Partitions one CREATE may ask for (the service never allows more than 4,096); a "
        "larger CREATE gets an error reply and nothing is made.",
    )
    max_partitions_total: int = _limit(
        65_536,
        "count",
        1,
        MAX_PARTITIONS,
        "Partitions of all streams together in the data dir; a CREATE that would pass it gets "
        "an error reply and nothing is made.",
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise LimitError(f"{f.name}: expected a number, got {value!r}")
            if not f.metadata["min"] <= value <= f.metadata["max"]:  # nan too
                raise LimitError(f"{f.name}: {expected(f)}, got {value!r}")

    def log_options(self) -> LogLimits:
        """The keyword arguments of ``open_log`` these limits set."""
        return {
            "max_open_partitions": self.max_open_partitions or None,
            "max_partitions_per_stream": self.max_partitions_per_stream,
            "max_partitions_total": self.max_partitions_total,
        }

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], origin: str = "") -> ServerLimits:
        """Limits from ``{field: value}`` (missing fields keep their defaults); values may be
        text (``"32MiB"``, ``"5"``) as a flag, an env variable or a config file gives them."""
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if values.get(f.name) is None:
                continue
            try:
                kw[f.name] = parse_limit(f, values[f.name])
            except ValueError as e:
                where = f" (from {origin})" if origin else ""
                raise LimitError(f"{f.name}: {e}, got {values[f.name]!r}{where}") from None
        return cls(**kw)


class LimitError(ValueError):
    """A limit's value is not valid; the message names the limit."""


_SIZE = re.compile(r"^\s*(\d+)\s*(b|kib|mib|gib|k|m|g)?\s*$", re.IGNORECASE)
_UNITS = {None: 1, "b": 1, "k": KiB, "kib": KiB, "m": MiB, "mib": MiB, "g": GiB, "gib": GiB}


def expected(f: dataclasses.Field) -> str:
    """What a limit's value must be, range included, as its errors say it (``expected a
    number of seconds 0.1-86400``)."""
    lo, hi, unit = f.metadata["min"], f.metadata["max"], f.metadata["unit"]
    if unit == "seconds":
        return f"expected a number of seconds {lo:g}-{hi:g}"
    if unit == "bytes":
        return f"expected a size of {lo}-{hi} bytes (e.g. 32MiB)"
    return f"expected a whole number {lo}-{hi}"


def parse_limit(f: dataclasses.Field, raw: Any) -> int | float:
    """One limit's value: a number, or text; sizes also as ``64KiB``/``32MiB``/``1GiB``.
    A value outside the field's range (``min``-``max``), ``nan`` and ``inf`` are refused with
    the range named. The ``ValueError`` says what was expected; the caller adds the value and
    where it came from (``[limits] frame_timeout: expected a number of seconds 0.1-86400, got
    1e+300 (from …)``)."""
    lo, hi = f.metadata["min"], f.metadata["max"]
    unit = f.metadata["unit"]
    value: int | float
    if isinstance(raw, bool):
        raise ValueError(expected(f))
    if unit == "seconds":
        try:
            value = float(raw.strip()) if isinstance(raw, str) else float(raw)
        except (TypeError, ValueError):
            raise ValueError(expected(f)) from None
    elif isinstance(raw, str):
        m = _SIZE.match(raw) if unit == "bytes" else re.match(r"^\s*(\d+)\s*()$", raw)
        if m is None:
            raise ValueError(expected(f))
        digits = m.group(1)  # int() refuses over 4,300 digits, with a message of its own
        scale = _UNITS[(m.group(2) or "").lower() or None]
        value = int(digits) * scale if len(digits) <= 20 else hi + 1
    elif isinstance(raw, int):
        value = raw
    else:
        raise ValueError(expected(f))
    if not lo <= value <= hi:  # nan and inf too
        raise ValueError(expected(f))
    return value


def limit_fields() -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(ServerLimits)


def describe(f: dataclasses.Field) -> str:
    """A field's help with its unit and default, as ``--help`` and docs show it."""
    default = f.default
    unit = f.metadata["unit"]
    if unit == "bytes" and isinstance(default, int):
        shown = _size_text(default)
    elif unit == "seconds":
        shown = f"{default:g} s" + (" (off)" if default == 0 and f.name == "idle_timeout" else "")
    else:
        shown = str(default)
    return f"{f.metadata['help']} Default {shown}."


def _size_text(n: int) -> str:
    for name, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size}{name}"
    return f"{n} bytes"


def click_options(name: Callable[[dataclasses.Field], str] | None = None) -> Callable[[Any], Any]:
    """A decorator adding one ``--limits-<field>`` option per limit (env
    ``LOGLAKE_LIMITS_<FIELD>``), each passed as ``limits_<field>`` (None when not given)."""
    import click

    def checked(f: dataclasses.Field) -> Callable[[Any, Any, Any], Any]:
        """The value as given, once ``parse_limit`` takes it: else click's usage error naming
        this flag (``--limits-frame-timeout nan`` named only ``frame_timeout`` and "the
        --limits-* flags")."""

        def check(_ctx: Any, _param: Any, value: Any) -> Any:
            if value is not None:
                try:
                    parse_limit(f, value)
                except ValueError as e:
                    raise click.BadParameter(f"{e}, got {value!r}") from None
            return value

        return check

    def decorate(fn: Any) -> Any:
        for f in reversed(limit_fields()):
            flag = name(f) if name else "--limits-" + f.name.replace("_", "-")
            fn = click.option(
                flag,
                "limits_" + f.name,
                default=None,
                callback=checked(f),
                metavar={"bytes": "SIZE", "seconds": "SECONDS"}.get(f.metadata["unit"], "N"),
                envvar=ENV_PREFIX + f.name.upper(),
                show_envvar=True,
                help=describe(f),
            )(fn)
        return fn

    return decorate


def from_click(params: Mapping[str, Any]) -> ServerLimits:
    """``ServerLimits`` from the ``limits_<field>`` values ``click_options`` gave a command."""
    values = {f.name: params.get("limits_" + f.name) for f in limit_fields()}
    return ServerLimits.from_mapping(values, "--limits-* flags or LOGLAKE_LIMITS_* variables")
