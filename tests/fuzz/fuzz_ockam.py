"""Fuzz the Ockam wire: TCP frames (``TcpConnection``), CBOR ``TCPMessage`` bodies and the older
BARE routing message (``loglake.wire.ockam``).

A ``TCPMessage`` body is decoded differentially: by loglake and by the reference-shaped peer
(``tests/streams/interop/ockam_peer.py``, the reference's ``decode_strict`` rules written with
``cbor2`` alone); both must accept or both refuse, and agree on what they accept — but for what
loglake refuses on purpose with ``OckamWireLimit`` (routes over its limits, CBOR tags).

Typed errors: ``OckamWireError``/``BareDecodeError`` (``DecodeError``) from the decoders;
``TcpConnection`` never raises on peer bytes — it sets ``error`` to a ``RemoteProtocolError`` or
``DecodeError`` and returns the messages completed before it. Properties beyond "no crash": the
connection gives the same messages and the same error kind whether the bytes come in one chunk
or split in two (framing is chunk-independent), and the connection's route-cache shortcut
decodes a body to the same message as ``decode_transport_message``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tests.fuzz`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loglake.errors import DecodeError
from loglake.wire import ockam
from tests.fuzz import _harness
from tests.streams.interop import ockam_peer as ref

EXPECTED = (DecodeError,)
INSTRUMENT = ("loglake.wire.ockam", "loglake.wire.bare", "loglake.wire.varint")


def _feed(chunks: list[bytes]) -> tuple[list[ockam.RoutingMessage], type | None]:
    conn = ockam.TcpConnection(max_frame=1 << 16)
    out: list[ockam.RoutingMessage] = []
    for c in chunks:
        out += conn.receive_data(c)
    return out, type(conn.error) if conn.error is not None else None


def one(data: bytes) -> None:
    if not data:
        return
    mode, body = data[0] % 3, data[1:]
    if mode == 0:  # a TCP byte stream after the version byte, whole and split
        stream = ockam.VERSION_BYTE + body
        whole = _feed([stream])
        cut = 1 + (data[0] >> 2) % max(1, len(stream))
        split = _feed([stream[:cut], stream[cut:]])
        assert whole == split, f"chunking changed the result: {whole} vs {split}"
        for m in whole[0]:  # what came out encodes back to a frame that decodes the same
            assert ockam.decode_transport_message(ockam.encode_transport_message(m)) == m
    elif mode == 1:  # one frame body, against the reference-shaped peer's decoder
        try:
            theirs = ref.decode_message(body)
        except ref.BadFrame:
            theirs = None
        try:
            msg = ockam.decode_transport_message(body)
        except ockam.OckamWireLimit:
            # refused on purpose (a route over loglake's limits, a CBOR tag, a string in too many
            # chunks) where the peer, a plain cbor2 decoder, may take it
            raise
        except DecodeError:
            assert theirs is None, f"the peer accepts what loglake refuses: {theirs}"
            raise
        assert theirs is not None, f"loglake accepts what the peer refuses: {msg}"
        assert (
            [(a.type, a.value) for a in msg.onward_route],
            [(a.type, a.value) for a in msg.return_route],
            msg.payload,
            msg.tracing_context,
        ) == (theirs.onward, theirs.ret, theirs.payload, theirs.tracing)
        conn = ockam.TcpConnection()
        conn.receive_data(ockam.VERSION_BYTE + ockam.encode_frame(msg))
        # the same body framed again (it may be longer than the canonical encoding: CBOR has
        # non-minimal lengths) is read through the connection's route-cache shortcut
        again = conn.receive_data(len(body).to_bytes(4, "big") + body)
        assert conn.error is None and again == [msg], (again, conn.error)
    else:
        ockam.decode_wire_binary(body)


def seeds() -> list[bytes]:
    r1 = ockam.route("stream_service", "app")
    r2 = (ockam.tcp_address("127.0.0.1", 4000), ockam.Address.local("client"))
    # the reference's own vector (transport_message.ex, written by its Elixir codec)
    reference = bytes.fromhex("848182004e73747265616d5f736572766963658182004361707043010203f6")
    msgs = [
        ockam.RoutingMessage(r1, r2, b"payload"),
        ockam.RoutingMessage((), (), b""),
        ockam.RoutingMessage(r1, (), bytes(300), "trace-ctx"),
    ]
    frames = ockam.encode_frames(msgs)
    return (
        [b"\x00" + frames, b"\x00" + frames[:-3]]
        + [b"\x01" + ockam.encode_transport_message(m) for m in msgs]
        + [b"\x01" + reference, b"\x00" + len(reference).to_bytes(4, "big") + reference]
        # shapes the reference refuses, a mutation away from accepted ones: 3 items (no
        # tracing context), addresses as maps {0: type, 1: value}
        + [b"\x01\x83" + reference[1:-1], b"\x01\x83\x81\xa2\x00\x00\x01\x41a\x80\x41\x01"]
        + [b"\x02" + ockam.encode_wire_binary(m) for m in msgs]
    )


if __name__ == "__main__":
    _harness.main(one, EXPECTED, seeds, INSTRUMENT)
