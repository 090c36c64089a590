"""Each events role in its own process on loopback (`python -m loglake.events.cli serve`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loglake.events.client import HttpEventsClient, InboxReader
from loglake.events.identity import Identity
from tests.procs import free_port, wait_port

ROLES = ("orchestrator", "broadcaster", "subscriber", "publisher")


@dataclass
class Cluster:
    tmp: Path
    namespace: str = "com.example.e2e"
    extra: dict[str, list[str]] = field(default_factory=dict)
    roles: tuple[str, ...] = ROLES
    """Role names; ``broadcaster2`` … run more broadcasters (kind = name without digits)."""
    streams: list[str] = field(default_factory=list)
    """Store options for the orchestrator and the publisher (e.g. ``--streams-port N`` of a
    ``loglake serve``); default: a ``--data-dir`` per role under ``tmp``."""

    def __post_init__(self) -> None:
        self._inbox: InboxReader | None = None
        self.ids = {r: Identity.generate() for r in self.roles}
        self.ports = {r: free_port() for r in self.roles}
        self.urls = {r: f"http://127.0.0.1:{p}" for r, p in self.ports.items()}
        self.keys: dict[str, Path] = {}
        for r, ident in self.ids.items():
            self.keys[r] = self.tmp / f"{r}.key"
            self.keys[r].write_text(ident.seed.hex())
        directory = {self.ids[r].principal.to_str(): self.urls[r] for r in self.roles}
        self.directory = self.tmp / "directory.json"
        self.directory.write_text(json.dumps(directory))
        self.procs: dict[str, subprocess.Popen] = {}

    def principal(self, role: str) -> str:
        return self.ids[role].principal.to_str()

    def start(self) -> None:
        for r in self.roles:  # orchestrator first: the others call it at start
            self.start_one(r)

    def start_one(self, r: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        args = [
            sys.executable,
            "-m",
            "loglake.events.cli",
            "serve",
            "--role",
            r.rstrip("0123456789"),
            "--key-file",
            str(self.keys[r]),
            "--port",
            str(self.ports[r]),
            "--directory",
            str(self.directory),
        ]
        if r == "orchestrator":
            for b in self.roles:
                if b.startswith("broadcaster"):
                    args += ["--broadcaster", self.principal(b)]
        else:
            args += ["--orchestrator", self.principal("orchestrator")]
        if r == "publisher":
            args += ["--register", self.namespace]
        extra = self.extra.get(r, [])
        kind = r.rstrip("0123456789")
        if kind in ("orchestrator", "publisher") and not {"--data-dir", "--streams-port"} & {
            *extra,
            *self.streams,
        }:
            args += ["--data-dir", str(self.tmp / f"{r}-data")]  # never the user's data dir
        if kind in ("orchestrator", "publisher"):
            args += self.streams
        args += extra
        log = open(self.tmp / f"{r}.log", "ab")  # noqa: SIM115 - closed with the process
        self.procs[r] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        wait_port(self.ports[r], self.procs[r])

    def stop(self, role: str | None = None) -> None:
        for r in [role] if role else list(self.procs):
            p = self.procs.pop(r, None)
            if p is None:
                continue
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    @contextlib.contextmanager
    def paused(self, role: str) -> Iterator[None]:
        """``role``'s process SIGSTOPped for the block: it holds its sockets and answers nothing
        (a call to it waits, up to the callers' 120 s call timeout), so a test holds a replay in
        a state instead of racing the clock for it."""
        proc = self.procs[role]
        proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            proc.send_signal(signal.SIGCONT)

    def orchestrator_journal(self) -> list[dict]:
        """The orchestrator's journal records, read while it runs (read-only, from its store)."""
        from loglake.events.journal import decode_records, stream_name
        from loglake.events.store import StreamsStore

        opts = [*self.streams, *self.extra.get("orchestrator", [])]
        with contextlib.ExitStack() as stack:
            if "--streams-port" in opts:
                from loglake.streams import StreamClient

                port = int(opts[opts.index("--streams-port") + 1])
                streams: Any = stack.enter_context(StreamClient("127.0.0.1", port))
            else:
                from loglake.log import open_log
                from loglake.streams import LocalStreams

                d = (
                    opts[opts.index("--data-dir") + 1]
                    if "--data-dir" in opts
                    else self.tmp / "orchestrator-data"
                )
                log = stack.enter_context(open_log(d, readonly=True))
                streams = LocalStreams(log)
            stream = stream_name()
            return decode_records(stream, StreamsStore(streams).payloads(stream))

    def known_head(self, namespace: str | None = None) -> int:
        """The head of ``namespace`` the orchestrator has journalled (0 if none yet)."""
        ns = namespace or self.namespace
        journal = self.orchestrator_journal()
        return max([0, *(r["head"] for r in journal if r["op"] == "head" and r["ns"] == ns)])

    def client(self, role: str, as_role: str | None = None, ident: Identity | None = None):
        return HttpEventsClient(self.urls[role], ident or self.ids[as_role or role])

    def inbox(self) -> InboxReader:
        """The subscriber's inbox, one reader for the cluster's life: each read acknowledges
        the one before, so what one test read is not read again by the next."""
        if self._inbox is None:
            self._inbox = InboxReader(self.client("subscriber"))
        return self._inbox

    def logs(self) -> str:
        return "\n".join(
            f"--- {r}\n{(self.tmp / f'{r}.log').read_text(errors='replace')[-3000:]}"
            for r in self.roles
            if (self.tmp / f"{r}.log").exists()
        )
