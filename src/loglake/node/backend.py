"""Where a node keeps its streams: the one place that chooses, so every part the node runs
(the stream service, ICRC roles and journals, Cardinal checkpoints, SDS channels and store,
the archives control node and member) reads and writes the same history.

- no ``[streams] backend``: the embedded log in the data dir (``loglake.log.open_log``), sealing
  in a child process off the GIL of the node's servers;
- ``[streams] backend = "nats://h1,h2,h3"``: ``JetStreamLog`` (``streams/jetstream.py``) — every
  partition a JetStream stream with ``[streams] replicas`` replicas, consumer indexes in its KV
  bucket; the data dir keeps the lake the sealer copies JetStream's history into (reads below
  JetStream's retention come from it) and the parts' caches and keys.
"""

from __future__ import annotations

import asyncio
from typing import Any

from loglake.log import Log, StreamConfig, open_log
from loglake.node.config import NodeConfig


def open_node_log(cfg: NodeConfig, default_config: StreamConfig) -> Log:
    """The node's log, as ``[streams] backend`` says."""
    if not cfg.streams.backend:
        return open_log(cfg.data_dir, default_config=default_config, seal_processes=True)
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


def start_sealer(cfg: NodeConfig, log: Log, stop: asyncio.Event) -> asyncio.Task[Any] | None:
    """With a JetStream backend, copy its history into the data dir's lake every
    ``[streams] seal_interval`` s (the embedded log seals itself)."""
    if not cfg.streams.backend:
        return None
    from loglake.streams.jetstream_seal import seal_loop

    return asyncio.create_task(seal_loop(log, cfg.data_dir, cfg.streams.seal_interval, stop))
