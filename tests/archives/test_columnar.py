"""The columnar WakuMessage decoder (``archives.columnar``) against each layout's own
``decode_record``, record for record, without Spark."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from loglake.archives import get_layout
from loglake.archives.columnar import decode_waku_batch
from loglake.archives.errors import BadRecord
from loglake.archives.layout import Layout

LAYOUTS = ["spec", "status-go"]


def _odd_records(layout: Layout, rng: random.Random, n: int) -> list[bytes]:
    """Good records with optional fields, and broken ones: truncated, garbage, repeated or
    unknown fields, bad UTF-8, no timestamp, over-long varints, empty."""
    out = []
    for _ in range(n):
        if layout.name == "spec":
            topic: bytes | str = "/t/é/x"
            extra: dict[str, object] = {
                "version": rng.choice([None, 0, 3]),
                "meta": rng.choice([None, b"mm"]),
                "ephemeral": rng.choice([None, True]),
            }
        else:
            topic = rng.randbytes(4)
            extra = {
                "sig": rng.randbytes(rng.randrange(70)),
                "third_party_id": rng.choice(["", "abc"]),
                "padding": rng.choice([None, b"pp"]),
            }
        ts = rng.choice([0, 1, 10**18 + rng.randrange(10**12)])
        r = layout.make_record(
            payload=rng.randbytes(rng.randrange(300)), topic=topic, timestamp_ns=ts, **extra
        )
        r = rng.choice(
            [
                r,
                r,
                r,
                r[: rng.randrange(len(r) + 1)],
                rng.randbytes(rng.randrange(12)),
                r + r[:8],
                r + b"\xa0\x06\x05",
                b"\x12\x02\xff\xfe" + r,
                r + b"\x12\x02\xff\xfe",
                b"",
                b"\x0a\x01x\x12\x01t",
                r + b"\x50" + b"\xff" * 11,
                r + b"\x50\x81\x80\x80\x80\x80\x80\x80\x80\x80\x7f",
            ]
        )
        out.append(r)
    return out


@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_the_vectorised_decoder_agrees_with_decode_record_record_for_record(layout_name):
    """The numpy decoder the archives-build job runs (``decode_waku_batch``) gives, for every
    record, what the layout's ``decode_record`` gives (time, topic, cap), or flags it bad
    where that raises; on a sliced Arrow column too."""
    layout = get_layout(layout_name)
    for seed in range(12):
        recs = _odd_records(layout, random.Random(seed), 300)
        col = pa.array(recs, type=pa.binary())
        if seed % 2:
            col, recs = col.slice(7, 200), recs[7:207]
        ts, topics, cap, bads = decode_waku_batch(layout_name, col)
        got_topics = topics.to_pylist()
        for i, raw in enumerate(recs):
            try:
                m = layout.decode_record(raw)
            except BadRecord:
                assert bads and bads[i] is not None, (seed, i, raw)
                continue
            assert not bads or bads[i] is None, (seed, i, raw)
            assert (int(ts[i]), got_topics[i], int(cap[i])) == (m[0], m[1], m[3]), (seed, i)
