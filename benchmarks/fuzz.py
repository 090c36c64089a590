"""Fuzz every decoder for a fixed number of inputs and report inputs/s and findings per decoder.

Each harness (``tests/fuzz/fuzz_<name>.py``, atheris + libFuzzer, seeded with known-good
encodings) runs in its own process with ``LOGLAKE_FUZZ_FINDINGS`` set, so a failure — any
exception but the decoder's typed error, or a broken round-trip property — is recorded (one
file per exception type and raising line, holding the first input) and fuzzing goes on; a hang
past 10 s or memory past 2 GB still stops the harness and is counted as a finding. Issue 15 §2:
≥ 1,000,000 inputs per decoder.

    .venv/bin/python benchmarks/fuzz.py [--inputs 1000000] [--harness NAME ...] [--jobs 1]
        [--max-seconds 0] [--nice 10] [--out benchmarks/out/fuzz]

Inputs/s is inputs over the harness's wall time, start-up (imports, instrumentation) included,
on whatever else the machine was doing; ``--jobs`` runs that many harnesses at once. A summary
goes to ``<out>/summary.json``; findings (inputs and tracebacks) stay under ``<out>/<name>/``.

Differential fuzzers (``--diff``): loglake against the reference implementations
(``tests/differential/fuzzers.py``: BARE vs @bare-ts/lib, SDS vs @waku/sds, archive protobufs vs
protoc-built classes, torrents vs libtorrent), each for ``--diff-seconds``, seeded (the seed is
printed; ``--seed`` replays a run), with inputs compared per second and every disagreement.
``--plant NAME`` runs a planted bug's fuzzer (``tests/differential/plants.py``) until its first
catch and prints the inputs and seconds it took.

    .venv/bin/python benchmarks/fuzz.py --diff [--fuzzer NAME ...] [--diff-seconds 60] [--seed N]
    .venv/bin/python benchmarks/fuzz.py --diff --plant NAME [--plant NAME ...] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.fuzz, tests.differential

from tests.fuzz import runner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=1_000_000, help="inputs per harness")
    ap.add_argument(
        "--harness", action="append", choices=runner.HARNESSES, help="(repeatable) default: all"
    )
    ap.add_argument("--jobs", type=int, default=1, help="harnesses run at once")
    ap.add_argument(
        "--max-seconds",
        type=int,
        default=0,
        help="stop a harness after this many seconds of fuzzing even if short of --inputs "
        "(0: no limit); the report says how many inputs it ran",
    )
    ap.add_argument("--nice", type=int, default=10, help="niceness of the fuzzing processes")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/fuzz"))
    diff = ap.add_argument_group("differential fuzzers")
    diff.add_argument("--diff", action="store_true", help="run the differential fuzzers instead")
    diff.add_argument("--fuzzer", action="append", help="(repeatable) default: all")
    diff.add_argument("--diff-seconds", type=float, default=60.0, help="time budget per fuzzer")
    diff.add_argument("--seed", type=int, help="default: a random one (printed, for replay)")
    diff.add_argument("--plant", action="append", help="(repeatable) a planted bug to catch")
    diff.add_argument(
        "--candid-diff",
        type=int,
        metavar="EXAMPLES",
        default=0,
        help="instead: the Candid differential fuzzer against @dfinity/candid for this many "
        "batches (see candid_diff; --seed, default 33); --max-seconds bounds it",
    )
    args = ap.parse_args()
    if args.candid_diff:
        seed = 33 if args.seed is None else args.seed
        candid_diff(args.candid_diff, seed, args.max_seconds or 3600)
        return
    if args.diff or args.plant:
        raise SystemExit(run_differential(args))
    names = args.harness or list(runner.HARNESSES)
    args.out.mkdir(parents=True, exist_ok=True)

    def one(name: str) -> runner.Result:
        r = runner.run(
            name,
            args.inputs,
            args.out / name,
            collect=True,
            nice=args.nice,
            max_total_time=args.max_seconds,
        )
        status = "done" if r.completed else f"STOPPED (exit {r.returncode})"
        print(
            f"{name:20} {r.runs:>10,} inputs {r.seconds:8.1f} s {r.inputs_per_s:8,.0f} inputs/s "
            f"{len(r.findings)} findings  {status}",
            flush=True,
        )
        for f in r.findings:
            print(f"    {f['signature']}: {f.get('error', '')[:160]}", flush=True)
        return r

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(one, names))
    summary = {
        r.name: {
            "inputs": r.runs,
            "seconds": round(r.seconds, 1),
            "inputs_per_s": round(r.inputs_per_s),
            "completed": r.completed,
            "findings": [{k: f.get(k) for k in ("signature", "error", "file")} for f in r.findings],
        }
        for r in results
    }
    previous = args.out / "summary.json"
    if previous.exists():  # keep other harnesses' figures from earlier runs
        summary = json.loads(previous.read_text()) | summary
    previous.write_text(json.dumps(summary, indent=1) + "\n")
    print()
    print(f"{'decoder':20} {'inputs':>10} {'inputs/s':>9} findings")
    for name, s in sorted(summary.items()):
        print(f"{name:20} {s['inputs']:>10,} {s['inputs_per_s']:>9,} {len(s['findings'])}")


def run_differential(args: argparse.Namespace) -> int:
    """The differential fuzzers for a longer run (or the planted bugs); 1 if any disagreed or a
    plant went uncaught."""
    import random

    from tests.differential.fuzzers import FUZZERS
    from tests.differential.peer import NodePeer, available
    from tests.differential.plants import PLANTS

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    print(f"seed {seed} (replay: --seed {seed})", flush=True)
    plants = [PLANTS[p] for p in args.plant or []]
    unknown = [n for n in args.fuzzer or [] if n not in FUZZERS]
    if unknown:
        print(f"unknown fuzzer {unknown[0]!r}: one of {', '.join(FUZZERS)}", file=sys.stderr)
        return 2
    names = [p.fuzzer for p in plants] or args.fuzzer or list(FUZZERS)
    peer = None
    if any(FUZZERS[n].needs_peer for n in names):
        if not available():
            print("node or a reference package is missing: make node-deps", file=sys.stderr)
            return 2
        peer = NodePeer()
    failed = False
    try:
        if plants:
            for plant in plants:
                with plant.apply():
                    out = FUZZERS[plant.fuzzer].run(
                        peer,
                        examples=10**9,
                        seed=seed,
                        max_seconds=args.diff_seconds,
                        stop_at_first=True,
                    )
                if out.first_catch is None:
                    failed = True
                    what = f"NOT caught in {out.cases:,} inputs, {out.seconds:.1f} s"
                    print(f"{plant.name:22} {what}")
                    continue
                n, secs = out.first_catch
                print(f"{plant.name:22} caught after {n:,} inputs, {secs:.2f} s ({plant.what})")
                print(f"    {out.disagreements[0][:300]}")
            return int(failed)
        print(f"{'fuzzer':14} {'reference':22} {'inputs':>10} {'seconds':>8} {'inputs/s':>9} found")
        for name in names:
            f = FUZZERS[name]
            out = f.run(peer, examples=10**9, seed=seed, max_seconds=args.diff_seconds)
            print(
                f"{name:14} {f.reference:22} {out.cases:>10,} {out.seconds:>8.1f} "
                f"{out.cases_per_second:>9,.0f} {len(out.disagreements)}",
                flush=True,
            )
            for d in out.disagreements[:5]:
                print(f"    {d[:300]}")
            failed |= bool(out.disagreements)
    finally:
        if peer is not None:
            peer.close()
    return int(failed)


# -- Candid against @dfinity/candid --------------------------------------------------------------
def candid_diff(examples: int, seed: int, max_seconds: float) -> None:
    """The ``make test`` Candid differential fuzzer (``tests/differential/test_candid.py``), run
    longer: random types and values both ways, and mutants of the reference's bytes.

    Two passes: value mutants under the reference's type table (what ``make test`` asserts:
    any disagreement is a defect), then mutants anywhere, type table included, which also
    compare the subtyping rules (record fields missing under an ``opt``, unknown variant tags,
    the ``opt`` special rule) — printed as found, with their count.
    """
    from tests.differential import candid
    from tests.differential._run import run
    from tests.differential.peer import DiffPeer

    with DiffPeer() as peer:
        for header in (False, True):
            name = "candid, mutants anywhere" if header else "candid, value mutants"
            out = run(
                name,
                candid.batches,
                lambda b, h=header: candid.check(peer, b, header_mutants=h),
                examples=examples,
                seed=seed,
                max_seconds=max_seconds,
            )
            print(f"{out.report(limit=10)}\n  {out.cases / max(out.seconds, 1e-9):,.0f} cases/s")
            spec = candid.SPEC_OVER_REFERENCE
            print(f"  {len(spec)} mutants where loglake follows the spec and @dfinity/candid not:")
            for line in spec[:5]:
                print(f"    {line}")
            spec.clear()


if __name__ == "__main__":
    main()
