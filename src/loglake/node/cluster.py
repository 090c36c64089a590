"""What an operator of a node on a NATS JetStream cluster needs to see at a glance: which node
holds which lease, the cluster's health, and how far the sealer is behind.

Read at request time, never kept up to date in between (as ``NodeCollector`` reads the log):

- **leases**: this node's view (``NodeLeases.held()``, so a lease added to the node shows up
  here unchanged) and the cluster's: the newest message on each lease key of the KV bucket
  (``streams/lease.py``) names its holder and its revision (the fencing token); an expired or
  released lease leaves a marker, read as "no holder";
- **stream groups**: every JetStream stream under the node's prefix (the partitions' streams and
  the index and lease buckets) with its leader and replicas — current, offline, ops behind — from
  one paged ``$JS.API.STREAM.LIST``, the same ``ClusterInfo`` ``js.stream_info`` returns;
- **the meta group** (which server places streams: its leader and peers) is not in any API a
  client account can call; the servers' monitoring endpoint ``/jsz`` has it, so it is read from
  ``[streams] nats_monitor`` when set. ``/jsz``'s ``meta_cluster.replicas`` lists the peers other
  than the answering server, as that server sees them; the leader's own answer is the one with
  current lags, so it is preferred;
- **sealer lag** per partition: JetStream's last sequence against the end of the lake this node
  seals into (``jetstream_seal.sealed_next``), in records and in seconds (how long ago JetStream
  stored the oldest record not sealed yet). Only the node that holds the sealer's lease seals,
  into its own data dir, so only that node reports the lag (another node's lake is not the
  sealer's).

Every call to the cluster has a short deadline (``STATUS_TIMEOUT``): with no quorum or no server,
the answer says the cluster is unreachable and why, instead of holding a scrape or a console
poll for the log's longer push deadline. One answer is reused for ``CACHE_S``, so a console
polling and Prometheus scraping at once do not multiply the requests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from pydantic import BaseModel

from loglake.log.api import ascii_digits

STATUS_TIMEOUT = 3.0
"""Seconds one status read may wait on the cluster (all requests together)."""
MONITOR_TIMEOUT = 1.5
"""Seconds one ``/jsz`` read may take (the monitoring endpoints are read in parallel): the
socket's timeout, and the whole read's (``read_meta``)."""
CACHE_S = 1.0
"""An answer younger than this is reused."""
NS = 1_000_000_000


class LeaseStatus(BaseModel):
    name: str
    held_here: bool
    """This node's own view: it may do the lease's work now."""
    holder: str | None
    """Who the cluster says holds it (the lease key's value), None when nobody does."""
    this_node: bool
    """``holder`` is this node."""
    token: int | None
    """The lease key's revision: the fencing token its holder's writes carry."""
    written_ns: int | None
    """When the holder last acquired or renewed it (the key's newest message)."""


class PeerStatus(BaseModel):
    name: str
    leader: bool = False
    current: bool = True
    """A follower that has every entry the leader has (the leader itself: true)."""
    offline: bool = False
    lag: int = 0
    """Raft entries behind the leader."""
    active_s: float | None = None
    """Seconds since the leader last heard from this follower."""


class GroupStatus(BaseModel):
    jetstream_stream: str
    stream: str | None
    """The loglake stream this JetStream stream is a partition of (None: a KV bucket)."""
    partition: int | None
    leader: str | None
    """None when the group has no leader (no quorum)."""
    replicas: list[PeerStatus]
    messages: int
    last_seq: int


class MetaStatus(BaseModel):
    cluster: str | None
    leader: str | None
    size: int | None
    peers: list[PeerStatus]
    monitors: dict[str, str]
    """Each ``[streams] nats_monitor`` URL and how it answered (``ok`` or the error)."""


class SealerLag(BaseModel):
    stream: str
    partition: int
    sealed_next: int
    """One past the newest index in the lake."""
    next_index: int
    """One past JetStream's last record (its last sequence)."""
    lag_records: int
    lag_seconds: float
    """Age of the oldest record not sealed yet (0 when none is waiting)."""


class SealerStatus(BaseModel):
    here: bool
    """This node seals (it holds the sealer's lease); ``lag`` is filled only then."""
    holder: str | None
    interval_s: float
    lag: list[SealerLag]
    error: str | None = None


class ClusterStatus(BaseModel):
    backend: str
    """``embedded`` (no cluster: every once-only work runs here) or ``jetstream``."""
    node: str
    """This node's name in the leases (``NodeLeases.holder``)."""
    servers: str | None
    replicas: int | None
    prefix: str | None
    reachable: bool
    error: str | None
    """Why the cluster could not be read (then the lists below are what could be read)."""
    leases: list[LeaseStatus]
    meta: MetaStatus | None
    groups: list[GroupStatus]
    sealer: SealerStatus | None
    read_ns: int


class ClusterView:
    """``status()`` for ``GET /api/cluster`` and ``metric_families()`` for ``/metrics``, over
    the node's raw log (a ``JetStreamLog`` or the embedded one), its ``NodeLeases`` and its
    ``[streams]`` config."""

    def __init__(self, log: Any, leases: Any, streams_cfg: Any, data_dir: Path) -> None:
        self.log = log
        self.leases = leases
        self.cfg = streams_cfg
        self.data_dir = Path(data_dir)
        self._lock = threading.Lock()
        self._cached: tuple[float, ClusterStatus] | None = None

    @property
    def jetstream(self) -> bool:
        return bool(self.cfg.backend)

    def status(self) -> ClusterStatus:
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < CACHE_S:
                return self._cached[1]
            status = self._read()
            self._cached = (time.monotonic(), status)
            return status

    def _holder_name(self) -> str:
        return str(getattr(self.leases, "holder", "") or "")

    def _held(self) -> dict[str, bool]:
        held = getattr(self.leases, "held", None)
        return dict(held()) if held is not None else {}

    def _read(self) -> ClusterStatus:
        if not self.jetstream:
            return ClusterStatus(
                backend="embedded",
                node=self._holder_name(),
                servers=None,
                replicas=None,
                prefix=None,
                reachable=True,
                error=None,
                leases=[],
                meta=None,
                groups=[],
                sealer=None,
                read_ns=time.time_ns(),
            )
        held = self._held()
        errors: list[str] = []
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # /jsz while the cluster answers
            meta_future = pool.submit(read_meta, tuple(self.cfg.nats_monitor))
            try:
                infos, lease_msgs = self.log.call(
                    asyncio.wait_for(self._gather(list(held)), STATUS_TIMEOUT),
                    STATUS_TIMEOUT,
                )
            except Exception as e:  # no quorum, no server, log closed: say so, do not raise
                infos, lease_msgs = [], {}
                errors.append(_why(e))
            try:
                meta = meta_future.result()
            except Exception as e:  # read_meta's own failure: the monitors' part, not the page's
                why = f"not read: {_why(e)}"
                meta = MetaStatus(
                    cluster=None,
                    leader=None,
                    size=None,
                    peers=[],
                    monitors={url: why for url in self.cfg.nats_monitor},
                )
        me = self._holder_name()
        leases = []
        for name, here in sorted(held.items()):
            holder, token, written = lease_msgs.get(name, (None, None, None))
            leases.append(
                LeaseStatus(
                    name=name,
                    held_here=here,
                    holder=holder,
                    this_node=holder is not None and holder == me,
                    token=token,
                    written_ns=written,
                )
            )
        groups = [g for g in (group_of(si) for si in infos) if g is not None]
        sealer = self._sealer(held, leases, infos)
        return ClusterStatus(
            backend="jetstream",
            node=me,
            servers=self.cfg.backend,
            replicas=self.cfg.replicas,
            prefix=self.cfg.nats_prefix,
            reachable=not errors,
            error="; ".join(errors) or None,
            leases=leases,
            meta=meta,
            groups=groups,
            sealer=sealer,
            read_ns=time.time_ns(),
        )

    async def _gather(self, names: list[str]) -> tuple[list[Any], dict[str, Any]]:
        js = self.log.js
        prefix = self.cfg.nats_prefix
        mine = (f"{prefix}-", f"KV_{prefix}_")
        infos = []
        offset = 0
        while True:  # STREAM.LIST pages (256 a page); an empty page ends it
            page = await js.streams_info(offset)
            if not page:
                break
            infos += [si for si in page if si.config.name.startswith(mine)]
            offset += len(page)
        lease_msgs = {}
        bucket = f"{prefix}_leases"
        for name in names:
            lease = getattr(self.leases, "leases", {}).get(name)
            lease_msgs[name] = await read_lease(js, getattr(lease, "bucket", bucket), name)
        return infos, lease_msgs

    def _sealer(
        self, held: dict[str, bool], leases: list[LeaseStatus], infos: list[Any]
    ) -> SealerStatus:
        here = held.get("sealer", True) if held else True
        holder = next((x.holder for x in leases if x.name == "sealer"), None)
        status = SealerStatus(
            here=here, holder=holder, interval_s=float(self.cfg.seal_interval), lag=[]
        )
        if not here or not infos:
            return status
        from loglake.streams.jetstream_seal import sealed_next

        rows = []
        for si in infos:
            part = loglake_partition(si, self.cfg.nats_prefix)
            if part is None:
                continue
            stream, p = part
            st = si.state
            first, end = max(st.first_seq, 1) - 1, st.last_seq
            sealed = sealed_next(self.data_dir, stream, p)
            rows.append((si.config.name, stream, p, sealed, max(sealed, first), end))
        waiting = [(name, start + 1) for name, _, _, _, start, end in rows if end > start]
        stamps: dict[str, int] = {}
        if waiting:
            try:
                stamps = self.log.call(
                    asyncio.wait_for(self._stamps(waiting), STATUS_TIMEOUT), STATUS_TIMEOUT
                )
            except Exception as e:  # the cluster went away between the list and the reads
                status.error = _why(e)
        now = time.time_ns()
        for name, stream, p, sealed, start, end in sorted(rows, key=lambda r: (r[1], r[2])):
            stored = stamps.get(name)
            status.lag.append(
                SealerLag(
                    stream=stream,
                    partition=p,
                    sealed_next=sealed,
                    next_index=end,
                    lag_records=max(0, end - start),
                    lag_seconds=round(max(0.0, (now - stored) / NS), 3) if stored else 0.0,
                )
            )
        return status

    async def _stamps(self, targets: list[tuple[str, int]]) -> dict[str, int]:
        """When JetStream stored each (stream, sequence): the server's ``Nats-Time-Stamp``,
        not the record's own timestamp — a writer may give any time (an archive's messages
        are days old when pushed), and the lag is how long the sealer has left one waiting."""
        import nats.js.errors

        from loglake.streams.jetstream import _parse_ts

        out = {}
        for name, seq in targets:
            try:
                msg = await self.log.js.get_msg(name, seq, direct=True)
                out[name] = _parse_ts((msg.headers or {}).get("Nats-Time-Stamp"))
            except (nats.js.errors.NotFoundError, ValueError):
                continue  # trimmed meanwhile, or a stamp we cannot read: age unknown
        return out

    def log_readable(self) -> bool:
        """False when the last status read found the JetStream cluster unreachable (the log's
        own reads would each wait out their deadline)."""
        return not self.jetstream or self.status().reachable

    def metric_families(self) -> Iterator[Any]:
        """The cluster's series for ``NodeCollector`` (docs/operations.md lists them)."""
        if not self.jetstream:
            return
        s = self.status()
        reachable = GaugeMetricFamily(
            "loglake_jetstream_reachable",
            "1 when the node read the cluster's state within its deadline, 0 when it could not.",
        )
        reachable.add_metric([], 1 if s.reachable else 0)
        yield reachable
        held = GaugeMetricFamily(
            "loglake_lease_held",
            "1 while this node holds the lease and may do its work, 0 while another does.",
            labels=["lease"],
        )
        holder = GaugeMetricFamily(
            "loglake_lease_holder",
            "1 for the node the cluster says holds each lease (no sample: nobody holds it).",
            labels=["lease", "holder"],
        )
        for lease in s.leases:
            held.add_metric([lease.name], 1 if lease.held_here else 0)
            if lease.holder is not None:
                holder.add_metric([lease.name, lease.holder], 1)
        yield held
        yield holder
        leader = GaugeMetricFamily(
            "loglake_jetstream_leader",
            "1 for the server leading each group: a JetStream stream, or the meta group "
            '(jetstream_stream="$meta", which places streams).',
            labels=["jetstream_stream", "server"],
        )
        lag = GaugeMetricFamily(
            "loglake_jetstream_replica_lag",
            "Raft entries a follower of a group is behind its leader.",
            labels=["jetstream_stream", "server"],
        )
        offline = GaugeMetricFamily(
            "loglake_jetstream_replica_offline",
            "1 when a group's member is offline or not current (cannot serve as its leader now).",
            labels=["jetstream_stream", "server"],
        )
        groups: list[tuple[str, str | None, list[PeerStatus]]] = [
            (g.jetstream_stream, g.leader, g.replicas) for g in s.groups
        ]
        if s.meta is not None and s.meta.leader is not None:
            groups.append(("$meta", s.meta.leader, s.meta.peers))
        leaderless = GaugeMetricFamily(
            "loglake_jetstream_leaderless",
            "1 when a group has no leader (no quorum: its stream takes no writes).",
            labels=["jetstream_stream"],
        )
        for name, lead, peers in groups:
            leaderless.add_metric([name], 0 if lead else 1)
            if lead:
                leader.add_metric([name, lead], 1)
            for p in peers:
                if p.leader:
                    continue
                lag.add_metric([name, p.name], p.lag)
                offline.add_metric([name, p.name], 1 if p.offline or not p.current else 0)
        yield from (leader, leaderless, lag, offline)
        if s.sealer is not None and s.sealer.here:
            records = GaugeMetricFamily(
                "loglake_sealer_lag_records",
                "Records JetStream holds that the sealer has not copied into the lake yet.",
                labels=["stream", "partition"],
            )
            seconds = GaugeMetricFamily(
                "loglake_sealer_lag_seconds",
                "Age of the oldest record not sealed yet (0: none waiting).",
                labels=["stream", "partition"],
            )
            for x in s.sealer.lag:
                records.add_metric([x.stream, str(x.partition)], x.lag_records)
                seconds.add_metric([x.stream, str(x.partition)], x.lag_seconds)
            yield records
            yield seconds


def group_of(si: Any) -> GroupStatus | None:
    """A JetStream ``StreamInfo`` as a group: its leader first, then its followers."""
    from loglake.streams.jetstream import META_PARTITION, META_STREAM

    cluster = si.cluster
    meta = si.config.metadata or {}
    leader = cluster.leader if cluster is not None else None
    replicas = [PeerStatus(name=leader, leader=True)] if leader else []
    for r in (cluster.replicas if cluster is not None else None) or []:
        replicas.append(
            PeerStatus(
                name=r.name or "?",
                current=bool(r.current),
                offline=bool(r.offline),
                lag=int(r.lag or 0),
                active_s=round(r.active / NS, 3) if r.active is not None else None,
            )
        )
    partition = meta.get(META_PARTITION)
    return GroupStatus(
        jetstream_stream=si.config.name,
        stream=meta.get(META_STREAM),
        partition=int(partition) if partition is not None and ascii_digits(partition) else None,
        leader=leader,
        replicas=replicas,
        messages=si.state.messages,
        last_seq=si.state.last_seq,
    )


def loglake_partition(si: Any, prefix: str) -> tuple[str, int] | None:
    """``(stream, partition)`` of a JetStream stream loglake made under ``prefix``, or None: its
    metadata names a valid stream and partition whose JetStream name is this stream's (what
    ``JetStreamLog.streams`` checks). Another client's stream under the prefix may carry any
    metadata: an ``int()`` of it failed every status read (``/api/cluster``, ``/metrics``), and
    its stream name reached the lake's paths."""
    from loglake.log.api import STREAM_NAME_RE
    from loglake.streams.jetstream import META_PARTITION, META_STREAM, encode_name

    meta = si.config.metadata or {}
    stream, partition = meta.get(META_STREAM), meta.get(META_PARTITION)
    if not isinstance(stream, str) or not STREAM_NAME_RE.fullmatch(stream):
        return None
    if not isinstance(partition, str) or not ascii_digits(partition):
        return None
    if si.config.name != f"{prefix}-{encode_name(stream)}-{int(partition)}":
        return None
    return stream, int(partition)


async def read_lease(js: Any, bucket: str, name: str) -> tuple[str | None, int | None, int | None]:
    """(holder, revision, written ns) of lease ``name`` from the newest message on its key; a
    marker (expired), a delete (released) or a value with no TTL (another client's) is no
    holder."""
    import nats.js.errors

    from loglake.streams.lease import LEASE_PREFIX, lease_holder_message

    subject = f"$KV.{bucket}.{LEASE_PREFIX}{name}"
    try:
        msg = await js.get_last_msg(f"KV_{bucket}", subject, direct=True)
    except nats.js.errors.NotFoundError:
        return None, None, None
    headers = msg.headers or {}
    if not lease_holder_message(headers):  # a marker, a delete, or another client's value
        return None, msg.seq, None
    written = None
    stamp = headers.get("Nats-Time-Stamp")
    if stamp:
        from loglake.streams.jetstream import _parse_ts

        try:
            written = _parse_ts(stamp) or None
        except ValueError:  # a server's stamp we cannot read: the time is only informative
            written = None
    return (msg.data or b"").decode(errors="replace"), msg.seq, written


def read_meta(urls: tuple[str, ...]) -> MetaStatus | None:
    """The meta group from the servers' ``/jsz`` (None when no monitoring URL is configured).
    Every URL is read (a server that does not answer is worth showing); the leader's answer
    is used, else any answer."""
    if not urls:
        return None
    answers: dict[str, dict] = {}
    monitors: dict[str, str] = {}
    reads = {url: _jsz_read(url) for url in urls}
    concurrent.futures.wait(reads.values(), timeout=MONITOR_TIMEOUT)
    for url, read in reads.items():
        got = (
            read.result()
            if read.done()
            else f"unreachable: no whole answer in {MONITOR_TIMEOUT:g} s"
        )
        if isinstance(got, dict):
            answers[url], monitors[url] = got, "ok"
        else:
            monitors[url] = got
    best = None
    for got in answers.values():
        mc = got.get("meta_cluster") or {}
        names = {r.get("name") for r in mc.get("replicas") or [] if isinstance(r, dict)}
        if mc.get("leader") and mc.get("leader") not in names:  # the leader's own view
            best = mc
            break
        best = best or mc
    if best is None:
        return MetaStatus(cluster=None, leader=None, size=None, peers=[], monitors=monitors)
    leader = best.get("leader") or None
    peers = [PeerStatus(name=leader, leader=True)] if leader else []
    for r in best.get("replicas") or []:
        if not isinstance(r, dict) or r.get("name") == leader:
            continue
        active = r.get("active")
        peers.append(
            PeerStatus(
                name=str(r.get("name", "?")),
                current=bool(r.get("current")),
                offline=bool(r.get("offline")),
                lag=int(r.get("lag") or 0),
                active_s=round(active / NS, 3) if isinstance(active, int | float) else None,
            )
        )
    size = best.get("cluster_size")
    return MetaStatus(
        cluster=best.get("name"),
        leader=leader,
        size=size if isinstance(size, int) else None,
        peers=peers,
        monitors=monitors,
    )


_jsz_reads: dict[str, concurrent.futures.Future[dict | str]] = {}
_jsz_lock = threading.Lock()


def _jsz_read(url: str) -> concurrent.futures.Future[dict | str]:
    """``_jsz(url)`` on a thread of its own, or the read of ``url`` still running (at most one
    a URL). Why: ``urlopen``'s timeout bounds each socket read, not the request, so an endpoint
    sending a byte a second held ``read_meta`` (and ``/metrics`` and ``/api/cluster``, behind
    ``ClusterView``'s lock: 12 s measured with a 1.5 s timeout) for as long as it sent;
    ``read_meta`` waits ``MONITOR_TIMEOUT`` for the reads, and a read still running is not
    started again, so such an endpoint holds one thread, not one a status read."""
    with _jsz_lock:
        read = _jsz_reads.get(url)
        if read is None or read.done():
            read = concurrent.futures.Future()
            _jsz_reads[url] = read
            threading.Thread(target=_jsz_into, args=(url, read), daemon=True).start()
        return read


def _jsz_into(url: str, read: concurrent.futures.Future[dict | str]) -> None:
    try:
        read.set_result(_jsz(url))
    except BaseException as e:  # pragma: no cover - _jsz says why in a string
        read.set_exception(e)


def _jsz(url: str) -> dict | str:
    """``url``/jsz as a dict, or why not (one line)."""
    try:
        with urllib.request.urlopen(f"{url}/jsz", timeout=MONITOR_TIMEOUT) as r:
            body = json.loads(r.read(4 * 1024 * 1024))
    except (OSError, urllib.error.URLError, http.client.HTTPException) as e:
        return f"unreachable: {getattr(e, 'reason', None) or e}"
    except ValueError as e:
        return f"not a NATS monitoring endpoint (answer is not JSON: {e})"
    if not isinstance(body, dict) or not isinstance(body.get("meta_cluster", {}), dict):
        return "not a NATS monitoring endpoint (no meta_cluster in /jsz)"
    bad = meta_shape_error(body.get("meta_cluster") or {})
    if bad is not None:
        return f"not a NATS monitoring endpoint ({bad})"
    return body


_INT64 = 2**63


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -_INT64 <= v < _INT64


def meta_shape_error(mc: dict) -> str | None:
    """Why ``/jsz``'s ``meta_cluster`` is not of the shape a NATS server gives (None: it is):
    names are strings, ``replicas`` a list of objects, numbers finite and within int64.
    Found from outside: valid JSON of another shape (``leader: ["n1"]``, ``lag: 1e400``,
    ``replicas: 5``, a replica ``name: {}``) from one monitoring URL failed ``read_meta``, so
    ``GET /api/cluster`` and the whole ``/metrics`` scrape were 500s."""
    for key in ("leader", "name"):
        if mc.get(key) is not None and not isinstance(mc[key], str):
            return f"meta_cluster.{key} is not a string"
    if mc.get("cluster_size") is not None and not _is_int(mc["cluster_size"]):
        return "meta_cluster.cluster_size is not an integer"
    replicas = mc.get("replicas")
    if replicas is None:
        return None
    if not isinstance(replicas, list) or not all(isinstance(r, dict) for r in replicas):
        return "meta_cluster.replicas is not a list of objects"
    for r in replicas:
        if r.get("name") is not None and not isinstance(r["name"], str):
            return "a meta_cluster replica's name is not a string"
        for key in ("current", "offline"):
            if r.get(key) is not None and not isinstance(r[key], bool):
                return f"a meta_cluster replica's {key} is not a boolean"
        lag = r.get("lag")
        if lag is not None and not (_is_int(lag) and lag >= 0):
            return "a meta_cluster replica's lag is not an integer ≥ 0"
        active = r.get("active")
        if active is not None and not (
            _is_int(active) or (isinstance(active, float) and math.isfinite(active))
        ):
            return "a meta_cluster replica's active is not a finite number"
    return None


def _why(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if isinstance(e, TimeoutError):
        text = f"no answer within {STATUS_TIMEOUT:g}s"
    return f"{type(e).__name__}: {text}"
