"""End to end: orchestrator, broadcaster, publisher and subscriber each in its own process.

Issue 6 "Tests": publish 10,000 events; a subscriber that joined late replays [from, to) and
[from, null) and receives exactly the matching events, each once, with the replay headers;
filter and skip; cancel mid-way; status pending → running → completed(n) / canceled(n) /
errored(text); bad input (malformed Candid, bad signature, unknown namespace, from > to, huge
range, cancelling another's replay) → the right error and no state change.
"""

from __future__ import annotations

import time

import pytest

from loglake.events.client import CallRejected, post_raw
from loglake.events.identity import Identity
from loglake.events.messages import (
    H_REPLAY_END_ID,
    H_REPLAY_ID,
    Err,
    GetReplays,
    Ok,
    Registration,
    ReplayRegistration,
    ReplayState,
)
from loglake.wire.icrc16 import map_get
from tests.events.cluster import Cluster
from tests.events.wait import STATUS_POLL_S, gather, wait_until

pytestmark = pytest.mark.slow
N = 10_000
WINDOW = 500
"""The broadcaster's ``--max-unconfirmed``: at most this many notifications of a subscriber
that confirms nothing."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(
        tmp_path_factory.mktemp("events-e2e"),
        extra={
            "publisher": ["--batch-size", "100", "--throttle-ms", "5"],
            "orchestrator": ["--max-events-per-replay", "8000"],
            # a stopped subscriber confirms nothing: past this window its replays get Busy and
            # stay running (test_status_pending_running_then_cancel_mid_way holds one so)
            "broadcaster": ["--max-unconfirmed", str(WINDOW)],
        },
    )
    c.start()
    try:
        pub = c.client("publisher")
        # the publisher registers at start; it takes a publish once its stream is open
        wait_until(
            lambda: pub.call("loglake_publish", (c.namespace, [])) == [],
            what="the publisher up",
            retry_on=(CallRejected,),
        )
        for lo in range(0, N, 1000):
            items = [
                ({"Map": [("i", {"Nat": i}), ("kind", {"Text": "ab"[i % 2]})]}, None)
                for i in range(lo, lo + 1000)
            ]
            assert pub.call("loglake_publish", (c.namespace, items)) == list(range(lo, lo + 1000))
        # The late subscriber subscribes stopped: live events the publisher may still be
        # forwarding must not reach it (its dedup would then hide their replays).
        sub = c.client("orchestrator", "subscriber")
        stopped = [("icrc72:subscription:stopped", {"Bool": True})]
        [r] = sub.call("icrc72_register_subscription", [Registration(c.namespace, stopped)])
        assert isinstance(r, Ok), r
        # the publisher's head update has landed (the assignments go out before any replay's
        # system messages, in order, so they need no wait)
        wait_until(lambda: c.known_head() == N, what=f"head {N} at the orchestrator")
        yield c
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.stop()


def wait_final(c: Cluster, rid: int, timeout: float = 25.0) -> list[ReplayState]:
    sub = c.client("orchestrator", "subscriber")
    seen: list[ReplayState] = []

    def final() -> bool:
        [st] = [s for s in sub.call("icrc77_get_replays", GetReplays()) if s.replay_id == rid]
        if not seen or seen[-1] != st.status:
            seen.append(st.status)
        return st.status.final

    try:
        wait_until(final, timeout, what=f"replay {rid} final", interval=STATUS_POLL_S)
    except AssertionError:
        raise AssertionError(f"replay {rid} still {seen} after {timeout}s\n{c.logs()}") from None
    return seen


def drain(c: Cluster, want: int | None = None, timeout: float = 10.0):
    inbox = c.inbox()
    out = gather(
        lambda: inbox.read(100_000),
        lambda got: want is None or len(got) >= want,
        timeout,
    )
    if want is None or len(out) >= want:
        time.sleep(0.2)  # not a wait for state: a quiet period, to see that nothing more arrives
        out += inbox.read(100_000)
    return out


def register(c: Cluster, start, end, config=None, ns=None, who="subscriber"):
    client = c.client("orchestrator", who)
    [r] = client.call(
        "icrc77_register_replay", [ReplayRegistration(ns or c.namespace, start, end, config or [])]
    )
    return r


def test_closed_range_replay_exactly_once_with_headers(cluster):
    r = register(cluster, 2000, 3000)
    assert isinstance(r, Ok), r
    states = wait_final(cluster, r.value)
    assert states[-1] == ReplayState("completed", 1000)
    assert states[0].tag in ("pending", "running")
    notes = drain(cluster, 1000)
    assert [n.event_id for n in notes] == list(range(2000, 3000))
    assert all(map_get(n.headers, H_REPLAY_ID) == {"Nat": r.value} for n in notes)
    assert notes[5].data == {"Map": [("i", {"Nat": 2005}), ("kind", {"Text": "b"})]}


def test_open_ended_replay_ends_at_the_head_with_end_id(cluster):
    r = register(cluster, 9500, None)
    assert wait_final(cluster, r.value)[-1] == ReplayState("completed", 500)
    notes = drain(cluster, 500)
    assert [n.event_id for n in notes] == list(range(9500, N))
    assert {map_get(n.headers, H_REPLAY_END_ID)["Nat"] for n in notes} == {N - 1}


def test_filter_and_skip(cluster):
    cfg = [("filter", {"Text": 'kind == "a"'}), ("skip", {"Array": [{"Nat": 4}, {"Nat": 2}]})]
    r = register(cluster, 3000, 9000, cfg)
    assert wait_final(cluster, r.value)[-1] == ReplayState("completed", 6000)
    want = [i for i in range(3000, 9000) if i % 2 == 0 and (i + 2) % 4 == 0]
    assert [n.event_id for n in drain(cluster, len(want))] == want


def status_of(c: Cluster, rid: int) -> ReplayState:
    sub = c.client("orchestrator", "subscriber")
    [st] = [s for s in sub.call("icrc77_get_replays", GetReplays()) if s.replay_id == rid]
    return st.status


def test_status_pending_running_then_cancel_mid_way(cluster):
    """Each state is held, not raced: with the broadcaster stopped the orchestrator's
    broadcaster-first add waits, so the publisher has not heard of the replay (pending); with
    the subscriber stopped nothing is confirmed, so past the broadcaster's window of WINDOW
    unconfirmed notifications every event is answered Busy and the replay cannot end (running)
    until it is canceled."""
    rid = None
    with cluster.paused("subscriber"):
        with cluster.paused("broadcaster"):
            r = register(cluster, 0, 2000)
            assert isinstance(r, Ok), r
            rid = r.value
            assert status_of(cluster, rid) == ReplayState("pending")
        wait_until(
            lambda: status_of(cluster, rid).tag == "running",
            what=f"replay {rid} running",
            interval=STATUS_POLL_S,
        )
        # sent reports run up to the window, then the publisher only gets Busy
        time.sleep(0.5)  # not a wait for state: the replay cannot end while nothing is confirmed
        assert status_of(cluster, rid).tag == "running"
        sub = cluster.client("orchestrator", "subscriber")
        assert sub.call("icrc77_cancel_replay", [rid]) == [Ok(rid)]
        # the publisher reports canceled(n) with no call to the stopped subscriber in its way
        final = wait_final(cluster, rid)[-1]
    assert final.tag == "canceled" and 0 < final.value <= WINDOW, final
    got = drain(cluster, final.value)
    ids = [n.event_id for n in got]
    # every event the broadcaster accepted reaches the subscriber once, in order, and no more
    assert ids == list(range(final.value))
    assert all(map_get(n.headers, H_REPLAY_ID) == {"Nat": rid} for n in got)
    time.sleep(0.3)  # a quiet period (not a wait for state): nothing more is enqueued
    assert cluster.inbox().read(100_000) == []


def test_bad_input_gets_the_right_error_and_changes_nothing(cluster):
    sub = cluster.client("orchestrator", "subscriber")
    before = sub.call("icrc77_get_replays", GetReplays())
    url = cluster.urls["orchestrator"]
    me = cluster.ids["subscriber"]
    # malformed Candid, correctly signed
    body = b"DIDL\x01\x6c\x99"
    with pytest.raises(CallRejected) as e:
        post_raw(
            url,
            "icrc77_register_replay",
            body,
            me.sign_call("icrc77_register_replay", body, time.time_ns()),
            10,
        )
    assert e.value.status == 400 and "Candid" in e.value.reason
    # a signature over other bytes
    from loglake.events.codec import METHODS

    good = METHODS["icrc77_register_replay"].encode_arg(
        [ReplayRegistration(cluster.namespace, 0, 1)]
    )
    with pytest.raises(CallRejected) as e:
        post_raw(
            url,
            "icrc77_register_replay",
            good,
            me.sign_call("icrc77_register_replay", good + b"x", time.time_ns()),
            10,
        )
    assert e.value.status == 401
    assert register(cluster, 0, 1, ns="no.such.namespace") == Err("PublicationNotFound")
    r = register(cluster, 10, 5)
    assert r.tag == "ImproperConfig" and "start 10 > end 5" in r.payload
    r = register(cluster, 0, None)  # 10,000 events > --max-events-per-replay 8000
    assert r.tag == "RangeTooLarge"
    other = Identity.generate()
    rid = before[-1].replay_id
    assert cluster.client("orchestrator", ident=other).call("icrc77_cancel_replay", [rid]) == [
        Err("Unauthorized")
    ]
    assert sub.call("icrc77_get_replays", GetReplays()) == before


def test_cli_replay_shows_progress_until_completed_and_lists_replays(cluster):
    from click.testing import CliRunner

    from loglake.events.cli import command

    run = CliRunner().invoke
    base = ["--url", cluster.urls["orchestrator"], "--key-file", str(cluster.keys["subscriber"])]
    r = run(command, ["replay", *base, cluster.namespace, "--from", "100", "--to", "200"])
    assert r.exit_code == 0, r.output
    assert "completed(100)" in r.output
    rid = int(r.output.split("replay ")[1].split()[0])
    r = run(command, ["replays", *base, "--namespace", cluster.namespace])
    assert r.exit_code == 0 and "completed(100)" in r.output
    r = run(command, ["replay-status", *base, str(rid)])
    assert r.exit_code == 0 and '"status": "completed(100)"' in r.output
    for missing in (0, rid + 10**6, 2**70):  # one call each (none past a cursor's 64 bits)
        r = run(command, ["replay-status", *base, str(missing)])
        assert r.exit_code == 1 and f"no replay {missing} visible" in r.output, r.output
    r = run(command, ["cancel", *base, str(rid)])
    # refused (the replay has completed): printed, and exit status 1
    assert r.exit_code == 1 and "CannotCancel" in r.output
    assert "Error: 1 of 1 cancel(s) refused" in r.output
    r = run(command, ["replay", *base, "no.such.ns", "--from", "0"])
    # a typed error is one readable line, not a traceback (clitools.TypedErrorGroup)
    assert r.exit_code == 1 and r.output.startswith("Error: ") and "PublicationNotFound" in r.output
    pub = ["--url", cluster.urls["publisher"], "--key-file", str(cluster.keys["publisher"])]
    r = run(command, ["publish", *pub, cluster.namespace, "--text", "hello"])
    assert r.exit_code == 0 and f"ids {N}..{N}" in r.output


def test_cli_replay_with_skip_says_what_reaches_the_subscriber_and_received_shows_it(cluster):
    """``replay --skip 2`` printed ``completed(2000)`` beside ``sent: 0`` and no way to see what
    the subscriber got: completed(n) counts what the publisher republished, the Broadcaster
    applies the skip, and ``received`` takes the subscriber's notifications."""
    import json

    from click.testing import CliRunner

    from loglake.events.cli import command

    drain(cluster)  # what earlier tests left in the inbox
    run = CliRunner().invoke
    base = ["--url", cluster.urls["orchestrator"], "--key-file", str(cluster.keys["subscriber"])]
    # ids no other test replays: the subscriber delivers an event id once (its seen set)
    args = [cluster.namespace, "--from", "9001", "--to", "9101", "--skip", "4,1"]
    r = run(command, ["replay", *base, *args])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "completed(100)" in out
    assert "100 events of [9001, 9101) republished to the Broadcaster; the skip lets 25 of" in out
    rid = int(r.output.split("replay ")[1].split()[0])
    st = json.loads(run(command, ["replay-status", *base, str(rid)]).output)
    assert st["stats"]["icrc77:replay:sent"] == "100"  # the final count, not the last report
    sub = ["--url", cluster.urls["subscriber"], "--key-file", str(cluster.keys["subscriber"])]
    want = [i for i in range(9001, 9101) if (i + 1) % 4 == 0]
    got: list[dict] = []

    def more() -> bool:
        r = run(command, ["received", *sub, "--take", "1000", "--json"])
        assert r.exit_code == 0, r.output
        got.extend(json.loads(line) for line in r.output.splitlines())
        return len(got) >= len(want)

    wait_until(more, 20, what="the replayed notifications", fail=False)
    assert [g["event_id"] for g in got] == want
    assert {g["replay_id"] for g in got} == {rid}
    r = run(command, ["replays", *base, "--namespace", cluster.namespace])
    assert "[9001, 9101)" in r.output and "None" not in r.output


def test_replay_errors_when_the_broadcaster_is_gone(cluster):
    cluster.stop("broadcaster")
    r = register(cluster, 0, 10)
    assert isinstance(r, Ok)
    final = wait_final(cluster, r.value)[-1]
    assert final.tag == "errored" and "publish failed" in final.value
