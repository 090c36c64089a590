"""Stream records as the console's record browser shows them: decoded by the parts' own codecs.

Why on the server: the four protocol formats loglake stores are read by Python codecs that
already exist and are tested against the reference implementations (protobuf for WakuMessage
and SDS, loglake's Avro for Cardinal, Candid/ICRC-16 for ICRC events). Re-implementing them in
JavaScript would be a second copy to keep in step; instead the browser sends the record bytes it
read from the node's API and gets back plain JSON fields. Text and hex views need no codec and
are drawn in the browser.

What a record of each format is (how the parts store them):

- ``waku`` — a 14/WAKU2-MESSAGE as the spec layout of a community stream writes it
  (``loglake.archives.layout.SpecLayout``); ``waku-status-go`` — status-go's ``WakuMessage``
  (``StatusGoLayout``);
- ``sds`` — one ``SdsMessage`` (``loglake.sds.codec.decode``, every field checked); a history
  entry whose retrieval hint is loglake's (``sds.channel.decode_hint``) also shows the stream
  position it points to;
- ``cardinal`` — the transport's envelope ``long(len(key)) key value``
  (``loglake.cardinal.transport.open_envelope``), then ``loglake.cardinal.codec.decode``;
- ``icrc`` — a Publisher's stored event ``kind · timestamp · [headers] · ICRC-16 value``
  (``loglake.events.publisher.event_of``).

A record that does not decode is not an HTTP error: a range may hold records of other formats,
so each record gets either its fields or the codec's own error text. Bytes in the output are
``{"len", "hex", "text"}`` (hex cut at ``MAX_HEX_BYTES`` so an 18 KB bloom filter does not
flood the page; ``text`` only when the bytes are printable UTF-8, cut at ``MAX_TEXT`` characters
with ``"text_truncated": true``).

What one request may cost is bounded (``Budget``): a record shows at most ``RECORD_VALUES``
values and ``RECORD_CHARS`` characters of text and hex, a request ``REQUEST_VALUES`` and
``REQUEST_CHARS``; a list cut there ends with ``{"truncated": N}`` (N items not shown), a dict
with the key ``"…"`` holding it, a string with ``"…"``; once the request's budget is spent the
remaining records are not decoded (``ok: false``, ``skipped: true``). An ICRC-16 value is decoded
under ``candid.element_budget`` (``MAX_ELEMENTS`` a record), so a record of more elements is
refused before it is built. Found from outside: one 4.4 MB event anyone could push over the
stream service (``{"Array": [{"Nat": 0}] × 2.2M}``), shown as an ICRC-72 event, cost the node
815 MiB and 9 s and answered 22 MB.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError as PbDecodeError
from google.protobuf.message import Message as PbMessage
from icp_principal import Principal

from loglake.archives.layout import LAYOUTS
from loglake.cardinal import codec as cardinal_codec
from loglake.cardinal.transport import open_envelope
from loglake.errors import DecodeError
from loglake.events.publisher import stored_parts
from loglake.sds import codec as sds_codec
from loglake.sds.channel import decode_hint
from loglake.sds.chat import decode_envelope
from loglake.wire import icrc16
from loglake.wire.icrc16 import Property, RawValue
from loglake.wire.pb import archives_spec_pb2 as spec_pb
from loglake.wire.pb import archives_statusgo_pb2 as sg_pb

MAX_HEX_BYTES = 256
"""Bytes fields longer than this show their first ``MAX_HEX_BYTES`` in hex (``truncated``)."""

MAX_DEPTH = 64
"""Nesting deeper than this (an ICRC-16 value can nest) is shown as ``"…"``."""

MAX_TEXT = 4096
"""Characters of one string (or of bytes' ``text``) shown; longer ones are cut."""
RECORD_VALUES = 10_000
"""Values shown of one record (lists and dicts past it end in a ``{"truncated": N}``)."""
RECORD_CHARS = 1024 * 1024
"""Characters of text and hex shown of one record."""
REQUEST_VALUES = 100_000
"""Values shown in one request, all records together."""
REQUEST_CHARS = 8 * 1024 * 1024
"""Characters of text and hex shown in one request."""
MAX_ELEMENTS = 50_000
"""Elements of arrays, maps, sets and classes an ICRC record's decode may build (the
headers' and the value's together); past it the record is refused, not built."""


@dataclasses.dataclass(slots=True)
class Budget:
    """What is left to show: values and characters (``to_json`` charges it)."""

    values: int
    chars: int

    def take(self, want: Budget) -> Budget:
        """A part of this budget, at most ``want`` (``spend`` charges what it used)."""
        return Budget(min(self.values, want.values), min(self.chars, want.chars))

    def spend(self, part: Budget, start: Budget) -> None:
        """Charge what ``part`` (taken as ``start``) used."""
        self.values -= start.values - part.values
        self.chars -= start.chars - part.chars

    @property
    def spent(self) -> bool:
        return self.values <= 0 or self.chars <= 0


def _unlimited() -> Budget:
    return Budget(1 << 62, 1 << 62)


def truncated(n: int) -> dict[str, int]:
    """What stands in for ``n`` items of a list (or dict) the budget did not reach."""
    return {"truncated": n}


class ConsoleDecodeError(DecodeError):
    """A record does not decode in the format asked for; the message is the codec's reason."""


class TooLargeToShow(ConsoleDecodeError):
    """A record with more elements than ``MAX_ELEMENTS``: refused before it is built."""


def bytes_json(b: bytes, budget: Budget | None = None) -> dict[str, Any]:
    """Bytes for the page: length, hex (bounded) and, when printable UTF-8, the text (its
    first ``MAX_TEXT`` characters, fewer if ``budget`` has fewer left)."""
    budget = budget if budget is not None else _unlimited()
    hex_part = b[: min(MAX_HEX_BYTES, max(0, budget.chars) // 2)].hex()
    budget.chars -= len(hex_part)
    out: dict[str, Any] = {"len": len(b), "hex": hex_part}
    if len(hex_part) < 2 * len(b):
        out["truncated"] = True
    try:
        text = b.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        room = min(MAX_TEXT, max(0, budget.chars))
        if len(text) > room:
            text = text[:room]
            out["text_truncated"] = True
        budget.chars -= len(text)
        out["text"] = text
    return out


def to_json(v: Any, budget: Budget | None = None, _depth: int = 0) -> Any:
    """Any decoded value (dataclasses, protobuf messages, ICRC-16 values, bytes, principals)
    as JSON-able data, fields in declaration order; at most ``budget``'s values and
    characters (lists, dicts and strings cut past it, as the module docstring says)."""
    if budget is None:
        budget = _unlimited()
    budget.values -= 1
    if _depth > MAX_DEPTH:
        return "…"
    d = _depth + 1
    if v is None or isinstance(v, bool | int | float):
        return v
    if isinstance(v, str):
        room = min(MAX_TEXT, max(0, budget.chars))
        if len(v) > room:
            v = v[:room] + "…"
        budget.chars -= len(v)
        return v
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes_json(bytes(v), budget)
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, Principal):
        return {"principal": v.to_str()}
    if isinstance(v, RawValue):
        return to_json(v.decode(), budget, d)
    if isinstance(v, Property):
        return {
            "name": to_json(v.name, budget, d),
            "value": to_json(v.value, budget, d),
            "immutable": v.immutable,
        }
    if isinstance(v, PbMessage):
        return _dict(((f.name, val) for f, val in v.ListFields()), len(v.ListFields()), budget, d)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        fields = dataclasses.fields(v)
        return _dict(((f.name, getattr(v, f.name)) for f in fields), len(fields), budget, d)
    if isinstance(v, dict):
        return _dict(((str(k), x) for k, x in v.items()), len(v), budget, d)
    if isinstance(v, list | tuple):
        out: list[Any] = []
        for i, x in enumerate(v):
            if i and budget.spent:  # the first item always: a cut list is never bare
                out.append(truncated(len(v) - i))
                break
            out.append(to_json(x, budget, d))
        return out
    return repr(v)


def _dict(items: Any, n: int, budget: Budget, d: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, (k, x) in enumerate(items):
        if i and budget.spent:  # as a list: at most MAX_DEPTH values past the budget
            out["…"] = truncated(n - i)
            break
        out[k] = to_json(x, budget, d)
    return out


Decoder = Callable[[bytes, Budget], dict[str, Any]]


def _waku(layout: str, pb_cls: Callable[[], PbMessage]) -> Decoder:
    def decode(data: bytes, budget: Budget) -> dict[str, Any]:
        LAYOUTS[layout].decode_record(data)  # the part's check (raises BadRecord)
        m = pb_cls()
        try:
            m.ParseFromString(data)
        except (PbDecodeError, RuntimeError, ValueError) as e:  # unreachable after the check
            raise ConsoleDecodeError(str(e)) from e
        return {"type": "WakuMessage", "fields": to_json(m, budget)}

    return decode


def _sds(data: bytes, budget: Budget) -> dict[str, Any]:
    msg = sds_codec.decode(data)
    kind = msg.kind
    fields = to_json(msg, budget)
    # a loglake retrieval hint names a stream position (sds.channel): show where it points
    for name in ("causal_history", "repair_request"):
        rows = fields.get(name)
        if not isinstance(rows, list):  # cut by the budget
            continue
        for entry, row in zip(getattr(msg, name), rows, strict=False):  # rows may be cut
            if not isinstance(row, dict) or "retrieval_hint" not in row:
                continue
            where = decode_hint(entry.retrieval_hint)
            if where is not None:
                row["hint_points_to"] = {
                    "stream": where[0],
                    "partition": where[1],
                    "index": where[2],
                }
    # a line of ``loglake sds chat`` (or the node's SDS API): its envelope read out beside
    # the content's bytes (sds.chat), so the page shows the line's text
    env = decode_envelope(msg.content) if msg.content else None
    if env is not None and env.sender_id == msg.sender_id:
        fields["chat"] = to_json({"sent_ms": env.sent_ms, "text": env.text}, budget)
    return {"type": f"SdsMessage ({kind.value if kind else 'no kind'})", "fields": fields}


def _cardinal(data: bytes, budget: Budget) -> dict[str, Any]:
    key, value = open_envelope(data)
    msg = cardinal_codec.decode(key, value)
    return {"type": type(msg).__name__, "fields": to_json(msg, budget)}


def _icrc(data: bytes, budget: Budget) -> dict[str, Any]:
    # index, namespace and source are not in the stored bytes (they are the record's position
    # and the stream's name); the page shows the index itself, so only stored fields are kept.
    # The headers and the value are each decoded under MAX_ELEMENTS (icrc16.decode_bounded):
    # what the publisher's event_of would build in full.
    ts, header_bytes, value_bytes = stored_parts(data)
    try:
        headers = (
            None
            if header_bytes is None
            else icrc16.decode_bounded(header_bytes, MAX_ELEMENTS, as_map=True)
        )
        value = icrc16.decode_bounded(value_bytes, MAX_ELEMENTS)
    except icrc16.ICRC16TooLarge as e:
        raise TooLargeToShow(f"too large to show decoded ({e}); view it as hex") from None
    fields = {"timestamp": ts, "headers": to_json(headers, budget), "data": to_json(value, budget)}
    return {"type": "ICRC-72 event", "fields": fields}


DECODERS: dict[str, Decoder] = {
    "waku": _waku("spec", spec_pb.WakuMessage),
    "waku-status-go": _waku("status-go", sg_pb.WakuMessage),
    "sds": _sds,
    "cardinal": _cardinal,
    "icrc": _icrc,
}
"""Format name (as the page and the API call it) → decoder of one record."""

FORMATS = tuple(DECODERS)


def decode_record(fmt: str, data: bytes, budget: Budget | None = None) -> dict[str, Any]:
    """``{"type", "fields"}`` of one record in format ``fmt`` (at most ``budget``'s values and
    characters; ``RECORD_VALUES`` and ``RECORD_CHARS`` if None); ``ConsoleDecodeError`` (with
    the codec's reason) if it is not one; ``KeyError`` for an unknown format."""
    decoder = DECODERS[fmt]
    if budget is None:
        budget = Budget(RECORD_VALUES, RECORD_CHARS)
    try:
        return decoder(data, budget)
    except DecodeError as e:
        raise ConsoleDecodeError(str(e)) from e
    except (ValueError, IndexError, OverflowError, RecursionError) as e:
        # a codec that let a low-level error through: still the record's fault, say so
        raise ConsoleDecodeError(f"{type(e).__name__}: {e}") from e


def decode_many(
    fmt: str, records: list[bytes], budget: Budget | None = None
) -> list[dict[str, Any]]:
    """Each record decoded, or ``{"error": reason}`` in its place; each shows at most
    ``RECORD_VALUES``/``RECORD_CHARS`` and all together ``budget`` (``REQUEST_VALUES``,
    ``REQUEST_CHARS`` if None): the records past it are not decoded (``skipped``)."""
    if budget is None:
        budget = Budget(REQUEST_VALUES, REQUEST_CHARS)
    per_record = Budget(RECORD_VALUES, RECORD_CHARS)
    out: list[dict[str, Any]] = []
    for data in records:
        if budget.spent:
            out.append(
                {
                    "ok": False,
                    "skipped": True,
                    "error": f"not decoded: this request's budget ({REQUEST_VALUES:,} values, "
                    f"{REQUEST_CHARS // 2**20} MiB of text) is spent; ask for fewer records",
                }
            )
            continue
        start = budget.take(per_record)
        part = dataclasses.replace(start)
        try:
            out.append({"ok": True, **decode_record(fmt, data, part)})
        except ConsoleDecodeError as e:
            out.append({"ok": False, "error": str(e)})
            if isinstance(e, TooLargeToShow):  # its decode built up to MAX_ELEMENTS: charge it
                part.values = 0
        budget.spend(part, start)
    return out
