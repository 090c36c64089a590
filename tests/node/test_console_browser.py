"""The web console in a real browser, as an operator uses it.

Debian's chromium, driven by Playwright for Python (``executable_path="/usr/bin/chromium"``;
never ``playwright install``), against a node serving real data: the node's app
(``loglake.node.app.create_app``) under uvicorn on a loopback port, over a real log in a temp
dir, holding streams written by the parts themselves — community WakuMessages (archives'
layout), an SDS channel (``SdsChannel`` participants), a Cardinal chain (``StreamProducer``),
ICRC-72 stored events (the Publisher's stored form) — and a consumer index. Each test clicks
through pages, asserts what is shown, and saves screenshots in its ``tmp_path``.
"""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loglake.archives.layout import LAYOUTS
from loglake.cardinal.producer import BlockPayload, Producer
from loglake.cardinal.synthetic import schema_for, synthetic_chain
from loglake.cardinal.transport import StreamProducer, StreamTransport
from loglake.events.publisher import stored_event
from loglake.log import Log, StreamConfig, open_log
from loglake.node.api.context import NodeContext
from loglake.node.app import create_app
from loglake.node.metrics import InstrumentedLog, NodeMetrics
from loglake.sds.channel import SdsChannel, stream_for
from loglake.streams.api import LocalStreams
from loglake.wire import icrc16
from tests.procs import free_port, wait_port
from tests.waiting import wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
TOKEN = "console-test-token-0123456789"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.peer("chromium", shutil.which(CHROMIUM) is not None, "apt-get install chromium"),
]

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect


@dataclass
class Node:
    url: str
    log: Log
    streams: LocalStreams


def _populate(log: Log) -> None:
    """Streams of each protocol format, written through each part's own API."""
    streams = LocalStreams(log)
    # Status community: 14/WAKU2-MESSAGE records in a 2-partition stream
    log.create_stream("community.status", StreamConfig(partitions=2))
    layout = LAYOUTS["spec"]
    log.append_payloads(
        "community.status",
        0,
        [
            layout.make_record(
                payload=f"hello community {i}".encode(),
                topic="/status/1/chat/proto",
                timestamp_ns=1_764_000_000_000_000_000 + i,
            )
            for i in range(5)
        ],
    )
    # SDS: two participants on one channel
    alice = SdsChannel(streams, "room", "alice")
    bob = SdsChannel(streams, "room", "bob")
    alice.send(b"hi bob")
    bob.poll()
    bob.send(b"hi alice")
    alice.poll()
    # Cardinal: a short chain from a producer over the stream transport
    chain = synthetic_chain(3)
    cp = StreamProducer(StreamTransport(streams, 1), Producer("chain", schema_for("chain")))
    for step in chain.steps:
        assert isinstance(step, BlockPayload)  # a chain without reorgs
        cp.send_block(step)
    # ICRC-72: stored events of a namespace
    log.create_stream("icrc.payments")
    log.append_payloads(
        "icrc.payments",
        0,
        [
            stored_event(
                icrc16.validate(
                    {"Map": [("amount", icrc16.nat(100 + i)), ("memo", icrc16.text("rent"))]}
                ),
                None,
                1_764_000_000_000_000_000 + i,
            )
            for i in range(3)
        ],
    )
    # a plain stream with a consumer that lags
    log.create_stream("orders", StreamConfig(partitions=3))
    for p in range(3):
        log.append_payloads("orders", p, [f"order {p}-{i}".encode() for i in range(10)])
    log.save_index("billing", "orders", 4, 1)
    assert stream_for("room") in log.streams()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    import uvicorn

    data = tmp_path_factory.mktemp("node-data")
    metrics = NodeMetrics()
    log = InstrumentedLog(open_log(data), metrics)
    ctx = NodeContext(log=log, data_dir=data, metrics=metrics)
    metrics.attach(ctx)
    _populate(log)
    app = create_app(ctx, token=TOKEN)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, name="console-node", daemon=True)
    thread.start()
    try:
        wait_port(port)
        yield Node(f"http://127.0.0.1:{port}", log, LocalStreams(log))
    finally:
        server.should_exit = True
        thread.join(10)
        log.close()


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
    """A fresh tab (its own sessionStorage); any JavaScript error on the page fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    pg = context.new_page()
    pg.set_default_timeout(10_000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield pg
    finally:
        context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def open_console(page: Any, node: Node, route: str = "/streams") -> None:
    """What an operator does with the URL the node printed: open it (token in the fragment)."""
    page.goto(f"{node.url}/console/#{route}&token={TOKEN}")


def shot(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)


def row(page: Any, table: str, attr: str, value: object) -> Any:
    return page.locator(f'[data-testid="{table}"] tr[{attr}="{value}"]')


# -- token ---------------------------------------------------------------------------------


def test_token_from_the_url_is_kept_for_the_tab_and_leaves_the_address_bar(
    page: Any, node: Node, tmp_path: Path
) -> None:
    page.goto(f"{node.url}/console/#token={TOKEN}")
    expect(page.locator('[data-testid="streams-table"]')).to_be_visible()
    assert "token" not in page.url and page.url.endswith("#/streams")
    assert page.evaluate("sessionStorage.getItem('loglake.token')") == TOKEN
    page.reload()  # still signed in: the token is in sessionStorage, not the URL
    expect(page.locator('[data-testid="streams-table"]')).to_be_visible()
    shot(page, tmp_path, "streams")


def test_a_wrong_token_says_so_and_the_login_form_takes_the_right_one(
    page: Any, node: Node, tmp_path: Path
) -> None:
    page.goto(f"{node.url}/console/#token=not-the-token")
    err = page.locator('[data-testid="auth-error"]')
    expect(err).to_contain_text("The node refused this token")
    expect(err).to_contain_text("node.token")
    shot(page, tmp_path, "wrong-token")
    assert page.evaluate("sessionStorage.getItem('loglake.token')") is None
    page.fill("#token", TOKEN)
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
    stop = threading.Event()

    def pusher() -> None:
        i = 0
        while not stop.is_set():
            node.log.append_payloads("orders", i % 3, [f"live {i}-{k}".encode() for k in range(20)])
            i += 1
            stop.wait(0.05)

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
        stop.set()
        t.join(5)
    assert page.evaluate("window.__same_page") is True


def _rate(text: str) -> float:
    return float(text.removesuffix("/s").replace(",", "")) if text.endswith("/s") else 0.0


def test_stream_page_shows_partitions_and_consumer_lag(
    page: Any, node: Node, tmp_path: Path
) -> None:
    node.log.save_index("billing", "orders", 4, 1)
    open_console(page, node)
    page.click('[data-testid="streams-table"] a:text-is("orders")')
    expect(page.locator('[data-testid="stream-name"]')).to_have_text("orders")
    parts = page.locator('[data-testid="partitions-table"] tbody tr')
    expect(parts).to_have_count(3)
    end = node.log.next_index("orders", 1)
    billing = row(page, "consumers-table", "data-consumer", "billing")
    expect(billing.locator('[data-testid="lag"]')).to_have_text(f"{end - 4:,}")
    shot(page, tmp_path, "stream-orders")
    # from a partition to its records
    row(page, "partitions-table", "data-partition", 1).locator('[data-testid="browse"]').click()
    expect(page.locator('[data-testid="records-table"]')).to_contain_text("order 1-0")
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
    table = browse(page, node, stream_for("room"), "sds")
    first = table.locator("tr[data-index='0'] [data-testid='decoded']")
    expect(first).to_contain_text("SdsMessage (content)")
    expect(field(first, "sender_id")).to_have_text("alice")
    expect(field(first, "channel_id")).to_have_text("room")
    expect(field(first, "content")).to_have_text('"hi bob"')
    second = table.locator("tr[data-index='1'] [data-testid='decoded']")
    expect(field(second, "sender_id")).to_have_text("bob")
    # bob's message depends on alice's, and its hint points at her record
    expect(field(second, "causal_history")).to_contain_text(f"{stream_for('room')}")
    shot(page, tmp_path, "records-sds")


def test_record_browser_decodes_cardinal_messages(page: Any, node: Node, tmp_path: Path) -> None:
    table = browse(page, node, "chain", "cardinal")
    decoded = table.locator("[data-testid='decoded']")
    expect(decoded.first).to_be_visible()
    types = {t.strip() for t in decoded.locator(".dtype").all_inner_texts()}
    assert "Batch" in types, types
    batch = decoded.filter(has=page.locator(".dtype", has_text=re.compile("^Batch$"))).first
    expect(field(batch, "number")).to_be_visible()
    expect(field(batch, "parent")).to_be_visible()
    shot(page, tmp_path, "records-cardinal")


def test_record_browser_decodes_icrc_events_and_waku_messages(
    page: Any, node: Node, tmp_path: Path
) -> None:
    table = browse(page, node, "icrc.payments", "icrc")
    first = table.locator("tr[data-index='0'] [data-testid='decoded']")
    expect(first).to_contain_text("ICRC-72 event")
    expect(field(first, "data")).to_contain_text("amount")
    expect(field(first, "data")).to_contain_text("100")
    expect(field(first, "data")).to_contain_text("rent")
    shot(page, tmp_path, "records-icrc")
    table = browse(page, node, "community.status", "waku")
    first = table.locator("tr[data-index='0'] [data-testid='decoded']")
    expect(first).to_contain_text("WakuMessage")
    expect(field(first, "content_topic")).to_have_text("/status/1/chat/proto")
    expect(field(first, "payload")).to_have_text('"hello community 0"')
    # the same records read as another format: a per-record message, not a broken page
    page.select_option('select[name="view"]', "cardinal")
    expect(table.locator('[data-testid="decode-error"]').first).to_contain_text(
        "not a Cardinal message"
    )
    shot(page, tmp_path, "records-waku")
