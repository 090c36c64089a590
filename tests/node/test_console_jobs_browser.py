"""Every Spark job the console offers, started from the console in a real browser.

The console's jobs page used to be tested only in its disabled state, so ``sds-audit`` failing
on every start (a bare ``AssertionError``) went unseen. Here a node with ``[jobs]`` and
``[sds]`` on runs in process; its SDS participants exchange messages through the node's API;
then each job is chosen in the page's form, started, and followed until the table says it
succeeded — in Debian's chromium driven by Playwright, as in ``test_console_browser.py``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright import sync_api as playwright_sync

from loglake.node.config import load_config
from loglake.node.runner import BackgroundNode
from loglake.streams import StreamClient
from tests.node.test_console_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.peer("chromium", shutil.which(CHROMIUM) is not None, "apt-get install chromium"),
]
expect = playwright_sync.expect
CHANNEL = "room"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundNode]:
    data = tmp_path_factory.mktemp("jobs-node")
    cfg = load_config(
        data={
            "data_dir": str(data),
            "http": {"port": 0},
            "streams": {"port": 0, "segment_bytes": 4096},
            "sds": {"enabled": True, "channel": CHANNEL, "participants": ["alice", "bob"]},
            "jobs": {"enabled": True},
        },
        env={},
    )
    with BackgroundNode(cfg) as n:
        with httpx.Client(
            base_url=n.url + "/api", headers={"Authorization": f"Bearer {n.token}"}, timeout=60
        ) as api:
            for sender, text in (("alice", "hi bob"), ("bob", "hi alice"), ("alice", "bye")):
                r = api.post(
                    f"/sds/channels/{CHANNEL}/messages", json={"sender": sender, "text": text}
                )
                assert r.status_code < 300, r.text
        addr = n.context.stream_address
        assert addr is not None
        with StreamClient(port=addr[1]) as c:  # sealed history for compact: 20 segments
            c.create_stream("hist", 1)
            for _ in range(20):
                c.push_many("hist", [b"x" * 200] * 100)
        n.context.log.wait_for_seals()
        yield n


@pytest.fixture
def page(node: BackgroundNode) -> Iterator[Any]:
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            pg = browser.new_page(viewport={"width": 1280, "height": 860})
            errors: list[str] = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            yield pg
            assert not errors, f"JavaScript errors on the page: {errors}"
        finally:
            browser.close()


@pytest.mark.parametrize(("job", "stream"), [("sds-audit", f"sds.{CHANNEL}"), ("compact", "hist")])
def test_each_job_starts_from_the_console_and_succeeds(
    page: Any, node: BackgroundNode, job: str, stream: str, tmp_path: Path
) -> None:
    page.goto(f"{node.url}/console/#/jobs&token={node.token}")
    form = page.locator('[data-testid="job-form"]')
    form.locator('select[name="job"]').select_option(job)
    form.locator('select[name="stream"]').select_option(stream)
    form.locator('button[type="submit"]').click()
    expect(page.locator('[data-testid="job-message"]')).to_contain_text("submitted")
    newest = page.locator('[data-testid="jobs-table"] tbody tr').first
    expect(newest).to_contain_text(job)
    # the first job starts the node's Spark session (tens of seconds on a 2-core machine)
    expect(newest.locator('[data-testid="job-state"]')).to_have_text("succeeded", timeout=240_000)
    page.screenshot(path=str(tmp_path / f"job-{job}.png"), full_page=True)
