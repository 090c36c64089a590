"""The console's Cluster page in a real browser (Debian chromium driven by Playwright, as in
``test_console_browser.py``): two nodes on a real 3-node JetStream cluster (loopback), the page
of each shows who holds the sealer's lease, the meta leader and the stream groups, and — on the
node that seals — the sealer's lag; the page of a node on the embedded log says it has no
cluster."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright import sync_api as playwright_sync

from loglake.node.config import embedded_default
from loglake.node.runner import BackgroundNode
from loglake.streams.jetstream import JetStreamLog
from loglake.streams.jetstream_seal import sealed_next
from tests.conftest import require_peer
from tests.nats_cluster import NATS_HINT, NatsCluster, have_nats_server
from tests.node.conftest import background_node
from tests.node.test_console_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.peer("chromium", shutil.which(CHROMIUM) is not None, "apt-get install chromium"),
]
expect = playwright_sync.expect


@pytest.fixture
def browser() -> Iterator[Any]:
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def open_page(browser: Any, node: BackgroundNode, errors: list[str]) -> Any:
    pg = browser.new_page(viewport={"width": 1280, "height": 900})
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(f"{node.url}/console/#/cluster&token={node.token}")
    return pg


def test_the_cluster_page_shows_leases_leaders_and_the_sealer_lag(
    browser: Any, tmp_path: Path
) -> None:
    require_peer("nats-server", have_nats_server(), NATS_HINT)
    prefix = "con" + uuid.uuid4().hex[:8]
    errors: list[str] = []
    with NatsCluster(3) as nats3:
        mon = nats3.monitor_urls
        # The holder seals as soon as it takes the lease, so the stream and 3 records are there
        # first: that round seals them (waited for below), and the 7 appended after it are the
        # lag the page shows until the next round (an hour away). Appended while the lease was
        # still being taken, the 7 were sealed by that first round on a loaded machine (lag 0).
        log = JetStreamLog(nats3.url, prefix=prefix)
        log.create_stream_replicated("orders", None, 3)
        log.append_payloads("orders", [b"early%d" % i for i in range(3)], partition=0)
        # Leases of 30 s, not the fixture's 2 s: this test is not about failover, and on a loaded
        # machine a 2 s lease changed hands between the two pages (a CI run saw it).
        opts = {"nats_monitor": mon, "seal_interval": 3600, "lease_ttl": 30}
        a = background_node(nats3.url, tmp_path / "a", prefix, **opts)
        b = background_node(nats3.url, tmp_path / "b", prefix, **opts)
        try:
            deadline = time.monotonic() + 30
            while not (a.node.leases.holds("sealer") or b.node.leases.holds("sealer")):
                assert time.monotonic() < deadline, "no node took the sealer's lease"
                time.sleep(0.1)
            holder, other = (a, b) if a.node.leases.holds("sealer") else (b, a)
            name = holder.node.leases.holder
            while sealed_next(tmp_path / ("a" if holder is a else "b"), "orders", 0) < 3:
                assert time.monotonic() < deadline, "the holder did not seal on taking the lease"
                time.sleep(0.1)
            log.append_payloads("orders", [b"x%d" % i for i in range(7)], partition=0)

            pg = open_page(browser, holder, errors)
            expect(pg.locator('[data-testid="nav-cluster"]')).to_have_class("active")
            expect(pg.locator('[data-testid="backend"]')).to_contain_text("reachable")
            row = pg.locator('[data-testid="leases-table"] tr[data-key="sealer"]')
            expect(row).to_contain_text(name)
            expect(row).to_contain_text("this node")
            expect(pg.locator('[data-testid="meta-leader"]')).to_have_text(
                nats3.varz(0, "jsz")["meta_cluster"]["leader"]
            )
            expect(pg.locator('[data-testid="meta"] [data-testid="peer"]')).to_have_count(3)
            group = pg.locator(
                f'[data-testid="groups-table"] tr[data-key="{log.js_name("orders", 0)}"]'
            )
            expect(group).to_contain_text("orders / 0")
            expect(group.locator('[data-testid="peer"]')).to_have_count(3)
            expect(group.locator('[data-state="leader"]')).to_have_count(1)
            lag = pg.locator('[data-testid="sealer-table"] tr[data-key="orders"]')
            expect(lag.locator('[data-testid="lag-records"]')).to_have_text("7")
            pg.screenshot(path=str(tmp_path / "cluster-holder.png"), full_page=True)

            pg2 = open_page(browser, other, errors)
            row = pg2.locator('[data-testid="leases-table"] tr[data-key="sealer"]')
            expect(row).to_contain_text(name)
            expect(row).not_to_contain_text("this node")
            expect(pg2.locator('[data-testid="sealer-elsewhere"]')).to_contain_text(name)
        finally:
            log.close()
            a.stop()
            b.stop()
    assert not errors, f"JavaScript errors on the page: {errors}"


def test_the_cluster_page_of_an_embedded_node_says_there_is_no_cluster(
    browser: Any, tmp_path: Path
) -> None:
    errors: list[str] = []
    with BackgroundNode(embedded_default(tmp_path), say=lambda _: None) as node:
        pg = open_page(browser, node, errors)
        expect(pg.locator('[data-testid="embedded"]')).to_contain_text("no cluster")
    assert not errors, f"JavaScript errors on the page: {errors}"
