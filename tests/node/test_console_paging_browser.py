"""The console's lists past one page, in a real browser (Debian's chromium through Playwright,
as ``test_console_browser.py`` drives it) against a real ``loglake node`` process fed over the
stream service, as anyone can feed it: 505 streams named ``0…`` sort before the operator's
``orders``, and 250 consumers at index 0 of a long stream fill the most-behind view before the
operator's ``billing``. The real stream and consumer are found through the filter and through
the next page; the record browser's stream dropdown finds ``orders`` through its filter.
Before: the streams page polled the first 500 streams only and the consumers list the 200 most
behind, with no filter and no next page: neither ``orders`` nor ``billing`` could be reached."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loglake.streams.client import StreamClient
from tests.node.lightnode import LightNode, light_node
from tests.node.test_console_browser import (  # noqa: F401 -- fixtures used by name
    browser,
    expect,
    open_console,
    page,
    pytestmark,
    row,
    shot,
)

JUNK_STREAMS = 505
JUNK_CONSUMERS = 250


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LightNode]:
    with light_node(tmp_path_factory.mktemp("console-paging")) as n:
        with StreamClient(port=n.streams_port, timeout=10) as c:
            c.create_stream("orders")  # the operator's
            c.push_many("orders", [f"order {i}".encode() for i in range(3)])
            c.save_index("billing", "orders", 1)  # lag 2
            for i in range(JUNK_STREAMS):  # anyone's, sorting first
                c.create_stream(f"0{i:04d}")
            c.create_stream("0junk")
            c.push_many("0junk", [b"y"] * 20)
            for i in range(JUNK_CONSUMERS):  # lag 20 each: the most behind
                c.save_index(f"0fake-{i:03d}", "0junk", 0)
        yield n


def test_a_stream_past_the_first_page_is_found_by_filter_and_next_page(
    page: Any,  # noqa: F811 -- the imported fixture, requested by name
    node: LightNode,
    tmp_path: Path,
) -> None:
    open_console(page, node, "/streams")
    table = page.locator('[data-testid="streams-table"]')
    shown = page.locator('[data-testid="streams-shown"]')
    total = JUNK_STREAMS + 2
    expect(shown).to_have_text(f"Showing 1–500 of {total} streams (by name).")
    expect(table.locator("tbody tr")).to_have_count(500)
    orders = row(page, "streams-table", "data-stream", "orders")
    expect(orders).to_have_count(0)
    page.click('[data-testid="streams-next"]')
    expect(shown).to_have_text(f"Showing 501–{total} of {total} streams (by name).")
    expect(orders).to_have_count(1)
    expect(orders.locator('[data-testid="records"]')).to_have_text("3")
    expect(page.locator('[data-testid="streams-next"]')).to_be_disabled()
    page.click('[data-testid="streams-prev"]')
    expect(shown).to_contain_text("Showing 1–500 of")
    expect(orders).to_have_count(0)
    page.fill('[data-testid="streams-filter"]', "ORD")
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(orders).to_have_count(1)
    shot(page, tmp_path, "streams-filtered")
    page.fill('[data-testid="streams-filter"]', "0049")
    expect(table.locator("tbody tr")).to_have_count(11)  # 00049, 00490…00499


def test_a_consumer_left_out_of_the_most_behind_is_found_by_filter_and_next_page(
    page: Any,  # noqa: F811
    node: LightNode,
    tmp_path: Path,
) -> None:
    open_console(page, node, "/streams")
    notice = page.locator('[data-testid="consumers-shown"]')
    total = JUNK_CONSUMERS + 1
    expect(notice).to_have_text(f"Showing the 200 most behind of {total} consumers.")
    billing = row(page, "consumers-table", "data-consumer", "billing")
    expect(billing).to_have_count(0)
    page.fill('[data-testid="consumers-filter"]', "bill")
    expect(billing).to_have_count(1)
    expect(billing.locator('[data-testid="lag"]')).to_have_text("2")
    page.fill('[data-testid="consumers-filter"]', "orders")  # the stream's name
    expect(page.locator('[data-testid="consumers-table"] tbody tr')).to_have_count(1)
    expect(billing).to_have_count(1)
    page.fill('[data-testid="consumers-filter"]', "")
    expect(billing).to_have_count(0)
    # every consumer, by client id, a page at a time ("0fake-…" sort before "billing")
    page.select_option('[data-testid="consumers-order"]', "client")
    expect(notice).to_have_text(f"Showing 1–200 of {total} consumers (by client id).")
    expect(billing).to_have_count(0)
    page.click('[data-testid="consumers-next"]')
    expect(notice).to_have_text(f"Showing 201–{total} of {total} consumers (by client id).")
    expect(billing).to_have_count(1)
    shot(page, tmp_path, "consumers-next-page")
    page.click('[data-testid="consumers-prev"]')
    expect(billing).to_have_count(0)
    # one stream's consumers: the filter is on the client id
    open_console(page, node, "/streams?stream=0junk")
    expect(page.locator('[data-testid="consumers-shown"]')).to_contain_text(
        f"of {JUNK_CONSUMERS} consumers"
    )
    page.fill('[data-testid="consumers-filter"]', "fake-137")
    rows = page.locator('[data-testid="consumers-table"] tbody tr')
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-consumer", "0fake-137")


def test_the_record_browser_finds_a_stream_past_the_first_page_by_its_filter(
    page: Any,  # noqa: F811
    node: LightNode,
    tmp_path: Path,
) -> None:
    open_console(page, node, "/records?stream=00000&partition=0&start=0")
    select = page.locator('select[name="stream"]')
    options = select.locator("option")
    expect(select).to_have_value("00000")
    expect(page.locator('[data-testid="stream-choices"]')).to_have_text(
        f"the first 500 of {JUNK_STREAMS + 2}: filter to find another"
    )
    expect(options).to_have_count(500)
    expect(options.filter(has_text=re.compile("^orders$"))).to_have_count(0)
    page.fill('[data-testid="stream-filter"]', "orders")
    expect(options).to_have_text(["00000", "orders"])  # the chosen one stays listed
    select.select_option("orders")
    table = page.locator('[data-testid="records-table"]')
    expect(table.locator("tr[data-index='2']")).to_contain_text("order 2")
    expect(select).to_have_value("orders")
    assert "stream=orders" in page.url
    shot(page, tmp_path, "records-filtered")
