"""SDS messages decoded a batch at a time into Arrow columns: what the sds-audit Spark job
reads of each record of a channel's stream (``DECODED_SCHEMA``).

Why here and not in the job: it is SDS's decoding (``sds.codec``'s protobuf, its causal
history read against the previous one), testable without Spark; the job
(``pipeline/jobs/sds_audit.py``) only schedules it in ``mapInArrow`` tasks.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from loglake.wire.arrow_offsets import value_offsets

_decode: Any
try:  # the batch kernel in C (``_decode.c``); where it is not built, ``_scan`` reads the batch
    _decode = importlib.import_module("loglake.sds._decode")
except ImportError:  # pragma: no cover - a build without a C compiler
    _decode = None

_STRING = pa.string()

HISTORY_DICTIONARY = pa.list_(pa.dictionary(pa.int32(), pa.string()))
"""A list of dictionary-encoded ids: the decoder's ``history_stored`` and ``causal_new``, and
``history_dictionary``'s type."""

DECODED_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("index", pa.int64()),
        ("timestamp_ns", pa.int64()),
        ("ok", pa.bool_()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("kind", pa.string()),
        ("message_id", pa.string()),
        ("sender", pa.string()),
        ("lamport", pa.int64()),
        ("history_stored", HISTORY_DICTIONARY),
        ("history_back", pa.int32()),
        ("history_from", pa.int32()),
        ("history_run", pa.int32()),
        ("causal_new", HISTORY_DICTIONARY),
        ("repair_request", pa.list_(pa.string())),
        ("bloom_filter", pa.binary()),
        ("content_bytes", pa.int64()),
    ]
)
"""The causal history of a message is ``history_run`` ids of the history ``history_back``
rows before it in the same batch, from its id ``history_from`` on (none when
``history_run`` is 0), then ``history_stored`` (the other ids, dictionary-encoded: the
decoder's dictionary holds the batch's stored ids in order of first appearance, which a
slice or a filter of the batch does not keep): ``history_lists`` turns a batch's rows back
into lists of ids, without a Python object per id. Why the run: a history mostly repeats its
sender's previous one (a window sliding over the channel), which the decoder compares anyway
(``causal_new``); stored whole, the decode copied and compressed ~13 KB a record that only
the ``messages`` table's writer reads (1M messages of 200-entry histories: ~3 CPU-s of the
decode). Why dictionary-encoded: an id the channel sends is in the stored history of about
one message per sender (~20 copies a batch); as strings each copy was copied out of the
record, compressed into the job's work file and hashed again for Parquet's dictionary
(``history_dictionary``). A reader must rebuild a batch's histories before it filters or
reorders its rows.

``bloom_filter``: null where the record has none, and where it has more bits set than a
filter of the default capacity sets (``DecodeState.max_bloom_bits``): such a filter
acknowledges nothing, as a participant counts it (``loglake.sds.participant``, difference 10).

``causal_new``: the causal-history ids that were not in the previous message of the same
sender read by the same task (all of them for a sender's first message in a task). An id left
out was in an earlier message of that sender, so whatever it shows (an acknowledgement, a
reference) was shown there first: the sweep and the dependency counts read only these, about
``participants`` ids a message instead of 200 when senders take turns. Dictionary-encoded, in
order of first appearance in the batch (``_decode.list_codes``): an id is in the
``causal_new`` of about one message per sender, ~20 copies a batch, and its readers hash each
id once (concatenated batches unify their dictionaries)."""
HISTORY_RUN_COLUMNS = ("history_back", "history_from", "history_run")
"""Where a decoded row's history starts with a run of an earlier row's (``DECODED_SCHEMA``)."""


def decode_batches(
    channel: str, verify_message_ids: bool = True
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: stream records → ``DECODED_SCHEMA`` rows.

    Where the C kernel is built (``_decode.c``), a batch is one walk of its records in C
    (``DecodeState._decode_kernel``); the numpy path below is the fallback where it is not.
    A batch is read a column at a time (``_scan``: every record's fields found by numpy
    rounds over the column's buffers; the history entries identified by Arrow's hash table,
    each distinct entry parsed once by ``parse_entry``); Python per record is a few list
    writes. A record the scan cannot vouch for (unknown or repeated fields, other wire types,
    non-ASCII ids, anything rejected) is read by the per-record path (``parse`` and the
    history read against the previous one, ``DecodeState.history``), the reference the batch
    path is tested equal to. Every entry gets a code (its encoded bytes' identity); the
    batch's histories and ``causal_new`` are ``take``s of the codes' ids, and histories leave
    cut at their runs (``history_stored``). ``verify_message_ids``: as
    ``DecodeState``'s."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from loglake.sds.bloom import BloomFilter

        state = DecodeState(channel, BloomFilter().n_bytes, verify_message_ids=verify_message_ids)
        for batch in batches:
            yield state.decode(batch)

    return run


def _default_max_bloom_bits() -> int:
    """``DecodeState.max_bloom_bits``: the bound of the default filter, the audit's."""
    from loglake.sds.bloom import DEFAULT_CAPACITY, DEFAULT_ERROR_RATE, max_honest_bits

    return max_honest_bits(DEFAULT_CAPACITY, DEFAULT_ERROR_RATE)


def _reason(e: Exception) -> tuple[str, str]:
    from loglake.sds.errors import SdsDecodeError

    assert isinstance(e, SdsDecodeError)
    return str(e.reason.value), e.detail


@dataclass
class _Base:
    """A history read whole, kept to read the next one against: its canonical encoding (each
    entry as ``encode_history_entry`` writes it), where each entry starts in it (and the end),
    and the entries' codes (``DecodeState.ids``)."""

    raw: bytes
    offsets: Any  # np.ndarray[int64], n + 1
    codes: Any  # np.ndarray[int64], n


_ENTRY_TAG = b"\x5a"  # field 11, length-delimited
_MAX_CODES = 400_000


# SdsMessage's fields (sds.proto) as the batch scan reads them
_F_SENDER, _F_MESSAGE_ID, _F_CHANNEL, _F_LAMPORT = 1, 2, 3, 10
_F_HISTORY, _F_BLOOM, _F_REPAIR, _F_CONTENT = 11, 12, 13, 20
_SINGULAR_BYTES = (_F_SENDER, _F_MESSAGE_ID, _F_CHANNEL, _F_BLOOM, _F_CONTENT)
_MAX_FIELD_BYTES = 1 << 31  # a longer length is past any batch: the per-record path says so


@dataclass
class _Rows:
    """What ``DecodeState.decode`` gathers per record before building the batch's columns."""

    n: int
    ok: Any = None
    reason: list[str | None] = field(default_factory=list)
    detail: list[str | None] = field(default_factory=list)
    kind: list[str | None] = field(default_factory=list)
    mid: list[str | None] = field(default_factory=list)
    sender: list[str | None] = field(default_factory=list)
    lamport: list[int | None] = field(default_factory=list)
    blooms: list[bytes | None] = field(default_factory=list)
    cbytes: list[int | None] = field(default_factory=list)
    requests: list[list[str] | None] = field(default_factory=list)
    codes: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        import numpy as np

        n = self.n
        self.ok = np.zeros(n, dtype=bool)
        self.reason, self.detail, self.kind = [None] * n, [None] * n, [None] * n
        self.mid, self.sender, self.lamport = [None] * n, [None] * n, [None] * n
        self.blooms, self.cbytes, self.requests = [None] * n, [None] * n, [None] * n
        self.codes = [np.zeros(0, dtype=np.int64)] * n


@dataclass
class _Scan:
    """Where each field of each record of a batch lies (``_scan``), as numpy arrays over the
    column's value buffer ``data``. ``ok``: the record is made only of ``SdsMessage``'s fields
    with their wire types and single-octet tags (two for content), each singular field at most
    once, every length inside the record; any other record (unknown or repeated fields, other
    wire types, over-long or truncated varints, lengths past the end, an empty record) is left
    to the per-record path. ``entries`` / ``requests``: the causal history / repair request
    entries as (offsets per record, body start, body length)."""

    data: Any
    begin: Any
    end: Any
    ok: Any
    has: dict[int, Any]
    start: dict[int, Any]
    length: dict[int, Any]
    lamport: Any
    entries: tuple[Any, Any, Any]
    requests: tuple[Any, Any, Any]


def _tag_fields() -> Any:
    """First octet of a tag → the ``SdsMessage`` field it opens (0: none the scan takes).
    0xa2 is content's first octet (field 20, two octets: a2 01)."""
    import numpy as np

    table = np.zeros(256, dtype=np.int64)
    for tag, f in ((0x0A, 1), (0x12, 2), (0x1A, 3), (0x50, 10), (0x5A, 11), (0x62, 12)):
        table[tag] = f
    table[0x6A], table[0xA2] = 13, 20
    return table


def _scan(column: pa.Array) -> _Scan | None:
    """The fields of every record of a binary column, one field of every unfinished record per
    round (numpy over the value buffer: no Python object per record or per entry); None for a
    column that is not plain binary without nulls (the per-record path reads it).

    Why rounds: protobuf fields follow one another, so a record's next field is known only once
    the previous one's length is; a round reads the next field of every record at once (a
    history of 200 entries: ~205 rounds a batch). Bounded: every round moves each record past
    at least one octet, and every read is inside the buffer (``decode_uleb_batch``)."""
    import numpy as np

    from loglake.wire.varint import decode_uleb_batch

    n = len(column)
    if column.type != pa.binary() or column.null_count or not n:
        return None
    bufs = column.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int32, count=column.offset + n + 1)[column.offset :]
    # the batch's own bytes (a slice of a larger chunk shares its buffer): positions below are
    # relative to the first record
    lo, hi = int(offs[0]), int(offs[-1])
    data = np.frombuffer(bufs[2], dtype=np.uint8)[lo:hi] if hi > lo else np.zeros(0, np.uint8)
    begin = offs[:-1].astype(np.int64) - lo
    end = offs[1:].astype(np.int64) - lo
    pos = begin.copy()
    ok = begin < end  # an empty record: the per-record path names what it lacks
    twice = np.zeros(n, dtype=bool)
    table = _tag_fields()
    has = {f: np.zeros(n, dtype=bool) for f in (*_SINGULAR_BYTES, _F_LAMPORT)}
    start = {f: np.zeros(n, dtype=np.int64) for f in _SINGULAR_BYTES}
    length = {f: np.zeros(n, dtype=np.int64) for f in _SINGULAR_BYTES}
    lamport = np.zeros(n, dtype=np.uint64)
    runs: dict[int, list[tuple[Any, ...]]] = {_F_HISTORY: [], _F_REPAIR: []}
    count = {_F_HISTORY: np.zeros(n, dtype=np.int64), _F_REPAIR: np.zeros(n, dtype=np.int64)}
    top = len(data) - 1
    rows = np.flatnonzero(ok)
    hist, hist_count = runs[_F_HISTORY], count[_F_HISTORY]
    while len(rows):
        p, e = pos[rows], end[rows]
        t = data[p]
        if t[0] == 0x5A and t[-1] == 0x5A and bool((t == 0x5A).all()):
            # every record at a history entry with a one-octet length (the rounds of a
            # 200-entry history): the general round below, without its masks
            p2 = p + 2
            if int(p2[-1]) <= top + 1 and int(p2.max()) <= top + 1:
                ln = data[p2 - 1].astype(np.int64)
                nxt = p2 + ln
                if int(ln.max()) < 0x80 and bool((nxt <= e).all()):
                    hist.append((rows, hist_count[rows], p2, ln))
                    hist_count[rows] += 1
                    pos[rows] = nxt
                    rows = rows[nxt < e]
                    continue
        f = table[t]
        two = f == _F_CONTENT
        if two.any():
            second = data[np.minimum(p + 1, top)]
            f = np.where(two & ((second != 1) | (p + 1 >= e)), 0, f)
            p1 = p + 1 + two
        else:
            p1 = p + 1
        val, p2, good = decode_uleb_batch(data, p1, e)
        good &= f != 0
        is_len = f != _F_LAMPORT
        over = is_len & (val >= np.uint64(_MAX_FIELD_BYTES))
        ln = np.where(is_len & ~over, val, np.uint64(0)).astype(np.int64)
        nxt = p2 + ln
        good &= ~over & (nxt <= e)
        f0 = int(f[0])
        fields = [f0] if bool((f == f0).all()) else np.unique(f[good]).tolist()
        for num in fields:
            m = good if len(fields) == 1 else good & (f == num)
            r = rows[m]
            if not len(r):
                continue
            if num in runs:
                c = count[num]
                runs[num].append((r, c[r], p2[m], ln[m]))
                c[r] += 1
            elif num:
                h = has[num]
                twice[r] |= h[r]
                h[r] = True
                if num == _F_LAMPORT:
                    lamport[r] = val[m]
                else:
                    start[num][r] = p2[m]
                    length[num][r] = ln[m]
        if not bool(good.all()):
            ok[rows[~good]] = False
            rows, nxt = rows[good], nxt[good]
        pos[rows] = nxt
        rows = rows[nxt < end[rows]]
    ok &= ~twice  # a singular field twice: protobuf keeps the last; the per-record path reads it
    return _Scan(
        data,
        begin,
        end,
        ok,
        has,
        start,
        length,
        lamport,
        _flatten(runs[_F_HISTORY], count[_F_HISTORY], ok),
        _flatten(runs[_F_REPAIR], count[_F_REPAIR], ok),
    )


def _flatten(runs: list[tuple[Any, ...]], count: Any, ok: Any) -> tuple[Any, Any, Any]:
    """A repeated field's occurrences collected round by round → in record order: offsets per
    record (none for a record that is not ``ok``), body start, body length."""
    import numpy as np

    n = len(count)
    offs = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.where(ok, count, 0), out=offs[1:])
    total = int(offs[-1])
    body = np.zeros(total, dtype=np.int64)
    length = np.zeros(total, dtype=np.int64)
    if not runs or not total:
        return offs, body, length
    rows, k, at, ln = (np.concatenate(c) for c in zip(*runs, strict=True))
    keep = ok[rows]
    if not bool(keep.all()):
        rows, k, at, ln = rows[keep], k[keep], at[keep], ln[keep]
    dest = offs[rows] + k
    body[dest] = at
    length[dest] = ln
    return offs, body, length


def _gather(data: Any, start: Any, length: Any) -> pa.Array:
    """The binary array of ``data[start[i] : start[i] + length[i]]`` (short values: ids)."""
    import numpy as np

    n = len(start)
    offs = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(length, out=offs[1:])
    at = np.repeat(start - offs[:-1], length) + np.arange(int(offs[-1]), dtype=np.int64)
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [None, pa.py_buffer(offs.astype(np.int32)), pa.py_buffer(data[at].tobytes())],
    )


def _non_ascii_rows(arr: pa.Array) -> Any:
    """Which values of a binary array (``_gather``'s) hold an octet above 0x7f."""
    import numpy as np

    n = len(arr)
    bufs = arr.buffers()
    values = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else None
    if values is None or not len(values) or int(values.max()) < 0x80:
        return np.zeros(n, dtype=bool)
    offs = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1).astype(np.int64)
    high = np.concatenate(([0], np.cumsum(values >= 0x80)))
    return high[offs[1:]] > high[offs[:-1]]


@dataclass
class DecodeState:
    """What one task remembers between batches: a code per distinct encoded history entry (its
    id, canonical encoding, or the error it raised), each sender's previous message (index,
    entry codes) for ``causal_new``, and histories to read the next ones against (``_Base``).

    Why bases: a causal history mostly repeats the one before it (a participant's log shifted
    by what arrived since). Rather than turning 200 entries into Python objects per message,
    the decoder finds the previous history's tail in the record's bytes (``bytes.find`` and
    one compare, C speed) and parses only what follows it. The result is exactly the
    protobuf's list of entries: the bytes before the tail parse on their own as a message
    with no history entry (so the tail starts on a field boundary), the tail is a run of
    whole canonical entries (built by this class, not read from input), and the bytes after it
    parse on their own (their entries are the new ones); entries in protobuf order are then
    head's (none) + the tail's + the rest's. Any failure falls back to reading every entry."""

    channel: str
    bloom_bytes: int
    code_of: dict[bytes, int] = field(default_factory=dict)
    ids: list[str] = field(default_factory=list)
    encoded: list[bytes] = field(default_factory=list)
    errors: dict[int, Exception] = field(default_factory=dict)
    previous: dict[str, tuple[int, Any]] = field(default_factory=dict)
    bases: dict[str, _Base] = field(default_factory=dict)
    last_base: _Base | None = None
    fast: int = 0  # histories read against a base (for tests and profiling)
    whole: int = 0  # histories read entry by entry
    id_array: pa.Array | None = None
    """``ids`` as an Arrow array, extended as codes are added (rebuilt after ``compact``): each
    batch's histories are a ``take`` from it, and converting every id again per batch cost
    time growing with the task."""
    batched: bool = True
    """Read a batch's records with the C kernel (``_decode_kernel``) where it is built, else
    with ``_scan`` (numpy over the column's buffers), and take the per-record path
    (``_decode_row``) only for the records they cannot vouch for. False: every record through
    ``_decode_row``, the reference the tests hold both batch paths to."""
    kernel: bool = True
    """Use the C kernel when it is built (False: ``_scan``, for the tests and benchmarks that
    compare the two)."""
    senders: dict[bytes, bytes] = field(default_factory=dict)
    """The C kernel's ``causal_new`` state (``previous`` in its own form): sender's UTF-8 →
    its previous message's index and entries' encoded bytes, as ``_decode.causal`` packs
    them."""
    verify_message_ids: bool = True
    """A content message whose id is not its content's SHA-256 is a reject
    (``bad-message-id``), as a participant drops it (``ParticipantOptions.verify_message_ids``,
    the same default; ``loglake.sds.participant``, difference 8). Why: any member can send
    other content under a message's id; taken as that message's first copy, it was the
    message the audit reported, sender and all."""
    max_bloom_bits: int = field(default_factory=_default_max_bloom_bits)
    """A bloom filter with more bits set is read as none (``DECODED_SCHEMA``): the most a
    filter of the default capacity sets (``bloom.max_honest_bits``), the bound a participant
    applies. Why: one sync whose filter had every bit set acknowledged, in the audit, every
    message before it."""

    def _code(self, body: bytes) -> int:
        c = self.code_of.get(body)
        if c is None:
            from loglake.sds.codec import parse_entry
            from loglake.sds.errors import SdsDecodeError
            from loglake.wire.varint import encode_uleb

            c = len(self.ids)
            self.code_of[body] = c
            try:
                self.ids.append(parse_entry(body).message_id)
            except SdsDecodeError as bad:
                self.ids.append("")
                self.errors[c] = bad
            self.encoded.append(_ENTRY_TAG + encode_uleb(len(body)) + body)
        return c

    def _base(self, codes: list[int], tail: _Base | None = None, pos: int = 0, k: int = 0) -> _Base:
        """The base of ``tail``'s entries from entry k (byte pos) on, then ``codes``' entries
        (``tail`` None: those alone). One copy of the kept bytes and arrays filled in place:
        this runs once per message, with a history of ~200 entries and a few new ones."""
        import numpy as np

        enc = self.encoded
        parts = [enc[c] for c in codes]
        if tail is None:
            offsets = np.empty(len(parts) + 1, dtype=np.int64)
            offsets[0] = 0
            lens = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
            np.cumsum(lens, out=offsets[1:])
            return _Base(b"".join(parts), offsets, np.array(codes, dtype=np.int64))
        keep = len(tail.codes) - k
        offsets = np.empty(keep + len(parts) + 1, dtype=np.int64)
        np.subtract(tail.offsets[k:], pos, out=offsets[: keep + 1])
        at = int(offsets[keep])
        for i, part in enumerate(parts, keep + 1):
            at += len(part)
            offsets[i] = at
        out = np.empty(keep + len(parts), dtype=np.int64)
        out[:keep] = tail.codes[k:]
        out[keep:] = codes
        return _Base(b"".join([memoryview(tail.raw)[pos:], *parts]), offsets, out)

    def _against(
        self, base: _Base, data: bytes, first: bytes, n: int
    ) -> tuple[int, int, Any] | None:
        """(pos, k, new entry bodies) when ``data``'s entries are ``base``'s from entry k (at
        byte pos) on, then the new ones; None when that cannot be shown."""
        import numpy as np
        from google.protobuf.message import DecodeError as PbDecodeError

        from loglake.wire.pb import sds_pb2

        c0 = self.code_of.get(first)
        if c0 is None:
            return None
        enc0 = self.encoded[c0]
        pos = base.raw.find(enc0)
        if pos < 0:
            return None
        k = int(np.searchsorted(base.offsets, pos))
        if k >= len(base.codes) or int(base.offsets[k]) != pos:
            return None
        s = data.find(enc0)
        if s < 0 or not data.startswith(memoryview(base.raw)[pos:], s):
            return None
        end = s + len(base.raw) - pos
        view = sds_pb2.SdsMessageRawView
        try:
            if len(view.FromString(data[:s]).causal_history):
                return None
            new = view.FromString(data[end:]).causal_history
        except (PbDecodeError, RuntimeError, ValueError):
            return None
        if len(base.codes) - k + len(new) != n:
            return None
        return pos, k, new

    def history(self, sender: str, data: bytes, hist: Any) -> tuple[Any, Exception | None]:
        """The codes of a record's history entries in order, and the first bad entry's error."""
        import numpy as np

        n = len(hist)
        if not n:
            return np.zeros(0, dtype=np.int64), None
        first = hist[0]
        for base in (self.last_base, self.bases.get(sender)):
            if base is None:
                continue
            found = self._against(base, data, first, n)
            if found is None:
                continue
            pos, k, new = found
            codes = [self._code(b) for b in new]
            err = next((self.errors[c] for c in codes if c in self.errors), None)
            self.fast += 1
            if err is None:
                b = self._base(codes, base, pos, k)
                self.bases[sender] = self.last_base = b
                return b.codes, None
            return np.concatenate((base.codes[k:], np.array(codes, dtype=np.int64))), err
        self.whole += 1
        codes = [self._code(b) for b in hist]
        err = next((self.errors[c] for c in codes if c in self.errors), None)
        if err is None:
            b = self._base(codes)
            self.bases[sender] = self.last_base = b
            return b.codes, None
        return np.array(codes, dtype=np.int64), err

    def compact(self) -> None:
        """Forget the codes no kept history uses (bounded memory over a long task)."""
        import numpy as np

        if len(self.ids) <= _MAX_CODES:
            return
        kept = [c for _, c in self.previous.values()] + [b.codes for b in self.bases.values()]
        if self.last_base is not None:
            kept.append(self.last_base.codes)
        live = np.unique(np.concatenate(kept)) if kept else np.zeros(0, dtype=np.int64)
        remap = np.full(len(self.ids), -1, dtype=np.int64)
        remap[live] = np.arange(len(live), dtype=np.int64)
        live_list = live.tolist()
        self.id_array = None
        self.code_of = {b: int(remap[c]) for b, c in self.code_of.items() if remap[c] >= 0}
        self.ids = [self.ids[c] for c in live_list]
        self.encoded = [self.encoded[c] for c in live_list]
        self.errors = {int(remap[c]): e for c, e in self.errors.items() if remap[c] >= 0}
        self.previous = {s: (i, remap[c]) for s, (i, c) in self.previous.items()}
        seen: dict[int, _Base] = {}
        for s, b in list(self.bases.items()):
            nb = seen.get(id(b))
            if nb is None:
                nb = seen[id(b)] = _Base(b.raw, b.offsets, remap[b.codes])
            self.bases[s] = nb
        if self.last_base is not None:
            lb = self.last_base
            self.last_base = seen.get(id(lb)) or _Base(lb.raw, lb.offsets, remap[lb.codes])

    def _decode_row(self, r: int, data: bytes | None, rows: _Rows) -> None:
        """Record ``r`` the way a participant reads it (``codec.parse``, then ``parse_entry``
        per entry through ``history``): the reference, and the batch path's fallback."""
        from loglake.sds.bloom import bits_set
        from loglake.sds.codec import parse, parse_entry
        from loglake.sds.errors import DropReason, SdsDecodeError
        from loglake.sds.messages import message_id_of

        try:
            if data is None:
                raise SdsDecodeError(DropReason.MALFORMED, "no data")
            pb = parse(data)
            if pb.channel_id != self.channel:
                raise SdsDecodeError(DropReason.WRONG_CHANNEL, f"channel {pb.channel_id!r}")
            bloom = pb.bloom_filter if pb.HasField("bloom_filter") else None
            if bloom is not None and len(bloom) != self.bloom_bytes:
                raise SdsDecodeError(
                    DropReason.BAD_BLOOM_FILTER, f"bloom filter of {len(bloom)} bytes"
                )
            # a bad entry rejects its message (the first bad one in order names the
            # reason), then a bad repair request; those are never a sender's previous one
            codes, bad = self.history(pb.sender_id, data, pb.causal_history)
            rows.codes[r] = codes
            if bad is not None:
                raise bad
            reqs = [parse_entry(b).message_id for b in pb.repair_request]
            has_lamport = pb.HasField("lamport_timestamp")
            content = pb.content
            if (
                self.verify_message_ids
                and has_lamport
                and content
                and pb.message_id != message_id_of(content)
            ):  # the participant's check and words (receive)
                raise SdsDecodeError(
                    DropReason.BAD_MESSAGE_ID, "message_id is not the SHA-256 of the content"
                )
        except SdsDecodeError as e:
            rows.reason[r], rows.detail[r] = _reason(e)
            return
        rows.ok[r] = True
        rows.kind[r] = ("content" if content else "sync") if has_lamport else "ephemeral"
        rows.mid[r] = pb.message_id
        rows.sender[r] = pb.sender_id
        rows.lamport[r] = pb.lamport_timestamp if has_lamport else None
        over = bloom is not None and bits_set(bloom) > self.max_bloom_bits
        rows.blooms[r] = None if over else bloom
        rows.cbytes[r] = len(content)
        rows.requests[r] = reqs

    def _decode_scanned(self, column: pa.Array, scan: _Scan, rows: _Rows) -> None:
        """The batch path: ``scan``'s fields checked a column at a time (what ``codec.parse``
        and this class's ``_decode_row`` check, for records whose ids are ASCII: the same
        verdicts), then per record only its history's codes (``_scanned_codes``) and repair
        requests. A record failing any check goes through ``_decode_row``, which names the
        reason exactly as a participant would."""
        import numpy as np
        import pyarrow.compute as pc

        from loglake.sds.codec import DEFAULT_LIMITS as lim
        from loglake.sds.codec import parse_entry
        from loglake.sds.errors import SdsDecodeError
        from loglake.sds.messages import message_id_of

        n = len(column)
        data = scan.data
        length, start, has = scan.length, scan.start, scan.has
        ok = scan.ok.copy()
        sizes = scan.end - scan.begin
        ok &= sizes <= lim.max_message_bytes
        ids = {}
        for f in (_F_SENDER, _F_MESSAGE_ID, _F_CHANNEL):
            ln = np.where(ok, length[f], 0)
            ok &= ln <= lim.max_id_chars
            ids[f] = _gather(data, start[f], np.where(ok, ln, 0))
        # ASCII ids only: then protobuf's UTF-8 check passes and characters are bytes; any
        # other byte sends the record to the per-record path, which checks it as protobuf does
        wide = np.zeros(n, dtype=bool)
        for arr in ids.values():
            wide |= _non_ascii_rows(arr)
        ok &= ~wide
        ok &= (length[_F_MESSAGE_ID] > 0) & (length[_F_SENDER] > 0)
        same = pc.equal(ids[_F_CHANNEL], pa.scalar(self.channel.encode(), pa.binary()))
        ok &= np.asarray(same.fill_null(False))
        content = length[_F_CONTENT]
        ok &= content <= lim.max_content_bytes
        ok &= np.diff(scan.entries[0]) <= lim.max_causal_history
        ok &= np.diff(scan.requests[0]) <= lim.max_repair_request
        ok &= has[_F_LAMPORT] | (content > 0)
        ok &= ~has[_F_BLOOM] | (length[_F_BLOOM] == self.bloom_bytes)
        ok &= scan.lamport < np.uint64(1 << 63)
        # over-full bloom filters (read as none): the bits of every filter at once, from one
        # count per octet of the batch summed over each filter's span
        bloom_rows = np.flatnonzero(ok & has[_F_BLOOM])
        over_full = np.zeros(n, dtype=bool)
        if len(bloom_rows):
            at = start[_F_BLOOM][bloom_rows]
            bounds = np.empty(2 * len(at), dtype=np.int64)
            bounds[0::2], bounds[1::2] = at, at + self.bloom_bytes
            counts = np.append(np.bitwise_count(data), np.uint8(0))  # room for an end bound
            sums = np.add.reduceat(counts, bounds, dtype=np.int64)[0::2]
            over_full[bloom_rows] = sums > self.max_bloom_bits

        raw = memoryview(data)  # bytes are copied out only where a record needs them
        codes = self._entry_codes(scan)
        eoffs = scan.entries[0]
        if self.errors and len(codes):
            # a record with a bad entry goes through ``_decode_row``, which names the first
            bad = np.isin(codes, np.fromiter(self.errors, dtype=np.int64))
            if bool(bad.any()):
                seen = np.concatenate(([0], np.cumsum(bad)))
                ok &= seen[eoffs[1:]] == seen[eoffs[:-1]]
        mids = ids[_F_MESSAGE_ID].to_pylist()
        senders = ids[_F_SENDER].to_pylist()
        lamports = scan.lamport.tolist()
        has_lamport = has[_F_LAMPORT].tolist()
        has_bloom = has[_F_BLOOM].tolist()
        cbytes = content.tolist()
        eo = eoffs.tolist()
        roffs, rbody, rlen = scan.requests[0].tolist(), scan.requests[1], scan.requests[2]
        begin, end = scan.begin.tolist(), scan.end.tolist()
        over = over_full.tolist()
        verify = self.verify_message_ids
        content_at = start[_F_CONTENT].tolist()
        for r, good in enumerate(ok.tolist()):
            c = cbytes[r]
            if good and verify and c and has_lamport[r]:
                # a content message whose id is not its content's hash: the per-record path
                # names it (one hash a message: this path runs where the C kernel is not built)
                at = content_at[r]
                good = mids[r] == message_id_of(raw[at : at + c]).encode()
            if not good:
                self._decode_row(r, raw[begin[r] : end[r]].tobytes(), rows)
                continue
            reqs: list[str] = []
            try:
                for j in range(roffs[r], roffs[r + 1]):
                    at = int(rbody[j])
                    reqs.append(parse_entry(raw[at : at + int(rlen[j])].tobytes()).message_id)
            except SdsDecodeError:  # named by the per-record path
                self._decode_row(r, raw[begin[r] : end[r]].tobytes(), rows)
                continue
            rows.codes[r] = codes[eo[r] : eo[r + 1]]
            rows.ok[r] = True
            rows.kind[r] = ("content" if c else "sync") if has_lamport[r] else "ephemeral"
            rows.mid[r] = mids[r].decode()
            rows.sender[r] = senders[r].decode()
            rows.lamport[r] = lamports[r] if has_lamport[r] else None
            if has_bloom[r] and not over[r]:
                at = int(start[_F_BLOOM][r])
                rows.blooms[r] = raw[at : at + self.bloom_bytes].tobytes()
            rows.cbytes[r] = c
            rows.requests[r] = reqs

    def _entry_codes(self, scan: _Scan) -> Any:
        """The code of every history entry ``scan`` found, in order, each distinct body looked
        up (and, new, parsed by ``_code``) once. How, without a Python object per entry: the
        column's buffer read as an Arrow binary array whose values alternate between the
        bytes before an entry's body and the body, and ``dictionary_encode``d (Arrow's hash
        table); only the distinct bodies become Python ``bytes``."""
        import numpy as np
        import pyarrow.compute as pc

        _, body, blen = scan.entries
        m = len(body)
        if not m:
            return np.zeros(0, dtype=np.int64)
        bounds = np.empty(2 * m + 2, dtype=np.int64)
        bounds[0] = 0
        bounds[1:-1:2] = body
        bounds[2:-1:2] = body + blen
        bounds[-1] = len(scan.data)
        values = pa.Array.from_buffers(
            pa.large_binary(), 2 * m + 1, [None, pa.py_buffer(bounds), pa.py_buffer(scan.data)]
        )
        encoded = pc.dictionary_encode(values)
        local = np.asarray(encoded.indices)[1::2]
        used = np.zeros(len(encoded.dictionary), dtype=bool)
        used[local] = True
        which = np.flatnonzero(used)
        bodies = encoded.dictionary.take(pa.array(which)).to_pylist()
        code_of = np.zeros(len(used), dtype=np.int64)
        code_of[which] = [self._code(b) for b in bodies]
        return code_of[local]

    def decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        import numpy as np

        self.compact()
        if self.batched and self.kernel and _decode is not None:
            return self._decode_kernel(batch)
        n = batch.num_rows
        idxs = batch.column("index").to_pylist()
        rows = _Rows(n)
        column = batch.column("data")
        scan = _scan(column) if self.batched else None
        if scan is None:
            for r, data in enumerate(column.to_pylist()):
                self._decode_row(r, data, rows)
        else:
            self._decode_scanned(column, scan, rows)
        ok, reason, detail, kind, mid, sender = (
            rows.ok,
            rows.reason,
            rows.detail,
            rows.kind,
            rows.mid,
            rows.sender,
        )
        lamport, blooms, cbytes, requests, row_codes = (
            rows.lamport,
            rows.blooms,
            rows.cbytes,
            rows.requests,
            rows.codes,
        )
        empty = np.zeros(0, dtype=np.int64)

        counts = np.fromiter((len(c) for c in row_codes), dtype=np.int64, count=n)
        codes = np.concatenate(row_codes) if n else empty
        total = len(codes)
        ends = np.cumsum(counts)
        starts = ends - counts
        row_of = np.repeat(np.arange(n, dtype=np.int64), counts)

        # causal_new: the entries not in the previous message of the same sender read by this
        # task (by encoded entry, i.e. by code)
        prev_row = np.full(n, -1, dtype=np.int64)
        carried: list[Any] = []
        last: dict[str, int] = {}
        for r in np.flatnonzero(ok).tolist():
            s = sender[r]
            assert s is not None
            p = last.get(s)
            if p is not None:
                if idxs[p] < idxs[r]:
                    prev_row[r] = p
            else:
                before = self.previous.get(s)
                if before is not None and before[0] < idxs[r]:
                    prev_row[r] = n + len(carried)
                    carried.append(before[1])
            last[s] = r
        new = np.ones(total, dtype=bool)
        if total:
            # a mark per code: the previous message's codes marked with a token, then the
            # row's codes not carrying it are new
            mark = np.full(len(self.ids), -1, dtype=np.int64)
            for r in np.flatnonzero(prev_row >= 0).tolist():
                p = int(prev_row[r])
                prev = codes[starts[p] : ends[p]] if p < n else carried[p - n]
                mark[prev] = r
                new[starts[r] : ends[r]] = mark[codes[starts[r] : ends[r]]] != r
        for s, r in last.items():
            if len(self.previous) > 100_000:
                self.previous.clear()
            self.previous[s] = (idxs[r], codes[starts[r] : ends[r]].copy())

        # a lamport over 2^63 - 1 is rejected last (it still was the sender's previous message)
        for r in np.flatnonzero(ok).tolist():
            lam = lamport[r]
            if lam is not None and lam >= 1 << 63:
                ok[r] = False
                reason[r], detail[r] = "oversized", "lamport_timestamp over 2^63 - 1"
        for r in np.flatnonzero(~ok).tolist():
            kind[r] = mid[r] = sender[r] = lamport[r] = blooms[r] = cbytes[r] = requests[r] = None

        built = 0 if self.id_array is None else len(self.id_array)
        if built < len(self.ids):
            more = pa.array(self.ids[built:], pa.string())
            self.id_array = (
                more if self.id_array is None else pa.concat_arrays([self.id_array, more])
            )
        id_arr = self.id_array if self.id_array is not None else pa.array([], pa.string())
        keep = ok[row_of]

        def lists(elems: Any) -> pa.ListArray:
            per_row = np.bincount(row_of[elems], minlength=n)
            offsets = np.concatenate([[0], np.cumsum(per_row)]).astype(np.int32)
            values = id_arr.take(pa.array(codes[elems])) if total else pa.array([], pa.string())
            return pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(~ok))

        history = dictionary_reference(lists(keep))
        causal_new = dictionary_reference(lists(keep & new))
        return pa.RecordBatch.from_arrays(
            [
                batch.column("partition"),
                batch.column("index"),
                batch.column("timestamp_ns"),
                pa.array(ok, pa.bool_()),
                pa.array(reason, pa.string()),
                pa.array(detail, pa.string()),
                pa.array(kind, pa.string()),
                pa.array(mid, pa.string()),
                pa.array(sender, pa.string()),
                pa.array(lamport, pa.int64()),
                history,
                *_stored_whole(n),
                causal_new,
                pa.array(requests, pa.list_(pa.string())),
                pa.array(blooms, pa.binary()),
                pa.array(cbytes, pa.int64()),
            ],
            schema=DECODED_SCHEMA,
        )

    def _decode_kernel(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch read by the C kernel: ``_decode.scan`` walks every record's protobuf and
        vouches for it or flags it (module docstring of ``_decode.c``: what it vouches for);
        a flagged record goes through ``_decode_row``, the reference, and what it read is
        appended to ``extra`` (positions past ``data``'s end address it). ``_decode.causal``
        then marks the entries not in the sender's previous message (by their encoded bytes,
        compared exactly), and the columns are ``_decode.gather``s of spans: no Python object
        per record or per entry, except for the flagged records."""
        import numpy as np

        from loglake.sds.codec import DEFAULT_LIMITS as lim

        assert _decode is not None
        n = batch.num_rows
        given = batch.column("data")
        column = given if given.type == pa.binary() else given.cast(pa.binary())
        if column.null_count:  # a null record is empty to the kernel: flagged
            column = column.fill_null(b"")
        bufs = column.buffers()
        if n and bufs[1] is not None:
            offs = np.frombuffer(bufs[1], dtype=np.int32, count=column.offset + n + 1)
            offs = offs[column.offset :].astype(np.int64)
        else:
            offs = np.zeros(n + 1, dtype=np.int64)
        data = bufs[2] if n and bufs[2] is not None else pa.py_buffer(b"")
        rec = np.zeros((n, _decode.R_FIELDS), dtype=np.int64)
        limits = (
            lim.max_message_bytes,
            lim.max_id_chars,
            lim.max_hint_bytes,
            lim.max_content_bytes,
            lim.max_causal_history,
            lim.max_repair_request,
        )
        ents_b, reqs_b = _decode.scan(
            offs,
            data,
            self.channel.encode(),
            self.bloom_bytes,
            limits,
            rec,
            pa.allocate_buffer,
            self.verify_message_ids,
            self.max_bloom_bits,
        )
        ents = np.frombuffer(ents_b, dtype=np.int64).reshape(-1, 4)
        reqs = np.frombuffer(reqs_b, dtype=np.int64).reshape(-1, 2)
        hist_end = np.zeros(n + 1, dtype=np.int64)
        hist_end[1:] = rec[:, _R_HIST_END]
        req_end = np.zeros(n + 1, dtype=np.int64)
        req_end[1:] = rec[:, _R_REQ_END]
        ok = rec[:, _R_FLAG] == 0
        late = np.zeros(n, dtype=bool)  # read, then rejected: lamport over 2^63 - 1
        reason: list[str | None] | None = None
        detail: list[str | None] | None = None
        extra = bytearray()
        flagged = np.flatnonzero(~ok).tolist()
        if flagged:
            rows = _Rows(n)
            base = data.size
            more_e: list[tuple[int, list[tuple[int, int, int, int]]]] = []
            more_r: list[tuple[int, list[tuple[int, int]]]] = []

            def put(b: bytes) -> tuple[int, int]:
                at = base + len(extra)
                extra.extend(b)
                return at, len(b)

            values = given.to_pylist() if given.null_count else None
            for r in flagged:
                raw = values[r] if values is not None else None
                if values is None:
                    raw = data[int(offs[r]) : int(offs[r + 1])].to_pybytes()
                self._decode_row(r, raw, rows)
                if not rows.ok[r]:
                    continue
                ok[r] = True
                row = rec[r]
                row[_R_SENDER_AT], row[_R_SENDER_LEN] = put(str(rows.sender[r]).encode())
                row[_R_MID_AT], row[_R_MID_LEN] = put(str(rows.mid[r]).encode())
                lam = rows.lamport[r]
                row[_R_HAS_LAMPORT] = lam is not None
                if lam is not None and lam >= 1 << 63:
                    late[r] = True
                else:
                    row[_R_LAMPORT] = lam or 0
                bloom = rows.blooms[r]
                row[_R_BLOOM_AT] = put(bloom)[0] if bloom is not None else -1
                row[_R_CONTENT_LEN] = rows.cbytes[r] or 0
                es = []
                for c in rows.codes[r].tolist():
                    enc = self.encoded[c]
                    es.append((*put(_entry_body(enc)), *put(self.ids[c].encode())))
                more_e.append((r, es))
                more_r.append((r, [put(q.encode()) for q in rows.requests[r] or []]))
            ents, hist_end = _insert(ents, hist_end, more_e, 4)
            reqs, req_end = _insert(reqs, req_end, more_r, 2)
            reason, detail = rows.reason, rows.detail
        xbuf = bytes(extra)
        index = np.ascontiguousarray(batch.column("index").to_numpy(), dtype=np.int64)
        sender = np.ascontiguousarray(rec[:, [_R_SENDER_AT, _R_SENDER_LEN]])
        runs = np.empty((n, 3), dtype=np.int32)  # history_back, history_from, history_run
        new = _decode.causal(
            self.senders,
            data,
            xbuf,
            ok.astype(np.uint8),
            sender,
            index,
            hist_end,
            np.ascontiguousarray(ents),
            runs,
            np.ascontiguousarray(rec[:, [_R_RUN_ROW, _R_RUN_FROM, _R_RUN]]),
        )
        if late.any():
            ok &= ~late
            assert reason is not None and detail is not None
            for r in np.flatnonzero(late).tolist():
                reason[r], detail[r] = "oversized", "lamport_timestamp over 2^63 - 1"
            # a rejected row has no history, so none starts with its run or with its own
            runs[~ok | ~ok[np.arange(n) - runs[:, 0]]] = 0

        def strings(at: Any, ln: Any, valid: Any, typ: pa.DataType = _STRING) -> pa.Array:
            ln = np.where(valid, ln, 0)
            at = np.where(valid, at, 0)
            offsets = np.zeros(len(ln) + 1, dtype=np.int64)
            np.cumsum(ln, out=offsets[1:])
            return pa.Array.from_buffers(
                typ,
                len(ln),
                [
                    _validity(valid),
                    pa.py_buffer(offsets.astype(np.int32)),
                    pa.py_buffer(_decode.gather(data, xbuf, at, ln)),
                ],
            )

        def lists(spans: Any, ends: Any) -> pa.ListArray:
            """The ids of ``spans`` (rows of int64 whose last two are an id's at and len),
            each row's from ``ends``, as list<string> (null where the row is not ok)."""
            values, voffs, loffs, lens = _decode.lists(
                data, xbuf, spans, spans.shape[1], ends, ok8, b"", pa.allocate_buffer
            )
            strs = pa.Array.from_buffers(
                pa.string(), len(lens) // 4, [None, pa.py_buffer(voffs), pa.py_buffer(values)]
            )
            offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(loffs)])
            return pa.ListArray.from_arrays(offsets, strs, mask=mask)

        def coded(spans: Any, ends: Any, keep: bytes, skip: Any = b"") -> pa.ListArray:
            """``lists`` of ``keep``'s entries, dictionary-encoded (``_decode.list_codes``)."""
            values, voffs, codes, loffs, distinct, _ = _decode.list_codes(
                data, xbuf, spans, spans.shape[1], ends, ok8, keep, pa.allocate_buffer, skip
            )
            ids = pa.Array.from_buffers(
                pa.string(), distinct, [None, pa.py_buffer(voffs), pa.py_buffer(values)]
            )
            at = pa.Array.from_buffers(pa.int32(), len(codes) // 4, [None, pa.py_buffer(codes)])
            offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(loffs)])
            items = pa.DictionaryArray.from_arrays(at, ids)
            return pa.ListArray.from_arrays(offsets, items, mask=mask)

        ok8 = ok.astype(np.uint8)
        mask = pa.array(~ok)
        has_bloom = ok & (rec[:, _R_BLOOM_AT] >= 0)
        clen = rec[:, _R_CONTENT_LEN]
        has_lamport = rec[:, _R_HAS_LAMPORT] != 0
        kinds = np.where(has_lamport, np.where(clen > 0, 0, 1), 2)
        kind = pa.array(["content", "sync", "ephemeral"]).take(pa.array(kinds, mask=~ok))
        return pa.RecordBatch.from_arrays(
            [
                batch.column("partition"),
                batch.column("index"),
                batch.column("timestamp_ns"),
                pa.array(ok, pa.bool_()),
                pa.array(reason, pa.string()) if reason else pa.nulls(n, pa.string()),
                pa.array(detail, pa.string()) if detail else pa.nulls(n, pa.string()),
                kind,
                strings(rec[:, _R_MID_AT], rec[:, _R_MID_LEN], ok),
                strings(rec[:, _R_SENDER_AT], rec[:, _R_SENDER_LEN], ok),
                pa.array(rec[:, _R_LAMPORT], pa.int64(), mask=~(ok & has_lamport)),
                # what history_stored stores: each row's entries past its run
                coded(ents, hist_end, b"", np.ascontiguousarray(runs[:, 2])),
                *(pa.array(runs[:, i]) for i in range(3)),
                coded(ents, hist_end, new),
                lists(reqs, req_end),
                strings(
                    rec[:, _R_BLOOM_AT],
                    np.full(n, self.bloom_bytes, dtype=np.int64),
                    has_bloom,
                    pa.binary(),
                ),
                pa.array(np.maximum(clen, 0), pa.int64(), mask=~ok),
            ],
            schema=DECODED_SCHEMA,
        )


# ``_decode.scan``'s per-record columns (the enum at the top of ``_decode.c``)
(
    _R_FLAG,
    _R_SENDER_AT,
    _R_SENDER_LEN,
    _R_MID_AT,
    _R_MID_LEN,
    _R_LAMPORT,
    _R_HAS_LAMPORT,
    _R_BLOOM_AT,
    _R_CONTENT_LEN,
    _R_HIST_END,
    _R_REQ_END,
    _R_RUN,
    _R_RUN_ROW,
    _R_RUN_FROM,
) = range(14)


def _entry_body(encoded: bytes) -> bytes:
    """An entry's body from its encoding (tag, varint length, body)."""
    at = 1
    while encoded[at] & 0x80:
        at += 1
    return encoded[at + 1 :]


def _stored_whole(n: int) -> list[pa.Array]:
    """``history_back``, ``history_from`` and ``history_run`` of ``n`` rows whose histories
    are stored whole (no run)."""
    import numpy as np

    zeros = pa.array(np.zeros(n, dtype=np.int32))
    return [zeros, zeros, zeros]


def _validity(valid: Any) -> pa.Buffer | None:
    """An Arrow validity bitmap of a numpy bool array (None: every value valid)."""
    import numpy as np

    if bool(np.all(valid)):
        return None
    return pa.array(valid, pa.bool_()).buffers()[1]


def _insert(spans: Any, ends: Any, more: list[tuple[int, list[Any]]], width: int) -> Any:
    """``spans`` (rows of ``width`` int64, each record's from ``ends``) with ``more``'s rows
    added at the end of their records' (which hold none): the records the reference path
    read."""
    import numpy as np

    at = [int(ends[r + 1]) for r, rs in more for _ in rs]
    vals = np.array([v for _, rs in more for v in rs], dtype=np.int64).reshape(-1, width)
    counts = np.zeros(len(ends) - 1, dtype=np.int64)
    for r, rs in more:
        counts[r] = len(rs)
    out = np.insert(spans, np.array(at, dtype=np.int64), vals, axis=0) if len(at) else spans
    return out, ends + np.concatenate(([0], np.cumsum(counts)))


@dataclass
class _Stored:
    """A batch's ``history_stored`` as the kernels read it: each row's own codes one after
    another (a null row has none, whatever it spans), their offsets, each row's validity (one
    octet a row) and the dictionary."""

    codes: Any  # np.ndarray[int32]
    offsets: Any  # np.ndarray[int32], n + 1
    valid: Any  # np.ndarray[uint8]
    ids: pa.Array


def _stored_codes(col: pa.ListArray) -> _Stored:
    """``history_stored`` (``HISTORY_DICTIONARY``, any slice of it) as ``_Stored``; TypeError
    for another type."""
    import numpy as np

    items = col.type.value_type
    if not (pa.types.is_dictionary(items) and items.value_type == _STRING):
        raise TypeError(f"history_stored of {col.type}: {HISTORY_DICTIONARY} expected")
    n = len(col)
    own = np.asarray(value_offsets(col), dtype=np.int64)
    valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=np.uint8)
    lens = np.where(valid != 0, np.diff(own), 0)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise OverflowError("history_stored: a batch's entries over 2^31")
    items = col.values
    if not n or offsets[-1] == own[-1] - own[0]:  # no null row spans values: a slice
        own_codes = items.indices.slice(int(own[0]), int(offsets[-1]))
    else:
        own_codes = items.indices.take(
            pa.array(value_indices(own[:-1][valid != 0], own[1:][valid != 0]))
        )
    codes = np.ascontiguousarray(own_codes.to_numpy(), dtype=np.int32)
    return _Stored(codes, offsets.astype(np.int32), valid, items.dictionary)


def _stored_and_runs(rows: pa.RecordBatch) -> tuple[_Stored, list[Any] | None]:
    """A batch's stored ids (``_Stored``) and its ``HISTORY_RUN_COLUMNS`` (int32 arrays), the
    readers' common start; None for the runs when the batch has none (its stored lists are
    its histories). ValueError for a run of no length."""
    import numpy as np

    stored = _stored_codes(rows.column("history_stored"))
    runs = [
        np.asarray(rows.column(c).fill_null(0).to_numpy(), dtype=np.int32)
        for c in HISTORY_RUN_COLUMNS
    ]
    if runs[2].any():
        return stored, runs
    if runs[0].any() or runs[1].any():
        raise ValueError("a history run of no length")
    return stored, None


def history_lists(rows: pa.RecordBatch) -> pa.ListArray:
    """The causal histories of a batch of ``DECODED_SCHEMA`` rows (as the decoder wrote it,
    or a slice of one whose runs' bases are in it) as list<string>, with no Python object per
    id: the stored ids (a take of ``history_stored``'s dictionary), each row's run put in
    front of its own (``_decode.unpack``; ``unpacked_reference`` without the C kernel).
    ValueError when a run has no base in the batch."""
    st, runs = _stored_and_runs(rows)
    strs = st.ids.take(pa.array(st.codes))
    mask = pa.array(st.valid == 0)
    if runs is None or _decode is None:
        stored = pa.ListArray.from_arrays(pa.array(st.offsets), strs, mask=mask)
        return stored if runs is None else unpacked_reference(stored, *runs)
    values, voffs, loffs = _decode.unpack(
        value_offsets(strs),
        strs.buffers()[2] or pa.py_buffer(b""),
        st.offsets,
        st.valid,
        *runs,
        pa.allocate_buffer,
    )
    k = len(voffs) // 4 - 1
    ids = pa.Array.from_buffers(pa.string(), k, [None, voffs, values])
    offsets = pa.Array.from_buffers(pa.int32(), len(st.valid) + 1, [None, loffs])
    return pa.ListArray.from_arrays(offsets, ids, mask=mask)


def history_dictionary(rows: pa.RecordBatch) -> pa.ListArray:
    """``history_lists`` as list<dictionary<int32, string>>, its dictionary the batch's
    distinct ids in order of first appearance, row by row: the dictionary Parquet's writer
    builds for the column, so a ``ParquetWriter`` given this writes the bytes it writes from
    ``history_lists`` (a row group of the batch). Why: the writer hashed every entry (200 a
    row) to build it, and ``history_lists`` copied every id out (13 KB a row); here no id is
    hashed: the stored ids' codes are the decoder's (``history_stored``, put in order of
    first appearance where a slice or a filter left them out of it, ``_first_appearance``)
    and each entry is an int32 code, a run's copied from its base (``_decode.unpack_codes``).
    A run repeats entries of earlier rows only, so the stored ids' order of first appearance
    is the histories' own. Without the C kernel, or for a dictionary that repeats an id:
    ``history_lists`` dictionary-encoded (the reference it is tested equal to). ValueError as
    ``history_lists``."""
    import pyarrow.compute as pc

    if _decode is None:
        return dictionary_reference(history_lists(rows))
    st, runs = _stored_and_runs(rows)
    if pc.count_distinct(st.ids).as_py() < len(st.ids):  # not the decoder's: hash them
        return dictionary_reference(history_lists(rows))
    codes, ids = _first_appearance(st.codes, st.ids)
    mask = pa.array(st.valid == 0)
    offsets = pa.array(st.offsets)
    if runs is not None:
        entries, loffs = _decode.unpack_codes(
            st.offsets, st.valid, *runs, codes, len(ids), pa.allocate_buffer
        )
        codes = pa.Array.from_buffers(pa.int32(), len(entries) // 4, [None, entries])
        offsets = pa.Array.from_buffers(pa.int32(), len(st.valid) + 1, [None, loffs])
    values = pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), ids)
    return pa.ListArray.from_arrays(offsets, values, mask=mask)


def _first_appearance(codes: Any, ids: pa.Array) -> tuple[Any, pa.Array]:
    """``codes`` into ``ids`` recoded so that the dictionary holds only the ids used, in order
    of first appearance (as they are when they already are: the decoder's batches)."""
    import numpy as np

    n, m = len(ids), len(codes)
    if m and (int(codes.min()) < 0 or int(codes.max()) >= n):
        raise ValueError("history_stored: a code outside its dictionary")
    first = np.full(n, m, dtype=np.int64)
    np.minimum.at(first, codes, np.arange(m, dtype=np.int64))
    if bool((first < m).all()) and bool((first[1:] > first[:-1]).all()):
        return codes, ids
    used = np.flatnonzero(first < m)
    order = used[np.argsort(first[used], kind="stable")]
    remap = np.full(n, -1, dtype=np.int32)
    remap[order] = np.arange(len(order), dtype=np.int32)
    return remap[codes], ids.take(pa.array(order))


def dictionary_reference(lists: pa.ListArray) -> pa.ListArray:
    """``lists`` (list<string>) as ``HISTORY_DICTIONARY``: every value hashed
    (``dictionary_encode``, first appearance first), as Parquet's writer does."""
    import numpy as np
    import pyarrow.compute as pc

    # the rows' own values (a null row may span some, which the writer never sees), each
    # row's offsets counted from its length (0 for a null row)
    lens = np.asarray(pc.fill_null(pc.list_value_length(lists), 0).to_numpy(), dtype=np.int64)
    offsets = np.zeros(len(lists) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    return pa.ListArray.from_arrays(
        pa.array(offsets), lists.flatten().dictionary_encode(), mask=lists.is_null()
    )


def unpacked_reference(stored: pa.ListArray, back: Any, start: Any, run: Any) -> pa.ListArray:
    """``history_lists`` from the stored ids (list<string>) and the runs, one Python list per
    row: the reference ``_decode.unpack`` is tested equal to."""
    out: list[list[str] | None] = []
    for r, ids in enumerate(stored.to_pylist()):
        b, f, k = int(back[r]), int(start[r]), int(run[r])
        if k < 0 or b < 0 or f < 0 or (not k and (b or f)):
            raise ValueError("a history run out of range")
        if k:
            base = out[r - b] if 0 < b <= r else None
            if ids is None or base is None or f + k > len(base):
                raise ValueError("a history run without a valid earlier base")
            ids = base[f : f + k] + ids
        out.append(ids)
    return pa.array(out, pa.list_(pa.string()))


class IdIndex:
    """Where ids lie among a set of ids (``ids``, a string array: its positions), what
    ``pyarrow.compute.index_in(values, value_set=ids)`` gives (-1 for none), with the set's
    hash table built once and kept (``_decode.id_table``): the sds-audit sweep looks up each
    decoded file's kept ``causal_new`` ids against the ~1M content ids, in place in the file's
    column (``index_in`` needed them taken out first, a copy of every kept id, and one table
    for all of them). Without the C kernel, or for values with nulls, ``index_in`` of the ids
    taken: the reference the kernel is tested equal to."""

    def __init__(self, ids: pa.Array) -> None:
        import numpy as np

        self.ids = ids
        self._slots = None
        if _decode is not None and ids.null_count == 0 and len(ids) < 2**30:
            self._offs = value_offsets(ids)
            self._data = ids.buffers()[2] or pa.py_buffer(b"")
            m = 1 << max(1, int(2 * len(ids)).bit_length())
            self._slots = np.empty(m, dtype=np.int32)
            _decode.id_table(self._offs, self._data, self._slots)

    def positions(self, parts: list[tuple[pa.Array, Any, Any]]) -> Any:
        """The positions (int64, -1 for none) of ``values[starts[i]:ends[i]]`` for each i of
        each (values, starts, ends) of ``parts`` in turn, one after another."""
        import numpy as np

        if self._slots is None or any(v.null_count or v.type != pa.string() for v, _, _ in parts):
            return self.reference(parts)
        given = [
            (
                value_offsets(values),
                values.buffers()[2] or pa.py_buffer(b""),
                np.ascontiguousarray(starts, dtype=np.int64),
                np.ascontiguousarray(ends, dtype=np.int64),
            )
            for values, starts, ends in parts
        ]
        out = np.empty(sum(int((e - s).sum()) for _, _, s, e in given), dtype=np.int64)
        _decode.id_lookup(self._slots, self._offs, self._data, given, out)
        return out

    def reference(self, parts: list[tuple[pa.Array, Any, Any]]) -> Any:
        """``positions`` by one ``index_in`` of the values taken (what the kernel is tested
        equal to)."""
        import numpy as np
        import pyarrow.compute as pc

        taken = [v.take(pa.array(value_indices(s, e))) for v, s, e in parts]
        found = pc.index_in(pa.chunked_array(taken, pa.string()), value_set=self.ids)
        return np.asarray(pc.fill_null(found, -1).to_numpy(), dtype=np.int64)


def first_rows(ids: pa.Array | pa.ChunkedArray) -> Any:
    """Each row's first row with the same id (int64; a row whose id is null: its own), what
    one ``IdIndex`` of the ids looked up in itself gives (``first_rows_reference``). Why not
    that: it needed the ids combined into one array and a hash table of all of them; here
    each id is hashed where it lies (``_decode.id_hashes``) and the hashes sorted, so only
    the rows whose hash another row shares (repeated ids, and 64-bit collisions) go through
    an ``IdIndex``, of those rows alone. 1M distinct ids: ~3x faster on the sds-audit
    driver, which idles the executors meanwhile."""
    import numpy as np

    chunks = ids.chunks if isinstance(ids, pa.ChunkedArray) else [ids]
    n = len(ids)
    if _decode is None or n >= 2**31 or any(c.type != _STRING for c in chunks):
        return first_rows_reference(ids)
    hashes = np.empty(n, dtype=np.uint64)
    at = 0
    for c in chunks:
        data = c.buffers()[2] or pa.py_buffer(b"")
        _decode.id_hashes(value_offsets(c), data, hashes[at : at + len(c)])
        at += len(c)
    row = np.arange(n, dtype=np.int64)
    ordered = np.sort(hashes)  # no permutation: most channels repeat no id
    shared = ordered[1:][ordered[1:] == ordered[:-1]]
    if not len(shared):
        return row
    some = np.isin(hashes, shared)
    if any(c.null_count for c in chunks):
        valid = [np.asarray(c.is_valid().to_numpy(zero_copy_only=False), bool) for c in chunks]
        some &= np.concatenate(valid)
    rows = np.flatnonzero(some)
    if len(rows) > n // 4:  # many repeated ids (resends): one table of all is cheaper
        return first_rows_reference(ids)
    picked = ids.take(pa.array(rows))
    picked = picked.combine_chunks() if isinstance(picked, pa.ChunkedArray) else picked
    k = np.arange(len(rows), dtype=np.int64)
    first = IdIndex(picked).positions([(picked, k[:1], k[-1:] + 1)]) if len(rows) else k
    row[rows] = rows[first]
    return row


def first_rows_reference(ids: pa.Array | pa.ChunkedArray) -> Any:
    """``first_rows`` by one ``IdIndex`` of all the ids (what it is tested equal to)."""
    import numpy as np

    flat = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    row = np.arange(len(flat), dtype=np.int64)
    if not len(row):
        return row
    first = IdIndex(flat).positions([(flat, row[:1], row[-1:] + 1)])
    if flat.null_count:  # index_in finds a null among the nulls: a null id is its own
        first[np.asarray(flat.is_null().to_numpy(zero_copy_only=False), bool)] = -1
    return np.where(first < 0, row, first)


def value_indices(starts: Any, ends: Any) -> Any:
    """The indexes ``starts[i] .. ends[i] - 1`` for each i in turn (int64)."""
    import numpy as np

    starts = np.asarray(starts, dtype=np.int64)
    lens = np.asarray(ends, dtype=np.int64) - starts
    before = np.cumsum(lens) - lens
    return np.repeat(starts - before, lens) + np.arange(int(lens.sum()), dtype=np.int64)
