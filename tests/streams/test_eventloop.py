"""The servers' event loop: uvloop unless the environment asks for asyncio's."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
import uvloop

from loglake.streams import eventloop
from loglake.streams.client import StreamClient
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService


def test_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.ENV, raising=False)
    loop = eventloop.new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_asyncio_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV, "asyncio")
    loop = eventloop.new_event_loop()
    try:
        assert not isinstance(loop, uvloop.Loop)
        assert isinstance(loop, asyncio.BaseEventLoop)
    finally:
        loop.close()


def test_a_wrong_choice_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV, "tokio")
    with pytest.raises(eventloop.EventLoopChoiceError, match="LOGLAKE_EVENT_LOOP"):
        eventloop.new_event_loop()


def test_uvloop_asked_for_but_absent_is_an_error_not_a_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    monkeypatch.setenv(eventloop.ENV, "uvloop")
    with pytest.raises(eventloop.EventLoopChoiceError, match="not installed"):
        eventloop.new_event_loop()
    monkeypatch.delenv(eventloop.ENV)
    loop = eventloop.new_event_loop()  # unset: asyncio's loop where uvloop is missing
    try:
        assert isinstance(loop, asyncio.BaseEventLoop)
    finally:
        loop.close()


def test_serve_names_a_wrong_choice_without_a_traceback(tmp_path) -> None:
    import subprocess

    env = {**os.environ, eventloop.ENV: "tokio"}
    p = subprocess.run(
        [sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(tmp_path), "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1
    assert "LOGLAKE_EVENT_LOOP must be 'uvloop' or 'asyncio'" in p.stderr
    assert "Traceback" not in p.stderr


def test_run_returns_the_coroutines_value_on_that_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.ENV, raising=False)

    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert eventloop.run(which()).startswith("uvloop")


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_the_stream_server_serves_on_either_loop(
    tmp_path, monkeypatch: pytest.MonkeyPatch, choice: str
) -> None:
    from loglake.log import open_log

    monkeypatch.setenv(eventloop.ENV, choice)
    log = open_log(tmp_path)
    try:
        with BackgroundServer(StreamService(log)) as srv, StreamClient(port=srv.port) as c:
            assert isinstance(srv._thread._loop, uvloop.Loop) == (choice == "uvloop")
            c.create_stream("s")
            assert [c.push("s", b"x%d" % i) for i in range(3)] == [0, 1, 2]
            assert c.push_many("s", [b"y"] * 500) == list(range(3, 503))
            assert [r.data for r in c.pull("s", 0, 3)] == [b"x0", b"x1", b"x2"]
    finally:
        log.close()
