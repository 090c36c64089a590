"""Sealing in a child process (``Sealer(processes=True)``, ``open_log(seal_processes=True)``:
what ``loglake serve`` and the node use, so a seal's CPU does not hold the server's GIL).

The lake files must be the ones an in-process seal writes; a child that dies fails only that
attempt (the job is retried with a new child); a damaged segment is still ``CorruptSegment``
naming the file (the exception crosses the process boundary); and while a layer over the file
primitives is installed, the seal stays in this process, where the layer is.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from concurrent.futures.process import BrokenProcessPool

import pyarrow.parquet as pq
import pytest

from loglake.log import StreamConfig, fs, open_log
from loglake.log.api import CorruptSegment
from loglake.log.lake import seal_segment
from loglake.log.sealer import Sealer
from tests.waiting import wait_until


def _fill(data_dir, seal_processes: bool) -> list[dict]:
    with open_log(data_dir, seal_processes=seal_processes) as log:
        log.create_stream("s", StreamConfig(segment_bytes=4000))
        for i in range(150):  # rolled every ~40 records: segments of plain records
            log.append_payloads("s", [b"plain %04d " % i * 8])
        for i in range(60):  # then segments of records with keys (the seal's row path)
            log.append("s", b"keyed %d " % i * 8, key=b"k", headers=(("h", b"%d" % i),))
        log.wait_for_seals()
        assert (log._sealer._pool is not None) == seal_processes  # a child did the seals
    rows = pq.read_table(data_dir / "lake" / "s", partitioning=None).to_pylist()
    for row in rows:
        row.pop("timestamp_ns")  # the appends' clock differs between the two logs
    return rows


def test_a_log_sealing_in_a_child_writes_the_lake_an_in_process_seal_writes(tmp_path):
    here = _fill(tmp_path / "thread", seal_processes=False)
    child = _fill(tmp_path / "child", seal_processes=True)
    assert len(here) > 150 and here[-1]["key"] == b"k"  # both kinds of segment were sealed
    assert child == here
    names = sorted(p.name for p in (tmp_path / "child" / "lake" / "s" / "partition=0").iterdir())
    assert names == sorted(
        p.name for p in (tmp_path / "thread" / "lake" / "s" / "partition=0").iterdir()
    )


def test_the_child_runs_elsewhere_a_dead_child_fails_one_call_and_the_next_gets_a_new_one():
    sealer = Sealer(processes=True)
    try:
        first = sealer.run(os.getpid)
        assert first != os.getpid()
        with pytest.raises(BrokenProcessPool):
            sealer.run(os._exit, 3)  # the child dies mid-job (killed, out of memory)
        second = sealer.run(os.getpid)
        assert second not in (first, os.getpid())
    finally:
        sealer.stop()


def test_with_a_file_layer_installed_the_seal_stays_in_this_process(monkeypatch):
    real = fs.write
    monkeypatch.setattr(fs, "write", lambda fd, data: real(fd, data))
    sealer = Sealer(processes=True)
    try:
        assert sealer.run(os.getpid) == os.getpid()
    finally:
        sealer.stop()


def test_a_damaged_segment_sealed_in_the_child_is_corrupt_segment_naming_it(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(seal_to_lake=False))
        log.append_payloads("s", [b"record %d" % i for i in range(20)])
    (seg,) = (tmp_path / "streams" / "s" / "0").glob("*.seg")
    raw = bytearray(seg.read_bytes())
    raw[len(raw) // 2] ^= 0x04
    seg.write_bytes(bytes(raw))
    sealer = Sealer(processes=True)
    try:
        with pytest.raises(CorruptSegment) as e:
            sealer.run(seal_segment, seg, 0, 20, tmp_path / "out", "s", 0)
    finally:
        sealer.stop()
    assert e.value.path == str(seg) and e.value.reason
    again = pickle.loads(pickle.dumps(e.value))
    assert (again.path, again.offset, again.reason, str(again)) == (
        e.value.path,
        e.value.offset,
        e.value.reason,
        str(e.value),
    )


def test_the_child_ends_when_its_parent_is_killed():
    """A server killed with SIGKILL never shuts its pool down: the child must not stay."""
    script = (
        "import os, sys\n"
        "from loglake.log.sealer import Sealer\n"
        "print(Sealer(processes=True).run(os.getpid), flush=True)\n"
        "os._exit(0)  # no stop(), no atexit: as after SIGKILL\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    child = int(out.stdout.split()[-1])

    def gone() -> bool:
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has ended
        except FileNotFoundError:
            return True

    wait_until(gone, timeout=15, what=f"the orphaned sealing child {child} to end")
