"""Serves one role core over HTTP (aiohttp), so each role can run in its own process.

The I/O adapter of the sans-I/O cores. Per request: verify the call's signature
(``identity.verify_call``; bad, expired or replayed → 401; the replay guard full → 503), decode
the Candid argument (malformed → 400), dispatch to the core with the verified caller (pure CPU
work on the event loop), wait until the actions the core queued have been performed, encode the
result.

Actions (``actions.py``) are performed in the order the core queued them by one task:
storage actions run on a worker thread (``asyncio.to_thread``) through the role's
``StreamsStore`` — an fsync never stalls the event loop, and the actions of every request queued
meanwhile go to the store together (one group commit) — and their results go back to the core
(``on_result``). Calls are handed, in order, to a sender task that signs them with the role's
own key and posts them to the URL the directory gives for the target principal; replies go back
to the core (``on_reply``). Nothing queued after a storage action — a call, or the reply to the
request that caused it — leaves before that action is done. A publisher, broadcaster or
orchestrator is pumped by a third task. A storage action that fails leaves the core ahead of
its log: the server answers 503 from then on (restart it; the state is rebuilt from the log).

Besides the ICRC methods, two local methods serve the CLI and tests (Candid too):
``loglake_publish`` (publisher; caller must be the publisher itself) and ``loglake_inbox``
(subscriber; caller must be the subscriber itself).
"""

from __future__ import annotations

import asyncio
import collections
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
from loglake.events.actions import Action, AppendEvents, Call, JobAction
from loglake.events.broadcaster import Broadcaster
from loglake.events.codec import METHODS
from loglake.events.identity import (
    Identity,
    ReplayCacheFull,
    ReplayGuard,
    SignatureError,
    principal_from_text,
    verify_call,
)
from loglake.events.orchestrator import Orchestrator
from loglake.events.publisher import Publisher
from loglake.events.role import Role
from loglake.events.store import ReplayJobs, StreamsStore, perform_job
from loglake.events.subscriber import Subscriber

log = logging.getLogger("loglake.events.server")

ALL_METHODS = METHODS
LOCAL_METHODS = ("loglake_publish", "loglake_inbox")


class Forbidden(LoglakeError):
    pass


class HttpRoleServer:
    def __init__(
        self,
        role: Role,
        identity: Identity,
        directory: dict[bytes, str],
        store: StreamsStore | None = None,
        clock: Callable[[], int] = time.time_ns,
        throttle_s: float = 0.0,
        jobs: ReplayJobs | None = None,
        replays: ReplayGuard | None = None,
    ) -> None:
        self.throttle_s = throttle_s
        self.replays = replays if replays is not None else ReplayGuard()
        """Signed calls accepted and not yet expired: a second use is refused (401)."""
        self.jobs = jobs
        """Performs replay job actions (issue 11 §2: an orchestrator's Spark jobs, a
        broadcaster's reads of their output), off the event loop like storage."""
        self.store = store
        self.batches: list[tuple[list[Action], asyncio.Future[dict[Action, Any]]]] = []
        self.kick = asyncio.Event()
        self.failed: BaseException | None = None
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
        if self.failed is not None:
            return web.Response(status=503, text=f"storage failed; restart the role: {self.failed}")
        now = self.clock()
        try:
            hdrs = {k.lower(): v for k, v in request.headers.items()}
            caller = verify_call(name, body, hdrs, now, self.replays)
        except SignatureError as e:
            return web.Response(status=401, text=str(e))
        except ReplayCacheFull as e:
            return web.Response(status=503, text=str(e), headers={"retry-after": "5"})
        try:
            arg = m.decode_arg(body)
        except DecodeError as e:
            return web.Response(status=400, text=f"malformed Candid argument: {e}")
        try:
            if name in LOCAL_METHODS:
                ret = self._local()[name](caller, arg, now)
            else:
                ret = self.role.dispatch(caller, name, arg, now)
        except Forbidden as e:
            self.drain()
            return web.Response(status=403, text=str(e))
        except LoglakeError as e:
            self.drain()
            return web.Response(status=400, text=f"{type(e).__name__}: {e}")
        try:
            results = await self.drain()
        except Exception as e:  # any storage failure: the role stops serving
            return web.Response(status=503, text=f"storage failed: {e}")
        if isinstance(ret, AppendEvents):  # loglake_publish: the ids the stream assigned
            ret = results[ret]
        try:
            out = m.encode_ret(ret)
        except LoglakeError as e:
            return web.Response(status=400, text=f"{type(e).__name__}: {e}")
        return web.Response(body=out, content_type="application/candid")

    def _local(self) -> dict[str, Callable[..., Any]]:
        out: dict[str, Callable[..., Any]] = {}
        if isinstance(self.role, Publisher):
            out["loglake_publish"] = self._publish
        if isinstance(self.role, Subscriber):
            out["loglake_inbox"] = self._inbox
        return out

    def _publish(self, caller: Any, arg: Any, now: int) -> AppendEvents:
        if caller != self.role.principal:
            raise Forbidden("only the publisher itself may publish")
        ns, items = arg
        assert isinstance(self.role, Publisher)  # only a publisher's server routes here
        return self.role.publish(ns, items, now)

    def _inbox(self, caller: Any, n: int, now: int) -> list[Any]:
        if caller != self.role.principal:
            raise Forbidden("only the subscriber itself may read its inbox")
        assert isinstance(self.role, Subscriber)  # only a subscriber's server routes here
        return self.role.take(n)

    # -- performing actions -------------------------------------------------------------------
    def drain(self) -> asyncio.Future[dict[Action, Any]]:
        """Hand the core's queued actions to the performer; the future resolves (to the results
        of the storage actions) once they and everything queued before them are performed."""
        fut: asyncio.Future[dict[Action, Any]] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_consume)
        self.batches.append((self.role.take_outbox(), fut))
        self.kick.set()
        self.wake.set()
        return fut

    async def _performer(self) -> None:
        while True:
            await self.kick.wait()
            self.kick.clear()
            while self.batches:
                batches, self.batches = self.batches, []
                actions = [a for acts, _ in batches for a in acts]
                try:
                    results = await self._perform(actions)
                except Exception as e:  # the core is now ahead of its log
                    log.exception("storage action failed; the role stops serving")
                    self.failed = e
                    for _, fut in [*batches, *self.batches]:
                        fut.set_exception(e)
                    self.batches = []
                    continue
                for _, fut in batches:
                    fut.set_result(results)
                self.wake.set()  # results may have made work for the pump (a replay's bounds)

    async def _perform(self, actions: list[Action]) -> dict[Action, Any]:
        results: dict[Action, Any] = {}
        work = collections.deque(actions)
        while work:
            a = work.popleft()
            if isinstance(a, Call):
                self.queue.put_nowait(a)
                continue
            if isinstance(a, JobAction):
                r = await asyncio.to_thread(perform_job, self.jobs, a)
                results[a] = r
                self.role.on_result(a, r, self.clock())
                work.extendleft(reversed(self.role.take_outbox()))
                continue
            group: list[Action] = [a]
            while work and not isinstance(work[0], Call | JobAction):
                group.append(work.popleft())
            if self.store is None:
                raise RuntimeError(f"{type(self.role).__name__} queued {a!r} and has no store")
            got = await asyncio.to_thread(self.store.perform_many, group)
            now = self.clock()
            for g, r in zip(group, got, strict=True):
                assert not isinstance(g, Call)
                results[g] = r
                self.role.on_result(g, r, now)
            work.extendleft(reversed(self.role.take_outbox()))  # consequences come first
        return results

    # -- sending ---------------------------------------------------------------------------
    async def _start(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        self.tasks = [asyncio.create_task(self._sender()), asyncio.create_task(self._performer())]
        if isinstance(self.role, Publisher | Broadcaster | Orchestrator):
            # replays; relay resends; an orchestrator's resends after a restart
            self.tasks.append(asyncio.create_task(self._pumper()))
        self.drain()

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
            self.drain()

    def _jobs_finished(self) -> bool:
        """Hand the ends of the orchestrator's replay jobs to it."""
        if self.jobs is None or not isinstance(self.role, Orchestrator):
            return False
        done = self.jobs.finished()
        for rid, result in done:
            self.role.job_finished(rid, result, self.clock())
        return bool(done)

    async def _pumper(self) -> None:
        while True:
            if self.failed is None and (self._jobs_finished() | self.role.pump(self.clock())):
                with contextlib.suppress(Exception):  # a failure is logged by the performer
                    await self.drain()  # reads done before the next pump: bounded memory
                await asyncio.sleep(self.throttle_s)
            else:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=0.05)


def _consume(fut: asyncio.Future[Any]) -> None:
    """Mark a future's exception as seen (the performer logs it once)."""
    if not fut.cancelled():
        fut.exception()


def load_directory(path: str | Path) -> dict[bytes, str]:
    """``{"<principal text>": "http://127.0.0.1:PORT", ...}`` → ``{principal bytes: url}``."""
    raw = json.loads(Path(path).read_text())
    return {principal_from_text(k).bytes: v.rstrip("/") for k, v in raw.items()}
