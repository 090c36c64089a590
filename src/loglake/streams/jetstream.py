"""loglake streams on a NATS JetStream cluster (DESIGN.md principle 4: an existing
distributed engine to scale, never a home-made cluster).

``JetStreamLog`` is a ``Log`` whose storage is JetStream, so the stream service
(``StreamService``/``StreamServer``, ``loglake serve --backend nats://…``) and ``LocalStreams``
run on it unchanged; ``JetStreamStreams`` is ``LocalStreams`` over it (the ``Streams`` API for
every other part). The mapping, and why:

- **one loglake partition = one JetStream stream**, named ``<prefix>-<name>-<partition>``
  (loglake names may hold ``.``, which JetStream names and subject tokens may not: ``_`` is
  written ``__`` and ``.`` is written ``_d``), subject ``<prefix>.<name>.<partition>``, with
  ``allow_direct`` so any current replica serves reads. The stream's metadata says which loglake
  stream and partition it is and how many partitions the stream has: that is how partition
  counts are discovered from the cluster (partition 0 is created last, so its existence means
  all partitions exist). A stream grows the same way round (``grow_stream``): the new
  partitions' streams first, then partition 0's count; a process learns of it when it asks for
  a partition past the count it knew, or for the stream's info.
- **the loglake index is the JetStream sequence − 1**. JetStream sequences are gapless unless
  someone deletes a message from the middle of the stream; a read that meets such a gap raises
  ``StreamGap`` (the part before the gap is served first) and ``gaps()`` reports every
  partition with deleted messages — the index is never silently renumbered. Purging the head
  (retention, ``truncate_before``) is not a gap: the first index moves, as in the embedded log.
- **a retried push is not stored twice**: every message carries a ``Nats-Msg-Id`` (generated, or
  the caller's ``msg_ids``); a publish whose ack did not come (leader lost, reconnect) is sent
  again with the same id, and JetStream answers a duplicate within its duplicate window
  (``duplicate_window``, default 2 min) with the original sequence.
- **no quorum → ``ClusterUnavailable`` within ``push_timeout``** (never a hang): every call has a
  deadline; retries stop there.
- **consumer indexes live in a JetStream key-value bucket** (``<prefix>_indexes``), kept monotonic
  by compare-and-set on the key's revision (``kv.update(..., last=revision)``, retried on a
  lost race). A value is the index in decimal digits, followed, for a consumer that belongs to
  an identity (a save under authentication, ``save_index_as``), by a newline and the owner:
  ``b"42"`` or ``b"42\nalice"``. Values without an owner are what earlier versions wrote, so a
  bucket written before owners existed reads unchanged; the owner travels in the same write as
  the index, so two savers racing for a new consumer cannot both own it.
- **retention**: ``StreamConfig.retention_ms/_bytes/_records`` become ``max_age``/``max_bytes``/
  ``max_msgs`` (JetStream enforces them itself, so ``enforce_retention`` has nothing to do).
  ``durability`` is the server's (``jetstream { sync_interval }``), not per stream.

nats-py is asyncio; ``JetStreamLog`` runs one connection on its own event-loop thread and its
blocking methods wait on it with a deadline, so it can be called from any thread (the stream
server performs actions on worker threads).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.js import api as jsapi

from loglake.errors import PATH_CHARS, LocalProtocolError, Unavailable, cut
from loglake.log.api import (
    INDEX_MAX,
    Entry,
    Headers,
    InvalidStreamName,
    Log,
    LogClosed,
    LogError,
    NotOwner,
    PartitionInfo,
    Record,
    StreamConfig,
    StreamExists,
    StreamInfo,
    UnknownPartition,
    UnknownStream,
    ascii_digits,
    cap_bytes,
    check_index,
    check_stream_name,
    check_timestamps,
)
from loglake.streams.api import LocalStreams
from loglake.streams.nats_url import split_servers
from loglake.structured_logging import log_event

logger = logging.getLogger(__name__)

WRONG_LAST_SEQUENCE = 10071
"""JetStream's code for a failed expected-last-sequence check (JSStreamWrongLastSequenceErrF)."""

_T = TypeVar("_T")

META_STREAM = "loglake.stream"
META_PARTITION = "loglake.partition"
META_PARTITIONS = "loglake.partitions"
KEY_HEADER = "Loglake-Key"
"""A record's key, base64 (NATS header values are text)."""
HEADERS_HEADER = "Loglake-Headers"
"""A record's headers, JSON ``[[name, base64 value], …]`` (kept in order, repeats allowed)."""
TS_HEADER = "Loglake-Timestamp"
"""A timestamp the writer gave (ns); otherwise the record's time is JetStream's."""
DIRECT_GET = "$JS.API.DIRECT.GET.{}"
PURGE = "$JS.API.STREAM.PURGE.{}"
MAX_PULL_BYTES = 8 * 1024 * 1024
MAX_GROW_ROUNDS = 50
"""Rounds a ``grow_stream`` takes at most to see partition 0's count settle (each round reads
it, and writes it when it is short); racing growers settle in a few."""
SAVED_INDEX_SLACK = 1 << 40
"""How far past the indexes this process has evidence of (its acknowledged pushes, the end of
the lake's files) a consumer's saved index still counts toward the first index of a partition
made again (``_first_indexes``). A saved index is a client's claim, not proof the index was
used: any client may save any index up to 2**64 − 1 for its own consumer id, and counting
that one asked nats-server for ``first_seq`` 2**64, which it refuses, so the partition could
not be made at all (and 2**63 or more would pass the lake's int64 index column). 2**40 (about
10**12 records) is more than any partition is written between two sightings, so a real
consumer's index is counted (a fresh process, which has no evidence, counts any index up to
it); a claim past it is logged and left out, and the first index stays far below both limits."""
READ_ATTEMPT = 1.0
"""Seconds a direct get waits for its first message before asking again (another replica)."""
STREAM_NAME_IN_USE = 10058
"""JetStream's error code for a create refused because the stream's name is taken (by a
stream of another configuration)."""
INFO_ATTEMPT = 1.0
"""Seconds the first request for a JetStream stream's info waits for its answer before it is
sent again (each later wait doubles, within ``request_timeout``). Why: on a cluster, a stream
just made (by a racing grower, say) has no leader for a moment, and then no server answers its
info at all: nats-server stays silent by design (server/jetstream_api.go,
``jsStreamInfoRequest``: a server that is not the stream's leader returns without a reply
while the group is new and has none). One request waited out the whole timeout and the call
failed with ``ClusterUnavailable`` although the leader was elected a moment later (22 of 400
racing grows on the local 3-node cluster); asked again, the leader answers."""
ABSENT_DOUBT, ABSENT_PAUSE = 1.0, 0.05
"""Seconds a "stream not found" for a partition that partition 0's count names is asked again
(``ABSENT_PAUSE`` apart) before loglake believes the partition was deleted outside it. Why:
nats-server answers "not found" (err_code 10059) for a stream whose creation is still under way
on the server answering, and a racing grow has raised ``UnknownStream`` from such an answer
about a partition the other grower had just made (the count names it only once its create was
acknowledged: the server answering lagged); taken at once for a deletion, it makes loglake
forget the stream. Partition 0's own "not found" is believed at once: it is what says a stream
does not exist, so a stream deleted whole is still unknown at once, and so is any name never
made."""
READ_RETRY_FIRST, READ_RETRY_MAX = 0.005, 0.1
"""Seconds between a read's unanswered attempts, doubling from the first to the most. Why: with
no replica serving (no quorum, every replica down) a direct get is answered "no responders" at
once, and the read asked again in a tight loop until ``request_timeout``: thousands of requests
a second from every reader for the length of the outage."""


class ClusterUnavailable(LogError, Unavailable):
    """The cluster did not acknowledge (or answer) within the deadline: no quorum for the
    stream, no reachable server. For a push the outcome of the unacknowledged messages is
    unknown; pushing them again with the same ``msg_ids`` within the duplicate window stores
    each at most once."""

    def __init__(self, what: str, seconds: float, cause: BaseException | str | None = None):
        self.what = what
        self.seconds = seconds
        detail = (
            f": {cause!r}" if isinstance(cause, BaseException) else f": {cause}" if cause else ""
        )
        super().__init__(f"NATS JetStream unavailable for {what} after {seconds:.1f}s{detail}")


class StreamGap(LogError):
    """A JetStream stream behind a loglake partition has messages deleted from its middle
    (changed outside loglake): the index ``missing`` cannot be served, and loglake will not
    renumber what follows."""

    def __init__(self, stream: str, partition: int, missing: int, next_present: int | None):
        self.stream, self.partition = stream, partition
        self.missing, self.next_present = missing, next_present
        after = f"; the next present index is {next_present}" if next_present is not None else ""
        super().__init__(
            f"stream {stream!r} partition {partition}: index {missing} was deleted from the "
            f"JetStream stream outside loglake{after}"
        )


class HeadMoved(LogError):
    """A conditional append (``push_expecting``) found the partition's head elsewhere than
    the writer expected: someone else appended since. Nothing was written."""

    def __init__(self, stream: str, partition: int, expected: int, detail: str = "") -> None:
        self.stream, self.partition, self.expected = stream, partition, expected
        super().__init__(
            f"{stream!r}/{partition}: the head is no longer {expected}{detail} (another "
            "writer appended)"
        )


class JetStreamError(LogError):
    """JetStream refused a request for a reason that retrying does not fix."""


def check_prefix(prefix: str) -> str:
    """``prefix`` if it can name the node's streams and KV buckets, else ``ValueError``. ASCII
    only: NATS names a KV bucket ``[a-zA-Z0-9_-]+`` (``str.isalnum`` let ``é`` through, to fail
    at the first bucket), and ``-`` separates the prefix from the stream in a stream's name."""
    if not prefix.isascii() or not prefix.replace("_", "").isalnum():
        raise ValueError(f"prefix must be [A-Za-z0-9_]+, not {prefix!r}")
    return prefix


def check_creds_readable(path: str | os.PathLike[str]) -> Path:
    """``path`` if it is a ``.creds`` file nats-py can read, else ``ValueError`` in one line
    that quotes the path cut (``errors.cut``), for the caller to name its key (the config's
    ``nats_creds``, serve's ``--nats-creds``). Why: a path the system refuses to look at (a
    name longer than the file system's, ``ENAMETOOLONG``) made ``Path.is_file`` raise an
    ``OSError`` that reached the user as ``Error: File name too long: <the whole path>``,
    naming no setting. It signs with ``nkeys``, a loglake dependency that an install without
    its dependencies may lack, whose absence surfaced as a connect failure 5 s later
    (``ModuleNotFoundError('nkeys')``)."""
    import importlib.util

    file = Path(path)
    try:
        is_file = file.is_file()
    except OSError as e:  # is_file answers False only for a missing file or directory
        raise ValueError(f"{cut(str(file), PATH_CHARS)}: {e.strerror or e}") from None
    if not is_file:
        raise ValueError(f"{cut(str(file), PATH_CHARS)} is not a file")
    if importlib.util.find_spec("nkeys") is None:
        raise ValueError("a .creds file needs the nkeys package: pip install 'nats-py[nkeys]'")
    return file


@dataclass(frozen=True, slots=True)
class JetStreamOptions:
    """How to reach and use a NATS cluster (``loglake serve --backend nats://…``)."""

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    replicas: int = 1
    """Replicas of each partition stream created (1 or 3; at most the cluster size)."""
    prefix: str = "loglake"
    """Namespace of stream names, subjects and the index bucket ([A-Za-z0-9_]): several loglake
    deployments can share one cluster."""
    push_timeout: float = 10.0
    """Longest a push waits for its acks (retries included) before ``ClusterUnavailable``."""
    ack_wait: float = 2.0
    """The first publish round's wait for acks before the unacknowledged messages are sent
    again (same msg ids)."""
    retry_wait: float = 0.25
    """The wait of every later round: a push that lost its first acks is usually in a
    failover, and the first ack after the new leader is elected comes at most this late."""
    request_timeout: float = 5.0
    """Reads and metadata calls."""
    duplicate_window: float = 120.0
    storage: str = "file"
    """``file`` or ``memory``."""
    credentials: str | None = None
    """A ``.creds`` file (NATS decentralized auth)."""
    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkeys_seed: str | None = None
    tls_ca: str | None = None
    """A CA file: connect with TLS verified against it."""
    reconnect_wait: float = 0.1
    """Between reconnect attempts. nats-py's default (2 s) is most of a failover's time."""
    connect_timeout: float = 2.0
    ping_interval: float = 2.0
    """Seconds between pings: a server that stops answering (paused, cut off) while its
    socket stays open is left after two missed pings (nats-py's default is 120 s)."""
    lake_dir: str | None = None
    """A data dir whose lake (``jetstream_seal``) serves reads below JetStream's retention."""
    extra: dict[str, Any] = field(default_factory=dict)
    """More keyword arguments for ``nats.connect``."""

    @classmethod
    def from_url(cls, url: str, **kw: Any) -> JetStreamOptions:
        """``nats://h1:4222,h2:4222,h3:4222`` (``nats://user:pass@h…`` and ``tls://`` kept)."""
        return cls(servers=split_servers(url), **kw)


MAX_JS_NAME = 255
"""Longest JetStream stream name nats-server accepts (``JSMaxNameLen``, server/jetstream_api.go:
"stream name is too long, maximum allowed is 255"). A partition's name is ``<prefix>-<enc(name)>-
<p>`` and ``enc`` doubles every ``_`` and ``.``, so a loglake name within its own 200 characters
can pass it: nats-server then answered an opaque 500 (err_code 10), not its own message."""


def encode_name(name: str) -> str:
    """A loglake stream name as a JetStream name/subject token (injective)."""
    return name.replace("_", "__").replace(".", "_d")


def decode_name(token: str) -> str:
    out, i = [], 0
    while i < len(token):
        c = token[i]
        if c == "_" and i + 1 < len(token):
            out.append("_" if token[i + 1] == "_" else ".")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _b64(s: str) -> str:
    return base64.urlsafe_b64encode(s.encode()).decode().rstrip("=")


def _unb64(s: str) -> str:
    """``_b64`` undone, strictly: a character outside the alphabet is an error, not skipped."""
    if not s:
        raise ValueError("empty")
    return base64.b64decode(s + "=" * (-len(s) % 4), altchars=b"-_", validate=True).decode()


def _parse_key(key: str) -> tuple[str, str, int] | None:
    """``c<client>.s<stream>.<partition>`` (``JetStreamLog._key``) back to its parts."""
    parts = key.split(".")
    if len(parts) != 3 or parts[0][:1] != "c" or parts[1][:1] != "s" or not ascii_digits(parts[2]):
        return None
    try:
        client, stream = _unb64(parts[0][1:]), _unb64(parts[1][1:])
    except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
        return None
    if key != f"c{_b64(client)}.s{_b64(stream)}.{int(parts[2])}":
        return None  # not the one spelling _key writes (padding, leading zeros)
    return client, stream, int(parts[2])


def _count(si: Any) -> int | None:
    """The partition count partition 0's stream info holds, or None if it is not one loglake
    writes (decimal digits, at least 1): another client's metadata may say anything, and
    ``int()`` alone raised a bare ValueError, or took "-3"."""
    count = (si.config.metadata or {}).get(META_PARTITIONS, "")
    return int(count) if ascii_digits(count) and int(count) >= 1 else None


def _parse_ts(value: str | None) -> int:
    """``Nats-Time-Stamp`` (RFC 3339, nanoseconds) → ns since the epoch."""
    if not value:
        return 0
    head, _, frac = value.rstrip("Z").partition(".")
    secs = int(datetime.fromisoformat(head + "+00:00").timestamp())
    return secs * 1_000_000_000 + int((frac + "000000000")[:9])


def _decode_key(value: str) -> bytes:
    return base64.b64decode(value, validate=True)


def _decode_headers(value: str) -> Headers:
    pairs = json.loads(value)
    if not isinstance(pairs, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs
    ):
        raise ValueError("not a list of [name, base64 value] pairs")
    return tuple((k, base64.b64decode(v, validate=True)) for k, v in pairs)


def _decode_ts(value: str) -> int:
    digits = value[1:] if value[:1] == "-" else value
    if not ascii_digits(digits) or len(digits) > 19 or not -(2**63) <= int(value) < 2**63:
        raise ValueError("not a decimal int64")  # the lake's column (and the log's) is int64
    return int(value)


def _loglake_field(
    headers: dict[str, str], name: str, decode: Callable[[str], _T], index: int
) -> _T | None:
    """A ``Loglake-*`` header of a read record, decoded, or None if it is absent or does not
    decode: another NATS client may publish on a partition's subject with any headers, and
    such a record is served (and sealed) as JetStream holds it, without the field, rather
    than failing every read and the sealer at its index (the data and the index are intact;
    other clients' headers are never part of a record either)."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        return decode(value)
    except ValueError as e:  # binascii.Error and json's errors are ValueErrors
        log_event(
            logger,
            logging.WARNING,
            "jetstream record header not written by loglake: left out",
            jetstream_stream=headers.get("Nats-Stream"),
            index=index,
            header=name,
            value=value[:80],
            error=str(e)[:200],
        )
        return None


MAX_INDEX_KEY = 2048
"""Longest consumer-index key (``c<b64 client>.s<b64 stream>.<p>``), in characters. Every KV
request carries the key in its subject, and nats-server closes a connection whose protocol
line passes ``max_control_line`` (4 KiB by default): a longer consumer id once closed this
log's connection for good (nats-py does not reconnect after that error), failing every call,
pushes included. 2,048 leaves room for the API prefix and the reply inbox: a client id of up
to ~1,350 UTF-8 bytes with the longest stream name (the stream service's ``max_client_id`` is
1,024)."""


class ConsumerKeyTooLong(JetStreamError, LocalProtocolError):
    """A consumer id (with its stream name) too long for a key of the index bucket
    (``MAX_INDEX_KEY``): refused before any request."""


class BadIndexValue(JetStreamError):
    """A consumer-index value in the KV bucket that is not ``<digits>[\\n<owner>]`` (written
    by something else): refused rather than read as an index."""


def encode_index_value(index: int, owner: str | None = None) -> bytes:
    """A consumer index as the bucket keeps it: digits, then ``\\n<owner>`` if owned."""
    return f"{index}\n{owner}".encode() if owner else str(index).encode()


def decode_index_value(value: bytes | None) -> tuple[int, str | None] | None:
    """``(index, owner or None)`` of a bucket value, or None if it is not one."""
    if not value:
        return None
    digits, sep, owner = value.partition(b"\n")
    # an index is a uint64 (what the stream service carries): a longer number is not one, and
    # more than 4,300 digits would make int() itself raise
    if not ascii_digits(digits) or len(digits) > len(str(INDEX_MAX)) or int(digits) > INDEX_MAX:
        return None
    try:
        who = owner.decode() if sep else None
    except UnicodeDecodeError:
        return None
    if sep and not who:
        return None
    return int(digits), who


def _connect_error(e: BaseException) -> str:
    """A failed connect attempt's error as a reader wants it: ``connection refused (ECONNREFUSED)
    …`` rather than its ``repr``."""
    if isinstance(e, OSError) and (e.strerror or e.errno):
        code = e.errno if isinstance(e.errno, int) and e.errno > 0 else None  # gaierror: < 0
        return f"last attempt: {e.strerror if code is None else os.strerror(code)}"
    return f"last attempt: {e!r}"


async def _log_nats_error(e: Exception) -> None:
    """nats-py's connection errors (a refused reconnect while a node is down): logged, not
    printed."""
    log_event(logger, logging.DEBUG, "nats connection error", error=repr(e))


class NatsUnavailable(Unavailable):
    """A nats-py error that a later attempt may not meet (no responders, a closed connection,
    a full reconnect buffer, a timeout, no leader or an electing stream): the cause chain holds
    it. Raised by ``_loglake_error`` so the retry loops here decide by ``retriable`` as every
    other caller does."""


_TRANSIENT_NATS = (
    asyncio.TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)


def _lost_cas(e: BaseException) -> bool:
    """A KV compare-and-set lost to another writer (``_retry`` wraps it in ``JetStreamError``):
    read the key again and retry. nats-py's ``create`` may say "key not found" when another
    writer created the key first, so any ``KeyValueError`` counts."""
    return isinstance(e, nats.js.errors.KeyValueError) or isinstance(
        e.__cause__, nats.js.errors.KeyValueError
    )


def _loglake_error(e: BaseException) -> BaseException:
    """nats-py's error in loglake's terms: a transient one becomes ``NatsUnavailable``
    (retriable, chained to it); any other is returned unchanged. The one place that knows
    which nats-py errors are transient."""
    if isinstance(e, _TRANSIENT_NATS):
        transient = True
    elif isinstance(e, nats.js.errors.APIError):
        # 503: no leader / JetStream temporarily unavailable; 10118: stream offline
        # (electing); 10005: no suitable peers for placement (a peer is offline or not yet
        # known: a starting or restarting cluster)
        transient = getattr(e, "code", None) == 503 or getattr(e, "err_code", None) in (
            10118,
            10005,
        )
    else:
        transient = False
    if not transient:
        return e
    err = NatsUnavailable(f"NATS: {e!r}")
    err.__cause__ = e
    return err


def transient(e: BaseException) -> bool:
    """Whether nats-py's error ``e`` is one a settling or loaded cluster answers for a while
    (worth retrying until a deadline), not a refusal."""
    return getattr(_loglake_error(e), "retriable", False)


async def until_settled(
    what: str,
    make: Callable[[], Awaitable[_T]],
    timeout: float,
    pause: float = 0.2,
    attempt: float | None = None,
) -> _T:
    """``make()``, again (``pause`` seconds later) while the cluster answers what a starting or
    loaded cluster answers for a while (a timeout, no leader, no placement yet), for ``timeout``
    seconds, each attempt bounded by what is left (nats-py's calls keep their own, longer
    timeouts: one once made an index save under no quorum take 10 s, not ~2-3 s); then
    ``ClusterUnavailable`` for ``what``. Any other error at once. Why: a node started beside a
    cluster still settling waits for it instead of exiting. The one retry loop of single
    requests (``JetStreamLog._retry`` is this one); a push's acks have their own rounds.

    With ``attempt``, the first attempt is given up after that many seconds, and each later
    one after twice the one before (still within what is left): for a request the server may
    drop without a word (``INFO_ATTEMPT``), which is better asked again than waited out."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            return await asyncio.wait_for(
                make(), max(0.05, left if attempt is None else min(attempt, left))
            )
        except Exception as e:
            if not transient(e):
                raise
            if time.monotonic() >= deadline:
                raise ClusterUnavailable(what, timeout, e) from e
            if attempt is not None:
                attempt *= 2
            await asyncio.sleep(pause)


async def open_bucket(
    js: Any,
    config: jsapi.KeyValueConfig,
    timeout: float,
    create: Callable[[Any, jsapi.KeyValueConfig], Awaitable[Any]] | None = None,
) -> Any:
    """The KV bucket ``config.bucket``, created if missing (idempotent: two nodes may race),
    ``until_settled``. The one opener of the index, lease and key buckets; ``create`` (default
    nats-py's ``create_key_value``) makes a missing one."""

    async def attempt() -> Any:
        with contextlib.suppress(nats.js.errors.BucketNotFoundError):
            return await js.key_value(config.bucket)
        try:
            return await (create(js, config) if create else js.create_key_value(config))
        except nats.js.errors.APIError as e:
            if transient(e):
                raise
            # another node created it meanwhile (with a config this one would not make
            # twice): open theirs; if it is not there either, the refusal stands, but for
            # "name already in use" (10058): then the bucket's stream is there, made a moment
            # ago (by this node's own earlier attempt, as quorum came back, or by another), and
            # the server asked has not taken it up yet and answers "not found" for it (as for a
            # racing grower's new partition, ``ABSENT_DOUBT``): asked again within the timeout
            try:
                return await js.key_value(config.bucket)
            except nats.js.errors.BucketNotFoundError:
                if e.err_code == STREAM_NAME_IN_USE:
                    raise NatsUnavailable(
                        f"the bucket {config.bucket!r} is made but not found yet"
                    ) from e
                raise e from None

    return await until_settled(f"the bucket {config.bucket!r}", attempt, timeout)


class JetStreamLog(Log):
    """A ``Log`` on NATS JetStream. ``close()`` it (it owns a connection and a thread)."""

    def __init__(self, options: JetStreamOptions | str, **kw: Any) -> None:
        if isinstance(options, str):
            options = JetStreamOptions.from_url(options, **kw)
        elif kw:
            raise TypeError("keyword options go with a URL, not with JetStreamOptions")
        check_prefix(options.prefix)
        self.options = options
        self._partitions: dict[str, int] = {}
        self._configs: dict[str, StreamConfig] = {}
        self._acked: dict[str, int] = {}
        """Per JetStream stream: the highest sequence this process saw acknowledged (a read
        from a replica behind it waits for the replica: read-your-writes)."""
        self._acked_gone: dict[str, int] = {}
        """What ``_forget`` dropped from ``_acked``: a partition deleted outside loglake and
        made again starts past it (``_first_indexes``)."""
        self._ids = itertools.count()
        self._id_prefix = f"{os.getpid():x}-{time.time_ns():x}-"
        self._closed = False
        self._ack_prefix: str | None = None
        self._acks: dict[str, asyncio.Future[int]] = {}
        self._tokens = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="loglake-nats")
        self._thread.daemon = True
        self._thread.start()
        try:
            self._call(self._connect(), options.connect_timeout * 3 + options.request_timeout)
        except BaseException:
            self._stop_loop()
            raise

    # -- plumbing ---------------------------------------------------------------------------
    def call(self, coro: Coroutine[Any, Any, _T], timeout: float | None = None) -> _T:
        """Run ``coro`` on this log's connection loop and wait for it: what else shares the
        connection (a node's leases, ``loglake.streams.lease``) runs there, with ``self.js``."""
        return self._call(coro, timeout)

    def _call(self, coro: Coroutine[Any, Any, _T], timeout: float | None = None) -> _T:
        if self._closed:
            coro.close()
            raise LogClosed("the JetStream log is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        # the coroutine keeps its own (shorter) deadlines; this one only guards against a hang
        wait = (timeout or self.options.push_timeout + self.options.request_timeout) + 5.0
        try:
            return fut.result(wait)
        except TimeoutError as e:
            fut.cancel()
            raise ClusterUnavailable("a request", wait, "no answer") from e

    async def _connect(self) -> None:
        o = self.options
        kw: dict[str, Any] = {
            "servers": list(o.servers),
            "reconnect_time_wait": o.reconnect_wait,
            "max_reconnect_attempts": -1,
            "connect_timeout": o.connect_timeout,
            "allow_reconnect": True,
            "name": "loglake",
            "error_cb": _log_nats_error,
        }
        if o.credentials:
            kw["user_credentials"] = o.credentials
        if o.user is not None:
            kw["user"], kw["password"] = o.user, o.password
        if o.token:
            kw["token"] = o.token
        if o.nkeys_seed:
            kw["nkeys_seed"] = o.nkeys_seed
        if o.tls_ca:
            import ssl

            kw["tls"] = ssl.create_default_context(cafile=o.tls_ca)
        kw.update(o.extra)
        kw.setdefault("ping_interval", o.ping_interval)
        kw.setdefault("max_outstanding_pings", 2)
        limit = o.connect_timeout * max(2, len(o.servers)) + 1
        last: list[BaseException] = []  # the latest error of the attempts, for the message
        report = kw["error_cb"]

        async def remember(e: Exception) -> None:
            last[:] = [e]
            await report(e)

        kw["error_cb"] = remember
        try:  # nats-py retries a first connect forever when reconnects are unlimited
            self.nc = await asyncio.wait_for(nats.connect(**kw), limit)
        except Exception as e:
            where = ",".join(o.servers)
            # the deadline's TimeoutError says nothing: the attempts' own error says why
            # (connection refused, no such host), found from outside
            cause = _connect_error(last[0]) if isinstance(e, TimeoutError) and last else e
            raise ClusterUnavailable(f"connect to {where}", limit, cause) from e
        finally:
            kw["error_cb"] = report
        self.js = self.nc.jetstream(timeout=o.request_timeout)
        self.kv = await self._bucket()

    @property
    def index_bucket(self) -> str:
        """The KV bucket of the consumers' indexes."""
        return f"{self.options.prefix}_indexes"

    async def _bucket(self) -> Any:
        o = self.options
        config = jsapi.KeyValueConfig(
            bucket=self.index_bucket,
            history=1,
            replicas=o.replicas,
            storage=jsapi.StorageType(o.storage),
        )
        return await open_bucket(self.js, config, o.push_timeout)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    def close(self) -> None:
        if self._closed:
            return
        with contextlib.suppress(Exception):
            self._call(self.nc.close(), 5)
        self._closed = True
        self._stop_loop()

    def js_name(self, stream: str, partition: int) -> str:
        return f"{self.options.prefix}-{encode_name(stream)}-{partition}"

    def subject(self, stream: str, partition: int) -> str:
        return f"{self.options.prefix}.{encode_name(stream)}.{partition}"

    # -- streams ----------------------------------------------------------------------------
    def create_stream(self, name: str, config: StreamConfig | None = None) -> StreamInfo:
        return self.create_stream_replicated(name, config)

    def create_stream_replicated(
        self, name: str, config: StreamConfig | None = None, replicas: int | None = None
    ) -> StreamInfo:
        """``create_stream`` with this stream's replica count (default: the options')."""
        check_stream_name(name)
        self._check_js_name(name, (config or StreamConfig()).partitions)
        self._call(self._create(name, config, replicas or self.options.replicas))
        return self.stream_info(name)

    def _check_js_name(self, name: str, partitions: int) -> None:
        """``InvalidStreamName`` before any request if the longest partition's JetStream name
        (the last partition's: the most digits) passes ``MAX_JS_NAME``."""
        longest = self.js_name(name, max(partitions, 1) - 1)
        if len(longest) > MAX_JS_NAME:
            raise InvalidStreamName(
                f"stream name {name!r} is too long for JetStream: its partition stream "
                f"{longest[:40]!r}… would be {len(longest)} characters, at most {MAX_JS_NAME} "
                f"(each '_' and '.' counts twice, plus the prefix {self.options.prefix!r} and the "
                "partition number)"
            )

    async def _create(self, name: str, config: StreamConfig | None, replicas: int) -> None:
        self._forget(name)  # the cluster's word, not this process's memory: it may be deleted
        have = await self._discover(name, missing_ok=True)
        if have is not None:
            if config is not None and have != config.partitions:
                raise StreamExists(
                    f"stream {name!r} exists with {have} partitions, not {config.partitions}"
                )
            if await self._remake_missing(name, have):
                return
            self._forget(name)  # partition 0 went meanwhile: made as a new stream below
        config = config or StreamConfig()
        n = config.partitions
        # the name may have been used before (deleted outside loglake): start past its indexes
        firsts = await self._first_indexes(name, range(n))
        for p in reversed(range(n)):  # partition 0 last: its existence means all exist
            cfg = jsapi.StreamConfig(
                name=self.js_name(name, p),
                subjects=[self.subject(name, p)],
                num_replicas=replicas,
                storage=jsapi.StorageType(self.options.storage),
                allow_direct=True,
                # JetStream refuses a duplicate window longer than max_age
                duplicate_window=min(
                    self.options.duplicate_window,
                    config.retention_ms / 1000 if config.retention_ms else float("inf"),
                ),
                max_age=config.retention_ms / 1000 if config.retention_ms else None,
                max_bytes=config.retention_bytes if config.retention_bytes is not None else None,
                max_msgs=config.retention_records if config.retention_records is not None else None,
                metadata={META_STREAM: name, META_PARTITION: str(p), META_PARTITIONS: str(n)},
            )
            await self._add_partition(name, p, cfg, firsts[p])
        self._partitions[name] = n
        self._configs[name] = config
        log_event(logger, logging.INFO, "jetstream stream created", stream=name, partitions=n)
        self._log_remade(name, firsts)

    async def _remake_missing(self, name: str, n: int) -> bool:
        """Make again, empty and configured as partition 0, the partitions of ``name`` whose
        JetStream streams were deleted outside loglake (``nats stream rm`` of one partition):
        reads of them raised ``UnknownStream`` and ``create_stream`` found the stream existing
        (partition 0 is there), so nothing could bring them back. Their records are gone; their
        indexes go on past every index known used (``_first_indexes``). False if partition 0
        itself is missing (then the whole stream is made again, partition 0 last)."""
        template: jsapi.StreamConfig | None = None
        missing = []
        for p in range(n):
            si = await self._partition_info(name, p)
            if si is None:
                if p == 0:
                    return False
                missing.append(p)
                continue
            if p == 0:
                template = si.config
        assert template is not None
        firsts = await self._first_indexes(name, missing) if missing else {}
        for p in reversed(missing):  # partition 0 stays: only the missing ones are made
            cfg = self._partition_config(template, name, p)
            await self._add_partition(name, p, cfg, firsts[p])
        if missing:
            log_event(
                logger,
                logging.WARNING,
                "jetstream partitions deleted outside loglake made again (empty)",
                stream=name,
                partitions=missing,
                first_indexes={str(p): firsts[p] for p in missing},
            )
        return True

    async def _add_partition(
        self, name: str, p: int, cfg: jsapi.StreamConfig, first_index: int, taken: bool = False
    ) -> None:
        """Make partition ``p``'s JetStream stream with ``cfg``, its first index
        ``first_index`` (JetStream's ``first_seq`` is the first index + 1). A stream already
        there with the same config is JetStream's no-op, as before. With a first index, one
        there with another (a partition that outlived the deletion of partition 0, or a
        process racing this one that chose another first index) is taken as it is, if it is
        this partition of ``name``: JetStream compares ``first_seq`` too. ``taken`` takes one
        there as it is whatever first index this process chose, 0 included (a grow: racing
        growers may have seen different indexes used, and the first made wins)."""
        if first_index:
            cfg = dataclasses.replace(cfg, first_seq=first_index + 1)
        try:
            await self._retry(f"create {name!r}", lambda: self.js.add_stream(cfg))
        except JetStreamError:
            if not (first_index or taken) or await self._partition_info(name, p) is None:
                raise
            await self._check_ours(name, p)

    async def _first_indexes(self, name: str, partitions: Iterable[int]) -> dict[int, int]:
        """The first index each of ``partitions`` of ``name`` is (re)made at: past every index
        loglake knows was used there, so a stream deleted outside loglake (``nats stream rm``)
        and made again never hands an index out twice. A new JetStream stream starts at
        sequence 1, and its indexes at 0, while consumers' saved indexes in the bucket and the
        sealed lake's files still name the old ones: a consumer would skip the first new
        records, and the lake would hold old records under new records' indexes. The highest
        of: what this process saw acknowledged (``_acked``, kept past ``_forget``), the end of
        the partition's lake files (with ``lake_dir``), and the highest consumer index saved
        for the partition, unless it passes the other two by more than ``SAVED_INDEX_SLACK``
        (a client's claim no evidence backs: left out and logged, so no saved value can stop
        a partition from being made). 0 for a name never used."""
        saved = await self._saved_indexes(name)
        lake = await asyncio.to_thread(self._lake_ends, name, list(partitions))
        out = {}
        for p, lake_next in lake.items():
            js = self.js_name(name, p)
            known = max(self._acked.get(js, 0), self._acked_gone.get(js, 0), lake_next)
            claims = saved.get(p, [])
            counted = [i for i in claims if i <= known + SAVED_INDEX_SLACK]
            if len(counted) < len(claims):
                log_event(
                    logger,
                    logging.WARNING,
                    "jetstream saved consumer index too far past the indexes used: not counted "
                    "for the first index of a partition made again",
                    stream=name,
                    partition=p,
                    saved_index=max(claims),
                    known_used=known,
                )
            out[p] = max([known, *counted])
        return out

    def _lake_ends(self, name: str, partitions: list[int]) -> dict[int, int]:
        """One past the last index of each partition's lake files (0 without ``lake_dir`` or
        files): the sealer of any process may have written them (``jetstream_seal``)."""
        from loglake.log.lake import list_lake_files
        from loglake.log.lake_schema import lake_partition_dir

        out = {}
        for p in partitions:
            files = (
                list_lake_files(lake_partition_dir(self.options.lake_dir, name, p))
                if self.options.lake_dir
                else []
            )
            out[p] = max((f.last + 1 for f in files), default=0)
        return out

    async def _saved_indexes(self, name: str) -> dict[int, list[int]]:
        """``{partition: every consumer index saved}`` for ``name`` in the index bucket. What
        it costs: one stream info of the bucket filtered on the stream's keys (every consumer
        and partition, ``c*.s<name>.*``), then a get per key found. Acceptable: it runs only
        when a stream or partition is made, and a stream with no consumers costs the one
        request."""
        bucket = self.index_bucket
        pre = f"$KV.{bucket}."

        info = await self._info(f"KV_{bucket}", subjects_filter=f"{pre}*.s{_b64(name)}.*")
        out: dict[int, list[int]] = {}
        for subject in info.state.subjects or {}:
            key = subject[len(pre) :]
            parsed = _parse_key(key)
            if parsed is None or parsed[1] != name:
                continue
            entry = await self._kv_get(key)
            value = decode_index_value(entry.value) if entry is not None else None
            if value is not None:  # a value that is not an index names none
                out.setdefault(parsed[2], []).append(value[0])
        return out

    def _log_remade(self, name: str, firsts: dict[int, int]) -> None:
        """Log the partitions of a stream made past indexes used before (not a new name)."""
        used = {str(p): first for p, first in sorted(firsts.items()) if first}
        if used:
            log_event(
                logger,
                logging.WARNING,
                "jetstream stream made again past the indexes used before",
                stream=name,
                first_indexes=used,
            )

    def grow_stream(self, name: str, partitions: int) -> StreamInfo:
        """``Log.grow_stream`` on the cluster (the stream service's CREATE for more partitions,
        as the Ockam reference's ``ensure_streams``): the new partitions' JetStream streams are
        made first, configured as partition 0 is, then partition 0's ``loglake.partitions`` is
        raised, so a process that reads the new count finds every partition it names. Readers
        of the existing partitions are not touched; other processes take up the new count when
        they next ask partition 0 (``stream_info``, ``partitions``, a partition they did not
        know). A crash between the two steps leaves empty partition streams that the count does
        not name yet; the next grow takes them up."""
        check_stream_name(name)
        self._check_js_name(name, partitions)
        self._call(self._grow(name, partitions))
        return self.stream_info(name)

    async def _grow(self, name: str, target: int) -> None:
        # JetStream has no compare-and-set on a stream's config: two processes growing at once
        # may write partition 0's count in either order, the smaller last. So after each write
        # (and before returning) the partitions just past the count are looked for: any there
        # were made by a grower for a larger count, which is written again. The count never
        # names a partition that does not exist; at rest it names every one. A new partition's
        # config depends on its number alone (``loglake.partitions`` there is ``p + 1``, the
        # least the stream has once it exists; partition 0's is the stream's count), so racing
        # growers make the same stream and JetStream takes the second ``add_stream`` as a no-op.
        for _ in range(MAX_GROW_ROUNDS):
            have = await self._refresh(name)
            if have >= target:
                beyond = have
                while await self._partition_info(name, beyond) is not None:
                    await self._check_ours(name, beyond)
                    beyond += 1
                if beyond == have:
                    self._partitions[name] = have
                    return
                target = beyond
                continue
            first = await self._partition_info(name, 0)
            if first is None:  # deleted outside loglake meanwhile
                self._forget(name)
                raise UnknownStream(name)
            template = first.config
            # the re-added partitions of a stream made again with fewer (deleted outside
            # loglake) start past their old indexes, as a remade partition does
            firsts = await self._first_indexes(name, range(have, target))
            for p in range(have, target):
                await self._make_partition(name, p, template, firsts[p])
            self._log_remade(name, firsts)
            meta = {**(template.metadata or {}), META_PARTITIONS: str(target)}
            cfg = dataclasses.replace(template, metadata=meta)
            await self._retry(f"grow {name!r}", lambda cfg=cfg: self.js.update_stream(cfg))
            log_event(logger, logging.INFO, "jetstream stream grown", stream=name,
                      partitions=target, before=have)  # fmt: skip
        raise JetStreamError(
            f"grow {name!r}: partition 0's count did not settle after {MAX_GROW_ROUNDS} rounds"
        )

    async def _make_partition(
        self, name: str, p: int, template: jsapi.StreamConfig, first_index: int
    ) -> None:
        """Partition ``p``'s JetStream stream, configured as ``template`` (partition 0's), its
        first index ``first_index`` (``_first_indexes``); one that is there already as this
        partition (a grower racing this one, or a grow that stopped before it wrote partition
        0's count) is taken as it is. Two growers may choose different first indexes (a
        consumer index saved, a file sealed or a push acknowledged between their looks, or
        each process knowing its own pushes): JetStream refuses the second ``add_stream``
        (its ``first_seq`` differs) and the second takes the first's stream as it is, so both
        grow to the identical stream. The first index is then what the first grower knew used
        when it looked; an index only the second knew is not counted, as no process's
        knowledge but its own is (docs/jetstream.md). Raising the head afterwards (a purge
        past it) could drop a record pushed meanwhile, so it is not done."""
        cfg = self._partition_config(template, name, p, {META_PARTITIONS: str(p + 1)})
        await self._add_partition(name, p, cfg, first_index, taken=True)

    def _partition_config(
        self, template: jsapi.StreamConfig, name: str, p: int, meta: dict[str, str] | None = None
    ) -> jsapi.StreamConfig:
        """Partition ``p``'s JetStream config, made from ``template`` (partition 0's, whose
        settings every partition shares): its own name, subject and ``loglake.partition``
        (and ``meta`` on top), and no ``first_seq`` (partition 0's, if it was made again; a
        partition's own comes from ``_first_indexes`` in ``_add_partition``)."""
        return dataclasses.replace(
            template,
            name=self.js_name(name, p),
            subjects=[self.subject(name, p)],
            metadata={**(template.metadata or {}), META_PARTITION: str(p), **(meta or {})},
            first_seq=None,
        )

    async def _check_ours(self, name: str, p: int) -> None:
        """``JetStreamError`` unless the JetStream stream of partition ``p`` says it is that
        partition of ``name`` (another client may have made one under the same name)."""
        si = await self._partition_info(name, p)
        meta = (si.config.metadata or {}) if si is not None else {}
        if meta.get(META_STREAM) != name or meta.get(META_PARTITION) != str(p):
            raise JetStreamError(
                f"JetStream stream {self.js_name(name, p)!r} was not created by loglake for "
                f"{name!r} (its metadata: {str(meta)[:200]})"
            )

    async def _refresh(self, name: str) -> int:
        """The partition count partition 0 holds now (another process may have grown the
        stream since this one learnt it). What this process acknowledged is kept, unlike
        ``_forget``: its pulls stay read-your-writes."""
        known = self._partitions.pop(name, None)
        try:
            n = await self._discover(name)
        except UnknownStream:
            if known is not None:  # deleted outside loglake: forget all of it
                self._partitions[name] = known
                self._forget(name)
            raise
        assert n is not None
        return n

    async def _partition_info(self, name: str, p: int) -> Any:
        """The JetStream stream info of partition ``p`` of ``name``; None if that stream does
        not exist (deleted outside loglake)."""
        try:
            return await self._info(self.js_name(name, p))
        except JetStreamError as e:
            if isinstance(e.__cause__, nats.js.errors.NotFoundError):
                return None
            raise

    async def _named_info(self, name: str, p: int) -> Any:
        """``_partition_info`` of a partition that partition 0's count names, where None (gone)
        makes the caller forget the stream: a "not found" for ``p`` > 0 is believed at once only
        if partition 0 is gone too or no longer names ``p``; otherwise ``p`` is asked again for
        ``ABSENT_DOUBT`` seconds (a server still making a partition another process made says
        "not found" for it) before it counts as deleted."""
        doubt_until = time.monotonic() + ABSENT_DOUBT
        while True:
            si = await self._partition_info(name, p)
            if si is not None or p == 0 or time.monotonic() >= doubt_until:
                return si
            first = await self._partition_info(name, 0)
            if first is None or (_count(first) or 0) <= p:
                return None
            await asyncio.sleep(ABSENT_PAUSE)

    async def _info(self, js: str, subjects_filter: str | None = None) -> Any:
        """The info of the JetStream stream ``js`` (a partition's, or a bucket's): every
        stream-info request of this log goes through here, so each is asked again when it goes
        unanswered (``INFO_ATTEMPT``) and ``ClusterUnavailable`` names the stream that did not
        answer, not only the loglake stream it belongs to."""
        return await self._retry(
            f"stream info of {js}",
            lambda: self.js.stream_info(js, subjects_filter=subjects_filter),
            self.options.request_timeout,
            INFO_ATTEMPT,
        )

    async def _retry(
        self, what: str, make: Any, timeout: float | None = None, attempt: float | None = None
    ) -> Any:
        """``until_settled`` for this log's requests (``push_timeout`` unless given); a refusal
        (any other nats-py ``APIError``) becomes ``JetStreamError``, its cause kept."""
        try:
            return await until_settled(
                what, make, timeout or self.options.push_timeout, 0.1, attempt
            )
        except nats.js.errors.APIError as e:
            raise JetStreamError(f"{what}: {e}") from e

    async def _discover(self, name: str, missing_ok: bool = False) -> int | None:
        n = self._partitions.get(name)
        if n is not None:
            return n
        si = await self._partition_info(name, 0)
        if si is None:
            if missing_ok:
                return None
            raise UnknownStream(name)
        meta = si.config.metadata or {}
        n = _count(si)
        if meta.get(META_STREAM) != name or n is None:
            raise JetStreamError(
                f"JetStream stream {si.config.name!r} was not created by loglake for {name!r}"
                f" (its metadata: {str(meta)[:200]})"
            )
        self._partitions[name] = n
        self._configs[name] = StreamConfig(
            partitions=n,
            retention_ms=int(si.config.max_age * 1000) if si.config.max_age else None,
            retention_bytes=si.config.max_bytes
            if si.config.max_bytes and si.config.max_bytes > 0
            else None,
            retention_records=si.config.max_msgs
            if si.config.max_msgs and si.config.max_msgs > 0
            else None,
            seal_to_lake=False,
        )
        return n

    def _forget(self, stream: str) -> None:
        """Drop what this process remembers of ``stream`` (partition count, config, acked
        sequences): the next call asks the cluster again."""
        for p in range(self._partitions.pop(stream, 0)):
            name = self.js_name(stream, p)
            seq = self._acked.pop(name, None)
            if seq is not None:
                self._acked_gone[name] = max(self._acked_gone.get(name, 0), seq)
        self._configs.pop(stream, None)

    async def _deleted(self, stream: str, partition: int) -> bool:
        """Whether the partition's JetStream stream is gone — deleted outside loglake (``nats
        stream rm``, another tool) after this process learnt of it: the cluster answers "stream
        not found" (for a partition partition 0 still names, still after ``ABSENT_DOUBT``:
        ``_named_info``). Then ``stream`` is forgotten (``UnknownStream`` follows, and
        ``create_stream`` makes it again). Asked when a read or a push finds no responder, which
        is otherwise what an unavailable cluster answers: any other answer (no leader, a
        timeout) is not a deletion, and those calls go on to their deadlines as before."""
        try:
            if await self._named_info(stream, partition) is not None:
                return False
        except Exception:  # unavailable: not known to be deleted
            return False
        log_event(
            logger,
            logging.WARNING,
            "jetstream stream deleted outside loglake",
            stream=stream,
            partition=partition,
        )
        self._forget(stream)
        return True

    async def _check(self, stream: str, partition: int) -> str:
        n = await self._discover(stream)
        assert n is not None
        if partition >= n:  # another process may have grown the stream (``grow_stream``)
            n = await self._refresh(stream)
        if not 0 <= partition < n:
            raise UnknownPartition(stream, partition, n)
        return self.js_name(stream, partition)

    def partitions(self, stream: str) -> int:
        """Partition 0's count, asked each time: another process may have grown the stream."""
        return self._call(self._refresh(stream))

    def has_stream(self, name: str) -> bool:
        """Whether the cluster holds ``name``: partition 0's JetStream stream, asked each time
        (one request), as ``partitions`` does. Before, a name this process had learnt was
        answered from its memory, True after the stream was deleted outside loglake (``nats
        stream rm``), so a caller that creates what is missing (the stream service's CREATE)
        did not make it again until a read or push here found it gone. A stream found gone
        is forgotten; one grown by another process is taken up. No caller asks it per record
        or per pull: the stream service's and the node's CREATE, the node's consumers list
        (once per stream), ``Streams.get_index`` (a consumer's resume) and one-off jobs, so
        the request is not cached."""
        return self._call(self._has_stream(name))

    async def _has_stream(self, name: str) -> bool:
        try:
            await self._refresh(name)
        except UnknownStream:
            return False
        return True

    def streams(self) -> list[str]:
        return self._call(self._streams())

    async def _streams(self) -> list[str]:
        names = []
        prefix = f"{self.options.prefix}-"
        async for si in _iter_streams(self.js):
            meta = si.config.metadata or {}
            if (
                si.config.name.startswith(prefix)
                and meta.get(META_PARTITION) == "0"
                and si.config.name == self.js_name(meta.get(META_STREAM, ""), 0)
            ):
                names.append(meta[META_STREAM])
        return sorted(names)

    def stream_info(self, name: str) -> StreamInfo:
        return self._call(self._stream_info(name))

    async def _stream_info(self, name: str) -> StreamInfo:
        n = await self._refresh(name)  # another process may have grown it
        parts = []
        for p in range(n):
            si = await self._named_info(name, p)
            if si is None:  # deleted outside loglake
                self._forget(name)
                raise UnknownStream(name)
            st = si.state
            parts.append(
                PartitionInfo(p, max(st.first_seq, 1) - 1, st.last_seq, st.bytes, st.last_seq)
            )
        return StreamInfo(name, self._configs[name], tuple(parts))

    def gaps(self, stream: str) -> dict[int, int]:
        """``{partition: messages deleted from its middle}`` for every partition of ``stream``
        whose JetStream stream was changed outside loglake (empty when all are gapless)."""
        return self._call(self._gaps(stream))

    async def _gaps(self, stream: str) -> dict[int, int]:
        n = await self._discover(stream)
        assert n is not None
        out = {}
        for p in range(n):
            si = await self._info(self.js_name(stream, p))
            if si.state.num_deleted:
                out[p] = si.state.num_deleted
        return out

    # -- writing ----------------------------------------------------------------------------
    def append_many(
        self, stream: str, entries: Sequence[Entry], *, partition: int = 0
    ) -> list[int]:
        check_timestamps(entries)  # JetStream would keep any number in the header
        datas, headers = [], []
        for e in entries:
            datas.append(e.data)
            h: dict[str, str] = {}
            if e.key is not None:
                h[KEY_HEADER] = base64.b64encode(e.key).decode()
            if e.timestamp_ns is not None:
                h[TS_HEADER] = str(e.timestamp_ns)
            if e.headers:
                h[HEADERS_HEADER] = json.dumps(
                    [[k, base64.b64encode(v).decode()] for k, v in e.headers]
                )
            headers.append(h)
        return self._call(self._publish(stream, partition, datas, headers, None), self._push_wait)

    def append_payloads(
        self, stream: str, datas: Sequence[bytes], *, partition: int = 0
    ) -> list[int]:
        return self.push_many(stream, partition, datas)

    def push_many(
        self,
        stream: str,
        partition: int,
        datas: Sequence[bytes],
        msg_ids: Sequence[str] | None = None,
    ) -> list[int]:
        """Append ``datas``; with ``msg_ids`` (one per message, unique per stream) a push that
        is retried within the duplicate window returns the first push's indexes."""
        if msg_ids is not None and len(msg_ids) != len(datas):
            raise ValueError("one msg id per message")
        return self._call(self._publish(stream, partition, datas, None, msg_ids), self._push_wait)

    def push_expecting(
        self, stream: str, partition: int, datas: Sequence[bytes], expected_next: int
    ) -> list[int]:
        """Append ``datas`` only if the partition's next index is ``expected_next`` when the
        first arrives (and, for each after it, right behind the one before): JetStream checks
        ``Nats-Expected-Last-Sequence`` (the last sequence is the next index: index =
        sequence − 1) as it stores each message, so a writer that lost a race, or was fenced
        out by a newer lease holder's claim, gets ``HeadMoved`` and its messages are not
        stored. Sent one at a time (a refusal must stop the rest); for the low-volume, once-only
        writers a lease guards (``streams.lease.LeaseFence``)."""
        return self._call(self._push_expecting(stream, partition, datas, expected_next))

    async def push_expecting_async(
        self, stream: str, partition: int, datas: Sequence[bytes], expected_next: int
    ) -> list[int]:
        """``push_expecting`` for a coroutine already on this log's loop (``call``): a lease
        claims its guarded streams from the loop, between reading the lease key and taking it."""
        return await self._push_expecting(stream, partition, datas, expected_next)

    async def next_index_async(self, stream: str, *, partition: int = 0) -> int:
        """``next_index`` for a coroutine already on this log's loop (``UnknownStream``)."""
        info = await self._stream_info(stream)
        return info.partitions[partition].next_index

    async def _push_expecting(
        self, stream: str, partition: int, datas: Sequence[bytes], expected_next: int
    ) -> list[int]:
        await self._check(stream, partition)
        subject = self.subject(stream, partition)
        out: list[int] = []
        for i, data in enumerate(datas):
            expected = expected_next + i
            try:
                ack = await self.js.publish(
                    subject,
                    data,
                    timeout=self.options.request_timeout,
                    headers={"Nats-Expected-Last-Sequence": str(expected)},
                )
            except nats.js.errors.APIError as e:
                if e.err_code == WRONG_LAST_SEQUENCE:
                    raise HeadMoved(stream, partition, expected, f" ({e.description})") from None
                err = _loglake_error(e)
                if err is e:
                    raise JetStreamError(f"fenced push to {stream!r}/{partition}: {e}") from e
                raise err from e
            except Exception as e:  # no answer: whether it was stored is unknown
                raise ClusterUnavailable(
                    f"a fenced push to {stream!r}/{partition}", self.options.request_timeout, e
                ) from e
            out.append(ack.seq - 1)
        if out:
            name = self.js_name(stream, partition)
            self._acked[name] = max(self._acked.get(name, 0), out[-1] + 1)
        return out

    @property
    def _push_wait(self) -> float:
        return self.options.push_timeout + self.options.request_timeout

    async def _publish(
        self,
        stream: str,
        partition: int,
        datas: Sequence[bytes],
        headers: Sequence[dict[str, str]] | None,
        msg_ids: Sequence[str] | None,
    ) -> list[int]:
        if not datas:
            await self._check(stream, partition)
            return []
        name = await self._check(stream, partition)
        subject = self.subject(stream, partition)
        if msg_ids is None:
            first = next(self._ids)
            for _ in range(len(datas) - 1):
                next(self._ids)
            msg_ids = [f"{self._id_prefix}{first + i:x}" for i in range(len(datas))]
        o = self.options
        deadline = time.monotonic() + o.push_timeout
        seqs: list[int | None] = [None] * len(datas)
        todo = list(range(len(datas)))
        last_error: BaseException | None = None
        probe: asyncio.Future[bool] | None = None  # ``_deleted``, once "no responders" came
        try:
            while todo:
                futs = []
                prefix = await self._ack_inbox()
                loop = asyncio.get_running_loop()
                for i in todo:
                    h = dict(headers[i]) if headers is not None else {}
                    h["Nats-Msg-Id"] = msg_ids[i]
                    token = f"{next(self._tokens):x}"
                    fut = loop.create_future()
                    self._acks[token] = fut
                    fut.add_done_callback(functools.partial(self._forget_ack, token))
                    try:
                        await self.nc.publish(subject, datas[i], reply=prefix + token, headers=h)
                    except Exception as e:  # disconnected and its buffer full: next round
                        fut.cancel()
                        if not transient(e):
                            raise
                        last_error = e
                        break
                    futs.append(fut)
                round_wait = (
                    o.ack_wait if len(todo) == len(datas) and last_error is None else o.retry_wait
                )
                wait = max(0.05, min(round_wait, deadline - time.monotonic()))
                if futs:
                    await asyncio.wait(futs, timeout=wait)
                left = []
                for k, i in enumerate(todo):
                    f = futs[k] if k < len(futs) else None
                    if f is not None and f.done() and not f.cancelled() and f.exception() is None:
                        seqs[i] = f.result()
                        continue
                    if f is not None and not f.done():
                        f.cancel()
                    elif f is not None and not f.cancelled():
                        err = f.exception()
                        assert err is not None
                        if not transient(err):
                            raise JetStreamError(f"push to {stream!r}/{partition}: {err}") from err
                        last_error = err
                    left.append(i)
                todo = left
                if todo and isinstance(last_error, nats.js.errors.NoStreamResponseError):
                    # no responders: a leader election, or the stream deleted outside loglake.
                    # Asked beside the re-sends, so a failover is not slowed by the question.
                    probe = probe or asyncio.ensure_future(self._deleted(stream, partition))
                if todo and probe is not None and probe.done() and probe.result():
                    raise UnknownStream(stream)  # no stream took them: nothing was stored
                if todo:
                    if time.monotonic() >= deadline:
                        raise ClusterUnavailable(
                            f"push to {stream!r} partition {partition} "
                            f"({len(todo)} of {len(datas)} unacknowledged)",
                            o.push_timeout,
                            last_error or "no ack",
                        )
                    await asyncio.sleep(0.05)
        finally:
            if probe is not None:
                probe.cancel()
        out = [s - 1 for s in seqs if s is not None]
        top = max(out) + 1
        if top > self._acked.get(name, 0):
            self._acked[name] = top
        return out

    async def _ack_inbox(self) -> str:
        """The reply prefix of publish acks: one wildcard subscription whose callback resolves
        each publish's future with its sequence (nats-py's ``publish_async`` does the same
        but adds a task per message for its stall limit: that was most of serve's push cost)."""
        if self._ack_prefix is None:
            prefix = f"{self.nc.new_inbox()}."
            await self.nc.subscribe(prefix + "*", cb=self._on_ack)
            self._ack_prefix = prefix
        return self._ack_prefix

    def _forget_ack(self, token: str, _fut: object) -> None:
        self._acks.pop(token, None)

    async def _on_ack(self, msg: Any) -> None:
        assert self._ack_prefix is not None
        fut = self._acks.pop(msg.subject[len(self._ack_prefix) :], None)
        if fut is None or fut.done():
            return
        if msg.headers and msg.headers.get("Status") == "503":  # no responders
            fut.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            resp = json.loads(msg.data)
            if "error" in resp:
                fut.set_exception(nats.js.errors.APIError.from_error(resp["error"]))
            else:
                fut.set_result(int(resp["seq"]))
        except (ValueError, KeyError, TypeError) as e:
            fut.set_exception(JetStreamError(f"bad publish ack: {e}"))

    # -- reading ----------------------------------------------------------------------------
    def read(
        self,
        stream: str,
        start: int,
        limit: int | None = None,
        end: int | None = None,
        *,
        partition: int = 0,
        lake: bool = True,
    ) -> list[Record]:
        if limit is None:
            limit = 1 << 62
        if end is not None:
            limit = min(limit, end - start)
        rows = self._call(self._read(stream, partition, start, limit, True))
        out = [Record(stream, partition, i, ts, k, h, d) for i, d, ts, k, h in rows]
        if lake and self.options.lake_dir and (not out or out[0].index > max(start, 0)):
            out = self._with_lake(stream, partition, max(start, 0), limit, out)
        return out

    def read_payloads(
        self,
        stream: str,
        start: int,
        limit: int | None = None,
        *,
        partition: int = 0,
        max_bytes: int | None = None,
    ) -> list[tuple[int, bytes]]:
        n = 1 << 62 if limit is None else limit
        rows = self._call(self._read(stream, partition, start, n, False, max_bytes))
        if self.options.lake_dir and n > 0 and (not rows or rows[0][0] > max(start, 0)):
            live = [Record(stream, partition, r[0], 0, None, (), r[1]) for r in rows]
            out = [(r.index, r.data) for r in self._with_lake(stream, partition, start, n, live)]
        else:
            out = [(r[0], r[1]) for r in rows]
        return out if max_bytes is None else cap_bytes(out, max_bytes)

    def _with_lake(
        self, stream: str, partition: int, start: int, limit: int, live: list[Record]
    ) -> list[Record]:
        """History below what JetStream still holds, from the sealed lake, then ``live``."""
        from loglake.log.lake import list_lake_files, read_lake_file, visible_lake_files
        from loglake.log.lake_schema import lake_partition_dir

        assert self.options.lake_dir is not None
        end = live[0].index if live else 1 << 62
        files = visible_lake_files(
            list_lake_files(lake_partition_dir(self.options.lake_dir, stream, partition))
        )
        out: list[Record] = []
        pos = max(start, 0)
        for f in files:
            if len(out) >= limit or pos >= end:
                break
            if f.last < pos or f.first > pos:
                continue  # before pos, or a hole: only contiguous history from pos
            got = read_lake_file(f, stream, partition, pos, min(end, f.last + 1), limit - len(out))
            out += got
            pos = out[-1].index + 1 if got else pos
        if not out:
            return live
        if pos == end:
            out += live[: limit - len(out)]
        return out

    async def _read(
        self,
        stream: str,
        partition: int,
        start: int,
        limit: int,
        full: bool,
        max_bytes: int | None = None,
    ) -> list[tuple[Any, ...]]:
        """``max_bytes``: no further batch once the data read passes it (each batch is at most
        ``MAX_PULL_BYTES``; ``read_payloads`` cuts the rows to it)."""
        name = await self._check(stream, partition)
        if limit <= 0:
            return []
        start = max(start, 0)
        out: list[tuple[Any, ...]] = []
        seq = start + 1
        deadline = time.monotonic() + self.options.request_timeout
        acked = self._acked.get(name, 0)
        probe: asyncio.Future[bool] | None = None  # ``_deleted``, once a read went unanswered
        pause = READ_RETRY_FIRST  # between unanswered attempts (``READ_RETRY_FIRST``)
        got_bytes = 0
        try:
            while len(out) < limit:
                batch, pending = await self._direct_batch(name, seq, min(limit - len(out), 100_000))
                if batch is None:  # no answer: that replica is paused/partitioned, or none serves
                    if out:
                        break
                    # a paused replica, no quorum, or the stream deleted outside loglake: asked
                    # beside the next attempts, which a paused replica's reads are not slowed by
                    probe = probe or asyncio.ensure_future(self._deleted(stream, partition))
                    if probe.done() and probe.result():
                        raise UnknownStream(stream)
                    if time.monotonic() < deadline:
                        # the queue group may pick a replica that answers; a "no responders"
                        # comes back at once, so the next attempt waits a little (doubling)
                        await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                        pause = min(2 * pause, READ_RETRY_MAX)
                        continue
                    raise ClusterUnavailable(
                        f"read of {stream!r}/{partition}",
                        self.options.request_timeout,
                        "no replica",
                    )
                for m in batch:
                    got = int(m.headers["Nats-Sequence"])
                    if got != seq:
                        if not await self._below_first(name, got):
                            return self._gap(stream, partition, seq - 1, got - 1, out)
                        if out:
                            # the head was purged (retention, truncate_before) between two
                            # batches of this read: not a gap. Serve what is read, contiguous;
                            # the next read from here starts at the new head (or the lake)
                            return out
                        seq = got  # retention dropped the head: start at the first index
                    out.append(self._row(m, full))
                    seq += 1
                    got_bytes += len(m.data)
                if max_bytes is not None and got_bytes > max_bytes:
                    break  # a pull's reply is full: what it cannot carry is not read
                if batch and pending:
                    continue  # the reply was cut (max_bytes): read on
                if (
                    seq - 1 < acked
                    and time.monotonic() < deadline
                    and await self._behind(name, seq)
                ):
                    await asyncio.sleep(0.005)  # this replica has not applied our acked pushes yet
                    continue
                break
        finally:
            if probe is not None:
                probe.cancel()
        return out

    async def _behind(self, name: str, seq: int) -> bool:
        """Does the stream's leader hold ``seq`` (so the replica that answered is behind)?"""
        si = await self._info(name)
        return si.state.first_seq <= seq <= si.state.last_seq

    @staticmethod
    def _row(m: Any, full: bool) -> tuple[Any, ...]:
        i = int(m.headers["Nats-Sequence"]) - 1
        if not full:
            return (i, m.data)
        h = m.headers
        key = _loglake_field(h, KEY_HEADER, _decode_key, i)
        hdrs = _loglake_field(h, HEADERS_HEADER, _decode_headers, i) or ()
        ts = _loglake_field(h, TS_HEADER, _decode_ts, i)
        if ts is None:
            ts = _parse_ts(h.get("Nats-Time-Stamp"))
        return (i, m.data, ts, key, hdrs)

    def _gap(
        self, stream: str, partition: int, missing: int, present: int, out: list
    ) -> list[tuple[Any, ...]]:
        log_event(
            logger,
            logging.ERROR,
            "jetstream stream has a gap (messages deleted outside loglake)",
            stream=stream,
            partition=partition,
            missing=missing,
        )
        if out:
            return out  # serve up to the gap; the next read starting at it raises
        raise StreamGap(stream, partition, missing, present)

    async def _below_first(self, name: str, got_seq: int) -> bool:
        """Is ``got_seq`` the stream's first sequence (the head was purged), not past a gap?"""
        si = await self._info(name)
        return si.state.first_seq >= got_seq

    async def _direct_batch(self, name: str, seq: int, n: int) -> tuple[list | None, int]:
        """One batched direct get (served by any current replica): the messages from ``seq``
        (deleted ones skipped by the server) and how many more the replica holds after them;
        ``(None, 0)`` if nothing answered."""
        msgs: list[Any] = []
        done: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

        async def on_msg(m: Any) -> None:  # one callback, not a task per message (next_msg)
            hdrs = m.headers or {}
            status = hdrs.get("Status")
            if status is None:
                msgs.append(m)
            elif not done.done():
                # 204 EOB (Nats-Num-Pending: what follows the batch), 404 nothing from seq,
                # 503 no responders
                done.set_result(None if status == "503" else int(hdrs.get("Nats-Num-Pending") or 0))

        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox, cb=on_msg)
        try:
            req = json.dumps({"seq": seq, "batch": n, "max_bytes": MAX_PULL_BYTES}).encode()
            await self.nc.publish(DIRECT_GET.format(name), req, reply=inbox)
            seen = -1
            while not done.done():
                try:  # wait for the end; a replica that stopped mid-reply is given up on
                    await asyncio.wait_for(
                        asyncio.shield(done),
                        READ_ATTEMPT if not msgs else self.options.request_timeout,
                    )
                except TimeoutError:
                    if len(msgs) == seen or not msgs:
                        return (msgs or None), 0
                    seen = len(msgs)
            pending = done.result()
            if pending is None:
                return None, 0
            return msgs, pending
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    # -- consumer indexes -------------------------------------------------------------------
    def _key(self, client_id: str, stream: str, partition: int) -> str:
        key = f"c{_b64(client_id)}.s{_b64(stream)}.{partition}"
        if len(key) > MAX_INDEX_KEY:
            raise ConsumerKeyTooLong(
                f"consumer id of {len(client_id.encode())} bytes is too long for the JetStream "
                f"index bucket (its key would be {len(key)} characters, at most {MAX_INDEX_KEY})"
            )
        return key

    def get_index(self, client_id: str, stream: str, *, partition: int = 0) -> int | None:
        return self._call(self._get_index(client_id, stream, partition))

    def save_index(self, client_id: str, stream: str, index: int, *, partition: int = 0) -> int:
        check_index(index)
        return self._call(self._save_index(client_id, stream, partition, index), self._push_wait)

    def save_index_as(
        self,
        client_id: str,
        stream: str,
        index: int,
        owner: str,
        override: bool = False,
        *,
        partition: int = 0,
    ) -> int:
        check_index(index)
        return self._call(
            self._save_index(client_id, stream, partition, index, owner, override),
            self._push_wait,
        )

    def index_owner(self, client_id: str, stream: str, *, partition: int = 0) -> str | None:
        return self._call(self._index_owner(client_id, stream, partition))

    def reset_index(
        self, client_id: str, stream: str, index: int | None, *, partition: int = 0
    ) -> int | None:
        if index is not None:
            check_index(index)
        return self._call(self._reset_index(client_id, stream, partition, index), self._push_wait)

    def consumer_indexes(self) -> dict[tuple[str, str, int], int]:
        """Every saved index in the bucket (the node's consumers list and lag): the keys
        decode back to ``(client_id, stream, partition)``; a key that does not (written by
        something else) is skipped, and so is a value that is not an index."""
        return self._call(self._consumer_indexes())

    async def _consumer_indexes(self) -> dict[tuple[str, str, int], int]:
        bucket = self.index_bucket
        pre = f"$KV.{bucket}."  # a key's subject in the bucket's stream (ADR-8)

        # Not kv.keys(): its watcher can end the initial replay early and list too few keys,
        # or none (nats-io/nats.py#842: seen here as an empty consumers list after a restart
        # under load). The stream's per-subject state is one request with no such race; a
        # deleted key is listed too, and its get below skips it.
        info = await self._info(f"KV_{bucket}", subjects_filter=f"{pre}>")
        out: dict[tuple[str, str, int], int] = {}
        for key in [s[len(pre) :] for s in (info.state.subjects or {})]:
            parsed = _parse_key(key)
            entry = await self._kv_get(key) if parsed is not None else None
            value = decode_index_value(entry.value) if entry is not None else None
            if parsed is not None and value is not None:
                out[parsed] = value[0]
        return out

    async def _index_entry(
        self, client_id: str, stream: str, partition: int, foreign_ok: bool = False
    ) -> tuple[str, Any, tuple[int, str | None] | None]:
        """``(key, KV entry or None, (index, owner) or None)`` of one consumer; a value that is
        not an index is ``BadIndexValue``, or with ``foreign_ok`` (an operator's reset, which
        replaces it) the entry with None."""
        await self._check(stream, partition)
        key = self._key(client_id, stream, partition)
        entry = await self._kv_get(key)
        if entry is None:
            return key, None, None
        value = decode_index_value(entry.value)
        if value is None and not foreign_ok:
            raise BadIndexValue(
                f"consumer {client_id!r} of {stream}/{partition}: the index bucket holds "
                f"{bytes(entry.value or b'')[:40]!r}, not an index (written by something else?)"
            )
        return key, entry, value

    async def _get_index(self, client_id: str, stream: str, partition: int) -> int | None:
        _, _, value = await self._index_entry(client_id, stream, partition)
        return None if value is None else value[0]

    async def _index_owner(self, client_id: str, stream: str, partition: int) -> str | None:
        _, _, value = await self._index_entry(client_id, stream, partition)
        return None if value is None else value[1]

    async def _kv_get(self, key: str) -> Any:
        async def get() -> Any:
            try:
                return await self.kv.get(key)
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                return None

        return await self._retry("index get", get, self.options.request_timeout)

    async def _save_index(
        self,
        client_id: str,
        stream: str,
        partition: int,
        index: int,
        owner: str | None = None,
        override: bool = False,
    ) -> int:
        """Monotonic save by compare-and-set on the key's revision. With ``owner`` (a save
        under authentication), as the embedded log's consumer store does: a consumer nobody
        owns becomes ``owner``'s in the same write; one another identity owns raises
        ``NotOwner`` unless ``override``."""
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        while True:  # compare-and-set on the revision; a lost race reads again
            key, entry, value = await self._index_entry(client_id, stream, partition)
            stored, had = value if value is not None else (None, None)
            if owner is not None and had is not None and had != owner and not override:
                raise NotOwner((client_id, stream, partition), had, owner)
            claim = owner if owner and had is None else None
            try:
                if entry is None:
                    data = encode_index_value(index, claim)
                    await self._retry("index save", lambda k=key, d=data: self.kv.create(k, d))
                    return index
                assert stored is not None
                if index <= stored and not claim:  # Ockam: a lower index "MUST NOT be changed"
                    return stored
                new = max(index, stored)
                data = encode_index_value(new, had or claim)
                await self._retry(
                    "index save",
                    lambda k=key, e=entry, d=data: self.kv.update(k, d, last=e.revision),
                )
                return new
            except (nats.js.errors.KeyValueError, JetStreamError) as e:
                if not _lost_cas(e):
                    raise

    async def _reset_index(
        self, client_id: str, stream: str, partition: int, index: int | None
    ) -> int | None:
        """An operator's reset (the owner stays) or, with None, the consumer's deletion
        (its owner goes with it: the key is deleted)."""
        if index is not None and index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        while True:
            key, entry, value = await self._index_entry(client_id, stream, partition, True)
            if entry is None:
                if index is None:
                    return None
                try:
                    data = encode_index_value(index)
                    await self._retry("index reset", lambda k=key, d=data: self.kv.create(k, d))
                    return None
                except (nats.js.errors.KeyValueError, JetStreamError) as e:
                    if not _lost_cas(e):
                        raise
                    continue
            # a value that is not an index (written by something else) has no index and no
            # owner: the reset overwrites it and the deletion removes it, by compare-and-set
            # as ever — the one way to repair such a consumer through loglake
            before, had = value if value is not None else (None, None)
            try:
                if index is None:
                    await self._retry(
                        "index delete", lambda k=key, e=entry: self.kv.delete(k, last=e.revision)
                    )
                elif index != before:
                    data = encode_index_value(index, had)
                    await self._retry(
                        "index reset",
                        lambda k=key, e=entry, d=data: self.kv.update(k, d, last=e.revision),
                    )
                return before
            except (nats.js.errors.KeyValueError, JetStreamError) as e:
                if not _lost_cas(e):
                    raise

    # -- maintenance ------------------------------------------------------------------------
    def truncate_before(self, stream: str, index: int, *, partition: int = 0) -> int:
        return self._call(self._truncate(stream, partition, index))

    async def _truncate(self, stream: str, partition: int, index: int) -> int:
        name = await self._check(stream, partition)
        if index <= 0:
            return 0
        si = await self._info(name)
        seq = min(index + 1, si.state.last_seq + 1)  # past the end: indexes go on from there
        if seq <= si.state.first_seq:
            return 0
        req = json.dumps({"seq": seq}).encode()
        resp = await self._retry(
            f"purge {name}", lambda: self.nc.request(PURGE.format(name), req, timeout=5)
        )
        body = json.loads(resp.data)
        if "error" in body:
            raise JetStreamError(f"purge {name}: {body['error']}")
        await self._mark_truncated(stream, partition, seq - 1)
        return int(body.get("purged", 0))

    @staticmethod
    def _truncation_key(stream: str, partition: int) -> str:
        # "t…" never parses as a consumer index key ("c….s….<p>", ``_parse_key``), so the
        # index bucket's listings skip it
        return f"t{_b64(stream)}.{partition}"

    async def _mark_truncated(self, stream: str, partition: int, before: int) -> None:
        """Note in the index bucket that records below ``before`` were dropped on purpose.
        Found from outside: the sealer (another process: ``serve``) reported the checkpoint
        records Cardinal's consumer truncates as "jetstream history lost before sealing", an
        error line at every round. A racing lower mark can only make the sealer report too
        much as lost, never hide a loss."""
        if before <= await self._truncated_before(stream, partition):
            return
        key, data = self._truncation_key(stream, partition), str(before).encode()
        await self._retry("truncation mark", lambda: self.kv.put(key, data))

    def truncated_before(self, stream: str, *, partition: int = 0) -> int:
        """Records below this index were dropped by ``truncate_before`` (0: none were)."""
        return self._call(self._truncated_before(stream, partition))

    async def _truncated_before(self, stream: str, partition: int) -> int:
        entry = await self._kv_get(self._truncation_key(stream, partition))
        value = bytes(entry.value or b"") if entry is not None else b""
        return int(value) if ascii_digits(value.decode("ascii", "replace")) else 0


async def _iter_streams(js: Any) -> Any:
    """Every stream's info, page by page (``$JS.API.STREAM.LIST``)."""
    offset = 0
    while True:
        resp = await js._api_request(
            f"{js._prefix}.STREAM.LIST", json.dumps({"offset": offset}).encode(), timeout=5
        )
        streams = resp.get("streams") or []
        for s in streams:
            yield jsapi.StreamInfo.from_response(s)
        offset += len(streams)
        if not streams or offset >= resp.get("total", 0):
            return


class JetStreamStreams(LocalStreams):
    """The ``Streams`` API on NATS JetStream: ``LocalStreams`` over a ``JetStreamLog``."""

    log: JetStreamLog

    def __init__(self, log: JetStreamLog, default_config: StreamConfig | None = None) -> None:
        super().__init__(log, default_config or StreamConfig(seal_to_lake=False))

    @classmethod
    def connect(cls, url: str, **options: Any) -> JetStreamStreams:
        """``JetStreamStreams.connect("nats://h1:4222,h2:4222", replicas=3)``."""
        return cls(JetStreamLog(url, **options))

    def partitions(self, stream: str) -> int:
        return self.log.partitions(stream)

    def push(self, stream: str, data: bytes, partition: int = 0, msg_id: str | None = None) -> int:
        return self.log.push_many(stream, partition, [data], None if msg_id is None else [msg_id])[
            0
        ]

    def push_many(
        self,
        stream: str,
        datas: Sequence[bytes],
        partition: int = 0,
        msg_ids: Sequence[str] | None = None,
    ) -> list[int]:
        return self.log.push_many(stream, partition, datas, msg_ids)
