"""Fuzz Cardinal message keys and values (``loglake.cardinal.codec.decode`` over the Avro reader
of ``loglake.cardinal.avro``): the input is ``key length (1 byte), key, value``.

Typed error: ``CardinalDecodeError``. Beyond "no crash": a decoded message encodes again
(``codec.encode`` refuses nothing the decoder accepted) and decodes back to itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loglake.cardinal import codec
from loglake.cardinal.errors import CardinalDecodeError
from loglake.cardinal.messages import (
    Batch,
    BatchDeleteMsg,
    BatchMsg,
    BatchRecord,
    Ping,
    Reorg,
    ReorgComplete,
    SubBatchHeader,
    SubBatchMsg,
)
from tests.fuzz import _harness

EXPECTED = (CardinalDecodeError,)
INSTRUMENT = ("loglake.cardinal.codec", "loglake.cardinal.avro", "loglake.wire.varint")


def one(data: bytes) -> None:
    if not data:
        return
    n = data[0]
    key, value = data[1 : 1 + n], data[1 + n :]
    msg = codec.decode(key, value)
    assert codec.decode(*codec.encode(msg)) == msg


def seeds() -> list[bytes]:
    h, b, p = b"\x11" * 32, b"\x22" * 32, b"\x33" * 32
    updates = {
        f"k/{i}": BatchRecord(b"v" * i, i, i % 2 == 0, b if i == 3 else bytes(32)) for i in range(4)
    }
    msgs = [
        Batch(h, 10, 2**200 + 5, p, updates),
        Batch(h, 0, 0, p, {}),
        SubBatchHeader(h, b, 3),
        SubBatchMsg(h, b, 0, ("del/a", "del/b"), {}),
        SubBatchMsg(h, b, 1, (), {f"u{i}": bytes([i]) * 3 for i in range(120)}),  # two blocks
        BatchMsg(h, "acct/1", b"value"),
        BatchDeleteMsg(h, "acct/2"),
        Reorg(h, 9),
        ReorgComplete(h, 9),
        Ping(b"\x44" * 32, b"ping"),
    ]
    out = []
    for m in msgs:
        key, value = codec.encode(m)
        out.append(bytes((len(key),)) + key + value)
    return out


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
