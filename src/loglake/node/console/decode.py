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
flood the page; ``text`` only when the bytes are printable UTF-8).
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
from loglake.events.publisher import event_of
from loglake.sds import codec as sds_codec
from loglake.sds.channel import decode_hint
from loglake.sds.chat import decode_envelope
from loglake.wire.icrc16 import Property, RawValue
from loglake.wire.pb import archives_spec_pb2 as spec_pb
from loglake.wire.pb import archives_statusgo_pb2 as sg_pb

MAX_HEX_BYTES = 256
"""Bytes fields longer than this show their first ``MAX_HEX_BYTES`` in hex (``truncated``)."""

MAX_DEPTH = 64
"""Nesting deeper than this (an ICRC-16 value can nest) is shown as ``"…"``."""


class ConsoleDecodeError(DecodeError):
    """A record does not decode in the format asked for; the message is the codec's reason."""


def bytes_json(b: bytes) -> dict[str, Any]:
    """Bytes for the page: length, hex (bounded) and, when printable UTF-8, the text."""
    out: dict[str, Any] = {"len": len(b), "hex": b[:MAX_HEX_BYTES].hex()}
    if len(b) > MAX_HEX_BYTES:
        out["truncated"] = True
    try:
        text = b.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        out["text"] = text
    return out


def to_json(v: Any, _depth: int = 0) -> Any:
    """Any decoded value (dataclasses, protobuf messages, ICRC-16 values, bytes, principals)
    as JSON-able data, fields in declaration order."""
    if _depth > MAX_DEPTH:
        return "…"
    d = _depth + 1
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes_json(bytes(v))
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, Principal):
        return {"principal": v.to_str()}
    if isinstance(v, RawValue):
        return to_json(v.decode(), d)
    if isinstance(v, Property):
        return {"name": v.name, "value": to_json(v.value, d), "immutable": v.immutable}
    if isinstance(v, PbMessage):
        return {f.name: to_json(val, d) for f, val in v.ListFields()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: to_json(getattr(v, f.name), d) for f in dataclasses.fields(v)}
    if isinstance(v, dict):
        return {str(k): to_json(x, d) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [to_json(x, d) for x in v]
    return repr(v)


def _waku(layout: str, pb_cls: Callable[[], PbMessage]) -> Callable[[bytes], dict[str, Any]]:
    def decode(data: bytes) -> dict[str, Any]:
        LAYOUTS[layout].decode_record(data)  # the part's check (raises BadRecord)
        m = pb_cls()
        try:
            m.ParseFromString(data)
        except (PbDecodeError, RuntimeError, ValueError) as e:  # unreachable after the check
            raise ConsoleDecodeError(str(e)) from e
        return {"type": "WakuMessage", "fields": to_json(m)}

    return decode


def _sds(data: bytes) -> dict[str, Any]:
    msg = sds_codec.decode(data)
    kind = msg.kind
    fields = to_json(msg)
    # a loglake retrieval hint names a stream position (sds.channel): show where it points
    for name in ("causal_history", "repair_request"):
        for entry, row in zip(getattr(msg, name), fields[name], strict=True):
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
        fields["chat"] = {"sent_ms": env.sent_ms, "text": env.text}
    return {"type": f"SdsMessage ({kind.value if kind else 'no kind'})", "fields": fields}


def _cardinal(data: bytes) -> dict[str, Any]:
    key, value = open_envelope(data)
    msg = cardinal_codec.decode(key, value)
    return {"type": type(msg).__name__, "fields": to_json(msg)}


def _icrc(data: bytes) -> dict[str, Any]:
    # index, namespace and source are not in the stored bytes (they are the record's position
    # and the stream's name); the page shows the index itself, so only stored fields are kept.
    e = event_of(0, data, "", Principal.anonymous(), raw=False)
    fields = {"timestamp": e.timestamp, "headers": to_json(e.headers), "data": to_json(e.data)}
    return {"type": "ICRC-72 event", "fields": fields}


DECODERS: dict[str, Callable[[bytes], dict[str, Any]]] = {
    "waku": _waku("spec", spec_pb.WakuMessage),
    "waku-status-go": _waku("status-go", sg_pb.WakuMessage),
    "sds": _sds,
    "cardinal": _cardinal,
    "icrc": _icrc,
}
"""Format name (as the page and the API call it) → decoder of one record."""

FORMATS = tuple(DECODERS)


def decode_record(fmt: str, data: bytes) -> dict[str, Any]:
    """``{"type", "fields"}`` of one record in format ``fmt``; ``ConsoleDecodeError`` (with the
    codec's reason) if it is not one; ``KeyError`` for an unknown format."""
    decoder = DECODERS[fmt]
    try:
        return decoder(data)
    except DecodeError as e:
        raise ConsoleDecodeError(str(e)) from e
    except (ValueError, IndexError, OverflowError, RecursionError) as e:
        # a codec that let a low-level error through: still the record's fault, say so
        raise ConsoleDecodeError(f"{type(e).__name__}: {e}") from e


def decode_many(fmt: str, records: list[bytes]) -> list[dict[str, Any]]:
    """Each record decoded, or ``{"error": reason}`` in its place."""
    out: list[dict[str, Any]] = []
    for data in records:
        try:
            out.append({"ok": True, **decode_record(fmt, data)})
        except ConsoleDecodeError as e:
            out.append({"ok": False, "error": str(e)})
    return out
