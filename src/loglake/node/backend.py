"""Where a node keeps its streams: the one place that chooses, so every part the node runs
(the stream service, ICRC roles and journals, Cardinal checkpoints, SDS channels and store,
the archives control node and member) reads and writes the same history.

- no ``[streams] backend``: the embedded log in the data dir (``loglake.log.open_log``), sealing
  in a child process off the GIL of the node's servers;
- ``[streams] backend = "nats://h1,h2,h3"``: ``JetStreamLog`` (``streams/jetstream.py``) — every
  partition a JetStream stream with ``[streams] replicas`` replicas, consumer indexes in its KV
  bucket; the data dir keeps the lake the sealer copies JetStream's history into (reads below
  JetStream's retention come from it) and the parts' caches; the identities' keys are in the
  cluster's key bucket (``node.keys``).

Several nodes may share one cluster (and ``nats_prefix``): work that must run once is held by
one of them at a time through a lease (``NodeLeases``, ``loglake.streams.lease``) and taken
over within ``[streams] lease_ttl`` when its holder dies: the sealer, retention (the node's
own pass over the lake; JetStream enforces ``max_age``/``max_bytes`` itself), the ICRC
orchestrator's journal and ledger writer, and the archives control node. A part gets its
lease as a ``streams.fence.Fence`` (``NodeLeases.fence``): it asks ``holds()`` before a round
and appends to the streams it owns through the fence, so a former holder's writes are refused
(``FencedOut``) once another node has taken over. A Cardinal consumer-group member runs in its
own process (``loglake cardinal consume``); it takes a ``Fence`` the same way
(``cardinal.transport.StreamTransport(fence=...)``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loglake.log import Log, StreamConfig, open_log
from loglake.node.config import NodeConfig

if TYPE_CHECKING:
    from loglake.streams.fence import Fence


def open_node_log(cfg: NodeConfig, default_config: StreamConfig) -> Log:
    """The node's log, as ``[streams] backend`` says."""
    if not cfg.streams.backend:
        from loglake.streams.limits import ServerLimits

        limits = ServerLimits.from_mapping(vars(cfg.limits))  # checked by config
        # seals in a child process, off the GIL of the node's servers (log.sealer)
        return open_log(
            cfg.data_dir,
            default_config=default_config,
            seal_processes=True,
            **limits.log_options(),  # open partitions and partition quotas
        )
    from loglake.streams.jetstream import JetStreamLog

    creds = cfg.streams.nats_creds
    return JetStreamLog(
        cfg.streams.backend,
        replicas=cfg.streams.replicas,
        prefix=cfg.streams.nats_prefix,
        credentials=str(creds) if creds is not None else None,
        lake_dir=str(cfg.data_dir),
    )


def describe_backend(cfg: NodeConfig) -> str:
    """One line for the banner: where the streams are."""
    if not cfg.streams.backend:
        return f"streams in the embedded log of {cfg.data_dir}"
    return (
        f"streams in NATS JetStream {cfg.streams.backend} (R{cfg.streams.replicas}, "
        f"prefix {cfg.streams.nats_prefix}); sealed lake in {cfg.data_dir}"
    )


SEALER, RETENTION, EVENTS_JOURNAL, ARCHIVES_CONTROL = (
    "sealer",
    "retention",
    "events.journal",
    "archives.control",
)
ONCE_ONLY = (SEALER, RETENTION, EVENTS_JOURNAL, ARCHIVES_CONTROL)
"""The work a node on a shared cluster runs only while it holds the lease of that name."""


class NodeLeases:
    """A node's leases on the cluster its log is on, one per once-only work, each renewed on
    the log's own connection loop. ``holds(name)`` is what that work asks before each round.
    With the embedded log there is no cluster to share and every lease is held."""

    def __init__(self, log: Log, cfg: NodeConfig, names: tuple[str, ...] = ONCE_ONLY) -> None:
        self.holder = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        """Who holds a lease (the value of its key): unique per node process."""
        self.leases: dict[str, Any] = {}
        self.fences: dict[str, Any] = {}
        """Name → ``streams.lease.LeaseFence`` (what the parts get through ``fence``)."""
        self.ttl = 0
        self._log: Any = None
        self._cfg = cfg
        if not cfg.streams.backend:
            return
        from loglake.streams.jetstream import JetStreamLog

        assert isinstance(log, JetStreamLog)
        self._log = log
        self.ttl = cfg.streams.lease_ttl
        for name in names:
            self.add(name)

    def add(self, name: str) -> Fence:
        """Contend for one more lease (the once-only work ``name``, e.g. an SDS participant
        this node is configured with) and return its fence; ``UNFENCED`` on the embedded log.
        Call it off the log's loop (it waits for the lease bucket)."""
        from loglake.streams.fence import UNFENCED

        if self._log is None:
            return UNFENCED
        if name in self.fences:
            fence: Fence = self.fences[name]
            return fence
        from loglake.streams.lease import JetStreamLease, LeaseFence

        log, cfg = self._log, self._cfg
        bucket = f"{cfg.streams.nats_prefix}_leases"

        async def start() -> JetStreamLease:
            lease = JetStreamLease(
                log.js,
                bucket,
                name,
                self.holder,
                ttl=cfg.streams.lease_ttl,
                replicas=cfg.streams.replicas,
            )
            # the fence first: each acquisition claims the guarded streams before it takes
            # the lease (streams.lease.LeaseFence)
            self.fences[name] = LeaseFence(log, lease)
            return await lease.start()

        lease = self.leases[name] = log.call(start())
        # wait out the first attempt (one round trip), so a part asking right after start
        # learns whether it holds the lease rather than reading a "not yet" as "elsewhere"
        deadline = time.monotonic() + 2 * lease.timeout
        while time.monotonic() < deadline and not lease.attempted():
            time.sleep(0.005)
        fence = self.fences[name]
        return fence

    def holds(self, name: str) -> bool:
        lease = self.leases.get(name)
        return True if self._log is None else lease is not None and lease.holds()

    def held(self) -> dict[str, bool]:
        """Each lease and whether this node holds it now."""
        return {name: self.holds(name) for name in self.leases}

    def checker(self, name: str) -> Callable[[], bool]:
        return lambda: self.holds(name)

    def fence(self, name: str) -> Fence:
        """The part's hook for the once-only work ``name``: ``UNFENCED`` on the embedded log
        (one node, nothing to share), the lease's ``LeaseFence`` on a cluster."""
        from loglake.streams.fence import UNFENCED

        return self.fences.get(name, UNFENCED)

    def view(self) -> dict[str, dict[str, Any]]:
        """Each lease as an operator sees it (for the API, metrics and console): whether this
        node holds it, its token while held, the guarded streams and the writes refused."""
        out: dict[str, dict[str, Any]] = {}
        for name, lease in self.leases.items():
            fence = self.fences.get(name)
            held = self.holds(name)
            out[name] = {
                "held": held,
                "holder": self.holder if held else None,
                "token": lease.token if held else None,
                "ttl": self.ttl,
                "streams": sorted(fence.streams) if fence is not None else [],
                "claims": fence.claims if fence is not None else 0,
                "refused": fence.refused if fence is not None else 0,
            }
        return out

    def close(self) -> None:
        """Hand every lease over (deleted, so another node takes it at once, not after the
        ttl); a node that dies instead lets them expire."""
        if self._log is None:
            return
        for lease in self.leases.values():
            try:
                self._log.call(lease.release(), timeout=lease.timeout * 2)
            except Exception:  # a cluster gone at stop: the lease expires on its own
                continue
        self.leases.clear()


def start_sealer(
    cfg: NodeConfig, log: Log, stop: asyncio.Event, leases: NodeLeases | None = None
) -> asyncio.Task[Any] | None:
    """With a JetStream backend, copy its history into the data dir's lake every
    ``[streams] seal_interval`` s, while this node holds the sealer's lease (the embedded log
    seals itself)."""
    if not cfg.streams.backend:
        return None
    from loglake.streams.jetstream_seal import seal_loop

    should_run = leases.checker("sealer") if leases is not None else None
    return asyncio.create_task(
        seal_loop(log, cfg.data_dir, cfg.streams.seal_interval, stop, should_run)
    )
