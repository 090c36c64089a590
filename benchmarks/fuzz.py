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
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.fuzz.runner

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
    ap.add_argument(
        "--candid-diff",
        type=int,
        metavar="EXAMPLES",
        default=0,
        help="instead: the Candid differential fuzzer against @dfinity/candid for this many "
        "batches (see candid_diff); --max-seconds bounds it",
    )
    ap.add_argument("--seed", type=int, default=33, help="(--candid-diff) hypothesis seed")
    args = ap.parse_args()
    if args.candid_diff:
        candid_diff(args.candid_diff, args.seed, args.max_seconds or 3600)
        return
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


if __name__ == "__main__":
    main()
