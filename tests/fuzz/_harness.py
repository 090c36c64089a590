"""The one atheris driver every ``tests/fuzz/fuzz_*.py`` harness runs through.

Why one driver: every harness has the same contract (issue 15 §2: "anything but the decoder's
typed error is a failure") and the same chores — seed a corpus from known-good encodings,
instrument loglake's code for coverage, hand libFuzzer its flags — so each harness only says
what it decodes (``one(data)``), which errors are the decoder's typed ones (``expected``) and
which bytes are good (``seeds()``).

A harness is a script: ``python tests/fuzz/fuzz_x.py -runs=N [libFuzzer flags] [corpus dirs]``.
With no corpus directory, the seeds are handed over as ``-seed_inputs`` (files in one folder
per harness under the temporary directory, rewritten each run) and new inputs stay in memory.
libFuzzer stops at the first failure, prints the traceback and writes the input as
``crash-<sha1>`` under ``-artifact_prefix``; a hang past ``-timeout`` seconds or memory past
``-rss_limit_mb`` is a failure too. With ``LOGLAKE_FUZZ_FINDINGS=DIR`` in the environment
(``benchmarks/fuzz.py`` sets it) a failure is recorded instead — one file per distinct
(exception type, raising line) in DIR, holding the first input that raised it — and fuzzing
goes on, so one run counts every finding.

The same harness is importable (``tests/fuzz/test_regressions.py`` calls its ``one`` on each
stored crash input, in process, without atheris).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType

FINDINGS_ENV = "LOGLAKE_FUZZ_FINDINGS"
"""Directory where a collecting run records findings (see the module docstring)."""


def check(one: Callable[[bytes], object], expected: tuple[type[BaseException], ...]) -> Callable:
    """``one`` wrapped so the decoder's typed errors count as a pass."""

    def run(data: bytes) -> None:
        with contextlib.suppress(expected):
            one(data)

    return run


def signature(exc: BaseException) -> str:
    """``Type@file:line`` of the innermost frame in loglake (else the innermost frame): what
    makes two failing inputs the same finding."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/loglake/" in f.filename or "/tests/fuzz/" in f.filename]
    f = (ours or frames or [None])[-1]
    where = f"{Path(f.filename).name}:{f.lineno}" if f is not None else "?"
    return f"{type(exc).__name__}@{where}"


def collecting(run: Callable[[bytes], None], out: Path) -> Callable[[bytes], None]:
    """``run`` that records each distinct unexpected exception in ``out`` and carries on."""
    out.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()

    def collect(data: bytes) -> None:
        try:
            run(data)
        except Exception as e:  # every escape is a finding; record it and keep fuzzing
            sig = signature(e)
            if sig in seen:
                return
            seen.add(sig)
            name = hashlib.sha1(sig.encode()).hexdigest()[:12]
            (out / f"{name}.bin").write_bytes(data)
            record = {"signature": sig, "error": f"{type(e).__name__}: {e}"[:300], "file": name}
            record["traceback"] = "".join(traceback.format_exception(e))[-4000:]
            with open(out / "findings.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    return collect


def _instrument(modules: tuple[str, ...]) -> None:
    """Coverage instrumentation of the Python code of ``modules`` (and their submodules), which
    must be imported already. Only the decoders a harness drives: instrumenting a function
    costs a few ms, and all of loglake would add seconds to every start."""
    import atheris

    done: set[int] = set()

    def fn(f: object) -> None:
        mod = getattr(f, "__module__", None) or ""
        if getattr(f, "__code__", None) is None or id(f) in done:
            return
        done.add(id(f))
        if not _within(mod, modules):  # e.g. ``dataclasses.field`` imported into a module
            return
        with contextlib.suppress(Exception):  # a builtin or an odd wrapper: left as it is
            atheris.instrument_func(f)

    def walk(obj: object, depth: int = 0) -> None:
        for v in list(vars(obj).values()):
            if isinstance(v, staticmethod | classmethod):
                v = v.__func__
            if isinstance(v, property):
                for acc in (v.fget, v.fset):
                    fn(acc)
            elif (
                isinstance(v, type)
                and depth < 2
                and v.__module__ == getattr(obj, "__name__", v.__module__)
            ):
                walk(v, depth + 1)
            else:
                fn(v)

    for name, mod in list(sys.modules.items()):
        if isinstance(mod, ModuleType) and _within(name, modules):
            walk(mod)


def _within(name: str, modules: tuple[str, ...]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


def main(
    one: Callable[[bytes], object],
    expected: tuple[type[BaseException], ...],
    seeds: Callable[[], Iterable[bytes]],
    instrument: tuple[str, ...],
) -> None:
    """Run the harness under atheris with ``sys.argv`` as libFuzzer's flags; ``instrument``
    names the modules (packages include their submodules) whose code guides it by coverage."""
    import atheris

    argv = list(sys.argv)
    run = check(one, expected)
    findings = os.environ.get(FINDINGS_ENV)
    if findings:
        run = collecting(run, Path(findings))
    if not any(not a.startswith("-") for a in argv[1:]):  # no corpus directory: seed inputs
        folder = Path(
            tempfile.gettempdir(), f"loglake-fuzz-seeds-{os.getuid()}", Path(argv[0]).stem
        )
        files = write_seeds(seeds(), folder)
        argv.append("-seed_inputs=" + ",".join(map(str, files)))
    _instrument(instrument)
    atheris.Setup(argv, run)
    atheris.Fuzz()


def write_seeds(seeds: Iterable[bytes], directory: Path) -> list[Path]:
    """Write ``seeds`` as files ``seed-NNNN`` in ``directory`` (each by an atomic rename, so two
    runs of one harness can share the folder); return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for i, s in enumerate(seeds):
        path = directory / f"seed-{i:04d}"
        tmp = directory / f".seed-{i:04d}.{os.getpid()}"
        tmp.write_bytes(s)
        os.replace(tmp, path)
        files.append(path)
    return files
