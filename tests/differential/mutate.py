"""Byte mutations of valid encodings, from a seeded ``random.Random``.

The mutations a decoder's boundary cases come from: a flipped bit, a byte set to a boundary
value (``00``, ``01``, ``7f``, ``80``, ``ff``), a byte inserted or deleted, a cut tail, a slice
duplicated, a multi-byte varint spliced in. A mutated input shared by two decoders is what
makes their accept/reject answers comparable.
"""

from __future__ import annotations

import random

from hypothesis import strategies as st

BOUNDARY = (0x00, 0x01, 0x02, 0x7F, 0x80, 0x81, 0xFE, 0xFF)
VARINTS = (
    b"\x80\x00",  # a non-minimal zero
    b"\x80\x80\x01",
    b"\xff\xff\xff\xff\x0f",  # 2**32 - 1
    b"\xff" * 9 + b"\x01",  # 2**64 - 1
    b"\xff" * 10,  # unterminated at ten octets
)


def mutate(data: bytes, rng: random.Random, rounds: int | None = None) -> bytes:
    """``data`` with one to three random mutations."""
    buf = bytearray(data)
    for _ in range(rounds or rng.choice((1, 1, 1, 2, 3))):
        op = rng.randrange(7)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[pos % len(buf)] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[pos % len(buf)] = rng.choice(BOUNDARY)
        elif op == 2:
            buf.insert(pos, rng.choice(BOUNDARY) if rng.random() < 0.5 else rng.randrange(256))
        elif op == 3 and buf:
            del buf[pos % len(buf)]
        elif op == 4:
            del buf[pos:]
        elif op == 5 and buf:
            a = rng.randrange(len(buf))
            b = min(len(buf), a + rng.randrange(1, 9))
            buf[pos:pos] = buf[a:b]
        else:
            buf[pos : pos + rng.randrange(3)] = rng.choice(VARINTS)
    return bytes(buf)


def mutations(valid: list[bytes], count: int, rng: random.Random) -> list[bytes]:
    """``count`` mutants of the ``valid`` encodings, round robin."""
    return [mutate(valid[i % len(valid)], rng) for i in range(count)] if valid else []


def sweep(data: bytes) -> list[bytes]:
    """Every single-octet change of ``data`` a decoder's checks sit on: each position set to
    ``00``, ``01``, ``02``, ``7f``, ``80``, ``ff`` and to its value plus and minus one.

    Why beside random mutations: a flag or a length is one octet at one place, and a random
    mutation hits it with the right value about once in a thousand tries (an ``optional`` flag
    of 2 was not caught within the budget that way). A sweep of a few messages per batch hits
    every one of them, deterministically: a length one too long, a count one too big, a flag,
    an enum value or a union tag one past the last."""
    out: set[bytes] = set()
    buf = bytearray(data)
    for i, b in enumerate(data):
        for v in (0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF, (b + 1) & 0xFF, (b - 1) & 0xFF):
            if v != b:
                buf[i] = v
                out.add(bytes(buf))
        buf[i] = b
    return sorted(out)


RNGS = st.integers(0, 2**32 - 1).map(random.Random)
"""A ``random.Random`` per batch from one drawn integer: its draws are not hypothesis's, so a
batch skipped (time budget, first catch) does not change what the next batches draw."""
