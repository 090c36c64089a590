"""Where a node keeps the keys of its identities — the ICRC roles' principals
(``events.<role>``) and the archives community's control key (``archives.control``).

- On the embedded log: files in the data dir (``events/<role>.key``, ``archives/control.key``),
  mode 0600, made on first start, as before.
- On a cluster (``[streams] backend``): in a JetStream KV bucket, ``<nats_prefix>_keys``, made
  with ``[streams] replicas``. Why: several nodes serving one history must be the same
  identities — a replay's principals are in the journal, a community is its control key — and
  the node taking a lease over must be able to act as them; the data dir then holds only the
  lake and caches, so a node with a fresh data dir is a full member. The first node to need a
  key makes it with a KV create, which fails if another node made it meanwhile; that node then
  reads the winner's, so every node converges on one key. A key file left in the data dir by a
  node that ran before the cluster had the key is uploaded as that key (the node keeps its
  identity); once the cluster has a key, the cluster's wins and the file is not read.

Who can read the keys: anyone with access to the NATS account the nodes use (the bucket is
an ordinary KV bucket). Protect them as you protect that account's credentials
(docs/node.md).
"""

from __future__ import annotations

import logging
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loglake.errors import LoglakeError
from loglake.log import fs

logger = logging.getLogger(__name__)

BUCKET_SUFFIX = "_keys"


class NodeKeyError(LoglakeError):
    """A node identity's key could not be read or stored (a damaged value, no cluster)."""


def read_key_file(path: Path) -> str:
    """The key text in ``path``, refused (``NodeKeyError`` naming the file) when others may
    read it or it is not text: it is a private key, kept like the node's token
    (``node/auth.py``), and a binary file used to stop the node with a UnicodeDecodeError
    traceback."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise NodeKeyError(
            f"{path} holds a private key and is readable by others (mode {mode:o}); run "
            f"`chmod 600 {path}`"
        )
    try:
        return path.read_bytes().decode("ascii").strip()
    except UnicodeDecodeError:
        raise NodeKeyError(f"{path}: not a key (expected hex text)") from None


def _file_key(path: Path, make: Callable[[], str]) -> str:
    """The key in ``path``, made (``fs.create_exclusive``: mode 0600, fsynced, removed and
    named if its write fails) if absent."""
    if path.exists():
        return read_key_file(path)
    value = make()
    return value if fs.create_exclusive(path, (value + "\n").encode()) else read_key_file(path)


class NodeKeys:
    """A node's identity keys: ``text(name, path, make)`` is the key ``name`` (text, e.g.
    hex), from the cluster's key bucket when the node is on one, else from ``path``; ``make``
    makes a new one where there is none."""

    def __init__(self, log: Any = None, prefix: str = "loglake", replicas: int = 1) -> None:
        self._log = log
        """The ``JetStreamLog`` whose connection reaches the bucket; None: files."""
        self.bucket = f"{prefix}{BUCKET_SUFFIX}"
        self.replicas = replicas

    @classmethod
    def for_node(cls, log: Any, cfg: Any) -> NodeKeys:
        """In the cluster when ``[streams] backend`` is set, in the data dir otherwise."""
        if not cfg.streams.backend:
            return cls()
        return cls(log, cfg.streams.nats_prefix, cfg.streams.replicas)

    @property
    def shared(self) -> bool:
        return self._log is not None

    def where(self, path: Path | None = None) -> str:
        """Where a key is kept, for errors: the bucket, or ``path`` (the file) on the
        embedded log, so the operator knows which file to fix."""
        if self.shared:
            return f"JetStream KV bucket {self.bucket}"
        return str(path) if path is not None else "the data dir"

    def text(self, name: str, path: Path, make: Callable[[], str]) -> str:
        if self._log is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            return _file_key(path, make)
        try:
            value: str = self._log.call(self._settled(name, path, make))
        except NodeKeyError:
            raise
        except Exception as e:  # nats-py's errors, a cluster without quorum
            raise NodeKeyError(f"key {name!r} in {self.where()}: {e!r}") from e
        return value

    async def _bucket(self) -> Any:
        from nats.js import api as jsapi

        from loglake.streams.jetstream import open_bucket

        config = jsapi.KeyValueConfig(bucket=self.bucket, history=1, replicas=self.replicas)
        return await open_bucket(self._log.js, config, self._log.options.push_timeout)

    async def _settled(self, name: str, path: Path, make: Callable[[], str]) -> str:
        """``_shared`` ``until_settled`` for the log's push timeout."""
        from loglake.streams.jetstream import until_settled

        return await until_settled(
            f"key {name!r}", lambda: self._shared(name, path, make), self._log.options.push_timeout
        )

    async def _shared(self, name: str, path: Path, make: Callable[[], str]) -> str:
        import nats.js.errors

        kv = await self._bucket()
        for _ in range(3):
            try:
                entry = await kv.get(name)
            except nats.js.errors.KeyNotFoundError:
                entry = None
            if entry is not None and entry.value:
                return bytes(entry.value).decode().strip()
            if path.exists():  # this node's key from before the cluster had one: keep it
                value = read_key_file(path)
                logger.info("node key %s: uploading %s to %s", name, path, self.bucket)
            else:
                value = make()
            try:
                await kv.create(name, value.encode())
            except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.APIError):
                continue  # another node stored its key first: read that one
            return value
        raise NodeKeyError(f"key {name!r} in {self.where()}: it kept changing while read")
