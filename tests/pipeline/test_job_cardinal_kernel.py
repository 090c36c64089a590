"""The columnar assembler of ``cardinal-blocks`` (``cardinal_blocks_kernel`` + ``Assembler.run``)
equals its pure-Python reference (``Assembler.run_reference``): the same blocks, times, control
records, rejects in the same order, and the same state after each micro-batch — on two redundant
producers' copies, corrupt and odd records, and varints the kernel leaves to Python. No Spark."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from loglake.cardinal.codec import encode
from loglake.cardinal.errors import CardinalDecodeError
from loglake.cardinal.messages import BatchMsg
from loglake.cardinal.producer import Producer
from loglake.cardinal.synthetic import schema_for, synthetic_chain
from loglake.cardinal.transport import envelope, open_envelope
from loglake.pipeline.jobs.cardinal_blocks import Assembler, AssemblyState
from loglake.pipeline.jobs.cardinal_blocks_kernel import envelope_heads

TOPICS = ("chain", "chain.state")


def _zigzag_varint(n: int, octets: int | None = None) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z or (octets is not None and len(out) + 1 < octets):
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def odd_records(rng: random.Random, block_hash: bytes) -> list[bytes | None]:
    """Records the kernel must leave to the reference path, or must read exactly as it does."""
    k = b"\x01" + block_hash + b"foo/x"
    return [
        None,
        b"",
        b"\x80",  # the varint cut short
        b"\x80" * 11,  # longer than 10 octets
        _zigzag_varint(-3) + b"abc",  # a negative key length
        _zigzag_varint(len(k), octets=3) + k + b"v",  # a non-minimal 3-octet varint
        b"\x80\x00" + k,  # an octet with the high bit, then 0 (not the inline form)
        _zigzag_varint(40) + b"\x00" * 10,  # the key past the end
        envelope(b"\x03" + block_hash[:10], b""),  # a block type with a short key
        envelope(b"\x09" + block_hash, b""),  # no such type
        envelope(b"\x00" + block_hash, b"\x01"),  # a Batch value that is not Avro
        envelope(bytes([rng.randrange(5)]) + rng.randbytes(9000), b"x"),  # a 2-octet varint
        envelope(bytes([rng.randrange(5)]) + rng.randbytes(40_000), b"y"),  # a 3-octet varint
        envelope(*encode(BatchMsg(block_hash, "zzz/nowhere", b"1"))),  # under no prefix
    ]


def micro_batches(seed: int) -> list[pa.Table]:
    """A chain's messages from two producers (and a third partial copy), shuffled into three
    micro-batches with odd records among them; each record has a topic, partition, offset and
    log time (some without one)."""
    rng = random.Random(seed)
    chain = synthetic_chain(12, updates=1 + seed % 3)
    producer = Producer(TOPICS[0], schema_for(TOPICS[0]))
    msgs: list[bytes] = []
    for block in chain.canonical:
        for _, ms in sorted(producer.block_messages(block).items()):
            msgs += [envelope(*encode(m)) for m in ms]
    datas: list[bytes | None] = msgs + msgs + rng.sample(msgs, len(msgs) // 3)
    datas += odd_records(rng, chain.canonical[3].hash)
    rng.shuffle(datas)
    offsets: dict[tuple[int, int], int] = {}
    rows = []
    for d in datas:
        t, p = rng.randrange(2), rng.randrange(3)
        off = offsets.get((t, p), rng.randrange(5))
        offsets[(t, p)] = off + 1 + rng.randrange(2)
        ts = -1 if rng.random() < 0.1 else 1_700_000_000_000_000_000 + rng.randrange(10**9)
        rows.append((d, t, p, off, ts))
    cut1, cut2 = sorted(rng.sample(range(1, len(rows)), 2))
    out = []
    for part in (rows[:cut1], rows[cut1:cut2], rows[cut2:]):
        cols = list(zip(*part, strict=True))
        out.append(
            pa.table(
                {
                    "data": pa.array(cols[0], pa.binary()),
                    "t": pa.array(cols[1], pa.int32()),
                    "partition": pa.array(cols[2], pa.int32()),
                    "offset": pa.array(cols[3], pa.int64()),
                    "ts": pa.array(cols[4], pa.int64()),
                }
            )
        )
    return out


def _fields(blocks: list) -> list[tuple]:
    """Every field of each block (``Block`` compares by identity), with its time."""
    return [
        (b.number, b.hash, b.parent, b.weight, b.values, b.deletes, b.offsets, t) for b, t in blocks
    ]


def _same(a, b) -> None:
    assert _fields(a.blocks) == _fields(b.blocks)  # with lowest offsets per source
    assert a.control == b.control
    assert a.rejects == b.rejects


@pytest.mark.parametrize("seed", range(8))
def test_columnar_assembler_equals_the_reference(seed):
    batches = micro_batches(seed)
    fast, ref = Assembler((".*",), 8, TOPICS), Assembler((".*",), 8, TOPICS)
    st_fast, st_ref = AssemblyState(), AssemblyState()
    blocks = rejects = 0
    for table in batches:
        got, want = fast.run(table, st_fast), ref.run_reference(table, st_ref)
        _same(got, want)
        assert st_fast.done == st_ref.done and st_fast.pending == st_ref.pending
        blocks += len(want.blocks)
        rejects += len(want.rejects)
    assert blocks >= 8 and rejects >= 10, "the input exercised too little"


def test_tracked_prefixes_and_chunked_input_equal_the_reference():
    batches = micro_batches(3)
    table = pa.concat_tables(batches)  # several chunks in one column
    fast, ref = Assembler(("^foo/",), 8, TOPICS), Assembler(("^foo/",), 8, TOPICS)
    st_fast, st_ref = AssemblyState(), AssemblyState()
    _same(fast.run(table, st_fast), ref.run_reference(table, st_ref))
    assert st_fast.done == st_ref.done and st_fast.pending == st_ref.pending


def test_envelope_heads_agree_with_open_envelope():
    """Where the kernel says "block message", ``open_envelope`` opens the same key; every record
    with an inline (one- or two-octet) varint and a block key is taken by the kernel."""
    rng = random.Random(5)
    datas: list[bytes | None] = odd_records(rng, rng.randbytes(32))
    for n in (33, 34, 63, 64, 100, 8191, 8192):
        datas.append(envelope(bytes([rng.randrange(7)]) + rng.randbytes(n - 1), rng.randbytes(5)))
    datas += [rng.randbytes(rng.randrange(1, 50)) for _ in range(300)]
    arr = pa.array(datas, pa.binary())
    heads = envelope_heads(arr)
    for i, d in enumerate(datas):
        try:
            k, _ = open_envelope(d or b"")
        except CardinalDecodeError:
            assert not heads.fast[i], d
            continue
        block = len(k) >= 33 and k[0] <= 4
        inline = d is not None and (d[0] < 0x80 or 0 < d[1] < 0x80)
        assert bool(heads.fast[i]) == (block and inline), d
        if heads.fast[i]:
            v = int(heads.vlen[i])
            assert d is not None and d[v : v + int(heads.klen[i])] == k
    sliced = envelope_heads(arr.slice(3, 20))  # an array that starts at an offset
    assert (sliced.fast == heads.fast[3:23]).all()
