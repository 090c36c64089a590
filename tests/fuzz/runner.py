"""Run a fuzz harness in its own process and read what it did (shared by ``test_fuzz.py`` and
``benchmarks/fuzz.py``).

Why a subprocess per harness: libFuzzer owns the process (it installs signal handlers, exits
with ``exit()`` when done, and a crash ends the process), and coverage instrumentation changes
loglake's code objects — neither belongs in the pytest process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.fuzz._harness import FINDINGS_ENV

FUZZ_DIR = Path(__file__).resolve().parent
ROOT = FUZZ_DIR.parents[1]
HARNESSES = tuple(sorted(p.stem.removeprefix("fuzz_") for p in FUZZ_DIR.glob("fuzz_*.py")))
"""Every harness by name (``tests/fuzz/fuzz_<name>.py``)."""
PER_INPUT_TIMEOUT_S = 10
"""libFuzzer ``-timeout``: an input taking longer is a hang (a failure)."""
RSS_LIMIT_MB = 2048
"""libFuzzer ``-rss_limit_mb``: a process growing past it is a failure (memory exhaustion)."""

_DONE = re.compile(r"Done (\d+) runs in (\d+) second")
_STATUS = re.compile(r"^#(\d+)\s", re.M)
_ARTIFACT = re.compile(r"Test unit written to (\S+)")


@dataclass
class Result:
    """What one harness run did. ``findings`` are distinct failures (collecting runs: one per
    exception type and raising line; otherwise the one failure that stopped libFuzzer)."""

    name: str
    runs: int
    seconds: float
    returncode: int
    completed: bool
    """libFuzzer reported "Done N runs" (it was not stopped by a failure)."""
    findings: list[dict] = field(default_factory=list)
    log: str = ""

    @property
    def inputs_per_s(self) -> float:
        return self.runs / self.seconds if self.seconds else 0.0


def script(name: str) -> Path:
    return FUZZ_DIR / f"fuzz_{name}.py"


def run(
    name: str,
    runs: int,
    out: Path,
    *,
    collect: bool = False,
    max_total_time: int = 0,
    nice: int = 0,
    extra: tuple[str, ...] = (),
) -> Result:
    """Fuzz harness ``name`` for ``runs`` inputs (or ``max_total_time`` seconds, if set and
    reached first); artifacts and the log go to ``out``. ``collect``: record every distinct
    failure and go on (``LOGLAKE_FUZZ_FINDINGS``) instead of stopping at the first."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        str(script(name)),
        f"-runs={runs}",
        f"-timeout={PER_INPUT_TIMEOUT_S}",
        f"-rss_limit_mb={RSS_LIMIT_MB}",
        f"-artifact_prefix={out}/",
        "-print_final_stats=1",
        *extra,
    ]
    if max_total_time:
        cmd.append(f"-max_total_time={max_total_time}")
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    findings_dir = out / "findings"
    if collect:
        env[FINDINGS_ENV] = str(findings_dir)
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    seconds = time.monotonic() - t0
    log = proc.stderr + proc.stdout
    (out / "log.txt").write_text(log)
    done = _DONE.search(log)
    if done:
        count = int(done.group(1))
    else:
        statuses = _STATUS.findall(log)
        count = int(statuses[-1]) if statuses else 0
    findings = []
    if (findings_dir / "findings.jsonl").exists():
        lines = (findings_dir / "findings.jsonl").read_text().splitlines()
        findings = [json.loads(line) for line in lines]
    for artifact in _ARTIFACT.findall(log):  # a failure that stopped libFuzzer
        kind = Path(artifact).name.split("-", 1)[0]  # crash, timeout, oom, leak
        findings.append({"signature": kind, "file": artifact, "error": _tail_error(log)})
    return Result(name, count, seconds, proc.returncode, done is not None, findings, log)


def _tail_error(log: str) -> str:
    """The exception line of the traceback libFuzzer printed (or its own error line)."""
    for line in reversed(log.splitlines()):
        if re.match(r"^\w+(\.\w+)*(Error|Exception|Exit|Interrupt)\b", line) or "ERROR:" in line:
            return line[:300]
    return ""
