"""``loglake job cardinal-blocks`` (issue 12 §1): Cardinal blocks as Parquet tables by Structured
Streaming — every block once, the canonical view equal to the single-process consumer's chain
(forks, reorgs within the threshold, one deeper than it on a reorg channel, two redundant
producers), bad records in ``rejects`` while the query runs on, options checked before any work,
and a query killed with SIGKILL mid-stream and restarted from its checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from loglake.cardinal.blocks import Block, BlockRef, ChainUpdate, ReorgEvent
from loglake.cardinal.cli import consume_topic, produce_chain
from loglake.cardinal.codec import encode
from loglake.cardinal.messages import BatchMsg, SubBatchMsg
from loglake.cardinal.synthetic import synthetic_chain
from loglake.cardinal.transport import envelope, partition_for
from loglake.log import Entry, StreamConfig, open_log
from loglake.pipeline.errors import BadOption
from loglake.pipeline.jobs.cardinal_blocks import BATCHES, CardinalBlocksOptions
from loglake.streams.api import LocalStreams

TOPIC = "chain"
TOPICS = (TOPIC, f"{TOPIC}.state")
PARTITIONS = 3
THRESHOLD = 8
DEEP = 10  # deeper than THRESHOLD: the producer sends it on a reorg channel


# -- input and the single-process reference ----------------------------------------------------


def make_input(data_dir: Path, blocks: int = 50, producers: int = 2) -> list[tuple[str, int, int]]:
    """A synthetic chain sent by ``producers`` redundant producers, after five bad records;
    return the (topic, partition, offset) of the bad records."""
    chain = synthetic_chain(blocks, deep_reorg=DEEP)
    target = chain.canonical[5]
    sub_id = target.batches["state/"].id
    planted = [
        (TOPIC, 0, b"\x80"),  # the envelope's key length is cut short
        (TOPIC, 1, envelope(b"\x00" + target.hash, b"\x01")),  # a Batch value that is not Avro
        (TOPIC, 2, envelope(b"\x09" + b"\x00" * 32, b"")),  # no such message type
    ]
    # well-formed but inconsistent: an index past ItemCount; a key under no announced prefix
    k, v = encode(SubBatchMsg(target.hash, sub_id, 99, (), {"state/x": b"1"}))
    planted.append((f"{TOPIC}.state", partition_for(k, PARTITIONS), envelope(k, v)))
    k, v = encode(BatchMsg(target.hash, "zzz/nowhere", b"1"))
    planted.append((TOPIC, partition_for(k, PARTITIONS), envelope(k, v)))
    log = open_log(data_dir)
    where = []
    try:
        for t in TOPICS:
            log.create_stream(t, StreamConfig(partitions=PARTITIONS))
        for topic, p, data in planted:
            (idx,) = log.append_many(topic, [Entry(data)], partition=p)
            where.append((topic, p, idx))
        for _ in range(producers):
            produce_chain(
                LocalStreams(log), TOPIC, blocks, deep_reorg=DEEP, reorg_threshold=THRESHOLD
            )
    finally:
        log.close()
    return where


def single_process_chain(data_dir: Path, scratch: Path) -> dict[int, Block]:
    """The chain (number → block) ``loglake cardinal consume`` ends with on a copy of the input,
    applying its chain updates and reorg notices in order."""
    copy = scratch / "single-process"
    shutil.copytree(data_dir, copy)
    events: list[ChainUpdate | ReorgEvent] = []
    log = open_log(copy)
    try:
        consume_topic(
            LocalStreams(log), TOPIC, "sp", reorg_threshold=THRESHOLD, on_event=events.append
        )
    finally:
        log.close()
    chain: dict[int, Block | BlockRef] = {}
    for ev in events:
        if isinstance(ev, ReorgEvent):
            if not ev.complete:
                for n in [n for n in chain if n > ev.number]:
                    del chain[n]
            continue
        for b in ev.removed:
            assert chain[b.number].hash == b.hash
            del chain[b.number]
        for b in ev.added:
            chain[b.number] = b
    out = {n: b for n, b in chain.items() if isinstance(b, Block)}
    assert len(out) == len(chain)
    return out


def job_chain(spark, out_dir: Path) -> dict[int, tuple[str, dict[str, bytes], set[str]]]:
    """number → (hash, values, deletes) of the job's canonical view."""
    from loglake.pipeline.cardinal import canonical, canonical_chain

    heads = {r["number"]: r["hash"] for r in canonical_chain(spark, out_dir).collect()}
    got: dict[int, tuple[str, dict[str, bytes], set[str]]] = {
        n: (h, {}, set()) for n, h in heads.items()
    }
    for r in canonical(spark, out_dir).collect():
        h, values, deletes = got[r["number"]]
        assert r["hash"] == h
        if r["key"] is None:
            continue
        if r["deleted"]:
            deletes.add(r["key"])
        else:
            values[r["key"]] = bytes(r["value"])
    return got


def assert_same_chain(spark, out_dir: Path, expected: dict[int, Block]) -> None:
    got = job_chain(spark, out_dir)
    assert sorted(got) == sorted(expected)
    for n, b in expected.items():
        h, values, deletes = got[n]
        assert h == b.hash.hex(), f"block #{n}"
        assert values == b.values, f"block #{n}"
        assert deletes == b.deletes, f"block #{n}"


def assert_each_block_once(spark, out_dir: Path) -> int:
    from loglake.pipeline.cardinal import table

    rows = table(spark, out_dir, "blocks").select("hash", "key", "deleted", "batch_id").collect()
    keys = [(r[0], r[1], r[2]) for r in rows]
    assert len(keys) == len(set(keys)), "a block's rows were written twice"
    per_block = {}
    for r in rows:
        per_block.setdefault(r[0], set()).add(r[3])
    assert all(len(b) == 1 for b in per_block.values()), "a block written by two micro-batches"
    return len(per_block)


def options(d: Path, out: Path, **kw) -> CardinalBlocksOptions:
    return CardinalBlocksOptions(str(d), TOPICS, str(out), reorg_threshold=THRESHOLD, **kw)


# -- options (no Spark) -----------------------------------------------------------------------


@pytest.fixture
def small_input(tmp_path):
    d = tmp_path / "data"
    log = open_log(d)
    try:
        for t in TOPICS:
            log.create_stream(t, StreamConfig(partitions=2))
    finally:
        log.close()
    return d


@pytest.mark.parametrize(
    ("change", "option"),
    [
        ({"data_dir": "/nonexistent/dir"}, "--data-dir"),
        ({"topics": ()}, "--topic"),
        ({"topics": ("chain", "nope")}, "--topic"),
        ({"topics": ("bad name!",)}, "--topic"),
        ({"topics": ("chain", "chain")}, "--topic"),
        ({"reorg_threshold": 0}, "--reorg-threshold"),
        ({"reorg_threshold": 2**31}, "--reorg-threshold"),  # over Avro's int: the CLI's cap
        ({"prefixes": ("foo/(",)}, "--prefix"),
        ({"max_records_per_trigger": 0}, "--max-records-per-trigger"),
        ({"max_records_per_trigger": 2**63}, "--max-records-per-trigger"),  # over Spark's long
        ({"follow_seconds": -1.0}, "--follow"),
    ],
)
def test_bad_options_are_refused_before_any_work_naming_the_option(
    small_input, tmp_path, change, option
):
    base = {
        "data_dir": str(small_input),
        "topics": TOPICS,
        "out_dir": str(tmp_path / "out"),
        "reorg_threshold": THRESHOLD,
    }
    with pytest.raises(BadOption) as e:
        CardinalBlocksOptions(**{**base, **change}).validate()
    assert e.value.option == option
    assert not (tmp_path / "out").exists(), "nothing is written before the options are good"


def test_out_inside_the_data_dir_is_refused(small_input):
    with pytest.raises(BadOption, match="--out"):
        options(small_input, small_input / "tables").validate()


def test_a_restart_with_other_options_is_refused_naming_the_option(small_input, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    identity = {
        "plan": 4,
        "data_dir": str(small_input),
        "topics": list(TOPICS),
        "reorg_threshold": THRESHOLD,
        "prefixes": [".*"],
    }
    (out / "_job.json").write_text(json.dumps(identity))
    options(small_input, out).validate()
    with pytest.raises(BadOption) as e:
        CardinalBlocksOptions(str(small_input), TOPICS, str(out), reorg_threshold=9).validate()
    assert e.value.option == "--reorg-threshold"


def test_an_output_of_the_two_stage_plan_is_refused(small_input, tmp_path):
    """An output written before the group key moved into the JVM (no ``plan`` in
    ``_job.json``): its checkpoint holds another query's operators and state."""
    out = tmp_path / "out"
    out.mkdir()
    identity = options(small_input, out).validate().identity()
    del identity["plan"]
    (out / "_job.json").write_text(json.dumps(identity))
    with pytest.raises(BadOption) as e:
        options(small_input, out).validate()
    assert e.value.option == "--out" and "plan 1" in str(e.value)


def test_cli_names_the_option(small_input, tmp_path):
    from click.testing import CliRunner

    from loglake.cli import main

    r = CliRunner().invoke(
        main,
        [
            *("job", "cardinal-blocks", "--data-dir", str(small_input)),
            *("--topic", "nope", "--out", str(tmp_path / "o")),
        ],
    )
    assert r.exit_code != 0
    assert "--topic" in r.output and "nope" in r.output


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (Linux's ``children`` lists)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            continue
        out += kids
        todo += kids
    return out


def comm_and_nice(pid: int) -> tuple[str, int] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None  # gone meanwhile
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    return comm, int(stat[stat.rindex(")") + 2 :].split()[16])  # field 19: nice


@pytest.mark.slow
@pytest.mark.spark
def test_the_command_lowers_its_priority_and_its_jvm_inherits_it(small_input, tmp_path):
    """``--nice N``: the command starts its JVM (and through it the Python workers) N steps
    below the priority it was started with, so a stream server beside it gets the CPU first;
    seen from outside, in ``/proc``, while the job runs."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    cmd = [sys.executable, "-m", "loglake.cli", "job", "cardinal-blocks"]
    args = ["--data-dir", str(small_input), "--out", str(tmp_path / "out"), "--nice", "3"]
    topics = [a for t in TOPICS for a in ("--topic", t)]
    log = tmp_path / "stderr.txt"  # a file, not a pipe nobody reads while it runs
    with log.open("w") as err:
        proc = subprocess.Popen([*cmd, *args, *topics], stdout=subprocess.DEVNULL, stderr=err)
    seen: dict[int, tuple[str, int]] = {}
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            for pid in [proc.pid, *descendants(proc.pid)]:
                got = comm_and_nice(pid)
                if got:
                    seen[pid] = got  # the last sighting: the command lowers its own at start
            time.sleep(0.05)
        proc.wait(60)
    finally:
        proc.kill()
    assert proc.returncode == 0, log.read_text()
    want = min(19, base + 3)
    assert seen[proc.pid][1] == want
    jvms = [n for c, n in seen.values() if c == "java"]
    assert jvms and set(jvms) == {want}, seen


def test_nice_is_checked_before_spark_starts(small_input, tmp_path):
    from click.testing import CliRunner

    from loglake.cli import main

    args = ["job", "cardinal-blocks", "--data-dir", str(small_input), "--topic", TOPIC]
    r = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "o"), "--nice", "20"])
    assert r.exit_code != 0 and "--nice" in r.output, r.output


# -- the stateful operator's core, without Spark ------------------------------------------------


def block_messages(block) -> list[tuple[bytes, bytes, str, int]]:
    from loglake.cardinal.producer import Producer
    from loglake.cardinal.synthetic import schema_for

    out = []
    for topic, msgs in sorted(Producer(TOPIC, schema_for(TOPIC)).block_messages(block).items()):
        for i, m in enumerate(msgs):
            out.append((*encode(m), f"{topic}:0", i))
    return out


def test_assemble_block_is_order_independent_and_keeps_what_it_needs():
    import random

    from loglake.cardinal.consumer import assemble_block

    block = synthetic_chain(3).canonical[2]
    msgs = block_messages(block)
    for seed in range(20):
        rng = random.Random(seed)
        shuffled = msgs + rng.sample(msgs, len(msgs) // 2)  # copies too
        rng.shuffle(shuffled)
        first = shuffled[: len(shuffled) // 3]
        partial = assemble_block(first)
        if partial.block is None:  # the state kept, then the rest: the same block
            done = assemble_block(partial.kept + shuffled[len(shuffled) // 3 :])
        else:
            done = partial
        assert done.block is not None and not done.rejected, seed
        values = dict(block.updates)
        for sb in block.batches.values():
            values.update(sb.updates)
        assert done.block.values == values and done.block.hash == block.hash


def test_assemble_block_rejects_extras_in_any_order():
    from loglake.cardinal.consumer import assemble_block

    block = synthetic_chain(3).canonical[2]
    sub = block.batches["state/"].id
    past = (*encode(SubBatchMsg(block.hash, sub, 99, (), {"state/x": b"1"})), "s:1", 7)
    stray = (*encode(BatchMsg(block.hash, "zzz/k", b"1")), "s:2", 8)
    bad = (b"\x03" + block.hash + b"\xff", b"", "s:3", 9)  # not UTF-8
    for extra in (past, stray, bad):
        for msgs in ([extra, *block_messages(block)], [*block_messages(block), extra]):
            r = assemble_block(msgs)
            assert r.block is not None
            assert [(s, o) for s, o, _ in r.rejected] == [extra[2:]]


def test_a_corrupt_copy_does_not_hide_the_good_copies_of_its_key():
    """A message whose key equals a real one but whose value is corrupt, at a lower position:
    it is the reject, and the producers' good copies still make the block, whether they come
    in the same call or in a later one (the stateful operator's two cuts of a micro-batch)."""
    from loglake.cardinal.consumer import assemble_block

    block = synthetic_chain(3).canonical[2]
    good = block_messages(block)
    batch = next(m for m in good if m[0][0] == 0x00)
    corrupt = (batch[0], b"\x01", "a:0", 0)  # the Batch's key, a value that is not Avro
    copies = [(k, v, "chain:1", o + 100) for k, v, _, o in good]  # the second producer's
    for msgs in ([corrupt, *good, *copies], [*copies, corrupt, *good]):
        r = assemble_block(msgs)
        assert r.block is not None and r.block.hash == block.hash
        assert [(s, o) for s, o, _ in r.rejected] == [("a:0", 0)]
        assert "Batch" in r.rejected[0][2]
    # the corrupt copy alone first, the good ones in a later call with what was kept
    first = assemble_block([corrupt])
    assert first.block is None and [(s, o) for s, o, _ in first.rejected] == [("a:0", 0)]
    later = assemble_block(first.kept + good)
    assert later.block is not None and not later.rejected
    # identical copies stay one message: a bad value sent twice is one reject
    twice = assemble_block([corrupt, (*corrupt[:2], "a:1", 5), *good])
    assert twice.block is not None and len(twice.rejected) == 1


# -- the job on Spark -------------------------------------------------------------------------


@pytest.mark.spark
def test_blocks_once_canonical_equals_single_process_and_rejects_kept(spark, tmp_path):
    from loglake.pipeline.cardinal import canonical_chain, table
    from loglake.pipeline.jobs.cardinal_blocks import run

    d = tmp_path / "data"
    planted = make_input(d)
    expected = single_process_chain(d, tmp_path)
    assert max(expected) > DEEP + THRESHOLD
    out = tmp_path / "out"
    # small micro-batches: blocks span batches (state), the Reorg waits for its ancestor
    summary = run(spark, options(d, out, max_records_per_trigger=60))
    assert summary.batches > 3
    assert summary.rejects == len(planted)
    assert_same_chain(spark, out, expected)
    n_blocks = assert_each_block_once(spark, out)
    assert n_blocks == summary.blocks
    actions = {r[0] for r in table(spark, out, "chain_updates").select("action").collect()}
    assert {"add", "remove", "reorg", "reorg_complete"} <= actions
    rejects = table(spark, out, "rejects").collect()
    assert sorted((r["topic"], r["partition"], r["offset"]) for r in rejects) == sorted(planted)
    reasons = " | ".join(r["reason"] for r in rejects)
    for why in ("malformed", "index past ItemCount", "no announced prefix"):
        assert why in reasons
    # a second run from the checkpoint with nothing new changes nothing
    again = run(spark, options(d, out))
    assert (again.blocks, again.rejects) == (summary.blocks, summary.rejects)
    head = canonical_chain(spark, out).collect()[-1]
    assert (head["number"], head["hash"]) == (max(expected), expected[max(expected)].hash.hex())


WORKER = textwrap.dedent(
    """
    import sys
    from loglake.pipeline import build_session
    from loglake.pipeline.jobs.cardinal_blocks import CardinalBlocksOptions, run
    data_dir, out = sys.argv[1:3]
    spark = build_session(master="local[1]", conf={
        "spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2"})
    print("started", flush=True)
    run(spark, CardinalBlocksOptions(data_dir, ("chain", "chain.state"), out, reorg_threshold=8,
        max_records_per_trigger=40, follow_seconds=0.1), timeout=600)
    """
)


def batches(out: Path) -> int:
    folder = out / BATCHES
    return len(list(folder.glob("*.json"))) if folder.is_dir() else 0


@pytest.mark.spark
@pytest.mark.slow
def test_killed_mid_stream_restarts_exactly_once(spark, tmp_path):
    from loglake.pipeline.jobs.cardinal_blocks import run

    d = tmp_path / "data"
    make_input(d, blocks=40)
    expected = single_process_chain(d, tmp_path)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(d), str(out)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 240
        while batches(out) < 3 and time.monotonic() < deadline:
            assert proc.poll() is None, "the streaming worker died on its own"
            time.sleep(0.05)
        assert batches(out) >= 3, "the worker made no progress in 240 s"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM, mid-stream
        proc.wait(30)
    before = batches(out)
    # the restart re-runs the batch planned before the kill with its recorded offsets, then
    # takes the rest in larger batches (the limit is no part of the job's identity)
    summary = run(spark, options(d, out, max_records_per_trigger=400))
    assert summary.batches > before, "the query had finished before the kill: nothing tested"
    assert_same_chain(spark, out, expected)
    assert assert_each_block_once(spark, out) == summary.blocks
    assert summary.rejects == 5
