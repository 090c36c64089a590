"""A pull of damaged history is an error the client surfaces, never an empty answer.

A corrupt sealed segment or lake page made ``log.read`` raise ``CorruptSegment``, but a TCP
pull of that range answered ``messages: []``: a client could not tell damage from the end of
the stream. Here a real data dir is damaged on disk (one flipped byte), served by a real
server over loopback, and pulled with loglake's client and as raw frames.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loglake.log import StreamConfig, open_log
from loglake.streams import DamagedHistory, StreamClient
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService


def _damaged(data: Path, stream: str, files: str) -> Path:
    with open_log(data) as log:
        if stream == "s":  # sealed segments kept on disk, no lake copy
            log.create_stream("s", StreamConfig(segment_bytes=3000, seal_to_lake=False))
        else:  # history served from the lake only (the segments are trimmed)
            log.create_stream("t", StreamConfig(segment_bytes=3000, retention_records=1))
        for i in range(80):
            log.append(stream, b"%s%04d" % (stream.encode(), i) + b"." * 40)
        log.wait_for_seals()
        log.enforce_retention()
    path = sorted(data.glob(files))[0]
    raw = bytearray(path.read_bytes())
    at = len(raw) // 2  # a segment: inside a record's bytes
    if path.suffix == ".parquet":  # the middle of the data column's pages, whose CRC fails
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(path).metadata.row_group(0)
        col = next(meta.column(i) for i in range(meta.num_columns)
                   if meta.column(i).path_in_schema == "data")  # fmt: skip
        at = col.data_page_offset + col.total_compressed_size // 2
    raw[at] ^= 0x10
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize(
    ("stream", "files"), [("s", "streams/s/0/*.seg"), ("t", "lake/t/partition=0/*.parquet")]
)
def test_a_pull_of_damaged_history_raises_damaged_history(tmp_path, stream, files):
    path = _damaged(tmp_path / "data", stream, files)
    with (
        open_log(tmp_path / "data") as log,
        BackgroundServer(StreamService(log)) as srv,
        StreamClient(port=srv.port) as c,
    ):
        with pytest.raises(DamagedHistory) as e:
            c.pull(stream, 0, 100)
        assert e.value.reason.startswith(f"damaged history: stream {stream!r} partition 0")
        assert path.name in e.value.reason  # names the damaged file
        # the connection stays usable, and undamaged history past the damage still reads
        tail = c.pull(stream, 79, 10)
        assert [m.index for m in tail] == [79]
