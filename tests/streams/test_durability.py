"""Acknowledged pushes survive a SIGKILL of ``loglake serve`` (batch durability, embedded log)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from loglake.streams.client import StreamClient
from tests.procs import wait_port


def start(data_dir, port) -> subprocess.Popen:
    args = ["serve", "--data-dir", str(data_dir), "--port", str(port), "--durability", "batch"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "loglake.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc)
    except BaseException:
        proc.kill()
        raise
    return proc


@pytest.mark.slow
def test_confirmed_pushes_survive_sigkill(tmp_path, port) -> None:
    proc = start(tmp_path, port)
    confirmed: dict[int, bytes] = {}
    try:
        with StreamClient(port=port, timeout=10, window=200) as c:
            c.create_stream("d", 2)
            for round_ in range(5):
                datas = [f"{round_}:{i}".encode() * 20 for i in range(400)]
                for idx, d in zip(c.push_many("d", datas, 1), datas, strict=True):
                    confirmed[idx] = d
            # more pushes in flight, then the kill: those may or may not be stored
            c.sock.sendall(c.core.push_frames(c._address("d", 1), [b"unconfirmed"] * 300)[1])
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    proc = start(tmp_path, port)
    try:
        with StreamClient(port=port, timeout=10) as c:
            got = {}
            index = 0
            while msgs := c.pull("d", index, 1000, 1):
                got.update((m.index, m.data) for m in msgs)
                index = msgs[-1].index + 1
        assert len(confirmed) == 2000
        for idx, data in confirmed.items():  # every acknowledged record, byte-identical
            assert got[idx] == data
        assert sorted(got) == list(range(len(got)))  # no holes, no partial record
        assert all(d == b"unconfirmed" for i, d in got.items() if i not in confirmed)
    finally:
        proc.terminate()
        proc.wait(30)
