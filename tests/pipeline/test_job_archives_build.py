"""``loglake job archives-build`` (issue 11 §1, §3): the control node's archives, built on Spark.

Every test compares with what ``ControlNode`` writes for the same stream (``data``, ``index``,
the torrent, the info hash), for both layouts. Streams are written through the real log with
small segments, so part of each stream is sealed to the lake (read natively) and part is the
live tail (read through the ``loglake`` source).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from coincurve import PrivateKey

from loglake.archives import ArchiveConfigError, ControlNode, MessageStore, community_id, get_layout
from loglake.archives.layout import Layout
from loglake.log import Entry, StreamConfig, open_log
from loglake.pipeline.errors import BadOption, JobFailed
from loglake.pipeline.jobs.archives_build import (
    STAGING_DIR,
    ArchivesBuildOptions,
    BadCommunityRecord,
    Community,
    communities_from_keys,
    run,
)
from loglake.streams.api import LocalStreams
from tests.archives.helpers import DAY, SPEC_TOPIC, START, WEEK, record

pytestmark = pytest.mark.spark

LAYOUTS = ["spec", "status-go"]
KEY = PrivateKey(bytes(range(1, 33)))
CID = community_id(KEY)
OTHER_TOPIC = {"spec": "/status/1/other/proto", "status-go": bytes.fromhex("0badcafe")}


def write_weeks(
    data_dir: Path,
    stream: str,
    layout: Layout,
    weeks: range,
    per_week: int = 40,
    seed: int = 0,
    in_order: bool = False,
) -> None:
    """``per_week`` messages a week (a few of 150 KB, so archives span several pieces; two
    topics; some sharing a timestamp), appended out of time order within each week, or in
    it (``in_order``: as a live community's stream mostly is)."""
    rng = random.Random(seed * 1000 + weeks.start)
    with open_log(data_dir) as log:
        if not log.has_stream(stream):
            log.create_stream(stream, StreamConfig(partitions=1, segment_bytes=64 * 1024))
        for w in weeks:
            recs = []
            for i in range(per_week):
                at = (
                    START
                    + w * WEEK
                    + rng.randrange(WEEK // (12 * 3600 * 10**9)) * 12 * 3600 * 10**9
                )
                size = 150_000 if i % 17 == 3 else rng.randrange(50, 900)
                payload = rng.randbytes(size)
                if i % 5 == 4:
                    extra = {"sig": b"\x02" * 65} if layout.name == "status-go" else {}
                    raw = layout.make_record(
                        payload=payload, topic=OTHER_TOPIC[layout.name], timestamp_ns=at, **extra
                    )
                else:
                    raw = record(layout, at, payload)
                recs.append((at, Entry(raw)))
            if in_order:
                recs.sort(key=lambda r: r[0])
            log.append_many(stream, [e for _, e in recs])


def control_build(data_dir: Path, root: Path, stream: str, layout: Layout, now: int, **kw):
    root.mkdir(parents=True, exist_ok=True)
    store = MessageStore(root / f"{CID}.sqlite")
    node = ControlNode(root, KEY, layout, store, **kw)
    with open_log(data_dir, readonly=True) as log:
        node.ingest_streams(LocalStreams(log), stream)
    out = node.build(now)
    store.close()
    return out


def job(spark, data_dir: Path, root: Path, layout: str, now: int, streams=None, **kw):
    comms = streams or (Community("c", CID),)
    return run(
        spark,
        ArchivesBuildOptions(
            str(data_dir), str(root), tuple(comms), layout=layout, now_ns=now, **kw
        ),
    )


def files(root: Path, cid: str = CID) -> dict[str, bytes]:
    out = {}
    for name, path in (
        ("data", root / cid / "data"),
        ("index", root / cid / "index"),
        ("torrent", root / f"{cid}.torrent"),
    ):
        out[name] = path.read_bytes() if path.exists() else None
    return out


def staging_empty(root: Path) -> bool:
    stage = root / STAGING_DIR
    return not stage.exists() or not any(stage.iterdir())


def assert_same(job_root: Path, ctl_root: Path, cid: str = CID) -> None:
    a, b = files(job_root, cid), files(ctl_root, cid)
    assert a["data"] is not None and len(a["data"]) > 0
    for name in ("data", "index", "torrent"):
        assert a[name] == b[name], f"{name} differs"


@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_output_is_byte_identical_to_the_control_node_over_many_weeks(spark, tmp_path, layout_name):
    layout = get_layout(layout_name)
    data = tmp_path / "data"
    write_weeks(data, "c", layout, range(0, 5))
    now = START + 5 * WEEK + 2 * DAY
    rep = job(spark, data, tmp_path / "job", layout_name, now)
    out = control_build(data, tmp_path / "ctl", "c", layout, now)
    assert_same(tmp_path / "job", tmp_path / "ctl")
    assert rep.new_archives == len(out.new) >= 5
    c = rep.communities[0]
    assert c.info_hash == out.torrent.info_hash
    assert (tmp_path / "job" / f"{CID}.magnet").read_text().strip() == out.torrent.magnet(CID)
    # both default to the layout's trackers (status-go's defaultAnnounceList for status-go)
    assert out.torrent.announce == layout.default_trackers
    assert c.windows == 5 and c.records == 5 * 40
    assert staging_empty(tmp_path / "job")

    # later weeks (and a catch-up over missed ones): appended, earlier pieces unchanged
    before = files(tmp_path / "job")["data"]
    write_weeks(data, "c", layout, range(5, 8), seed=1)
    now = START + 8 * WEEK + DAY
    rep = job(spark, data, tmp_path / "job", layout_name, now)
    out = control_build(data, tmp_path / "ctl", "c", layout, now)
    assert rep.communities[0].windows == 3 and rep.new_archives == len(out.new) >= 3
    assert_same(tmp_path / "job", tmp_path / "ctl")
    assert files(tmp_path / "job")["data"].startswith(before)

    # nothing due: nothing written
    rep = job(spark, data, tmp_path / "job", layout_name, now)
    assert rep.new_archives == 0
    assert_same(tmp_path / "job", tmp_path / "ctl")


def test_partial_window_and_topics_match_the_control_node(spark, tmp_path):
    layout = get_layout("spec")
    data = tmp_path / "data"
    write_weeks(data, "c", layout, range(0, 3))
    now = START + 2 * WEEK + 3 * DAY
    topics = (SPEC_TOPIC,)
    job(spark, data, tmp_path / "job", "spec", now, partial=True, topics=topics)
    store = MessageStore()
    node = ControlNode(tmp_path / "ctl", KEY, layout, store, list(topics))
    with open_log(data, readonly=True) as log:
        node.ingest_streams(LocalStreams(log), "c")
    out = node.build(now, partial=True)
    assert len(out.new) == 3
    assert_same(tmp_path / "job", tmp_path / "ctl")


@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_a_control_node_continues_from_what_the_job_wrote(spark, tmp_path, layout_name):
    layout = get_layout(layout_name)
    data = tmp_path / "data"
    write_weeks(data, "c", layout, range(0, 3))
    now = START + 3 * WEEK + DAY
    job(spark, data, tmp_path / "job", layout_name, now)
    written = files(tmp_path / "job")

    store = MessageStore(tmp_path / "job" / f"{CID}.sqlite")
    node = ControlNode(tmp_path / "job", KEY, layout, store)
    with open_log(data, readonly=True) as log:
        node.ingest_streams(LocalStreams(log), "c")
    assert node.build(now).new == []  # no rebuild
    assert files(tmp_path / "job") == written
    # its store knows which rows are archived: exactly the records in the job's archives
    in_archives = sum(
        len(layout.decode_archive(written["data"][e.offset : e.offset + e.size], e))
        for e in node.entries
    )
    flagged = store.db.execute("SELECT count(*) FROM archived").fetchone()[0]
    assert flagged == in_archives > 0
    assert store.last_archive_end_ns() == START + 3 * WEEK

    # the next week is built by the control node exactly as if it had built everything
    write_weeks(data, "c", layout, range(3, 4), seed=2)
    now = START + 4 * WEEK + DAY
    with open_log(data, readonly=True) as log:
        node.ingest_streams(LocalStreams(log), "c")
    assert len(node.build(now).new) >= 1
    store.close()
    control_build(data, tmp_path / "ctl", "c", layout, now)
    assert_same(tmp_path / "job", tmp_path / "ctl")


def _append_copies(data: Path, stream: str, picks: list[int]) -> list[bytes]:
    """Append again the records at the stream indexes ``picks`` (Waku messages received
    twice); returns every record of the stream, copies included."""
    with open_log(data) as log:
        recs = [r.data for r in log.read(stream, 0)]
        log.append_many(stream, [Entry(recs[i]) for i in picks])
    return recs + [recs[i] for i in picks]


@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_a_message_received_twice_is_archived_once_as_by_the_control_node(
    spark, tmp_path, layout_name
):
    """status-go keeps one row per message hash (persistence.go ``SaveWakuMessages``: INSERT
    OR REPLACE, ``hash`` the primary key): copies in the same lake file, in another one and in
    the live tail, and a record sent twice in a row, are archived once, by the job exactly as
    by the control node, whose store keeps the first copy (``MessageStore.add``)."""
    layout = get_layout(layout_name)
    data = tmp_path / "data"
    write_weeks(data, "c", layout, range(0, 3))
    _append_copies(data, "c", [3, 5, 41, 90, 90])  # weeks 1, 2 and 3 (index 90 three times)
    write_weeks(data, "c", layout, range(3, 4), seed=3)
    recs = _append_copies(data, "c", [1, 2, 119, 160])
    now = START + 4 * WEEK + DAY
    rep = job(spark, data, tmp_path / "job", layout_name, now)
    out = control_build(data, tmp_path / "ctl", "c", layout, now)
    assert_same(tmp_path / "job", tmp_path / "ctl")
    blob = files(tmp_path / "job")["data"]
    archived = [
        r for e in out.new for r in layout.decode_archive(blob[e.offset : e.offset + e.size], e)
    ]
    assert sorted(archived) == sorted(set(recs))  # every message, once
    assert rep.communities[0].records == len(set(recs)) == 4 * 40


def _with_bad_record(data: Path, layout: Layout) -> int:
    write_weeks(data, "c", layout, range(0, 2))
    with open_log(data) as log:
        (bad,) = log.append_many("c", [Entry(b"\xff\xff\xff not a WakuMessage")])
    write_weeks(data, "c", layout, range(2, 3), seed=3)
    return bad


@pytest.mark.parametrize("layout_name", LAYOUTS)
def test_a_bad_record_fails_the_job_naming_stream_and_index(spark, tmp_path, layout_name):
    layout = get_layout(layout_name)
    data = tmp_path / "data"
    bad = _with_bad_record(data, layout)
    with pytest.raises(BadCommunityRecord) as info:
        job(spark, data, tmp_path / "job", layout_name, START + 3 * WEEK + 1)
    assert info.value.stream == "c" and info.value.index == bad
    assert f"stream 'c' index {bad}" in str(info.value)
    assert files(tmp_path / "job") == {"data": None, "index": None, "torrent": None}
    assert staging_empty(tmp_path / "job")


def test_a_bad_record_is_skipped_and_counted_with_skip(spark, tmp_path):
    layout = get_layout("status-go")
    data = tmp_path / "data"
    bad = _with_bad_record(data, layout)
    now = START + 3 * WEEK + 1
    rep = job(spark, data, tmp_path / "job", "status-go", now, on_bad_record="skip")
    assert rep.bad_records == 1 and rep.communities[0].bad_sample[0][0] == bad
    control_build(data, tmp_path / "ctl", "c", layout, now)  # the control node skips it too
    assert_same(tmp_path / "job", tmp_path / "ctl")


def test_many_community_streams_in_one_job_one_output_each(spark, tmp_path):
    layout = get_layout("spec")
    data = tmp_path / "data"
    keys = tmp_path / "keys"
    keys.mkdir()
    for i in range(3):
        write_weeks(data, f"comm-{i}", layout, range(i, 3), per_week=15, seed=i)
        (keys / f"comm-{i}.key").write_text(PrivateKey(bytes([i + 7]) * 32).to_hex() + "\n")
    write_weeks(data, "unrelated", layout, range(0, 1), per_week=5)
    comms = communities_from_keys(str(data), "comm-*", key_dir=str(keys))
    assert [c.stream for c in comms] == ["comm-0", "comm-1", "comm-2"]
    now = START + 4 * WEEK + 1
    rep = job(spark, data, tmp_path / "job", "spec", now, streams=comms)
    assert [c.stream for c in rep.communities] == ["comm-0", "comm-1", "comm-2"]
    assert all(c.new_archives >= 1 for c in rep.communities)
    for i, c in enumerate(comms):
        key = PrivateKey(bytes([i + 7]) * 32)
        node = ControlNode(tmp_path / "ctl", key, layout, MessageStore())
        with open_log(data, readonly=True) as log:
            node.ingest_streams(LocalStreams(log), c.stream)
        node.build(now)
        assert_same(tmp_path / "job", tmp_path / "ctl", c.community_id)


def test_bad_options_are_typed_errors_before_spark(tmp_path):
    layout = get_layout("spec")
    data = tmp_path / "data"
    write_weeks(data, "c", layout, range(0, 1), per_week=3)
    write_weeks(data, "d", layout, range(0, 1), per_week=3)
    with pytest.raises(BadOption, match="no stream"):
        communities_from_keys(str(data), "nope-*", key_dir=str(tmp_path))
    kf = tmp_path / "k.key"
    kf.write_text(KEY.to_hex())
    with pytest.raises(BadOption, match="--key-dir"):
        communities_from_keys(str(data), "*", key_file=str(kf))
    with pytest.raises(BadOption, match="no key"):
        communities_from_keys(str(data), "*", key_dir=str(tmp_path))
    with pytest.raises(BadOption, match="fail or skip"):
        ArchivesBuildOptions(
            str(data), str(tmp_path / "r"), (Community("c", CID),), on_bad_record="x"
        )
    with pytest.raises(ArchiveConfigError, match="tracker 'ftp://x'"):
        ArchivesBuildOptions(
            str(data), str(tmp_path / "r"), (Community("c", CID),), announce=("ftp://x",)
        )
    with pytest.raises(BadOption, match="share"):
        ArchivesBuildOptions(
            str(data), str(tmp_path / "r"), (Community("c", CID), Community("d", CID))
        )


def test_cli_builds_and_prints_a_json_report(spark, tmp_path):
    from loglake.cli import main

    layout = get_layout("spec")
    data = tmp_path / "data"
    write_weeks(data, "c", layout, range(0, 2), per_week=10)
    kf = tmp_path / "ctl.key"
    kf.write_text(KEY.to_hex() + "\n")
    now = str((START + 2 * WEEK) // 10**9 + 5)
    args = ["job", "archives-build", "--data-dir", str(data), "--stream", "c", "--root",
            str(tmp_path / "job"), "--key-file", str(kf), "--now", now, "--json"]  # fmt: skip
    res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["new_archives"] >= 1
    control_build(data, tmp_path / "ctl", "c", layout, (START + 2 * WEEK) + 5 * 10**9)
    assert_same(tmp_path / "job", tmp_path / "ctl")


# -- a job killed midway -------------------------------------------------------------------------

KILLED_DRIVER = textwrap.dedent(
    """
    import os, signal, sys
    from loglake.pipeline import build_session
    from loglake.pipeline.jobs.archives_build import ArchivesBuildOptions, Community, run
    data, root, cid, layout, now, point = sys.argv[1:7]
    spark = build_session(master="local[1]", conf={"spark.driver.memory": "1g"})
    def fault(p):
        if p == point:
            os.kill(os.getpid(), signal.SIGKILL)
    run(spark, ArchivesBuildOptions(data, root, (Community("c", cid),), layout=layout,
                                    now_ns=int(now)), fault=fault)
    print("NOT KILLED", flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["parts", "committing"])
def test_a_killed_job_leaves_no_partial_archive_and_a_rerun_gives_the_same_bytes(
    spark, tmp_path, point
):
    layout = get_layout("status-go")
    data = tmp_path / "data"
    write_weeks(data, "c", layout, range(0, 3))
    now = START + 3 * WEEK + 1
    job(spark, data, tmp_path / "job", "status-go", START + 1 * WEEK + 1)  # week 0 committed
    committed = files(tmp_path / "job")
    write_weeks(data, "c", layout, range(3, 4), seed=5)
    now = START + 4 * WEEK + 1

    proc = subprocess.run(
        [sys.executable, "-c", KILLED_DRIVER, str(data), str(tmp_path / "job"), CID,
         "status-go", str(now), point],
        capture_output=True, timeout=300, start_new_session=True,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    seen = files(tmp_path / "job")
    if point == "parts":  # before the commit point: the old archives, whole
        assert seen == committed
    else:  # after it, between the data and index renames: the old index over a longer data
        assert seen["index"] == committed["index"] and seen["torrent"] == committed["torrent"]
        assert seen["data"].startswith(committed["data"])
        entries = layout.decode_index(seen["index"], len(seen["data"]))
        assert entries[-1].offset + entries[-1].size == len(committed["data"])

    rep = job(spark, data, tmp_path / "job", "status-go", now)  # the rerun
    assert rep.recovered == (1 if point == "committing" else 0)
    control_build(data, tmp_path / "ctl", "c", layout, now)
    assert_same(tmp_path / "job", tmp_path / "ctl")
    assert staging_empty(tmp_path / "job")


def test_one_job_per_root(tmp_path):
    from loglake.pipeline.jobs.archives_build import job_lock

    root = tmp_path / "job"
    root.mkdir()
    with job_lock(root), pytest.raises(JobFailed) as e, job_lock(root):
        pass
    assert str(e.value) == f"archives-build: another job is running on {root}"
    with job_lock(root):  # released with the job
        pass
    assert os.path.exists(root / ".archives-build.lock")


# -- a real cluster (issue 11 §3) ----------------------------------------------------------------


# run by the cluster application (``cluster_driver``: ``spark`` is its session on the cluster)
CLUSTER_DRIVER = textwrap.dedent(
    """
    from loglake.pipeline.jobs.archives_build import ArchivesBuildOptions, Community, run
    data, root, cid, now = argv
    assert spark.sparkContext.master == master
    result = {}
    for layout in ("spec", "status-go"):
        rep = run(spark, ArchivesBuildOptions(data + "/" + layout, root + "/" + layout,
                  (Community("c", cid),), layout=layout, now_ns=int(now)))
        result[layout] = rep.communities[0].info_hash
    """
)


@pytest.mark.slow
def test_the_job_on_a_standalone_cluster_equals_local(spark, cluster_driver, tmp_path):
    now = START + 4 * WEEK + 1
    for name in LAYOUTS:
        write_weeks(tmp_path / "data" / name, "c", get_layout(name), range(0, 4))
    hashes = cluster_driver.run(
        CLUSTER_DRIVER, str(tmp_path / "data"), str(tmp_path / "cluster"), CID, str(now)
    )
    for name in LAYOUTS:
        rep = job(spark, tmp_path / "data" / name, tmp_path / "local" / name, name, now)
        assert hashes[name] == rep.communities[0].info_hash
        assert_same(tmp_path / "cluster" / name, tmp_path / "local" / name)
