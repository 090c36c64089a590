"""CPU seconds of process trees, from ``/proc``, for the Spark benchmarks.

Why: on a shared machine a job's wall time says more about the neighbours than about the job;
the CPU seconds (user + system, reaped children included) of the driver, its JVM and Spark's
Python daemon and workers say what the job cost.
"""

from __future__ import annotations

import os


def snapshot() -> tuple[dict[int, list[int]], dict[int, float]]:
    """Every live process's children, and its CPU seconds (utime stime cutime cstime)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(name))
        cpu[int(name)] = sum(int(x) for x in fields[11:15]) / tick
    return children, cpu


def tree_cpu(root: int | None = None) -> float:
    """CPU seconds of ``root`` (this process by default) and every live descendant."""
    children, cpu = snapshot()
    total, todo = 0.0, [os.getpid() if root is None else root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += children.get(pid, [])
    return total
