"""Options of the ``loglake`` data source and of ``read()``, parsed and checked on the driver.

One parser for both entries so a bad value gets the same message wherever it is given
(name the option and the value, before any job work). Spark passes data
source options as a case-insensitive map of strings; names here are matched case-insensitively.

TLS for ``url`` (as the stream service's clients, docs/security.md): ``tlsCa`` (the CA of the
service's certificate), ``tlsCert`` and
``tlsKey`` (a client certificate, for mutual TLS), ``tlsServerName`` (the name the service's
certificate carries, default the url's host), or ``tls=true`` alone to trust the system's CAs.
Paths travel, not SSL contexts: each executor opens them, so on a cluster they must exist on
every worker at the same path.

JetStream (``loglake node --backend nats://…``): ``backend`` (``nats://h1:4222,h2:4222``, the
node's ``[streams] backend``), ``natsPrefix`` (its ``nats_prefix``, default ``loglake``) and
``natsCreds`` (a ``.creds`` file, on every worker); ``data_dir`` is then the node's data dir,
where the sealer keeps the lake (optional: without it everything comes from JetStream).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loglake.log.api import STREAM_NAME_RE, ascii_digits
from loglake.log.lake_schema import BACKEND_NOTE
from loglake.pipeline.errors import BadOption
from loglake.pipeline.lake import DEFAULT_SPLIT_RECORDS, lake_partitions, lake_streams
from loglake.pipeline.livelog import (
    DirSource,
    LiveSource,
    NatsSource,
    UrlSource,
    data_dir_option,
    parse_url,
)

EARLIEST, LATEST = "earliest", "latest"

OPTIONS = (
    *("stream", "data_dir", "path", "url", "partitionCount"),
    *("tls", "tlsCa", "tlsCert", "tlsKey", "tlsServerName"),
    *("backend", "natsPrefix", "natsCreds"),
    *("partitions", "startIndex", "endIndex", "splitRecords"),
    *("startingOffsets", "maxRecordsPerTrigger", "partitionBy"),
    *("nativeSealed", "driverTailRecords", "pushFilters", "failOnDataLoss"),
)
"""Every option of the ``loglake`` format and ``read_options`` (docs/pipeline.md's table), and
``_liveRanges`` (``read()``'s own). Any other name is ``BadOption``: Spark's built-in sources
ignore one, and a misspelt range or partition option then read the whole stream without a word
(``start_index=90`` gave all 200 rows)."""
_OPTION_NAMES = {n.lower(): n for n in (*OPTIONS, "_liveRanges")}
DEFAULT_DRIVER_TAIL = 0
"""Off by default: the issue's design sends the tail through the Python source."""


@dataclass(frozen=True)
class TlsFiles:
    """The ``tls*`` options: where a client finds its CA, certificate and key."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    def as_options(self) -> dict[str, str]:
        """The ``tls*`` options naming these files (what ``read``/``write`` pass on)."""
        named = {
            "tlsCa": self.ca,
            "tlsCert": self.cert,
            "tlsKey": self.key,
            "tlsServerName": self.server_name,
        }
        return {k: v for k, v in named.items() if v} or {"tls": "true"}


@dataclass
class TlsUrlSource(UrlSource):
    """``UrlSource`` whose client speaks TLS (``streams.tls.client_context``), built where the
    client is made — on the driver or in an executor."""

    tls: TlsFiles = field(default_factory=TlsFiles)

    def client(self) -> Any:
        from loglake.streams import StreamClient, client_context

        host, port = parse_url(self.url)
        t = self.tls
        ctx = client_context(t.ca, t.cert, t.key)
        return StreamClient(host, port, tls=ctx, server_hostname=t.server_name)


def _tls_options(options: Mapping[str, str], url: str | None) -> TlsFiles | None:
    files = {n: _get(options, n) or None for n in ("tlsCa", "tlsCert", "tlsKey", "tlsServerName")}
    on = _bool(options, "tls", False)
    if not on and not any(files.values()):
        return None
    if not url:
        given = "tls" if on else next(k for k, v in files.items() if v)
        raise BadOption(given, files.get(given) or "true", "TLS options go with url")
    if bool(files["tlsCert"]) != bool(files["tlsKey"]):
        raise BadOption("tlsCert", files["tlsCert"], "tlsCert and tlsKey go together")
    for name in ("tlsCa", "tlsCert", "tlsKey"):
        path = files[name]
        if path and not os.path.isfile(path):
            raise BadOption(name, path, "no such file (it must exist on every executor too)")
    return TlsFiles(files["tlsCa"], files["tlsCert"], files["tlsKey"], files["tlsServerName"])


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    """A true/false option, in any case (as Spark's Kafka source reads its own: Scala's
    ``toBoolean``); absent or empty is ``default``; anything else is ``BadOption``."""
    raw = _get(options, name)
    if not raw:
        return default
    if raw.lower() not in ("true", "false"):
        raise BadOption(name, raw, "expected true or false")
    return raw.lower() == "true"


def _get(options: Mapping[str, str], name: str) -> str | None:
    low = name.lower()
    for k, v in options.items():
        if k.lower() == low:
            return None if v is None else str(v)
    return None


def _int(
    options: Mapping[str, str], name: str, default: int | None, minimum: int = 0
) -> int | None:
    """A whole-number option, plain ASCII digits alone (``ascii_digits``): ``int`` alone also
    took " 5", "1_000" and other scripts' digits ("٣", "５"), so a typo read as a number. A
    leading ``-`` is parsed only to say the value is below ``minimum`` (no option is negative)."""
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    if not ascii_digits(raw.removeprefix("-")):
        raise BadOption(name, raw, "expected an integer (ASCII digits 0-9)")
    value = int(raw)
    if value < minimum:
        raise BadOption(name, raw, f"must be >= {minimum}")
    return value


@dataclass
class SourceOptions:
    stream: str
    data_dir: str | None = None
    url: str | None = None
    partition_count: int | None = None
    """``partitionCount`` (url only: the wire does not carry it)."""
    tls: TlsFiles | None = None
    """``tlsCa``/``tlsCert``/``tlsKey``/``tlsServerName``/``tls``: the url over TLS."""
    partitions: tuple[int, ...] | None = None
    """``partitions``: the log partitions to read, e.g. ``"0,2"`` (default all)."""
    start_index: int = 0
    start_index_set: bool = False
    """``startIndex`` was given: the batch counterpart of a JSON ``startingOffsets``, so one
    below a partition's first kept index is data loss (``datasource.check_start_index``).
    Not given (0) is earliest, as Kafka's batch ``startingOffsets`` defaults to."""
    end_index: int | None = None
    split_records: int = DEFAULT_SPLIT_RECORDS
    starting_offsets: str = EARLIEST
    max_records_per_trigger: int | None = None
    partition_column: str | None = None
    partition_by: str | None = None
    driver_tail_records: int = DEFAULT_DRIVER_TAIL
    """``driverTailRecords``: ``read()`` reads a live tail up to this size on the driver and
    hands it to Spark as Arrow; a larger one goes through the Python source in parallel."""
    push_filters: bool = False
    """``pushFilters``: opt into Spark's Python filter pushdown (see ``LoglakeReader``)."""
    fail_on_data_loss: bool = True
    """``failOnDataLoss`` (Spark's Kafka source's name, default and meaning): False skips a
    range retention removed, from the first index still held, with a warning naming it
    (``datasource.read_range``), instead of failing with ``LiveHistoryGone``."""
    live_ranges: dict[int, list[tuple[int, int]]] | None = None
    """Internal (``read()``): read exactly these live ranges and no lake file."""
    backend: str | None = None
    """``backend``: the NATS cluster the stream lives in (``nats://h1,h2,h3``)."""
    nats_prefix: str = "loglake"
    nats_creds: str | None = None
    raw: dict[str, str] = field(default_factory=dict)

    def live(self) -> LiveSource:
        if self.backend:
            return NatsSource(self.backend, self.nats_prefix, self.nats_creds)
        if self.url:
            return self.url_source()
        assert self.data_dir is not None
        return DirSource(self.data_dir)

    def url_source(self) -> UrlSource:
        """The running node ``url`` names, over TLS if the ``tls*`` options say so."""
        assert self.url is not None
        if self.tls is not None:
            return TlsUrlSource(self.url, self.partition_count or 1, self.tls)
        return UrlSource(self.url, self.partition_count or 1)


def _check_names(options: Mapping[str, str]) -> None:
    import difflib

    for name in options:
        if str(name).lower() not in _OPTION_NAMES:
            close = difflib.get_close_matches(str(name).lower(), list(_OPTION_NAMES), n=1)
            hint = f"did you mean {_OPTION_NAMES[close[0]]}? " if close else ""
            raise BadOption(
                str(name), options[name], f"unknown option ({hint}options: {', '.join(OPTIONS)})"
            )


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    _check_names(options)
    stream = _get(options, "stream")
    if not stream:
        raise BadOption("stream", stream, "required (the stream to read or write)")
    if not STREAM_NAME_RE.fullmatch(stream):
        raise BadOption("stream", stream, "not a valid stream name")
    url = _get(options, "url")
    data_dir = _get(options, "data_dir") or _get(options, "path")
    backend, prefix, creds = _nats_options(options, url)
    if url or backend:
        if url:
            parse_url(url)
        data_dir = data_dir_option(data_dir) if data_dir else None
    else:
        data_dir = data_dir_option(data_dir)
    parts_raw = _get(options, "partitions")
    partitions = None
    if parts_raw:
        # blanks around a comma are a list's spacing ("0, 2"); each number is ASCII digits
        # alone, as ``_int`` takes (``int`` also read "1_0" and "٣")
        items = [p.strip(" ") for p in parts_raw.split(",") if p.strip(" ")]
        if any(p.startswith("-") and ascii_digits(p[1:]) for p in items):
            raise BadOption("partitions", parts_raw, "partition numbers are >= 0")
        if not all(ascii_digits(p) for p in items):
            raise BadOption("partitions", parts_raw, "expected partition numbers like 0,2")
        partitions = tuple(sorted({int(p) for p in items}))
        if not partitions:  # " " or ",": it read no partition at all, with no error
            raise BadOption("partitions", parts_raw, "expected partition numbers like 0,2")
    start = _int(options, "startIndex", 0) or 0
    end = _int(options, "endIndex", None)
    if end is not None and end < start:
        raise BadOption("endIndex", end, f"is below startIndex={start}")
    starting = _get(options, "startingOffsets") or EARLIEST
    if starting not in (EARLIEST, LATEST):
        parse_offsets_json(starting)  # validates
    live_raw = _get(options, "_liveRanges")
    live_ranges = None
    if live_raw:
        try:
            live_ranges = {int(k): [(a, b) for a, b in v] for k, v in json.loads(live_raw).items()}
        except (ValueError, TypeError, AttributeError):
            raise BadOption("_liveRanges", live_raw, "internal to read(): do not set it") from None
    push = _bool(options, "pushFilters", False)
    lossy = _bool(options, "failOnDataLoss", True)
    by = _get(options, "partitionBy")
    if by is not None and by not in ("key", "round_robin") and not by.startswith("column:"):
        raise BadOption("partitionBy", by, "expected key, round_robin or column:NAME")
    return SourceOptions(
        stream=stream,
        data_dir=data_dir,
        url=url,
        partition_count=_int(options, "partitionCount", None, minimum=1),
        tls=_tls_options(options, url),
        partitions=partitions,
        start_index=start,
        start_index_set=_get(options, "startIndex") not in (None, ""),
        end_index=end,
        split_records=_int(options, "splitRecords", DEFAULT_SPLIT_RECORDS, minimum=1)
        or DEFAULT_SPLIT_RECORDS,
        starting_offsets=starting,
        max_records_per_trigger=_int(options, "maxRecordsPerTrigger", None, minimum=1),
        partition_by=by,
        push_filters=push,
        fail_on_data_loss=lossy,
        driver_tail_records=_int(options, "driverTailRecords", DEFAULT_DRIVER_TAIL) or 0,
        live_ranges=live_ranges,
        backend=backend,
        nats_prefix=prefix,
        nats_creds=creds,
        raw={str(k): str(v) for k, v in options.items()},
    )


def _nats_options(
    options: Mapping[str, str], url: str | None
) -> tuple[str | None, str, str | None]:
    """``backend``/``natsPrefix``/``natsCreds``, checked: a bad one fails on the driver."""
    backend = _get(options, "backend") or None
    prefix = _get(options, "natsPrefix") or "loglake"
    creds = _get(options, "natsCreds") or None
    data_dir = _get(options, "data_dir") or _get(options, "path")
    if not backend and not url and data_dir:
        # a node's data dir on JetStream says where its streams live (the sealer's note), so a
        # job given only ``--data-dir`` reads the unsealed part too, not only the lake
        note = _backend_note(data_dir)
        if note is not None:
            return note
    if not backend:
        for name, v in (("natsPrefix", _get(options, "natsPrefix")), ("natsCreds", creds)):
            if v:
                raise BadOption(name, v, "goes with backend=nats://HOST:PORT,...")
        return None, prefix, None
    if url:
        raise BadOption("backend", backend, "give url or backend, not both")
    servers = [s.strip() for s in backend.split(",") if s.strip()]
    for s in servers:
        scheme = s.split("://", 1)[0] if "://" in s else "nats"
        if scheme not in ("nats", "tls"):
            raise BadOption("backend", backend, "expected nats://HOST:PORT[,HOST:PORT...]")
    if not servers:
        raise BadOption("backend", backend, "expected nats://HOST:PORT[,HOST:PORT...]")
    if not prefix.replace("_", "").isalnum():
        raise BadOption("natsPrefix", prefix, "expected letters, digits and _")
    if creds and not os.path.isfile(creds):
        raise BadOption("natsCreds", creds, "no such file (it must exist on every executor too)")
    return backend, prefix, creds


def _backend_note(data_dir: str) -> tuple[str, str, str | None] | None:
    path = os.path.join(os.path.expanduser(data_dir), "lake", BACKEND_NOTE)
    try:
        with open(path, encoding="utf-8") as f:
            note = json.load(f)
        servers = ",".join(note["servers"])
        return servers, str(note["prefix"]), note.get("credentials") or None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadOption("data_dir", data_dir, f"unreadable {BACKEND_NOTE} ({e})") from None


def parse_offsets_json(text: str) -> dict[int, int]:
    """``startingOffsets`` as JSON: ``{"0": 10, "1": -2}``; -2 = earliest, -1 = latest
    (Kafka's convention, so a Spark user knows it)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadOption(
            "startingOffsets", text, f"not earliest, latest or JSON ({e.msg} at {e.pos})"
        ) from None
    if not isinstance(value, dict) or not value:
        raise BadOption("startingOffsets", text, 'expected a JSON object like {"0": 42}')
    out: dict[int, int] = {}
    for k, v in value.items():
        if not ascii_digits(str(k)):
            raise BadOption("startingOffsets", text, f"key {k!r} is not a partition number")
        if isinstance(v, bool) or not isinstance(v, int) or v < -2:
            raise BadOption(
                "startingOffsets", text, f"offset {v!r} of partition {k} is not an index"
            )
        out[int(k)] = v
    return out


@dataclass(frozen=True)
class StreamLayout:
    """Which partitions a stream has and the live log's ``(first, next)`` of each."""

    stream: str
    partitions: tuple[int, ...]
    live: dict[int, tuple[int, int]]


def resolve_stream(opts: SourceOptions) -> StreamLayout:
    """Find the stream in the live log and the lake; ``BadOption('stream', ...)`` if neither."""
    live = opts.live().partitions(opts.stream)
    lake = lake_partitions(opts.data_dir, opts.stream) if opts.data_dir else []
    if live is None and not lake:
        where = (
            f"backend {opts.backend} (prefix {opts.nats_prefix})"
            if opts.backend
            else f"url {opts.url}"
            if opts.url
            else f"data_dir {opts.data_dir}"
        )
        known = lake_streams(opts.data_dir) if opts.data_dir else []
        hint = f" (streams in the lake: {', '.join(known)})" if known else ""
        raise BadOption("stream", opts.stream, f"unknown stream in {where}{hint}")
    parts = sorted(set(live or {}) | set(lake))
    if opts.partitions is not None:
        missing = [p for p in opts.partitions if p not in parts]
        if missing:
            raise BadOption(
                "partitions",
                ",".join(map(str, opts.partitions)),
                f"stream {opts.stream!r} has partitions {parts}, not {missing}",
            )
        parts = list(opts.partitions)
    return StreamLayout(opts.stream, tuple(parts), dict(live or {}))
