"""SDS in the node: participants on one channel stream, and their routes.

Each configured participant is an ``sds.SdsChannel`` (the part's own I/O adapter) over
``LocalStreams`` on the node's log: the channel's stream is the broadcast and the log is the
store node that repairs missing dependencies by retrieval hint. One thread polls and ticks
every participant (``ROUND_S``); the API takes the same lock. The handle keeps only what the
participants report (events) for the health view: sent, delivered, acknowledged (with the
ack latency into ``loglake_sds_ack_latency_seconds``), repaired, lost.

On a cluster shared by several nodes a participant is one identity in one place: each node
contends for a lease per configured participant (``sds.<channel>.<participant>``) and runs it —
polls, ticks, sends as it — only while it holds that lease. Why: SDS drops a message carrying
its own sender id as its own, so the same id run on two nodes never delivers what the other
copy sent, and a message that names one of those in its causal history stays missing for ever
(repair never completes). A node asked to send as a participant another node holds answers 503
``SdsElsewhere``; when that node dies this one takes the participant over within the lease TTL,
as a new participant state read from the channel's start; the messages the other copy sent
go back into its local log as its own (``SdsChannel`` → ``Participant.restore_own``), so the
messages naming them are delivered (docs/node.md).

``POST .../messages`` may name participants that lose the broadcast (``lose_for``): the message
is in the stream but their cursor skips it, as if the transport dropped it. They find it
missing when a later message names it in its causal history, and fetch it from the store:
the walkthrough's "lost message repaired", and a way to see repair on a live node.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter
from fastapi import Path as PathParam
from pydantic import BaseModel, Field

from loglake.errors import LocalProtocolError, LoglakeError, Unavailable
from loglake.node.api.context import Node, NodeContext, part

router = APIRouter(tags=["sds"])

ROUND_S = 0.2
"""Seconds between poll/tick rounds of every participant."""
SYNC_INTERVAL_MS = 2000


class UnknownChannel(LoglakeError, KeyError):
    def __init__(self, what: str) -> None:
        super().__init__(what)

    def __str__(self) -> str:
        return str(self.args[0])


class SdsElsewhere(Unavailable):
    """Another node on the shared cluster runs this SDS participant now (it holds the
    participant's lease): sending as it here would make a second copy of one identity (503)."""


def participant_lease(channel: str, participant: str) -> str:
    """The lease name of ``participant`` on ``channel`` (a JetStream KV key: names that do not
    fit one are written in base64url, which does)."""
    import base64

    from loglake.streams.lease import LeaseCore

    name = f"sds.{channel}.{participant}"
    try:
        LeaseCore(name, "check")
    except ValueError:

        def b64(x: str) -> str:
            return base64.urlsafe_b64encode(x.encode()).decode()

        name = f"sds.{b64(channel)}.{b64(participant)}"
    return name


@dataclass
class ParticipantStats:
    sent: int = 0
    delivered: int = 0
    acknowledged: int = 0
    repaired: int = 0
    """Missing dependencies later delivered (fetched from the store by hint)."""
    lost: int = 0
    sent_at: dict[str, float] = field(default_factory=dict)
    missing_seen: set[str] = field(default_factory=set)
    recent: list[dict[str, Any]] = field(default_factory=list)


class SdsHandle:
    def __init__(
        self,
        ctx: NodeContext,
        channel: str,
        participants: tuple[str, ...],
        sync_interval_ms: int = SYNC_INTERVAL_MS,
    ) -> None:
        from loglake.sds import SdsChannel
        from loglake.streams import LocalStreams

        self.ctx = ctx
        self.channel = channel
        self.lock = threading.RLock()
        streams = LocalStreams(ctx.log)

        def participant(pid: str) -> Any:
            return SdsChannel(
                streams, channel, pid, sync_interval_ms=sync_interval_ms, sync_only_when_needed=True
            )

        self._new_participant = participant
        self.channels = {p: participant(p) for p in participants}
        self.stream = next(iter(self.channels.values())).stream
        self.stats = {p: ParticipantStats() for p in participants}
        leases = ctx.leases
        self.fences: dict[str, Any] = {
            p: leases.add(participant_lease(channel, p)) if leases is not None else None
            for p in participants
        }
        """Participant → its lease's fence on a shared cluster (None: alone, always here)."""
        self._tenures: dict[str, int | None] = {}
        """Participant → the lease tenure its state was built under (run here before)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loglake-sds", daemon=True)

    @classmethod
    def start(cls, ctx: NodeContext, section: Any) -> SdsHandle:
        handle = cls(
            ctx,
            section.channel,
            tuple(section.participants),
            round(section.sync_interval * 1000),
        )
        handle._thread.start()
        return handle

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(ROUND_S):
            try:
                self.round()
            except Exception as e:  # keep the node up; say what failed
                import logging

                from loglake.structured_logging import log_event

                log_event(logging.getLogger(__name__), logging.ERROR, "sds round", error=repr(e))

    def runs_here(self, pid: str) -> bool:
        """Whether this node runs ``pid`` now (holds its lease, or has no cluster to share). A
        participant taken over (a new tenure after another node ran it) starts from a new
        state read from the channel's start: the old one here may be behind what the other
        node sent as it."""
        fence = self.fences.get(pid)
        if fence is None:
            return True
        tenure = fence.tenure()
        if tenure is None:
            return False
        if self._tenures.get(pid, tenure) != tenure:
            self.channels[pid] = self._new_participant(pid)
        self._tenures[pid] = tenure
        return True

    def _need_here(self, pid: str) -> None:
        self._participant(pid)
        if not self.runs_here(pid):
            lease = participant_lease(self.channel, pid)
            raise SdsElsewhere(
                f"SDS participant {pid!r} of channel {self.channel!r} runs on another node "
                f"(it holds the lease {lease!r}); use it there: this node takes it over within "
                "the lease TTL if that node dies"
            )

    def round(self) -> None:
        """Every participant run here polls the channel (fetching missing messages) and ticks."""
        with self.lock:
            for pid in list(self.channels):
                if not self.runs_here(pid):
                    continue
                ch = self.channels[pid]
                out = ch.poll()
                out.extend(ch.tick())
                self._account(pid, out)

    def _account(self, pid: str, out: Any) -> None:
        from loglake.sds import (
            MessageAcknowledged,
            MessageDelivered,
            MessageSent,
            MessagesLost,
            MessagesMissing,
        )
        from loglake.sds.chat import text_of

        st = self.stats[pid]
        now = time.monotonic()
        for e in out.events:
            if isinstance(e, MessageSent):
                st.sent += 1
                st.sent_at[e.message_id] = now
            elif isinstance(e, MessageDelivered):
                st.delivered += 1
                if e.message_id in st.missing_seen:
                    st.repaired += 1
                    st.missing_seen.discard(e.message_id)
                st.recent.append(
                    {
                        "message_id": e.message_id,
                        "sender": e.sender_id,
                        "lamport": e.lamport_timestamp,
                        "text": text_of(e.sender_id, e.content)[0][:200],
                    }
                )
                del st.recent[:-20]
            elif isinstance(e, MessageAcknowledged):
                st.acknowledged += 1
                sent = st.sent_at.pop(e.message_id, None)
                if sent is not None and self.ctx.metrics is not None:
                    self.ctx.metrics.sds_ack_latency.labels(self.channel).observe(now - sent)
            elif isinstance(e, MessagesMissing):
                st.missing_seen.update(x.message_id for x in e.entries)
            elif isinstance(e, MessagesLost):
                st.lost += len(e.entries)

    def send(self, sender: str, text: str, lose_for: list[str]) -> tuple[str, int]:
        """``sender`` sends ``text``; ``lose_for`` skip it (a lost broadcast). Returns the
        message id and its stream index."""
        from loglake.sds.chat import encode_envelope

        with self.lock:
            self._need_here(sender)
            ch = self._participant(sender)
            for p in lose_for:
                self._need_here(p)
                if p == sender:
                    raise LocalProtocolError("a sender does not lose its own message")
            for p in lose_for:  # deliver everything before it, so only this one is lost
                other = self.channels[p]
                self._account(p, other.poll())
            index = self.ctx.log.next_index(self.stream)
            # the chat's envelope (``sds.chat``): a fresh nonce per text, so a text said
            # twice is two messages (the id is the content's SHA-256), and ``sds chat``
            # members of the channel show the API's texts as their own lines
            out = ch.send(encode_envelope(sender, text, int(ch.clock())))
            self._account(sender, out)
            for p in lose_for:
                other = self.channels[p]
                if other.next_index == index:
                    other.next_index = index + 1
            return out.to_send[0].message_id, index

    def _participant(self, pid: str) -> Any:
        ch = self.channels.get(pid)
        if ch is None:
            raise UnknownChannel(f"no SDS participant {pid!r} on channel {self.channel!r}")
        return ch

    def view(self, pid: str) -> dict[str, Any]:
        with self.lock:
            ch = self._participant(pid)
            pa, st = ch.participant, self.stats[pid]
            fence = self.fences.get(pid)
            return {
                "id": pid,
                "here": fence is None or fence.holds(),
                "lamport": pa.lamport,
                "next_index": ch.next_index,
                "sent": st.sent,
                "delivered": st.delivered,
                "acknowledged": st.acknowledged,
                "repaired": st.repaired,
                "lost": st.lost,
                "unacknowledged": list(pa.unacked),
                "possibly_acknowledged": list(pa.possibly_acked),
                "missing": [
                    {"message_id": mid, "detected_at_ms": at} for mid, (_, at) in pa.missing.items()
                ],
                "pending": len(pa.pending),
                "recent": list(st.recent),
            }

    def metric_families(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        fams = {
            "sent": CounterMetricFamily(
                "loglake_sds_sent", "SDS messages sent.", labels=["channel", "participant"]
            ),
            "delivered": CounterMetricFamily(
                "loglake_sds_delivered",
                "SDS messages delivered.",
                labels=["channel", "participant"],
            ),
            "repaired": CounterMetricFamily(
                "loglake_sds_repaired",
                "Missing dependencies fetched from the store and delivered.",
                labels=["channel", "participant"],
            ),
        }
        unacked = GaugeMetricFamily(
            "loglake_sds_unacknowledged",
            "Own messages not yet acknowledged.",
            labels=["channel", "participant"],
        )
        missing = GaugeMetricFamily(
            "loglake_sds_missing", "Missing causal dependencies.", labels=["channel", "participant"]
        )
        for pid in self.channels:
            v = self.view(pid)
            labels = [self.channel, pid]
            for k, fam in fams.items():
                fam.add_metric(labels, v[k])
            unacked.add_metric(labels, len(v["unacknowledged"]))
            missing.add_metric(labels, len(v["missing"]))
        yield from (*fams.values(), unacked, missing)


# -- routes ------------------------------------------------------------------------------------
class MissingOut(BaseModel):
    message_id: str
    detected_at_ms: int


class ParticipantOut(BaseModel):
    id: str
    here: bool = True
    """This node runs the participant now (on a shared cluster: holds its lease); another
    node's copy is shown as this node last had it."""
    lamport: int
    next_index: int
    """The channel stream index this participant reads next."""
    sent: int
    delivered: int
    acknowledged: int
    repaired: int
    lost: int
    unacknowledged: list[str]
    possibly_acknowledged: list[str]
    missing: list[MissingOut]
    """Causal dependencies not received yet (being fetched or repaired)."""
    pending: int
    recent: list[dict[str, Any]]


class ChannelOut(BaseModel):
    channel: str
    stream: str
    participants: list[str]
    healthy: bool
    """No participant has missing dependencies or lost messages."""


class ChannelDetail(ChannelOut):
    participant_states: list[ParticipantOut]


class SendIn(BaseModel):
    sender: str = Field(min_length=1, max_length=200)
    text: str = Field(max_length=65536)
    lose_for: list[Annotated[str, Field(max_length=200)]] = Field(default=[], max_length=100)
    """Participants that lose this broadcast (fault injection: they repair it later)."""


class SendOut(BaseModel):
    message_id: str
    index: int


ChannelName = Annotated[str, PathParam(max_length=200)]


def _sds(node: NodeContext, channel: str | None = None) -> SdsHandle:
    h: SdsHandle = part(node.sds, "SDS")
    if channel is not None and channel != h.channel:
        raise UnknownChannel(f"no SDS channel {channel!r} (this node runs {h.channel!r})")
    return h


def _detail(h: SdsHandle) -> ChannelDetail:
    states = [ParticipantOut(**h.view(p)) for p in h.channels]
    return ChannelDetail(
        channel=h.channel,
        stream=h.stream,
        participants=list(h.channels),
        healthy=all(not s.missing and not s.lost for s in states),
        participant_states=states,
    )


@router.get("/sds/channels", response_model=list[ChannelOut], summary="SDS channels and health")
def channels(node: Node) -> list[ChannelOut]:
    d = _detail(_sds(node))
    return [ChannelOut(**d.model_dump(exclude={"participant_states"}))]


@router.get(
    "/sds/channels/{channel}",
    response_model=ChannelDetail,
    summary="A channel's participants: unacknowledged messages, missing dependencies",
)
def channel(channel: ChannelName, node: Node) -> ChannelDetail:
    return _detail(_sds(node, channel))


@router.post(
    "/sds/channels/{channel}/messages",
    response_model=SendOut,
    status_code=201,
    summary="Send a message as one participant (lose_for: participants that miss it)",
)
def send(channel: ChannelName, body: SendIn, node: Node) -> SendOut:
    mid, index = _sds(node, channel).send(body.sender, body.text, body.lose_for)
    return SendOut(message_id=mid, index=index)
