"""CPU seconds of process trees, from ``/proc``, for the Spark benchmarks.

Why: on a shared machine a job's wall time says more about the neighbours than about the job;
the CPU seconds (user + system, reaped children included) of the driver, its JVM and Spark's
Python daemon and workers say what the job cost.
"""

from __future__ import annotations

import os
from collections.abc import Iterator


def _stats() -> Iterator[tuple[int, list[str]]]:
    """Every live process's pid and ``/proc/<pid>/stat`` fields after its name (the state
    first)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                yield int(name), f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile


def _tree(root: int | None, children: dict[int, list[int]]) -> Iterator[int]:
    """``root`` (this process by default) and every live descendant."""
    todo = [os.getpid() if root is None else root]
    while todo:
        pid = todo.pop()
        yield pid
        todo += children.get(pid, [])


def snapshot_split() -> tuple[dict[int, list[int]], dict[int, tuple[float, float]]]:
    """Every live process's children, and its user and system CPU seconds (reaped children
    included: utime + cutime, stime + cstime)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    split: dict[int, tuple[float, float]] = {}
    for pid, fields in _stats():
        children.setdefault(int(fields[1]), []).append(pid)
        user = (int(fields[11]) + int(fields[13])) / tick
        split[pid] = (user, (int(fields[12]) + int(fields[14])) / tick)
    return children, split


def snapshot() -> tuple[dict[int, list[int]], dict[int, float]]:
    """Every live process's children, and its CPU seconds (user + system)."""
    children, split = snapshot_split()
    return children, {pid: u + s for pid, (u, s) in split.items()}


def tree_cpu(root: int | None = None) -> float:
    """CPU seconds of ``root`` (this process by default) and every live descendant."""
    return sum(tree_user_sys(root))


def tree_user_sys(root: int | None = None) -> tuple[float, float]:
    """``tree_cpu`` split into user and system CPU seconds (reaped children included). Why:
    system time here is mostly page faults and page-cache writes, which a change of
    allocation or of where scratch files go moves without touching the user time."""
    children, split = snapshot_split()
    user = system = 0.0
    for pid in _tree(root, children):
        u, s = split.get(pid, (0.0, 0.0))
        user, system = user + u, system + s
    return user, system


def tree_faults(root: int | None = None) -> int:
    """Minor page faults of ``root`` (this process by default) and every live descendant,
    reaped children included (``minflt + cminflt``). Why: the system time of a stage is
    mostly fresh pages faulted in, and the count, unlike the time, does not grow with the
    neighbours' load: an allocation change is judged by it on a busy machine."""
    counts: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    for pid, fields in _stats():
        children.setdefault(int(fields[1]), []).append(pid)
        counts[pid] = int(fields[7]) + int(fields[8])
    return sum(counts.get(pid, 0) for pid in _tree(root, children))


def runqueue_wait(pids: set[int]) -> float:
    """Seconds the live threads of ``pids`` have spent runnable but waiting for a CPU
    (``/proc/<pid>/task/<tid>/schedstat``, second field, ns). Why: a process slowed beside
    another either waited for a CPU (this grows) or for something else, the disk or a peer."""
    total = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
    return total / 1e9


def steal_seconds() -> float:
    """CPU seconds the hypervisor gave to others since boot, all CPUs (``/proc/stat``'s
    ``steal``). Why: on a VM a phase slowed by the host's other guests looks like one slowed
    by what the benchmark runs beside it; this tells them apart."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0
