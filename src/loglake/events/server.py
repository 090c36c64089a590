"""Serves one role core over HTTP (aiohttp), so each role can run in its own process.

The I/O adapter of the sans-I/O cores. Per request: verify the call's signature
(``identity.verify_call``; bad → 401), decode the Candid argument (malformed → 400), dispatch to
the core with the verified caller, encode the result. Calls the core queues (its outbox) are sent
by one background task, in order, signed with the role's own key, to the URL the directory gives
for the target principal; replies go back to the core (``on_reply``). A publisher is pumped by a
second task while it has replays to procure.

Besides the ICRC methods, two local methods serve the CLI and tests (Candid too):
``loglake_publish`` (publisher; caller must be the publisher itself) and ``loglake_inbox``
(subscriber; caller must be the subscriber itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from loglake.errors import DecodeError, LoglakeError
from loglake.events.broadcaster import Broadcaster
from loglake.events.codec import METHODS
from loglake.events.identity import Identity, SignatureError, principal_from_text, verify_call
from loglake.events.orchestrator import Orchestrator
from loglake.events.publisher import Publisher
from loglake.events.role import Call, Role
from loglake.events.subscriber import Subscriber

log = logging.getLogger("loglake.events.server")

ALL_METHODS = METHODS
LOCAL_METHODS = ("loglake_publish", "loglake_inbox")


class Forbidden(LoglakeError):
    pass


class RoleServer:
    def __init__(
        self,
        role: Role,
        identity: Identity,
        directory: dict[bytes, str],
        clock: Callable[[], int] = time.time_ns,
        throttle_s: float = 0.0,
    ) -> None:
        self.throttle_s = throttle_s
        if role.principal != identity.principal:
            raise ValueError("the role's principal must be the identity's")
        self.role, self.identity, self.directory, self.clock = role, identity, directory, clock
        self.queue: asyncio.Queue[Call] = asyncio.Queue()
        self.tasks: list[asyncio.Task[Any]] = []
        self.session: aiohttp.ClientSession | None = None
        self.wake = asyncio.Event()
        self.app = web.Application(client_max_size=256 * 1024 * 1024)
        self.app.router.add_post("/api/{method}", self.handle)
        self.app.on_startup.append(self._start)
        self.app.on_cleanup.append(self._stop)

    # -- serving ---------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.Response:
        name = request.match_info["method"]
        m = ALL_METHODS.get(name)
        if m is None or (name not in self.role.methods and name not in self._local()):
            return web.Response(status=404, text=f"no method {name}")
        body = await request.read()
        now = self.clock()
        try:
            hdrs = {k.lower(): v for k, v in request.headers.items()}
            caller = verify_call(name, body, hdrs, now)
        except SignatureError as e:
            return web.Response(status=401, text=str(e))
        try:
            arg = m.decode_arg(body)
        except DecodeError as e:
            return web.Response(status=400, text=f"malformed Candid argument: {e}")
        try:
            if name in LOCAL_METHODS:
                ret = self._local()[name](caller, arg, now)
            else:
                ret = self.role.dispatch(caller, name, arg, now)
            out = m.encode_ret(ret)
        except Forbidden as e:
            return web.Response(status=403, text=str(e))
        except LoglakeError as e:
            return web.Response(status=400, text=f"{type(e).__name__}: {e}")
        self._drain()
        return web.Response(body=out, content_type="application/candid")

    def _local(self) -> dict[str, Callable[..., Any]]:
        out: dict[str, Callable[..., Any]] = {}
        if isinstance(self.role, Publisher):
            out["loglake_publish"] = self._publish
        if isinstance(self.role, Subscriber):
            out["loglake_inbox"] = self._inbox
        return out

    def _publish(self, caller: Any, arg: Any, now: int) -> list[int]:
        if caller != self.role.principal:
            raise Forbidden("only the publisher itself may publish")
        ns, items = arg
        return self.role.publish(ns, items, now)  # type: ignore[attr-defined]

    def _inbox(self, caller: Any, n: int, now: int) -> list[Any]:
        if caller != self.role.principal:
            raise Forbidden("only the subscriber itself may read its inbox")
        return self.role.take(n)  # type: ignore[attr-defined]

    # -- sending ---------------------------------------------------------------------------
    def _drain(self) -> None:
        for c in self.role.take_outbox():
            self.queue.put_nowait(c)
        self.wake.set()

    async def _start(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        self.tasks = [asyncio.create_task(self._sender())]
        if isinstance(self.role, Publisher | Broadcaster | Orchestrator):
            # replays; relay resends; an orchestrator's resends after a restart
            self.tasks.append(asyncio.create_task(self._pumper()))
        self._drain()

    async def _stop(self, app: web.Application) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.session is not None:
            await self.session.close()

    async def _send(self, c: Call) -> Any:
        url = self.directory.get(c.target.bytes)
        if url is None:
            raise ConnectionError(f"no address for {c.target}")
        m = METHODS[c.method]
        body = m.encode_arg(c.arg)
        headers = self.identity.sign_call(c.method, body, self.clock())
        assert self.session is not None
        async with self.session.post(
            f"{url}/api/{c.method}",
            data=body,
            headers={"content-type": "application/candid", **headers},
        ) as resp:
            data = await resp.read()
            if resp.status != 200:
                raise ConnectionError(f"{c.method} → {resp.status}: {data[:200]!r}")
        return m.decode_ret(data)

    async def _sender(self) -> None:
        while True:
            c = await self.queue.get()
            try:
                reply: Any = await self._send(c)
            except Exception as e:  # the core decides what a failed call means
                log.warning("call %s to %s failed: %s", c.method, c.target, e)
                reply = e
            self.role.on_reply(c, reply, self.clock())
            self._drain()

    async def _pumper(self) -> None:
        while True:
            if self.role.pump(self.clock()):
                self._drain()
                await asyncio.sleep(self.throttle_s)
            else:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=0.05)


def load_directory(path: str | Path) -> dict[bytes, str]:
    """``{"<principal text>": "http://127.0.0.1:PORT", ...}`` → ``{principal bytes: url}``."""
    raw = json.loads(Path(path).read_text())
    return {principal_from_text(k).bytes: v.rstrip("/") for k, v in raw.items()}
