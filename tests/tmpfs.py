"""A small real tmpfs for full-disk tests (issue 15 §3): ``small_tmpfs(path, size)``.

Mounting needs root, so a test run by another user is skipped with that reason, as the issue
asks; as root, a mount that fails is a missing peer (``require_peer``: a failure under CI).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_peer


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (``mount -o size=``) at ``path``; unmount afterwards."""
    if os.geteuid() != 0:
        pytest.skip("a full-disk test mounts a small tmpfs, which needs root (id -u is not 0)")
    path.mkdir(parents=True, exist_ok=True)
    done = None
    if shutil.which("mount") is not None:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
    why = "no mount command" if done is None else done.stderr.strip()
    require_peer("mount -t tmpfs", done is not None and done.returncode == 0, why)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)
