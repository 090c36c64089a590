"""SDS messages decoded a batch at a time into Arrow columns: what the sds-audit Spark job
reads of each record of a channel's stream (``DECODED_SCHEMA``).

Why here and not in the job: it is SDS's decoding (``sds.codec``'s protobuf, its causal
history read against the previous one), testable without Spark; the job
(``pipeline/jobs/sds_audit.py``) only schedules it in ``mapInArrow`` tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

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
        ("history_ids", pa.binary()),
        ("history_lens", pa.list_(pa.int32())),
        ("causal_new", pa.list_(pa.string())),
        ("repair_request", pa.list_(pa.string())),
        ("bloom_filter", pa.binary()),
        ("content_bytes", pa.int64()),
    ]
)
"""The causal history of a message is ``history_ids`` (its ids' UTF-8 bytes, concatenated)
and ``history_lens`` (each id's length in bytes): ``history_lists`` turns them back into the
list of ids, a batch at a time without a Python object per id. Why not a list of strings: 200
ids a row as strings cost the JVM a string object each, every time the column moves (into
``_work``, out of it, into the ``messages`` table); a binary value and an int array move as
a copy each.

``causal_new``: the causal-history ids that were not in the previous message of the same
sender read by the same task (all of them for a sender's first message in a task). An id left
out was in an earlier message of that sender, so whatever it shows (an acknowledgement, a
reference) was shown there first: the sweep and the dependency counts read only these, about
``participants`` ids a message instead of 200 when senders take turns."""


def decode_batches(
    channel: str,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: stream records → ``DECODED_SCHEMA`` rows.

    Per record, Python does only the message-level work (``parse``: one C-level protobuf parse,
    history entries kept as bytes) and reads the history against the previous one
    (``DecodeState.history``: only the entries after the previous history's tail become
    Python objects, each distinct entry parsed once by ``parse_entry``). Every entry gets a code
    (its encoded bytes' identity); the batch's histories and ``causal_new`` are ``take``s of the
    codes' ids, and histories leave packed (``history_ids`` + ``history_lens``)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from loglake.sds.bloom import BloomFilter

        state = DecodeState(channel, BloomFilter().n_bytes)
        for batch in batches:
            yield state.decode(batch)

    return run


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

    def decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        import numpy as np

        from loglake.sds.codec import parse, parse_entry
        from loglake.sds.errors import DropReason, SdsDecodeError

        self.compact()
        n = batch.num_rows
        idxs = batch.column("index").to_pylist()
        ok = np.zeros(n, dtype=bool)
        reason: list[str | None] = [None] * n
        detail: list[str | None] = [None] * n
        kind: list[str | None] = [None] * n
        mid: list[str | None] = [None] * n
        sender: list[str | None] = [None] * n
        lamport: list[int | None] = [None] * n
        blooms: list[bytes | None] = [None] * n
        cbytes: list[int | None] = [None] * n
        requests: list[list[str] | None] = [None] * n
        empty = np.zeros(0, dtype=np.int64)
        row_codes: list[Any] = [empty] * n
        for r, data in enumerate(batch.column("data").to_pylist()):
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
                row_codes[r] = codes
                if bad is not None:
                    raise bad
                reqs = [parse_entry(b).message_id for b in pb.repair_request]
            except SdsDecodeError as e:
                reason[r], detail[r] = _reason(e)
                continue
            has_lamport = pb.HasField("lamport_timestamp")
            content = pb.content
            ok[r] = True
            kind[r] = ("content" if content else "sync") if has_lamport else "ephemeral"
            mid[r] = pb.message_id
            sender[r] = pb.sender_id
            lamport[r] = pb.lamport_timestamp if has_lamport else None
            blooms[r] = bloom
            cbytes[r] = len(content)
            requests[r] = reqs

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

        id_arr = pa.array(self.ids, pa.string())
        keep = ok[row_of]

        def lists(elems: Any) -> pa.ListArray:
            per_row = np.bincount(row_of[elems], minlength=n)
            offsets = np.concatenate([[0], np.cumsum(per_row)]).astype(np.int32)
            values = id_arr.take(pa.array(codes[elems])) if total else pa.array([], pa.string())
            return pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(~ok))

        history = lists(keep)
        hist_ids, hist_lens = pack_lists(history)
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
                hist_ids,
                hist_lens,
                lists(keep & new),
                pa.array(requests, pa.list_(pa.string())),
                pa.array(blooms, pa.binary()),
                pa.array(cbytes, pa.int64()),
            ],
            schema=DECODED_SCHEMA,
        )


def pack_lists(lists: pa.ListArray) -> tuple[pa.Array, pa.ListArray]:
    """list<string> → (``history_ids``, ``history_lens``): each row's strings' bytes
    concatenated, and their lengths; no Python object per string."""
    import numpy as np

    n = len(lists)
    values = lists.values
    voffs = np.frombuffer(values.buffers()[1], dtype=np.int32)[
        values.offset : values.offset + len(values) + 1
    ]
    data = values.buffers()[2] or pa.py_buffer(b"")
    loffs = np.asarray(lists.offsets, dtype=np.int64)  # into ``values``
    valid = lists.is_valid()
    vbuf = None if lists.null_count == 0 else valid.buffers()[1]
    ids = pa.Array.from_buffers(
        pa.binary(),
        n,
        [vbuf, pa.py_buffer(voffs[loffs].astype(np.int32)), data],
        null_count=lists.null_count,
    )
    lens = np.diff(voffs)[loffs[0] : loffs[-1]] if n else np.zeros(0, dtype=np.int32)
    return ids, pa.ListArray.from_arrays(
        pa.array((loffs - loffs[0]).astype(np.int32)),
        pa.array(lens.astype(np.int32), pa.int32()),
        mask=pa.array(~np.asarray(valid)),
    )


def history_lists(ids: pa.Array, lens: pa.Array) -> pa.ListArray:
    """(``history_ids``, ``history_lens``) of a batch → the causal histories as list<string>,
    with no Python object per id (``pack_lists`` in reverse)."""
    import numpy as np

    n = len(ids)
    ioffs = np.frombuffer(ids.buffers()[1], dtype=np.int32)[ids.offset : ids.offset + n + 1]
    loffs = np.asarray(lens.offsets, dtype=np.int64)
    lo, hi = (int(loffs[0]), int(loffs[-1])) if n else (0, 0)
    flat = np.asarray(lens.values.slice(lo, hi - lo).to_numpy(zero_copy_only=False), np.int64)
    voffs = int(ioffs[0]) + np.concatenate(([0], np.cumsum(flat)))
    if n and not np.array_equal(voffs[loffs - lo], ioffs.astype(np.int64)):
        raise ValueError("history_ids and history_lens disagree")
    data = ids.buffers()[2] or pa.py_buffer(b"")
    values = pa.Array.from_buffers(
        pa.string(), len(flat), [None, pa.py_buffer(voffs.astype(np.int32)), data]
    )
    return pa.ListArray.from_arrays(
        pa.array((loffs - lo).astype(np.int32)), values, mask=pa.array(np.asarray(ids.is_null()))
    )
