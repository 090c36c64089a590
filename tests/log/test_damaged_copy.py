"""A sealed segment that fails its checksums while its lake copy verifies is served from the
lake copy: the history exists, undamaged, in one of its two copies. It used to raise
``CorruptSegment`` for every read of the range. ``verify`` still names the damaged file."""

from __future__ import annotations

import logging

import pytest

from loglake.log import CorruptSegment, StreamConfig, open_log


def _build(data, seal_to_lake: bool) -> list[bytes]:
    payloads = [b"r%04d" % i + b"." * (i % 40) for i in range(120)]
    with open_log(data) as log:
        log.create_stream("s", StreamConfig(segment_bytes=2000, seal_to_lake=seal_to_lake))
        for p in payloads:
            log.append("s", p)
        log.wait_for_seals()
    return payloads


def _flip_first_sealed_segment(data) -> str:
    path = sorted((data / "streams/s/0").glob("*.seg"))[0]
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x04
    path.write_bytes(bytes(raw))
    return str(path)


def test_a_damaged_sealed_segment_is_served_from_its_lake_copy(tmp_path, caplog):
    payloads = _build(tmp_path, seal_to_lake=True)
    damaged = _flip_first_sealed_segment(tmp_path)
    with open_log(tmp_path) as log, caplog.at_level(logging.ERROR, logger="loglake"):
        assert [r.data for r in log.read("s", 0)] == payloads
        assert [d for _, d in log.read_payloads("s", 5, limit=3)] == payloads[5:8]
        assert [r.data for r in log.read("s", 0)] == payloads  # logged once per file
        logged = [r for r in caplog.records if "served from its lake copy" in r.getMessage()]
        assert len(logged) == 1
        with pytest.raises(CorruptSegment) as e:
            log.verify()
        assert e.value.path == damaged


def test_without_a_lake_copy_the_damage_is_still_an_error(tmp_path):
    _build(tmp_path, seal_to_lake=False)
    damaged = _flip_first_sealed_segment(tmp_path)
    with open_log(tmp_path) as log, pytest.raises(CorruptSegment) as e:
        log.read("s", 0)
    assert e.value.path == damaged
