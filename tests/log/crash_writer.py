"""The crash test's two halves (issue 3 §5): a writer process and the checker.

``python tests/log/crash_writer.py DATA_DIR RUN THREADS`` appends to the stream ``crash``
(2 partitions, ``batch`` durability, small segments so rolls and lake seals happen) from several
threads and prints one line per acknowledged batch: ``ack <partition> <writer> <seq> <n>
<first_index>``. Each line is one ``os.write`` to the pipe (< PIPE_BUF, so atomic). The parent
SIGKILLs it at a random moment, reopens the data dir and calls ``check``: every acknowledged
record is present and byte-identical, the indexes are contiguous, and every stored record is a
whole record some writer wrote (no partial record is visible).

Payloads are a pure function of ``(writer, seq)`` so the checker can rebuild them.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

STREAM = "crash"
PARTITIONS = 2
SEGMENT_BYTES = 64 * 1024
TIME_LIMIT_S = 30.0


def config():
    from loglake.log import StreamConfig

    return StreamConfig(partitions=PARTITIONS, durability="batch", segment_bytes=SEGMENT_BYTES)


def expected(writer: int, seq: int) -> tuple[bytes, bytes, tuple[tuple[str, bytes], ...]]:
    """(data, key, headers) of record ``seq`` of ``writer``."""
    rnd = random.Random(writer * 1_000_003 + seq)
    data = b"w%d:s%d|" % (writer, seq) + rnd.randbytes(rnd.randrange(0, 1200))
    return data, b"%d:%d" % (writer, seq), (("writer", b"%d" % writer),)


def _writer_thread(log, writer: int, seed: int, deadline: float) -> None:
    from loglake.log import Entry

    rnd = random.Random(seed)
    seq = 0
    while time.monotonic() < deadline:
        p = rnd.randrange(PARTITIONS)
        n = rnd.randint(1, 20)
        entries = []
        for s in range(seq, seq + n):
            data, key, headers = expected(writer, s)
            entries.append(Entry(data, key=key, headers=headers))
        idx = log.append_many(STREAM, entries, partition=p)
        os.write(1, b"ack %d %d %d %d %d\n" % (p, writer, seq, n, idx[0]))
        seq += n


def main(argv: list[str]) -> int:
    from loglake.log import open_log

    data_dir, run, threads = argv[0], int(argv[1]), int(argv[2])
    os.write(1, b"opening\n")
    log = open_log(data_dir)
    log.create_stream(STREAM, config())
    os.write(1, b"ready\n")
    deadline = time.monotonic() + TIME_LIMIT_S
    ts = [
        threading.Thread(target=_writer_thread, args=(log, run * 100 + t, run * 7919 + t, deadline))
        for t in range(threads)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    log.close()
    return 0


@dataclass(frozen=True)
class Ack:
    partition: int
    writer: int
    seq: int
    n: int
    first_index: int


def parse_acks(out: bytes) -> list[Ack]:
    """Acks from whole lines only (a line cut by the kill was never a complete ack)."""
    acks = []
    for line in out.split(b"\n")[:-1]:
        parts = line.split()
        if parts and parts[0] == b"ack":
            acks.append(Ack(*map(int, parts[1:])))
    return acks


def check(data_dir: Path, acks: list[Ack], lake_seen: set[str] | None = None) -> int:
    """Reopen (running recovery) and verify; return how many records the log holds.
    ``lake_seen``: lake files already verified (they are immutable once named)."""
    from loglake.log import open_log

    with open_log(data_dir) as log:
        total = 0
        by_part: dict[int, dict[int, tuple[int, int]]] = {p: {} for p in range(PARTITIONS)}
        if STREAM not in log.streams():
            # the first writer was killed while it created the stream: nothing can have been
            # acknowledged yet (a push needs the stream), and there is nothing to check
            assert not acks, f"{len(acks)} acknowledged batches but no stream"
            return 0
        for p in range(PARTITIONS):
            info = log.stream_info(STREAM).partitions[p]
            assert info.first_index == 0
            recs = list(log.iter_records(STREAM, partition=p))
            assert [r.index for r in recs] == list(range(info.next_index)), "gap in indexes"
            for r in recs:
                w, s = map(int, r.key.split(b":"))
                assert (r.data, r.key, r.headers) == expected(w, s), f"bad record {p}/{r.index}"
                by_part[p][r.index] = (w, s)
            total += len(recs)
        for a in acks:
            for k in range(a.n):
                got = by_part[a.partition].get(a.first_index + k)
                assert got == (a.writer, a.seq + k), f"acknowledged record lost: {a} +{k}"
    check_lake(data_dir, by_part, lake_seen if lake_seen is not None else set())
    # ^ after close: every rolled segment has been sealed
    return total


def check_lake(
    data_dir: Path, by_part: dict[int, dict[int, tuple[int, int]]], seen: set[str]
) -> None:
    """Every lake file is whole, holds exactly its named index range, and each row is the
    record the log holds at that index."""
    import pyarrow.parquet as pq

    from loglake.log.lake_schema import LAKE_SCHEMA, lake_partition_dir, parse_lake_file_name

    for p in range(PARTITIONS):
        d = lake_partition_dir(data_dir, STREAM, p)
        files = sorted(d.glob("*.parquet")) if d.exists() else []
        nxt = 0
        for f in files:
            first, last = parse_lake_file_name(f.name) or (-1, -1)
            assert first == nxt, f"lake gap or overlap before {f}"
            nxt = last + 1
            if str(f) in seen:
                continue
            seen.add(str(f))
            t = pq.read_table(f, partitioning=None)
            assert t.schema == LAKE_SCHEMA
            rows = t.to_pylist()
            assert [r["index"] for r in rows] == list(range(first, last + 1)), f
            for r in rows:
                w, s = by_part[p][r["index"]]
                data, key, headers = expected(w, s)
                assert (r["data"], r["key"], r["partition"]) == (data, key, p), f
                assert [(h["key"], h["value"]) for h in r["headers"]] == list(headers)


def run_once(
    data_dir: Path, run: int, rnd: random.Random, threads: int = 3
) -> tuple[int, list[Ack]]:
    """One writer life: start, SIGKILL after a random delay, parse the acks. One life in four
    is killed while it opens the log (recovery, index rewrite, store compaction, seals of
    rolled segments); the others while appending. Returns (acknowledged batches, the acks)."""
    import signal
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, __file__, str(data_dir), str(run), str(threads)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first == b"opening\n", (first, proc.stderr.read() if proc.stderr else b"")
        if rnd.random() < 0.25:
            time.sleep(rnd.uniform(0.0, 0.03))
        else:
            ready = proc.stdout.readline()
            assert ready == b"ready\n", (ready, proc.stderr.read() if proc.stderr else b"")
            time.sleep(rnd.uniform(0.02, 0.4))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    acks = parse_acks(out)
    return len(acks), acks


def run_cycles(data_dir: Path, runs: int, seed: int, threads: int = 3) -> tuple[int, int]:
    """``runs`` writer lives on one data dir, each killed, each followed by a full check of
    every acknowledgement so far. Returns (acknowledged records, records in the log)."""
    rnd = random.Random(seed)
    all_acks: list[Ack] = []
    total = 0
    seen: set[str] = set()
    for run in range(runs):
        _, acks = run_once(data_dir, run, rnd, threads)
        all_acks += acks
        total = check(data_dir, all_acks, seen)
    return sum(a.n for a in all_acks), total


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
