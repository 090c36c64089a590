"""The web console in a real browser, as an operator uses it.

Debian's chromium, driven by Playwright for Python (``executable_path="/usr/bin/chromium"``;
never ``playwright install``), against a real ``loglake node`` process (stream service, ICRC
roles over HTTP, SDS participants, archives control and member loops, HTTP API, console)
whose data was made the way a user makes it: over the stream service (TCP) with the parts' own
clients — community WakuMessages (archives' layout), a Cardinal chain with a reorg
(``produce_chain``), a partitioned stream with a lagging consumer — and through the node's
API: ICRC-72 events published and replayed, an SDS exchange with a lost message repaired, a
weekly archive built, seeded and fetched by the member. The console is opened with the token in
the URL fragment; each test clicks through a page, asserts what is shown, and saves screenshots
in its ``tmp_path``. The ICRC roles run in process (the default transport): a replay runs
apart from the API call that registers it, so it can be seen running and cancelled.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright import sync_api as playwright_sync

from loglake.archives.layout import LAYOUTS
from loglake.cardinal.cli import produce_chain
from loglake.events.publisher import stored_event
from loglake.streams.client import StreamClient
from loglake.wire import icrc16
from tests.procs import free_port, stop, wait_port
from tests.waiting import wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
NAMESPACE = "shop.payments"
CHANNEL = "room"
DAY_NS = 86_400 * 10**9
BULK_EVENTS = 20_000
"""Events in the replay the console cancels."""
REPLAY_RATE = 2_000
"""The node's ``[events] replay_rate``: the bulk replay takes 10 s whatever the machine's speed,
so it is still under way when the cancel is clicked (unpaced, it had ended first once)."""

pytestmark = [
    pytest.mark.slow,
    pytest.mark.peer("chromium", shutil.which(CHROMIUM) is not None, "apt-get install chromium"),
]

expect = playwright_sync.expect


@dataclass
class Node:
    url: str
    console_url: str
    """The console URL with the token in its fragment."""
    link: str
    """The console link the node printed (a one-time login code in its fragment)."""
    token: str
    streams_port: int
    api: httpx.Client
    replay_id: int
    archive_ids: list[str]


CONFIG = """\
data_dir = "{data}"
[http]
port = {http}
[streams]
port = {streams}
[events]
enabled = true
transport = "inprocess"
namespaces = ["{namespace}"]
replay_rate = {replay_rate}
[archives]
enabled = true
wait = 0.0
check_every = 0.5
[sds]
enabled = true
channel = "{channel}"
participants = ["alice", "bob"]
"""


def _start(data: Path, cfg: Path) -> tuple[subprocess.Popen[str], str, str, str, int, list[str]]:
    """``loglake node --config cfg``; returns the process, its URL, the token and the console
    link it printed, its stream service port and its output so far (kept up to date, for
    failure messages)."""
    http = free_port()
    streams = free_port()
    while streams == http:
        streams = free_port()
    cfg.write_text(
        CONFIG.format(
            data=data,
            http=http,
            streams=streams,
            namespace=NAMESPACE,
            channel=CHANNEL,
            replay_rate=REPLAY_RATE,
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "loglake.cli", "node", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:  # the banner, up to the token line
        output.append(line)
        if "access token" in line:
            break
    token = output[-1].rsplit(":", 1)[-1].strip() if output else ""
    if not (token and "access token" in output[-1]):
        stop(proc)
        raise AssertionError("the node printed no token:\n" + "".join(output))
    output.append(proc.stdout.readline())  # the console link, next
    link = output[-1].split(": ", 1)[-1].strip()
    # keep reading the node's output so a full pipe never blocks it
    threading.Thread(target=lambda: output.extend(proc.stdout or ()), daemon=True).start()
    try:
        wait_port(http, proc)
    except (RuntimeError, TimeoutError) as e:
        stop(proc)
        raise AssertionError(f"{e}; the node said:\n" + "".join(output)) from None
    return proc, f"http://127.0.0.1:{http}", token, link, streams, output


def _populate(api: httpx.Client, streams_port: int) -> tuple[int, list[str]]:
    """Every page's data, made through the stream service and the node's API."""

    def call(method: str, path: str, **kw: Any) -> Any:
        r = api.request(method, path, **kw)
        assert r.status_code < 300, f"{method} {path}: {r.status_code} {r.text}"
        return r.json()

    with StreamClient("127.0.0.1", streams_port) as client:
        # Status community: a closed week of 14/WAKU2-MESSAGEs, then a control round
        community = call("GET", "/archives")["stream"]
        layout = LAYOUTS["spec"]
        week = time.time_ns() - 9 * DAY_NS
        client.create_stream(community)
        client.push_many(
            community,
            [
                layout.make_record(
                    payload=f"hello community {i}".encode(),
                    topic="/status/1/community-chat/proto",
                    timestamp_ns=week + i * (DAY_NS // 10),
                )
                for i in range(40)
            ],
        )
        call("POST", "/archives/build", json={})
        # a partitioned stream and a consumer that lags on partition 1
        client.create_stream("orders", partitions=3)
        for p in range(3):
            client.push_many("orders", [f"order {p}-{i}".encode() for i in range(10)], p)
        client.save_index("billing", "orders", 4, partition=1)
        # Cardinal: a chain whose depth-2 reorg travels as Reorg/ReorgComplete messages
        produce_chain(client, "chain", 6, partitions=1, deep_reorg=2, reorg_threshold=1)
    # ICRC-72/77: events published and delivered, then a replay of [5, 15)
    call("POST", "/events/subscriptions", json={"namespace": NAMESPACE})
    texts = [f"payment {i}" for i in range(20)]
    call("POST", f"/events/namespaces/{NAMESPACE}/events", json={"texts": texts})
    rid = call("POST", "/events/replays", json={"namespace": NAMESPACE, "start": 5, "end": 15})
    # SDS: bob loses alice's second message and repairs it from the store
    path = f"/sds/channels/{CHANNEL}/messages"
    call("POST", path, json={"sender": "alice", "text": "hi bob"})
    call("POST", path, json={"sender": "alice", "text": "lost", "lose_for": ["bob"]})
    call("POST", path, json={"sender": "alice", "text": "did you get that?"})
    built = wait_until(
        lambda: call("GET", "/archives")["archives"], timeout=30, what="an archive built"
    )
    return rid["id"], [a["archive_id"] for a in built]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    base = tmp_path_factory.mktemp("node")
    proc, url, token, link, streams_port, output = _start(base / "data", base / "loglake.toml")
    api = httpx.Client(
        base_url=url + "/api", headers={"Authorization": f"Bearer {token}"}, timeout=60
    )
    try:
        try:
            rid, archive_ids = _populate(api, streams_port)
        except Exception as e:
            raise AssertionError(f"{e!r}; the node said:\n" + "".join(output)) from e
        yield Node(
            url, f"{url}/console/#token={token}", link, token, streams_port, api, rid, archive_ids
        )
    finally:
        api.close()
        stop(proc, timeout=30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any, node: Node) -> Iterator[Any]:
    """A fresh tab (its own sessionStorage). Any JavaScript error or CSP violation fails the
    test, and so does any request to anywhere but the node (every asset ships in the package:
    no CDN)."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    pg = context.new_page()
    pg.set_default_timeout(10_000)
    errors: list[str] = []
    elsewhere: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on(  # the page's own Content-Security-Policy must never have to block it
        "console",
        lambda m: "Content Security Policy" in m.text and errors.append(m.text),
    )
    pg.on("request", lambda r: r.url.startswith(node.url + "/") or elsewhere.append(r.url))
    try:
        yield pg
    finally:
        context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
    assert not elsewhere, f"requests that did not go to the node: {elsewhere}"


def open_console(page: Any, node: Node, route: str = "/streams") -> None:
    """What an operator does with the URL the node printed: open it (token in the fragment)."""
    page.goto(f"{node.url}/console/#{route}&token={node.token}")


def shot(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)


def row(page: Any, table: str, attr: str, value: object) -> Any:
    return page.locator(f'[data-testid="{table}"] tr[{attr}="{value}"]')


# -- token ---------------------------------------------------------------------------------


def test_token_from_the_url_is_kept_for_the_tab_and_leaves_the_address_bar(
    page: Any, node: Node, tmp_path: Path
) -> None:
    page.goto(node.console_url)
    expect(page.locator('[data-testid="streams-table"]')).to_be_visible()
    assert "token" not in page.url and page.url.endswith("#/streams")
    assert page.evaluate("sessionStorage.getItem('loglake.token')") == node.token
    page.reload()  # still signed in: the token is in sessionStorage, not the URL
    expect(page.locator('[data-testid="streams-table"]')).to_be_visible()
    shot(page, tmp_path, "streams")


def test_the_printed_link_logs_in_once_and_never_holds_the_token(
    page: Any, node: Node, tmp_path: Path
) -> None:
    # The node printed ``/console/#token=<token>``: the console cleared its address bar, but
    # the browser's history (on disk, and synced) kept the token for good. The link holds a
    # one-time code now, which the console trades for the token; in the history it is spent.
    assert node.link.startswith(f"{node.url}/console/#login=") and node.token not in node.link
    page.goto(node.link)
    expect(page.locator('[data-testid="streams-table"]')).to_be_visible()
    assert "login" not in page.url and page.url.endswith("#/streams")
    assert page.evaluate("sessionStorage.getItem('loglake.token')") == node.token
    other = page.context.new_page()  # the same link again (from the history): spent
    other.goto(node.link)
    err = other.locator('[data-testid="auth-error"]')
    expect(err).to_contain_text("This console link did not log in")
    expect(err).to_contain_text("used already")
    assert other.evaluate("sessionStorage.getItem('loglake.token')") is None
    shot(other, tmp_path, "link-spent")
    other.close()


def test_a_wrong_token_says_so_and_the_login_form_takes_the_right_one(
    page: Any, node: Node, tmp_path: Path
) -> None:
    page.goto(f"{node.url}/console/#token=not-the-token")
    err = page.locator('[data-testid="auth-error"]')
    expect(err).to_contain_text("The node refused this token")
    expect(err).to_contain_text("node.token")
    shot(page, tmp_path, "wrong-token")
    assert page.evaluate("sessionStorage.getItem('loglake.token')") is None
    page.fill("#token", node.token)
    page.click('[data-testid="login-form"] button')
    expect(page.locator('[data-testid="streams-table"]')).to_be_visible()
    page.click('[data-testid="logout"]')
    expect(page.locator('[data-testid="login-form"]')).to_be_visible()


# -- streams -------------------------------------------------------------------------------


def test_stream_rates_update_live_without_reload(page: Any, node: Node, tmp_path: Path) -> None:
    open_console(page, node)
    orders = row(page, "streams-table", "data-stream", "orders")
    expect(orders.locator('[data-testid="push-rate"]')).to_have_text("0.0/s")
    before = int(orders.locator('[data-testid="records"]').inner_text().replace(",", ""))
    page.evaluate("window.__same_page = true")  # gone if the page reloads
    done = threading.Event()

    def pusher() -> None:  # a producer pushing over the stream service while the page is open
        with StreamClient("127.0.0.1", node.streams_port) as client:
            i = 0
            while not done.is_set():
                client.push_many("orders", [f"live {i}-{k}".encode() for k in range(20)], i % 3)
                i += 1
                done.wait(0.05)

    t = threading.Thread(target=pusher, daemon=True)
    t.start()
    try:
        expect(orders.locator('[data-testid="push-rate"]')).not_to_have_text("0.0/s")
        rate = wait_until(
            lambda: _rate(orders.locator('[data-testid="push-rate"]').inner_text()),
            what="a push rate above zero",
        )
        first = int(orders.locator('[data-testid="records"]').inner_text().replace(",", ""))
        assert first > before and rate > 0
        # the count keeps moving while the page stays the same page
        wait_until(
            lambda: (
                int(orders.locator('[data-testid="records"]').inner_text().replace(",", "")) > first
            ),
            what="the record count to move again",
        )
        shot(page, tmp_path, "streams-live")
    finally:
        done.set()
        t.join(10)
    assert page.evaluate("window.__same_page") is True


def _rate(text: str) -> float:
    return float(text.removesuffix("/s").replace(",", "")) if text.endswith("/s") else 0.0


def test_stream_page_shows_partitions_and_consumer_lag(
    page: Any, node: Node, tmp_path: Path
) -> None:
    open_console(page, node)
    page.click('[data-testid="streams-table"] a:text-is("orders")')
    expect(page.locator('[data-testid="stream-name"]')).to_have_text("orders")
    parts = page.locator('[data-testid="partitions-table"] tbody tr')
    expect(parts).to_have_count(3)
    end = node.api.get("/streams/orders/partitions").json()[1]["next_index"]
    billing = row(page, "consumers-table", "data-consumer", "billing")
    expect(billing.locator('[data-testid="lag"]')).to_have_text(f"{end - 4:,}")
    shot(page, tmp_path, "stream-orders")
    # from a partition to its records
    row(page, "partitions-table", "data-partition", 1).locator('[data-testid="browse"]').click()
    expect(page.locator('[data-testid="records-table"]')).to_contain_text("order 1-0")
    expect(page.locator('select[name="stream"]')).to_have_value("orders")
    expect(page.locator('select[name="partition"]')).to_have_value("1")
    assert "partition=1" in page.url


# -- record browser --------------------------------------------------------------------------


def browse(page: Any, node: Node, stream: str, view: str, start: int = 0) -> Any:
    open_console(page, node, f"/records?stream={stream}&partition=0&start={start}&view={view}")
    table = page.locator('[data-testid="records-table"]')
    expect(table).to_be_visible()
    return table


def field(record: Any, name: str) -> Any:
    return record.locator(f'dd[data-field="{name}"]').first


def test_record_browser_text_and_hex(page: Any, node: Node, tmp_path: Path) -> None:
    table = browse(page, node, "orders", "text")
    expect(table.locator("tr[data-index='0']")).to_contain_text("order 0-0")
    page.select_option('select[name="view"]', "hex")
    first = table.locator("tr[data-index='0'] pre.hex")
    expect(first).to_contain_text("6f 72 64 65 72")  # "order"
    expect(first).to_contain_text("|order 0-0".replace("|", ""))
    shot(page, tmp_path, "records-hex")
    # paging: next page starts where this one ended
    page.fill('input[name="limit"]', "5")
    page.press('input[name="limit"]', "Enter")
    expect(table.locator("tbody tr")).to_have_count(5)
    page.click('[data-testid="next"]')
    expect(table.locator("tbody tr").first).to_have_attribute("data-index", "5")


def test_record_browser_decodes_sds_messages(page: Any, node: Node, tmp_path: Path) -> None:
    stream = f"sds.{CHANNEL}"
    table = browse(page, node, stream, "sds")
    first = table.locator("tr[data-index='0'] [data-testid='decoded']")
    expect(first).to_contain_text("SdsMessage (content)")
    expect(field(first, "sender_id")).to_have_text("alice")
    expect(field(first, "channel_id")).to_have_text(CHANNEL)
    expect(field(field(first, "chat"), "text")).to_have_text("hi bob")  # the envelope's line
    third = table.locator("tr[data-index='2'] [data-testid='decoded']")
    expect(field(field(third, "chat"), "text")).to_have_text("did you get that?")
    # the third message names the two before it, and each hint points at its stream position
    history = field(third, "causal_history")
    expect(history.locator('dd[data-field="hint_points_to"]')).to_have_count(2)
    expect(history).to_contain_text(stream)
    shot(page, tmp_path, "records-sds")


def test_record_browser_decodes_cardinal_messages(page: Any, node: Node, tmp_path: Path) -> None:
    table = browse(page, node, "chain", "cardinal")
    decoded = table.locator("[data-testid='decoded']")
    expect(decoded.first).to_be_visible()
    types = [t.strip() for t in decoded.locator(".dtype").all_inner_texts()]
    assert {"Batch", "BatchMsg", "BatchDeleteMsg", "Reorg"} <= set(types), types
    batch = decoded.filter(has=page.locator(".dtype", has_text=re.compile("^Batch$"))).nth(1)
    expect(field(batch, "number")).to_have_text("1")
    expect(field(batch, "weight")).to_have_text("10")
    expect(field(batch, "updates")).to_contain_text("foo/")
    reorg = decoded.filter(has=page.locator(".dtype", has_text=re.compile("^Reorg$"))).first
    expect(field(reorg, "number")).to_have_text("3")
    shot(page, tmp_path, "records-cardinal")


def test_record_browser_decodes_icrc_events_and_waku_messages(
    page: Any, node: Node, tmp_path: Path
) -> None:
    table = browse(page, node, NAMESPACE, "icrc")
    first = table.locator("tr[data-index='0'] [data-testid='decoded']")
    expect(first).to_contain_text("ICRC-72 event")
    expect(field(first, "data")).to_contain_text("Text")
    expect(field(first, "data")).to_contain_text("payment 0")
    shot(page, tmp_path, "records-icrc")
    table = browse(page, node, "community", "waku")
    first = table.locator("tr[data-index='0'] [data-testid='decoded']")
    expect(first).to_contain_text("WakuMessage")
    expect(field(first, "content_topic")).to_have_text("/status/1/community-chat/proto")
    expect(field(first, "payload")).to_have_text('"hello community 0"')
    # the same records read as another format: a per-record message, not a broken page
    page.select_option('select[name="view"]', "cardinal")
    expect(table.locator('[data-testid="decode-error"]').first).to_contain_text(
        "not a Cardinal message"
    )
    shot(page, tmp_path, "records-waku")


# -- replays, archives, SDS ------------------------------------------------------------------


def test_replays_page_shows_state_and_progress(page: Any, node: Node, tmp_path: Path) -> None:
    open_console(page, node, "/replays")
    replay = row(page, "replays-table", "data-key", node.replay_id)
    expect(replay.locator('[data-testid="replay-status"]')).to_have_text("completed")
    expect(replay.locator('[data-col="progress"]')).to_contain_text("100%")
    expect(replay.locator('[data-col="progress"]')).to_contain_text("10 / 10")
    expect(replay.locator('[data-col="range"]')).to_have_text("5 … 14")
    expect(replay.locator('[data-testid="cancel"]')).to_have_count(0)  # nothing to cancel
    ns = row(page, "namespaces-table", "data-key", NAMESPACE)
    expect(ns.locator('[data-col="head"]')).to_have_text("20")
    expect(ns.locator('[data-col="subscriptions"]')).to_have_text("1")
    shot(page, tmp_path, "replays")


def test_a_running_replay_is_cancelled_from_the_console(
    page: Any, node: Node, tmp_path: Path
) -> None:
    bulk = "shop.bulk"  # its own namespace: the other tests' counts stay as they were
    assert node.api.post("/events/namespaces", json={"namespace": bulk}).status_code == 202
    wait_until(
        lambda: any(n["namespace"] == bulk for n in node.api.get("/events/namespaces").json()),
        what=f"{bulk} registered",
    )
    assert node.api.post("/events/subscriptions", json={"namespace": bulk}).status_code == 201
    # a long history, stored the way the Publisher stores events, pushed over the stream
    # service (as an import of old events would be): publishing 20,000 events one API call
    # per 1,000 would take a while, and the node's replay rate keeps the replay going long
    # enough to cancel
    event = stored_event(icrc16.text("bulk payment"), None, time.time_ns())
    with StreamClient("127.0.0.1", node.streams_port) as client:
        client.create_stream(bulk)  # the Publisher makes it on its first event; none yet
        for _ in range(0, BULK_EVENTS, 5000):
            client.push_many(bulk, [event] * 5000)
    wait_until(  # the Publisher reads its stream's head every second and reports it
        lambda: any(
            n["namespace"] == bulk and n["head"] == BULK_EVENTS
            for n in node.api.get("/events/namespaces").json()
        ),
        what=f"{bulk}'s head known to the orchestrator",
    )
    open_console(page, node, "/replays")
    expect(page.locator('[data-testid="replays-table"]')).to_be_visible()
    body = {"namespace": bulk, "start": 0, "end": BULK_EVENTS}
    rid = node.api.post("/events/replays", json=body).json()["id"]
    replay = row(page, "replays-table", "data-key", rid)
    # the page shows it under way, then the operator cancels it
    expect(replay.locator('[data-testid="replay-status"]')).to_have_text("running")
    shot(page, tmp_path, "replay-running")
    replay.locator('[data-testid="cancel"]').click()
    expect(page.locator('[data-testid="replay-message"]')).to_have_text(
        f"Cancel of replay {rid} sent to the orchestrator."
    )
    expect(replay.locator('[data-testid="replay-status"]')).to_have_text("canceled", timeout=20_000)
    expect(replay.locator('[data-testid="cancel"]')).to_have_count(0)
    shot(page, tmp_path, "replay-cancelled")
    final = node.api.get(f"/events/replays/{rid}").json()
    assert final["status"] == "canceled" and final["sent"] < BULK_EVENTS, final


def test_archives_page_shows_the_archive_its_torrent_and_the_member(
    page: Any, node: Node, tmp_path: Path
) -> None:
    open_console(page, node, "/archives")
    archives = page.locator('[data-testid="archives-table"] tbody tr')
    expect(archives).to_have_count(len(node.archive_ids))
    expect(archives.first).to_have_attribute("data-key", node.archive_ids[0])
    torrent = node.api.get("/archives/torrents").json()[0]
    expect(page.locator('[data-testid="info-hash"]')).to_have_text(torrent["info_hash"])
    expect(page.locator('[data-testid="torrent"]')).to_contain_text("yes")  # seeding
    # the member fetches the archive by torrent; the page shows it without a reload
    member = page.locator('[data-testid="member-archives"] tbody tr')
    expect(member).to_have_count(len(node.archive_ids), timeout=30_000)
    expect(page.locator('[data-testid="member"]')).to_contain_text("40 messages hydrated")
    shot(page, tmp_path, "archives")
    # from the archives to the community's messages, decoded
    page.click('[data-testid="browse-community"]')
    expect(page.locator('[data-testid="decoded"]').first).to_contain_text("hello community 0")


def test_sds_page_shows_channel_health_acks_and_repairs(
    page: Any, node: Node, tmp_path: Path
) -> None:
    open_console(page, node, "/sds")
    channel = page.locator(f'[data-testid="sds-channel"][data-channel="{CHANNEL}"]')
    expect(channel.locator('[data-testid="health"]')).to_have_text("healthy")
    alice = row(page, "participants-table", "data-key", "alice")
    bob = row(page, "participants-table", "data-key", "bob")
    expect(alice.locator('[data-col="sent"]')).to_have_text("3")
    expect(bob.locator('[data-col="delivered"]')).to_have_text("3")
    expect(bob.locator('[data-col="repaired"]')).to_have_text("1")  # the lost message
    expect(bob.locator('[data-testid="missing"]')).to_have_attribute("data-count", "0")
    # bob's sync messages acknowledge all three of alice's (the page follows without reload)
    expect(alice.locator('[data-col="acknowledged"]')).to_have_text("3", timeout=20_000)
    expect(alice.locator('[data-testid="unacked"]')).to_have_attribute("data-count", "0")
    shot(page, tmp_path, "sds")


def test_a_part_the_node_does_not_run_says_so(page: Any, node: Node, tmp_path: Path) -> None:
    open_console(page, node, "/jobs")  # this node runs no Spark jobs ([jobs] is off)
    expect(page.locator('[data-testid="part-disabled"]')).to_contain_text(
        "this node does not run Spark jobs"
    )
    expect(page.locator('[data-testid="job-form"]')).to_have_count(0)
    shot(page, tmp_path, "jobs-off")


# -- /docs ---------------------------------------------------------------------------------


def test_docs_renders_under_its_content_security_policy(browser: Any, tmp_path: Path) -> None:
    # /docs is served with a policy that allows its one inline style sheet by hash and nothing
    # else: in chromium the page is styled, lists every route and reports no violation; a style
    # the policy does not name is blocked (the policy is enforced, and a violation is seen)
    from loglake.node.config import load_config
    from loglake.node.runner import BackgroundNode

    cfg = load_config(
        data={
            "data_dir": str(tmp_path / "data"),
            "http": {"port": 0},
            "streams": {"enabled": False},
        },
        env={},
    )
    with BackgroundNode(cfg, say=lambda _: None) as n:
        operations = sum(
            len(m) for m in httpx.get(f"{n.url}/openapi.json").json()["paths"].values()
        )
        context = browser.new_context()
        pg = context.new_page()
        violations: list[str] = []

        def blocked(message: Any) -> bool:
            return "Content Security Policy" in message.text

        pg.on("console", lambda m: blocked(m) and violations.append(m.text))
        requests: list[str] = []
        pg.on("request", lambda r: requests.append(r.url))
        try:
            response = pg.goto(f"{n.url}/docs")
            assert response is not None and response.status == 200
            assert "style-src 'sha256-" in response.headers["content-security-policy"]
            expect(pg.locator("h1")).to_contain_text("loglake node")
            expect(pg.locator("table tr")).to_have_count(operations + 1)  # and the head row
            assert pg.evaluate("getComputedStyle(document.body).marginTop") == "32px"  # 2em
            assert pg.evaluate("getComputedStyle(document.body).fontFamily") == "sans-serif"
            pg.screenshot(path=str(tmp_path / "docs.png"), full_page=True)
            assert not violations, violations
            assert requests == [f"{n.url}/docs"]  # no asset from anywhere
            with pg.expect_console_message(blocked, timeout=5_000):
                pg.evaluate(
                    "document.head.append(Object.assign(document.createElement('style'),"
                    " {textContent: 'body{margin:5em}'}))"
                )
            assert pg.evaluate("getComputedStyle(document.body).marginTop") == "32px"
        finally:
            context.close()
