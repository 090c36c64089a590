"""Status community archives in the node: the control node and member loops, and their routes.

The loops are the ones ``loglake archives run`` / ``follow`` run (ingest the community stream,
build due 7-day windows, seed the newest torrent, publish its signed magnet on the special
channel, prune; follow the channel, fetch what is missing, hydrate), driven by the part's own
``ControlNode`` / ``MemberNode`` over ``LocalStreams`` on the node's log. Each loop has its
thread, which alone touches its libtorrent session and SQLite store; the API reads the
snapshot the loop publishes after every round, and asks for a round now (``POST
/api/archives/build``) through a queue, answered when the round is done.

State lives under ``<data dir>/archives/``: ``control.key`` (secp256k1, mode 0600, made on
first start: the community id is its public key; on a cluster it is in the cluster's key
bucket instead, ``node.keys``), ``control/`` (archives, torrent, store), ``member/`` (fetched
archives, store).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from loglake.errors import LoglakeError, Unavailable
from loglake.node.api.context import Node, NodeContext, fence_of, part
from loglake.node.backend import ARCHIVES_CONTROL
from loglake.node.config import archive_topics

router = APIRouter(tags=["archives"])

NS = 1_000_000_000
MEMBER_POLL_S = 0.5
FETCH_TIMEOUT_S = 20.0


def _control_key(folder: Path, keys: Any = None) -> Any:
    """The community's control key: from ``keys`` (``node.keys.NodeKeys``: the cluster's key
    bucket on a shared cluster, so whichever node holds the control lease is the same
    community), else from ``<folder>/control.key``; made on first use."""
    from coincurve import PrivateKey

    from loglake.archives import load_private_key
    from loglake.node.keys import NodeKeyError, NodeKeys

    keys = keys if keys is not None else NodeKeys()
    path = folder / "control.key"
    text = keys.text("archives.control", path, lambda: PrivateKey().to_hex())
    try:
        return load_private_key(text)
    except LoglakeError as e:  # ArchiveConfigError: not a secp256k1 key
        raise NodeKeyError(f"the archives control key in {keys.where(path)}: {e}") from None


def _entry(e: Any) -> dict[str, Any]:
    return {
        "archive_id": e.archive_id,
        "from_ns": e.metadata.from_ns,
        "to_ns": e.metadata.to_ns,
        "offset": e.offset,
        "size": e.size,
        "padding": e.padding,
    }


class _Loop:
    """A thread that runs ``round`` every ``period`` s, or at once when asked."""

    def __init__(self, name: str, period: float, round_: Any) -> None:
        self.period = period
        self.round = round_
        self.asks: queue.Queue[tuple[dict[str, Any], Future]] = queue.Queue()
        self._stop = threading.Event()
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        next_at = 0.0
        while not self._stop.is_set():
            try:
                kw, fut = self.asks.get(timeout=max(0.0, min(0.2, next_at - time.monotonic())))
            except queue.Empty:
                if time.monotonic() < next_at:
                    continue
                kw, fut = {}, None
            try:
                result = self.round(**kw)
                self.error = None
                if fut is not None:
                    fut.set_result(result)
            except Exception as e:
                self.error = f"{type(e).__name__}: {e}"
                if fut is not None:
                    fut.set_exception(e)
                else:
                    import logging

                    from loglake.structured_logging import log_event

                    log_event(
                        logging.getLogger(__name__), logging.WARNING, "archives", error=self.error
                    )
            next_at = time.monotonic() + self.period

    def ask(self, timeout: float = 120.0, **kw: Any) -> Any:
        fut: Future = Future()
        self.asks.put((kw, fut))
        return fut.result(timeout)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=60)


class ControlElsewhere(Unavailable):
    """Another node on the shared cluster is the archives control node (it holds the lease):
    a build asked of this one is refused (503) rather than run twice."""


class ArchivesHandle:
    def __init__(self, ctx: NodeContext, section: Any) -> None:
        from loglake.archives import community_id, get_layout
        from loglake.streams import LocalStreams

        self.ctx = ctx
        self.stream, self.channel = section.stream, section.channel
        self.layout = get_layout(section.layout)
        self.folder = ctx.data_dir / "archives"
        self.folder.mkdir(exist_ok=True)
        self.key = _control_key(self.folder, ctx.keys)
        self.community = community_id(self.key)
        self.streams = LocalStreams(ctx.log)
        self.fence = fence_of(ctx, ARCHIVES_CONTROL)
        """The control node's lease on a cluster shared by several nodes (``UNFENCED``
        alone): only its holder ingests, builds, publishes magnets and prunes."""
        self.fence.guard(section.channel)
        self.wait_ns = int(section.wait * NS)
        self.fetch_limits = {
            k: v
            for k, v in (
                ("max_archive_bytes", section.max_archive_bytes),
                ("max_fetch_bytes", section.max_fetch_bytes),
                ("deadline", section.fetch_deadline),
            )
            if v is not None  # unset: fetch_archives' defaults
        }
        self.trackers: tuple[str, ...] | None = section.trackers  # None: the layout's defaults
        self.topics = archive_topics(section)
        """The community's channel topics (None: unset, inferred and bounded by the builder)."""
        self.control_snapshot: dict[str, Any] | None = None
        self.member_snapshot: dict[str, Any] | None = None
        self.loops: list[_Loop] = []
        self.control: _Loop | None = None
        self.member: _Loop | None = None
        self._built_bytes = 0
        if section.control:
            self.control = _Loop("loglake-archives-control", section.check_every, self._control)
            self.loops.append(self.control)
        if section.member:
            self.member = _Loop("loglake-archives-member", MEMBER_POLL_S, self._member)
            self.loops.append(self.member)
        self._cnode: Any = None
        self._seeder: Any = None
        self._seeded: str | None = None
        self._mnode: Any = None
        self._stores: list[Any] = []

    @classmethod
    def start(cls, ctx: NodeContext, section: Any) -> ArchivesHandle:
        h = cls(ctx, section)
        for loop in h.loops:
            loop.thread.start()
        return h

    def close(self) -> None:
        for loop in self.loops:
            loop.stop()
        if self._seeder is not None:
            self._seeder.close()
        for s in self._stores:
            s.close()

    # -- the control node (its thread only) ---------------------------------------------------
    def _control(self, now_ns: int | None = None, partial: bool = False) -> dict[str, Any]:
        from loglake.archives import ControlNode, MessageStore
        from loglake.archives.bt import Seeder
        from loglake.log import UnknownStream

        if not self.fence.holds():  # another node on the cluster is the control node now
            return {"new_archives": 0, "ingested": 0, "magnet_index": None}

        if self._cnode is None:
            root = self.folder / "control"
            root.mkdir(exist_ok=True)
            store = MessageStore(root / f"{self.community}.sqlite")
            self._stores.append(store)
            topics = None if self.topics is None else list(self.topics)
            self._cnode = ControlNode(
                root, self.key, self.layout, store, topics, announce=self.trackers
            )
            self._seeder = Seeder(0)
        node = self._cnode
        now = now_ns if now_ns is not None else time.time_ns()
        try:
            ingested = node.ingest_streams(self.streams, self.stream)
        except UnknownStream:
            ingested = 0
        out = node.build(now, partial=partial)
        if self.ctx.metrics is not None:
            size = node.builder.data_size
            self.ctx.metrics.archive_bytes["build"] += max(0, size - self._built_bytes)
            self._built_bytes = size
        published = None
        if node.entries and (out.new or self._seeded is None):
            self._seeder.seed(node.torrent().metainfo(), node.root)
            self._seeded = node.torrent().info_hash
            published = node.publish_magnet(
                self.streams, self.channel, now // 1_000_000, (self._seeder.peer,), self.fence
            )
        pruned = node.prune(time.time_ns())  # pruning is by the real age of messages
        self.control_snapshot = self._control_view(node, ingested, len(out.new), pruned)
        return {"new_archives": len(out.new), "ingested": ingested, "magnet_index": published}

    def _control_view(self, node: Any, ingested: int, new: int, pruned: Any) -> dict[str, Any]:
        torrent = None
        peers: list[dict[str, Any]] = []
        if node.entries:
            t = node.torrent()
            torrent = {
                "name": self.community,
                "info_hash": t.info_hash,
                "magnet": node.magnet((self._seeder.peer,)),
                "size": node.builder.data_size,
                "piece_length": self.layout.piece_length,
                "seeding": self._seeded == t.info_hash,
            }
        handle = getattr(self._seeder, "handle", None)
        uploaded = 0
        if handle is not None:
            st = handle.status()
            uploaded = int(st.all_time_upload)
            for p in handle.get_peer_info():
                peers.append(
                    {
                        "address": f"{p.ip[0]}:{p.ip[1]}",
                        "client": p.client.decode("utf-8", "replace")
                        if isinstance(p.client, bytes)
                        else str(p.client),
                        "uploaded": int(p.total_upload),
                        "downloaded": int(p.total_download),
                    }
                )
        if self.ctx.metrics is not None:
            self.ctx.metrics.archive_bytes["seed"] = uploaded
        return {
            "community": self.community,
            "stream": self.stream,
            "channel": self.channel,
            "archives": [_entry(e) for e in node.entries],
            "torrent": torrent,
            "peers": peers,
            "seeder": self._seeder.peer,
            "uploaded_bytes": uploaded,
            "last_round_ns": time.time_ns(),
            "last_ingested": ingested,
            "last_new_archives": new,
            "last_pruned_records": pruned.log_records,
            "store_messages": node.store.count(),
            "future_records": node.future_count,
            "late_records": node.late_count,
            "topic_skipped_records": node.topic_skipped_count,
        }

    # -- the member (its thread only) -----------------------------------------------------------
    def _member(self) -> dict[str, Any]:
        from loglake.archives import MemberNode, MessageStore
        from loglake.log import UnknownStream

        if self._mnode is None:
            root = self.folder / "member"
            root.mkdir(exist_ok=True)
            store = MessageStore(root / "member.sqlite")
            self._stores.append(store)
            self._mnode = MemberNode(root, store, self.layout, self.community, self.wait_ns)
            self._fetches: list[dict[str, Any]] = []
        m = self._mnode
        now = time.time_ns()
        with contextlib.suppress(UnknownStream):  # the control node has not published yet
            m.poll(self.streams, self.channel, now)
        report = m.step(now, timeout=FETCH_TIMEOUT_S, **self.fetch_limits)
        if report is not None:
            self._fetches.append(
                {
                    "at_ns": now,
                    "archives": report.archives,
                    "missing": [e.archive_id for e in report.missing],
                    "hydrated_messages": report.hydrated_messages,
                    "bytes_downloaded": report.bytes_downloaded,
                    "left": [e.archive_id for e in report.left],
                }
            )
            del self._fetches[:-20]
            if self.ctx.metrics is not None:
                self.ctx.metrics.archive_bytes["fetch"] += report.bytes_downloaded
        self.member_snapshot = {
            "community": self.community,
            "archives": [
                {"archive_id": a.archive_id, "from_ns": a.from_ns, "to_ns": a.to_ns}
                for a in m.store.archives()
            ],
            "messages": m.store.count(),
            "fetches": list(self._fetches),
            "ignored": m.ignored,
        }
        return self.member_snapshot

    def build_now(self, now_ns: int | None, partial: bool) -> dict[str, Any]:
        if self.control is None:
            raise ArchivesOff("this node runs no archives control loop")
        if now_ns is not None and now_ns > time.time_ns():
            # a window closed early would miss the messages still to come in it
            raise ValueError("now_ns: a build as of a time still to come is refused")
        if not self.fence.holds():
            raise ControlElsewhere(
                "another node on the cluster is the archives control node now (it holds the "
                "lease); ask that node, or retry: this node takes over within the lease TTL if "
                "that node dies"
            )
        result: dict[str, Any] = self.control.ask(now_ns=now_ns, partial=partial)
        return result

    def errors(self) -> dict[str, str | None]:
        return {
            "control": self.control.error if self.control else None,
            "member": self.member.error if self.member else None,
        }


class ArchivesOff(LoglakeError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


# -- routes ------------------------------------------------------------------------------------
class ArchiveOut(BaseModel):
    archive_id: str
    from_ns: int
    to_ns: int
    offset: int
    size: int
    padding: int


class TorrentOut(BaseModel):
    name: str
    info_hash: str
    magnet: str
    size: int
    piece_length: int
    seeding: bool


class PeerOut(BaseModel):
    address: str
    client: str
    uploaded: int
    downloaded: int


class MemberArchiveOut(BaseModel):
    archive_id: str
    from_ns: int
    to_ns: int


class MemberOut(BaseModel):
    community: str
    archives: list[MemberArchiveOut]
    messages: int
    fetches: list[dict[str, Any]]
    ignored: int
    """Special-channel messages the member ignored (unsigned, foreign)."""


class ArchivesOut(BaseModel):
    community: str
    stream: str
    channel: str
    archives: list[ArchiveOut]
    """Built by the control node, oldest first."""
    torrent: TorrentOut | None
    seeder: str | None
    uploaded_bytes: int
    last_round_ns: int | None
    store_messages: int | None
    future_records: int | None
    """Records the control node refused as dated too far ahead of its clock: never archived."""
    late_records: int | None
    """Records that arrived after their window was archived: never archived (retention
    removes them once older than 30 days)."""
    topic_skipped_records: int | None
    """Records on topics past an archive's bounds (no ``[archives] topics``): never archived."""
    topics: list[str] | None
    """``[archives] topics``, the community's channel topics (None: unset, each archive lists
    its messages' own topics, bounded)."""
    member: MemberOut | None
    errors: dict[str, str | None]


class BuildIn(BaseModel):
    now_ns: int | None = Field(None, ge=0, le=2**63 - 1)
    """Build as of this time, not later than now (default: now)."""
    partial: bool = False
    """Also export the unfinished last window."""


class BuildOut(BaseModel):
    new_archives: int
    ingested: int
    magnet_index: int | None


def _topic_text(topic: bytes | str) -> str:
    """A topic as configured: the spec layout's text, a status-go topic's hex."""
    return topic if isinstance(topic, str) else topic.hex()


def _archives(node: NodeContext) -> ArchivesHandle:
    h: ArchivesHandle = part(node.archives, "archives")
    return h


@router.get("/archives", response_model=ArchivesOut, summary="Archives, torrent, member state")
def archives(node: Node) -> ArchivesOut:
    h = _archives(node)
    c = h.control_snapshot or {}
    return ArchivesOut(
        community=h.community,
        stream=h.stream,
        channel=h.channel,
        archives=c.get("archives", []),
        torrent=c.get("torrent"),
        seeder=c.get("seeder"),
        uploaded_bytes=c.get("uploaded_bytes", 0),
        last_round_ns=c.get("last_round_ns"),
        store_messages=c.get("store_messages"),
        future_records=c.get("future_records"),
        late_records=c.get("late_records"),
        topic_skipped_records=c.get("topic_skipped_records"),
        topics=None if h.topics is None else [_topic_text(t) for t in h.topics],
        member=MemberOut(**h.member_snapshot) if h.member_snapshot else None,
        errors=h.errors(),
    )


@router.get("/archives/torrents", response_model=list[TorrentOut], summary="Seeded torrents")
def torrents(node: Node) -> list[dict[str, Any]]:
    t = (_archives(node).control_snapshot or {}).get("torrent")
    return [t] if t else []


@router.get("/archives/peers", response_model=list[PeerOut], summary="The seeder's peers")
def peers(node: Node) -> list[dict[str, Any]]:
    peers_: list[dict[str, Any]] = (_archives(node).control_snapshot or {}).get("peers", [])
    return peers_


@router.post(
    "/archives/build",
    response_model=BuildOut,
    summary="Run a control round now: ingest, build due windows, seed, publish the magnet",
)
def build(body: BuildIn, node: Node) -> BuildOut:
    return BuildOut(**_archives(node).build_now(body.now_ns, body.partial))
