"""ICRC roles in the node over HTTP (``[events] transport = "http"``): any subset of roles.

The in-process network (``events.py``) needs every role in the node. Here each role the node
runs is served by the part's own adapter, ``events.HttpRoleServer`` (signed Candid over HTTP,
the one ``loglake events serve`` runs), on the node's event loop, one port per role
(``http_port`` + 0, 1, … in the order orchestrator, broadcaster, publisher, subscriber, one
per role run; or any free port: ``config.role_ports``). Roles elsewhere are reached through the
``directory`` file (``{"<principal>": "http://host:port"}``, as ``events serve`` reads it), so
a node can run, say, only a publisher and a subscriber against a remote orchestrator.

The API acts as the roles a person would: publishing is the publisher's ``loglake_publish``,
subscribing, replays and cancels are the subscriber's signed calls to the orchestrator, and
the subscriber's inbox is drained with ``loglake_inbox`` (``InboxReader``: at least once, each
call signed with the in-node role's key). The orchestrator's tables (namespaces,
subscriptions, replays) are read on the event loop that runs it, so a read never sees a
half-applied call; without a local orchestrator those routes answer 404.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from loglake.errors import LocalProtocolError
from loglake.node.api.context import NodeContext, PartDisabled
from loglake.node.api.events import (
    EventsCallFailed,
    EventsHandle,
    UnknownReplay,
    _identity,
    metric_families,
    registration_rows,
    replay_rows,
)
from loglake.node.config import role_ports

INBOX_POLL_S = 0.2


class EventsHttpHandle:
    def __init__(self, ctx: NodeContext, section: Any, loop: asyncio.AbstractEventLoop) -> None:
        from loglake.events import (
            C_REPLAY,
            Broadcaster,
            Publisher,
            Quotas,
            StreamsStore,
            Subscriber,
            load_directory,
            open_ledger,
            open_orchestrator,
            principal_from_text,
        )
        from loglake.streams import LocalStreams

        self.loop = loop
        self.ports = role_ports(section.roles, section.http_port)
        self.roles = tuple(self.ports)
        folder = ctx.data_dir / "events"
        self.ids = {r: _identity(folder, r, ctx.keys) for r in self.roles}
        self.principals = {r: i.principal for r, i in self.ids.items()}
        self.host = section.http_host
        self.directory: dict[bytes, str] = (
            load_directory(section.directory) if section.directory else {}
        )
        orch = (
            self.principals["orchestrator"]
            if "orchestrator" in self.principals
            else principal_from_text(section.orchestrator)
        )
        self.orchestrator_principal = orch
        streams = LocalStreams(ctx.log)
        self.cores: dict[str, Any] = {}
        self.stores: dict[str, Any] = {}
        self.publisher_reads: Any = None
        if "orchestrator" in self.roles:
            store = StreamsStore(streams)
            ledger = open_ledger(store, fee=1)
            store.perform_many(ledger.writes)
            ledger.writes.clear()
            broadcasters = [principal_from_text(b) for b in section.broadcasters]
            if "broadcaster" in self.principals:
                broadcasters.insert(0, self.principals["broadcaster"])
            self.cores["orchestrator"] = open_orchestrator(
                store, orch, broadcasters, Quotas(), ledger
            )
            self.stores["orchestrator"] = store
        if "broadcaster" in self.roles:
            self.cores["broadcaster"] = Broadcaster(self.principals["broadcaster"], orch)
        if "publisher" in self.roles:
            pub = Publisher(
                self.principals["publisher"],
                orch,
                batch_size=500,
                replay_rate=section.replay_rate or None,
            )
            for ns in section.namespaces:
                pub.register(ns, [(C_REPLAY, {"Bool": True})])
            self.cores["publisher"] = pub
            self.stores["publisher"] = StreamsStore(streams)
            # the replay rows' stream bounds, read on the loop: a store of their own, as the
            # publisher's store is in use on the server's worker thread
            self.publisher_reads = StreamsStore(streams)
        if "subscriber" in self.roles:
            self.cores["subscriber"] = Subscriber(self.principals["subscriber"], orch)
        self.servers: dict[str, Any] = {}
        self.runners: list[Any] = []
        self.urls: dict[str, str] = {}
        self.received: Counter[str] = Counter()
        self.inbox_tail: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._inbox_thread: threading.Thread | None = None

    @classmethod
    def start(
        cls, ctx: NodeContext, section: Any, loop: asyncio.AbstractEventLoop
    ) -> EventsHttpHandle:
        """Build the cores (blocking: journals are read), then serve them on ``loop``."""
        h = cls(ctx, section, loop)
        asyncio.run_coroutine_threadsafe(h._serve(), loop).result(60)
        if "subscriber" in h.roles:
            h._inbox_thread = threading.Thread(
                target=h._drain_inbox, name="loglake-events-inbox", daemon=True
            )
            h._inbox_thread.start()
        return h

    async def _serve(self) -> None:
        import socket

        from aiohttp import web

        from loglake.events import HttpRoleServer
        from loglake.events.server import RoleRunner

        # bind first: every URL must be in the directory before any server sends a call
        from loglake.node.runner import NodeStartError

        socks: dict[str, socket.socket] = {}
        for r in self.roles:
            try:
                s = socket.create_server((self.host, self.ports[r]))
            except OSError as e:  # a port taken: one line naming the key, not a traceback
                for bound in socks.values():
                    bound.close()
                raise NodeStartError(
                    f"[events] http_port: cannot listen on {self.host}:{self.ports[r]} for the "
                    f"{r}: {e.strerror or e}"
                ) from None
            socks[r] = s
            self.urls[r] = f"http://{self.host}:{s.getsockname()[1]}"
        local = {self.principals[r].bytes: self.urls[r] for r in self.roles}
        directory = {**self.directory, **local}
        for r in self.roles:
            server = HttpRoleServer(self.cores[r], self.ids[r], directory, self.stores.get(r))
            runner = RoleRunner(server.app, access_log=None)
            await runner.setup()
            await web.SockSite(runner, socks[r]).start()
            self.servers[r] = server
            self.runners.append(runner)

    def close(self) -> None:
        self._stop.set()
        if self._inbox_thread is not None:
            self._inbox_thread.join(timeout=30)
        if self.loop.is_running():

            async def cleanup() -> None:
                for runner in reversed(self.runners):
                    await runner.cleanup()

            asyncio.run_coroutine_threadsafe(cleanup(), self.loop).result(60)

    # -- acting as the roles ----------------------------------------------------------------
    def _client(self, role: str, target_url: str) -> Any:
        from loglake.events import HttpEventsClient

        return HttpEventsClient(target_url, self.ids[role])

    def _need(self, role: str) -> None:
        if role not in self.roles:
            raise PartDisabled(f"an ICRC {role}")

    def _orchestrator_url(self) -> str:
        url = self.urls.get("orchestrator") or self.directory.get(self.orchestrator_principal.bytes)
        if url is None:
            raise LocalProtocolError("the orchestrator's URL is not in [events] directory")
        return url

    def _as_subscriber(self, method: str, arg: Any) -> Any:
        self._need("subscriber")
        from loglake.events import CallRejected

        try:
            return self._client("subscriber", self._orchestrator_url()).call(method, arg)
        except CallRejected as e:
            raise EventsCallFailed(f"{method}: {e}") from None

    def _drain_inbox(self) -> None:
        from loglake.events import InboxReader

        # each read acknowledges the one before: a reply lost on the way comes again
        reader = InboxReader(self._client("subscriber", self.urls["subscriber"]))
        while not self._stop.wait(INBOX_POLL_S):
            try:
                got = reader.read(1000)
            except Exception:  # the server is stopping, or busy: try again next round
                continue
            with self._lock:
                for n in got:
                    self.received[n.namespace] += 1
                    self.inbox_tail.append(
                        {"namespace": n.namespace, "event_id": n.event_id, "timestamp": n.timestamp}
                    )
                del self.inbox_tail[:-50]

    def register(self, namespace: str) -> None:
        from loglake.events import C_REPLAY

        self._need("publisher")
        pub, server = self.cores["publisher"], self.servers["publisher"]

        def queue() -> None:
            pub.register(namespace, [(C_REPLAY, {"Bool": True})])
            server.drain()  # hand the queued call to the server's sender

        self.loop.call_soon_threadsafe(queue)

    def publish(self, namespace: str, texts: list[str]) -> list[int]:
        self._need("publisher")
        from loglake.events import CallRejected

        items = [({"Text": t}, None) for t in texts]
        try:
            ids: list[int] = self._client("publisher", self.urls["publisher"]).call(
                "loglake_publish", (namespace, items)
            )
        except CallRejected as e:
            raise EventsCallFailed(f"loglake_publish: {e}") from None
        return ids

    def subscribe(self, namespace: str) -> int:
        from loglake.events import Registration

        out = self._as_subscriber("icrc72_register_subscription", [Registration(namespace)])
        return EventsHandle._ok(out, "icrc72_register_subscription")

    def replay(self, namespace: str, start: int, end: int | None) -> int:
        from loglake.events import ReplayRegistration

        out = self._as_subscriber(
            "icrc77_register_replay", [ReplayRegistration(namespace, start, end)]
        )
        return EventsHandle._ok(out, "icrc77_register_replay")

    def cancel(self, replay_id: int) -> int:
        if "orchestrator" in self.roles:
            known = self.read_orchestrator(lambda o: replay_id in o.replays)
            if not known:
                raise UnknownReplay(replay_id)
        out = self._as_subscriber("icrc77_cancel_replay", [replay_id])
        return EventsHandle._ok(out, "icrc77_cancel_replay")

    # -- reading ----------------------------------------------------------------------------
    def read_orchestrator(self, fn: Any) -> Any:
        self._need("orchestrator")
        orch = self.cores["orchestrator"]

        async def on_loop() -> Any:
            return fn(orch)

        return asyncio.run_coroutine_threadsafe(on_loop(), self.loop).result(30)

    def replay_rows(self) -> list[dict[str, Any]]:
        """The orchestrator's replays; with the publisher in this node, ``expected`` and
        ``sent`` are its figures (events pushed to the stream without it count too), read on
        the loop that runs both cores."""
        return replay_rows(self, self.cores.get("publisher"), self.publisher_reads)

    def roles_view(self) -> dict[str, Any]:
        registrations = self._registrations()
        with self._lock:
            return {
                "roles": {r: p.to_str() for r, p in self.principals.items()},
                "urls": dict(self.urls),
                "received": dict(self.received),
                "recent": list(self.inbox_tail),
                "registrations": registrations,
            }

    def _registrations(self) -> dict[str, dict[str, Any]]:
        """Read on the publisher's loop (its core is not thread-safe)."""
        pub = self.cores.get("publisher")
        if pub is None:
            return {}

        async def on_loop() -> dict[str, dict[str, Any]]:
            return registration_rows(pub)

        return asyncio.run_coroutine_threadsafe(on_loop(), self.loop).result(30)

    def metric_families(self) -> Any:
        return metric_families(self, "orchestrator" in self.roles)


def write_directory(path: Path, entries: dict[str, str]) -> None:
    """A directory file (``{"<principal>": url}``) for other processes' roles (tests, docs)."""
    import json

    path.write_text(json.dumps(entries, indent=2))
