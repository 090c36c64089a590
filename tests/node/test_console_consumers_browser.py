"""The console's consumer actions in a real browser (Debian's chromium through Playwright, as
``test_console_browser.py`` drives it) against a real ``loglake node`` process: a consumer a
client saved at 2^64-1 over the stream service (stuck: saves only move an index up) is reset
from the consumers view, the client's next save lands, and the consumer is then deleted."""

from __future__ import annotations

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
from tests.waiting import wait_until

TOP = 2**64 - 1


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LightNode]:
    with light_node(tmp_path_factory.mktemp("console-consumers")) as n:
        yield n


def test_a_stuck_consumer_is_reset_then_deleted_from_the_console(
    page: Any,  # noqa: F811 -- the imported fixture, requested by name
    node: LightNode,
    tmp_path: Path,
) -> None:
    with StreamClient(port=node.streams_port, timeout=10) as c:
        c.create_stream("orders")
        c.push_many("orders", [b"a", b"b", b"c"])
        c.save_index("billing", "orders", TOP)
        assert c.save_index("billing", "orders", 1) == TOP  # stuck
        open_console(page, node, "/streams?stream=orders")
        billing = row(page, "consumers-table", "data-consumer", "billing")
        # JSON numbers past 2^53 reach JavaScript rounded: the page shows 2^64-1 as ...552,000
        expect(billing.locator('[data-testid="index"]')).to_contain_text("18,446,744,073,709,55")
        expect(billing.locator('[data-testid="owner"]')).to_have_text("nobody")
        billing.locator('[data-testid="reset"]').click()
        billing.locator('[data-testid="reset-to"]').fill("1")
        shot(page, tmp_path, "consumer-reset-confirm")
        billing.locator('[data-testid="confirm-reset"]').click()
        message = page.locator('[data-testid="consumer-message"]')
        expect(message).to_contain_text("reset from 18,446,744,073,709,55")
        expect(message).to_contain_text("to 1.")
        expect(billing.locator('[data-testid="index"]')).to_have_text("1")
        expect(billing.locator('[data-testid="lag"]')).to_have_text("2")
        assert c.save_index("billing", "orders", 2) == 2  # un-stuck
        shot(page, tmp_path, "consumer-reset")
        billing.locator('[data-testid="delete"]').click()
        billing.locator('[data-testid="confirm-delete"]').click()
        expect(message).to_contain_text("deleted (it was at 2)")
        expect(billing).to_have_count(0)
        wait_until(lambda: c.get_index("billing", "orders") == 0, 5)  # a new record at 0
