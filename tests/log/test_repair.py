"""``loglake log verify --repair`` (log/repair.py): a damaged copy of sealed history is rewritten
from the copy that verifies, in both directions, atomically, never from nothing, and only when
no writer holds the data dir. Driven through the CLI on real data dirs with real damage (a
flipped byte, a cut file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from loglake.log import CorruptSegment, StreamConfig, open_log
from loglake.log import fs as log_fs
from loglake.log.cli import command
from loglake.log.lake import LakeFile, check_lake_file, list_lake_files
from loglake.log.repair import RepairRefused, repair, scan_damage

PAYLOADS = [b"r%04d" % i + b"." * (i % 40) for i in range(300)]


def run(*args):
    return CliRunner().invoke(command, [str(a) for a in args], catch_exceptions=True)


@pytest.fixture
def data(tmp_path) -> Path:
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=2000, seal_to_lake=True))
        for i, p in enumerate(PAYLOADS):
            # some records with a key and headers: the segment's frames take the long form
            if i % 7 == 0:
                log.append("s", p, key=b"k%d" % i, headers=(("h", b"v"),))
            else:
                log.append("s", p)
        log.wait_for_seals()
    return tmp_path


def segments(data: Path) -> list[Path]:
    return sorted((data / "streams/s/0").glob("*.seg"))


def lake_files(data: Path) -> list[Path]:
    return sorted((data / "lake/s/partition=0").glob("*.parquet"))


def flip(path: Path, at: float = 0.5) -> bytes:
    raw = bytearray(path.read_bytes())
    raw[int(len(raw) * at)] ^= 0x10
    path.write_bytes(bytes(raw))
    return bytes(raw)


def flip_lake(path: Path) -> bytes:
    """A flipped bit inside the ``data`` column's page bytes, which the pages' CRC covers (a
    byte at a fixed share of the file may land in page headers or statistics, which no
    checksum covers, and the records there differ by run: their times are the clock's)."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    rg = meta.row_group(0)
    col = next(rg.column(i) for i in range(rg.num_columns) if rg.column(i).path_in_schema == "data")
    at = col.data_page_offset + col.total_compressed_size // 2
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x10
    path.write_bytes(bytes(raw))
    return bytes(raw)


def read_all(data: Path) -> list[tuple[int, int, bytes | None, tuple, bytes]]:
    with open_log(data, readonly=True) as log:
        return [
            (r.index, r.timestamp_ns, r.key, tuple(r.headers), r.data) for r in log.read("s", 0)
        ]


def lake_of(path: Path) -> LakeFile:
    first, last = map(int, path.name.removesuffix(".parquet").split("-"))
    return LakeFile(first, last, path)


def test_a_flipped_sealed_segment_is_rewritten_from_its_lake_copy(data):
    before = read_all(data)
    assert [r[4] for r in before] == PAYLOADS
    seg = segments(data)[1]
    original = seg.read_bytes()
    flip(seg)

    res = run("verify", "--data-dir", data)
    assert isinstance(res.exception, CorruptSegment) and res.exception.path == str(seg)
    assert "repairable" in res.output and seg.name in res.output
    assert read_all(data) == before  # served from the lake copy meanwhile

    res = run("verify", "--data-dir", data, "--repair", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    [d] = out["damage"]
    assert (d["kind"], d["path"], d["repaired"]) == ("segment", str(seg), True)
    assert seg.read_bytes() == original  # the writer's bytes, re-encoded exactly
    assert read_all(data) == before
    assert run("verify", "--data-dir", data).exit_code == 0


def test_a_cut_sealed_segment_is_rewritten_too(data):
    seg = segments(data)[0]
    original = seg.read_bytes()
    seg.write_bytes(original[: len(original) // 3])
    res = run("verify", "--data-dir", data, "--repair")
    assert res.exit_code == 0, res.output
    assert "1 repaired" in res.output and "0 unrecoverable" in res.output
    assert seg.read_bytes() == original


@pytest.mark.parametrize("damage", ["flip", "garbage"])
def test_a_damaged_lake_file_is_rewritten_from_its_sealed_segment(data, damage):
    before = read_all(data)
    lf = lake_files(data)[1]
    if damage == "flip":
        flip_lake(lf)
    else:
        lf.write_bytes(b"not parquet at all")
    with pytest.raises(CorruptSegment):
        check_lake_file(lake_of(lf))
    res = run("verify", "--data-dir", data)
    assert isinstance(res.exception, CorruptSegment) and res.exception.path == str(lf)

    res = run("verify", "--data-dir", data, "--repair")
    assert res.exit_code == 0, res.output
    assert "1 repaired" in res.output
    check_lake_file(lake_of(lf))
    assert read_all(data) == before
    assert run("verify", "--data-dir", data).exit_code == 0


def test_both_copies_bad_is_unrecoverable_and_nothing_is_rewritten(data):
    seg, lf = segments(data)[0], lake_files(data)[0]
    bad_seg, bad_lake = flip(seg), flip_lake(lf)
    seg2 = segments(data)[2]
    original2 = seg2.read_bytes()
    flip(seg2)  # a recoverable one beside: repaired; the run still fails

    res = run("verify", "--data-dir", data, "--repair", "--json")
    assert res.exit_code == 1
    damage = {d["path"]: d for d in json.loads(res.output)["damage"]}
    assert damage[str(seg)]["recoverable"] is False and damage[str(seg)]["repaired"] is False
    assert damage[str(lf)]["recoverable"] is False and damage[str(lf)]["repaired"] is False
    assert damage[str(seg2)]["repaired"] is True
    assert seg.read_bytes() == bad_seg and lf.read_bytes() == bad_lake
    assert seg2.read_bytes() == original2
    res = run("verify", "--data-dir", data, "--repair")
    assert res.exit_code == 1 and "unrecoverable" in res.output


def test_a_damaged_segment_without_a_lake_copy_is_unrecoverable(tmp_path):
    with open_log(tmp_path) as log:
        log.create_stream("s", StreamConfig(segment_bytes=2000, seal_to_lake=False))
        for p in PAYLOADS:
            log.append("s", p)
    seg = segments(tmp_path)[0]
    bad = flip(seg)
    report = repair(tmp_path)
    assert [(d.path, d.recoverable, d.repaired) for d in report.damage] == [
        (str(seg), False, False)
    ]
    assert seg.read_bytes() == bad


def test_repair_is_idempotent(data):
    flip(segments(data)[1])
    flip_lake(lake_files(data)[2])
    first = repair(data)
    assert len(first.repaired) == 2
    stamps = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in segments(data) + lake_files(data)}
    second = repair(data)
    assert second.damage == [] and second.segments == first.segments
    assert stamps == {
        p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in segments(data) + lake_files(data)
    }


def test_repair_refuses_while_a_writer_holds_the_data_dir(data):
    seg = segments(data)[0]
    bad = flip(seg)
    with open_log(data):
        res = run("verify", "--data-dir", data, "--repair")
        assert isinstance(res.exception, RepairRefused)
        assert "loglake serve" in str(res.exception)
        assert seg.read_bytes() == bad
        # the read-only check is fine beside the writer
        assert [d.path for d in scan_damage(data).damage] == [str(seg)]
    assert repair(data).repaired


def test_repaired_data_survives_a_restart(data):
    before = read_all(data)
    seg, lf = segments(data)[0], lake_files(data)[3]
    original = seg.read_bytes()
    flip(seg)
    flip_lake(lf)
    assert len(repair(data).repaired) == 2
    # a writer opens (recovery), appends, closes; then a fresh reader
    with open_log(data) as log:
        assert [r.data for r in log.read("s", 0)] == PAYLOADS
        log.append("s", b"after")
    after = read_all(data)
    assert after[:-1] == before and after[-1][4] == b"after"
    assert seg.read_bytes() == original
    check_lake_file(lake_of(lf))
    with open_log(data, readonly=True) as log:
        log.verify()


def test_a_crash_before_the_rename_leaves_the_old_file_and_the_next_run_repairs(data, monkeypatch):
    seg = segments(data)[1]
    original = seg.read_bytes()
    bad = flip(seg)

    def crash(src, dst):
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(log_fs, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        repair(data)
    monkeypatch.undo()
    assert seg.read_bytes() == bad  # the damaged file, whole: never a half-written one
    leftovers = list(seg.parent.glob(".*repair-tmp"))
    assert leftovers  # what the crash left behind ...
    assert len(repair(data).repaired) == 1
    assert not list(seg.parent.glob(".*repair-tmp"))  # ... is cleared by the next run
    assert seg.read_bytes() == original


def test_help_says_it_needs_the_writer_lock():
    res = run("verify", "--help")
    assert res.exit_code == 0 and "--repair" in res.output and "loglake serve" in res.output


def test_clean_data_dir_repairs_nothing(data):
    res = run("verify", "--data-dir", data, "--repair")
    assert res.exit_code == 0, res.output
    assert "0 damaged" in res.output
    assert len(list_lake_files(data / "lake/s/partition=0")) == len(lake_files(data))


def test_the_loglake_command_repairs_and_refuses_beside_a_writer(data):
    """The real command line, in its own process: one-line messages and exit statuses."""
    import subprocess
    import sys

    seg = segments(data)[1]
    original = seg.read_bytes()
    flip(seg)
    # the console command's module, in this interpreter (`make test` does not put the venv's
    # bin on PATH)
    cmd = [sys.executable, "-m", "loglake.cli", "log", "verify", "--data-dir", str(data)]
    with open_log(data):  # a writer, as `loglake serve` holds it
        res = subprocess.run([*cmd, "--repair"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 1
        assert "in use by a writer" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "repairable" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([*cmd, "--repair"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "1 repaired" in res.stdout
    assert seg.read_bytes() == original
    assert subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0


def test_a_compacted_lake_file_and_the_segments_it_spans_repair_each_other(data):
    """As the compaction job leaves the lake: one file over several sealed segments (written
    here with the lake's own writer), the files it covers gone."""
    from loglake.log.lake import read_lake_file, records_table, write_lake_table

    before = read_all(data)
    parts = lake_files(data)[:3]
    lfs = [lake_of(p) for p in parts]
    rows = [r for lf in lfs for r in read_lake_file(lf, "s", 0, lf.first, lf.last + 1, 10**6)]
    big = write_lake_table(parts[0].parent, records_table(rows, "s", 0))
    for p in parts:
        p.unlink()
    assert (big.first, big.last) == (lfs[0].first, lfs[-1].last)

    seg = segments(data)[1]  # inside the compacted range
    original = seg.read_bytes()
    flip(seg)
    report = repair(data)
    [d] = report.damage
    assert d.repaired and d.sources == (str(big.path),)
    assert seg.read_bytes() == original

    flip_lake(Path(big.path))
    report = repair(data)
    [d] = report.damage
    assert d.repaired and d.sources == tuple(str(p) for p in segments(data)[:3])
    check_lake_file(big)
    assert read_all(data) == before


def test_a_flipped_bit_anywhere_in_a_lake_file_is_corrupt_or_harmless_never_a_crash(data):
    """The lake's checker reads bytes from disk like any decoder: a bit flipped at any of
    any place (footer, schema, page headers, pages) gives ``CorruptSegment`` or, where no
    check covers it, a pass, never another exception (an ``IndexError`` escaped before)."""
    from loglake.log.api import CorruptSegment
    from loglake.log.lake import check_lake_file

    path = lake_files(data)[0]
    good = path.read_bytes()
    corrupt = 0
    for at in range(len(good)):
        raw = bytearray(good)
        raw[at] ^= 0x10
        path.write_bytes(bytes(raw))
        try:
            check_lake_file(lake_of(path))
        except CorruptSegment:
            corrupt += 1
    path.write_bytes(good)
    assert corrupt > 0
