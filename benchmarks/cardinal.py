"""Cardinal benchmark: messages/s consumed, alone and through loglake streams.

For blocks of 1, 100 and 1,000 updates (under the ``foo/`` prefix, so each update is its own
BatchMsg, plus the Batch), two redundant producers send every block; each message is counted
once per copy. Figures:

- consume alone: ``OrderedConsumer.receive`` over the encoded messages held in a list (two
  producers' copies interleaved block by block) — the sans-I/O core, one thread; reported per
  wall-clock second and per CPU-second of that thread (the per-core figure: the machine is
  shared, so wall time also counts other processes' turns);
- produce → stream → consume: two ``StreamProducer``s each send every run of blocks (about
  200 messages, one append per partition) into a 4-partition loglake stream (MemoryLog, and
  the embedded SegmentLog with its default ``batch`` durability), then ``StreamConsumer.run``
  until caught up; produce and consume rates separately. ``tcp``: the same through a stream
  server on 127.0.0.1 (``BackgroundServer`` on a MemoryLog) and ``StreamClient``.
- decode only: ``codec.decode`` of the same messages, the floor under the consumer.

Target (issue 5): ≥ 50,000 messages/s consumed per core. The reference (Go) is not runnable
here (no Go toolchain), so there is no peer figure from the same run.

Run: ``.venv/bin/python benchmarks/cardinal.py [--quick]``.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time

from loglake.cardinal.codec import decode, encode
from loglake.cardinal.messages import ZERO_HASH
from loglake.cardinal.ordering import Checkpoint, OrderedConsumer
from loglake.cardinal.producer import BlockPayload, Producer
from loglake.cardinal.transport import StreamConsumer, StreamProducer, StreamTransport
from loglake.log import MemoryLog, open_log
from loglake.streams.api import LocalStreams
from loglake.streams.client import StreamClient
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService

SCHEMA = {"foo/": "bench"}
TARGET = 50_000


def blocks(n_blocks: int, updates: int) -> list[BlockPayload]:
    out, parent = [], ZERO_HASH
    for n in range(n_blocks):
        h = hashlib.sha256(b"%d" % n).digest()
        ups = {f"foo/{n}/{i}": b"v" * 32 for i in range(updates)}
        out.append(BlockPayload(n, h, parent, n + 1, ups))
        parent = h
    return out


def encoded(chain: list[BlockPayload]) -> list[tuple[bytes, bytes]]:
    producers = [Producer("bench", SCHEMA), Producer("bench", SCHEMA)]
    msgs = []
    for b in chain:
        for p in producers:  # the redundant copy follows the first
            for _, ms in sorted(p.block_messages(b).items()):
                msgs.extend(encode(m) for m in ms)
    return msgs


def start() -> Checkpoint:
    return Checkpoint.starting_at(-1, ZERO_HASH, 0)


def consume_alone(msgs) -> tuple[float, float, int]:
    """Wall time, CPU time of this thread (the per-core figure on a shared machine), blocks."""
    c = OrderedConsumer(checkpoint=start())
    t, cpu = time.perf_counter(), time.thread_time()
    added = 0
    for i, (k, v) in enumerate(msgs):
        for u in c.receive(k, v, "bench:0", i):
            added += len(getattr(u, "added", ()))
    return time.perf_counter() - t, time.thread_time() - cpu, added


def decode_only(msgs) -> float:
    t = time.perf_counter()
    for k, v in msgs:
        decode(k, v)
    return time.perf_counter() - t


def through_streams(chain, streams, chunk: int) -> tuple[float, float, int, int]:
    """Both producers send each run of ``chunk`` blocks (one append per partition each), so
    their copies sit close together in the stream, as with producers running side by side."""
    t = time.perf_counter()
    cps = [StreamProducer(StreamTransport(streams, 4), Producer("bench", SCHEMA)) for _ in "ab"]
    for i in range(0, len(chain), chunk):
        for cp in cps:
            cp.send_blocks(chain[i : i + chunk])
    sent = sum(cp.sent for cp in cps)
    t_prod = time.perf_counter() - t
    c = StreamConsumer(StreamTransport(streams, 4), ["bench"], "bench", start=start())
    t = time.perf_counter()
    added = sum(len(getattr(u, "added", ())) for u in c.run())
    return t_prod, time.perf_counter() - t, sent, added


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs")
    args = ap.parse_args()
    budget = 20_000 if args.quick else 100_000  # messages per producer per case
    print(
        f"{'updates/block':>13} {'blocks':>6} {'messages':>9} | {'decode/s':>10} "
        f"{'consume/s':>10} {'cons/cpu-s':>10} | {'mem prod/s':>10} {'mem cons/s':>10} | "
        f"{'seg prod/s':>10} {'seg cons/s':>10} | {'tcp prod/s':>10} {'tcp cons/s':>10}"
    )
    for updates in (1, 100, 1000):
        n_blocks = max(5, budget // (updates + 1))
        chain = blocks(n_blocks, updates)
        msgs = encoded(chain)
        t_dec = decode_only(msgs)
        t_con, cpu_con, added = consume_alone(msgs)
        assert added == n_blocks, (added, n_blocks)
        chunk = max(1, 200 // (updates + 1))  # copies of a block stay close together
        mp, mc, sent, added = through_streams(chain, LocalStreams(MemoryLog()), chunk)
        assert added == n_blocks and sent == len(msgs)
        with tempfile.TemporaryDirectory() as d:
            log = open_log(d)
            try:
                sp, sc, _, added = through_streams(chain, LocalStreams(log), chunk)
            finally:
                log.close()
        assert added == n_blocks
        with (
            BackgroundServer(StreamService(MemoryLog())) as srv,
            StreamClient(port=srv.port, timeout=60) as client,
        ):
            tp, tc, _, added = through_streams(chain, client, chunk)
        assert added == n_blocks
        n = len(msgs)
        print(
            f"{updates:>13} {n_blocks:>6} {n:>9} | {n / t_dec:>10,.0f} {n / t_con:>10,.0f} "
            f"{n / cpu_con:>10,.0f} | "
            f"{n / mp:>10,.0f} {n / mc:>10,.0f} | {n / sp:>10,.0f} {n / sc:>10,.0f} | "
            f"{n / tp:>10,.0f} {n / tc:>10,.0f}"
        )
        if n / cpu_con < TARGET:
            print(f"  below the {TARGET:,} msgs/s per core target for consume alone")


if __name__ == "__main__":
    main()
