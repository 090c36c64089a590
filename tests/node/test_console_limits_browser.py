"""The console where the node bounds what it answers, in a real browser (Debian's chromium
through Playwright, as ``test_console_browser.py`` drives it) against a real ``loglake node``
process fed over the stream service, as anyone can feed it: an ICRC-72 event of 20,000 values
is shown up to the record's budget and says how many are left out; more streams and consumers
than a page shows say how many there are in all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loglake.events.publisher import stored_event
from loglake.streams.client import StreamClient
from loglake.wire import icrc16
from tests.node.lightnode import LightNode, light_node
from tests.node.test_console_browser import (  # noqa: F401 -- fixtures used by name
    browser,
    expect,
    open_console,
    page,
    pytestmark,
    shot,
)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LightNode]:
    with light_node(tmp_path_factory.mktemp("console-limits")) as n:
        yield n


def test_a_large_icrc_event_is_shown_cut_with_what_is_left_out(
    page: Any,  # noqa: F811 -- the imported fixture, requested by name
    node: LightNode,
    tmp_path: Path,
) -> None:
    with StreamClient(port=node.streams_port, timeout=10) as c:
        c.create_stream("big-events")
        c.push("big-events", stored_event({"Array": [icrc16.nat(7)] * 20_000}, None, 0))
    open_console(page, node, "/records?stream=big-events&partition=0&start=0&limit=1&view=icrc")
    decoded = page.locator("tr[data-index='0'] [data-testid='decoded']")
    # the node decodes 20,000 values and the page lays out the 5,000 shown: seconds on a
    # loaded 2-core machine, past expect's default 5 s (what is shown is the test)
    expect(decoded).to_contain_text("ICRC-72 event", timeout=30_000)
    cut = decoded.locator('[data-testid="truncated"]')
    expect(cut).to_have_count(1)
    expect(cut).to_have_text("… 15,001 more not shown")
    assert decoded.locator("ol.arr > li").count() == 5_000


def test_more_consumers_than_a_page_show_the_most_behind_and_the_total(
    page: Any,  # noqa: F811
    node: LightNode,
    tmp_path: Path,
) -> None:
    with StreamClient(port=node.streams_port, timeout=10) as c:
        c.create_stream("work")
        c.push_many("work", [b"x"] * 5)
        for i in range(250):  # 200 are shown
            c.save_index(f"worker-{i:03d}", "work", 5 if i != 137 else 0)
    open_console(page, node, "/streams")
    notice = page.locator('[data-testid="consumers-shown"]')
    expect(notice).to_have_text("Showing the 200 most behind of 250 consumers.")
    first = page.locator('[data-testid="consumers-table"] tbody tr').first
    expect(first).to_have_attribute("data-consumer", "worker-137")  # lag 5, the most behind
    open_console(page, node, "/streams?stream=work")
    expect(page.locator('[data-testid="consumers-shown"]')).to_contain_text("of 250 consumers")
    shot(page, tmp_path, "consumers-paged")
