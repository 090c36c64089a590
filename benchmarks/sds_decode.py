"""The sds-audit decoder alone, without Spark: the C kernel (``sds/_decode.c``) against the
numpy path it replaces (``sds.columnar._scan``), on the same records in one process,
alternating, in µs of CPU per record.

Why alternating in one process: on a shared machine the neighbours change from one minute to
the next; pairs of runs side by side see the same neighbours. Records: the first ``--records``
from ``--skip`` of a channel's lake files (``benchmarks/sds.py --audit`` writes one; a record
of its channel carries a 200-entry causal history, ~20 KB).

    .venv/bin/python benchmarks/sds_decode.py --lake /tmp/a35s3/c200k/data/lake/sds.bench
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import time

import pyarrow as pa
import pyarrow.parquet as pq

from loglake.sds.bloom import BloomFilter
from loglake.sds.columnar import DecodeState, _decode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lake", required=True, help="a stream's lake folder (partition=*/...)")
    ap.add_argument("--channel", default="bench", help="the SDS channel id (default: bench)")
    ap.add_argument("--records", type=int, default=12_000, help="records decoded a run")
    ap.add_argument("--skip", type=int, default=90_000, help="records skipped (full histories)")
    ap.add_argument("--pairs", type=int, default=5, help="kernel/numpy pairs of runs")
    ap.add_argument("--batch", type=int, default=10_000, help="records a batch (the job's)")
    args = ap.parse_args()
    if _decode is None:
        raise SystemExit("error: loglake.sds._decode is not built (make framer)")
    files = sorted(glob.glob(os.path.join(args.lake, "partition=*", "*.parquet")))
    if not files:
        raise SystemExit(f"error: no Parquet files under {args.lake}")
    # lake files are named by their index range: read only those holding the records wanted
    columns = ["partition", "index", "timestamp_ns", "data"]
    parts, seen = [], 0
    for f in sorted(files, key=os.path.basename):
        rows = pq.ParquetFile(f).metadata.num_rows
        if seen + rows > args.skip:
            parts.append(pq.read_table(f, columns=columns))
        seen += rows
        if seen >= args.skip + args.records:
            break
    table = pa.concat_tables(parts).sort_by("index")
    table = table.slice(max(0, args.skip - (seen - table.num_rows)), args.records).combine_chunks()
    batches = table.to_batches(max_chunksize=args.batch)
    n = table.num_rows

    def run(kernel: bool) -> float:
        state = DecodeState(args.channel, BloomFilter().n_bytes, kernel=kernel)
        start = time.process_time()
        for b in batches:
            state.decode(b)
        return (time.process_time() - start) / n * 1e6

    run(True), run(False)  # imports and first touch of the buffers
    got: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.pairs):
        for kernel in (True, False):
            got[kernel].append(run(kernel))
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    for kernel, name in ((True, "C kernel"), (False, "numpy _scan")):
        v = got[kernel]
        print(
            f"{name}: median {statistics.median(v):.1f} µs CPU/record "
            f"(min {min(v):.1f}, max {max(v):.1f}; {n:,} records, {args.pairs} runs)"
        )
    print(f"load {load}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
