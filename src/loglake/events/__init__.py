"""ICRC-72 pub/sub with ICRC-77 event replay. See docs/events.md.

The public face of the part. Four role cores, sans-I/O (they take calls and a clock, and queue
actions; they hold no log, socket or file):
:class:`Orchestrator`, :class:`Broadcaster`, :class:`Publisher`, :class:`Subscriber`.

The adapters, which do the I/O (their names say which):
:class:`HttpRoleServer` serves one core over HTTP (aiohttp, one role per process);
:class:`HttpEventsClient` calls a role over HTTP (signed Candid), :class:`InboxReader` reads a
subscriber's inbox through it at least once; :class:`InProcessNetwork` runs
cores together in one process (tests, simulations, benchmarks); :class:`StreamsStore` performs
the cores' storage actions on a ``loglake.streams.Streams`` (an embedded log or a
``loglake serve`` node), and :func:`open_orchestrator` / :func:`open_ledger` rebuild a core from
its streams.

Also here: what a caller sends and gets back (:class:`Registration`, :class:`ReplayRegistration`,
:class:`ReplayState`, :class:`Ok` / :class:`Err`, the notifications a subscriber takes), identities,
and what the pipeline's replay job runs inside Spark (:class:`ReplayJobSpec`, :func:`event_of`,
:func:`notification_parts`, filters). Actions, the system-namespace vocabulary and the role
plumbing stay in their modules (``loglake.events.actions``, ``.messages``, ``.role``): the cores
and tests use them, a user of the part does not. Names are imported on first use, so a Spark task
that needs one of them does not load the HTTP server or the other roles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loglake.faces import lazy_face

if TYPE_CHECKING:
    from loglake.events.actions import ReplayJobSpec
    from loglake.events.broadcaster import Broadcaster
    from loglake.events.client import (
        BadReply,
        CallRejected,
        HttpEventsClient,
        InboxReader,
        RoleUnreachable,
    )
    from loglake.events.fastcodec import notification_parts
    from loglake.events.filters import Filter, ImproperConfig, Skip
    from loglake.events.identity import Identity, SignatureError, principal_from_text
    from loglake.events.ledger import Ledger
    from loglake.events.messages import (
        C_REPLAY,
        H_REPLAY_END_ID,
        H_REPLAY_ID,
        Err,
        EventNotification,
        GetReplays,
        Ok,
        Registration,
        ReplayRegistration,
        ReplayState,
    )
    from loglake.events.network import InProcessNetwork
    from loglake.events.orchestrator import Orchestrator, Quotas
    from loglake.events.publisher import Publisher, event_of
    from loglake.events.server import HttpRoleServer, load_directory
    from loglake.events.store import StreamsStore, open_ledger, open_orchestrator
    from loglake.events.subscriber import Subscriber

_FACE = {
    "Broadcaster": "loglake.events.broadcaster",
    "C_REPLAY": "loglake.events.messages",
    "CallRejected": "loglake.events.client",
    "RoleUnreachable": "loglake.events.client",
    "BadReply": "loglake.events.client",
    "Err": "loglake.events.messages",
    "EventNotification": "loglake.events.messages",
    "Filter": "loglake.events.filters",
    "GetReplays": "loglake.events.messages",
    "H_REPLAY_END_ID": "loglake.events.messages",
    "H_REPLAY_ID": "loglake.events.messages",
    "HttpEventsClient": "loglake.events.client",
    "InboxReader": "loglake.events.client",
    "HttpRoleServer": "loglake.events.server",
    "Identity": "loglake.events.identity",
    "ImproperConfig": "loglake.events.filters",
    "InProcessNetwork": "loglake.events.network",
    "Ledger": "loglake.events.ledger",
    "Ok": "loglake.events.messages",
    "Orchestrator": "loglake.events.orchestrator",
    "Publisher": "loglake.events.publisher",
    "Quotas": "loglake.events.orchestrator",
    "Registration": "loglake.events.messages",
    "ReplayJobSpec": "loglake.events.actions",
    "ReplayRegistration": "loglake.events.messages",
    "ReplayState": "loglake.events.messages",
    "SignatureError": "loglake.events.identity",
    "Skip": "loglake.events.filters",
    "StreamsStore": "loglake.events.store",
    "Subscriber": "loglake.events.subscriber",
    "event_of": "loglake.events.publisher",
    "load_directory": "loglake.events.server",
    "notification_parts": "loglake.events.fastcodec",
    "open_ledger": "loglake.events.store",
    "open_orchestrator": "loglake.events.store",
    "principal_from_text": "loglake.events.identity",
}
"""Each public name and the module that defines it, imported on first use: a Spark task that
needs one decoder does not pay for the nodes, BitTorrent or the storage engine."""


__getattr__, __dir__ = lazy_face(__name__, _FACE)


__all__ = [
    "C_REPLAY",
    "H_REPLAY_END_ID",
    "H_REPLAY_ID",
    "BadReply",
    "Broadcaster",
    "CallRejected",
    "Err",
    "EventNotification",
    "Filter",
    "GetReplays",
    "HttpEventsClient",
    "HttpRoleServer",
    "Identity",
    "ImproperConfig",
    "InProcessNetwork",
    "InboxReader",
    "Ledger",
    "Ok",
    "Orchestrator",
    "Publisher",
    "Quotas",
    "Registration",
    "ReplayJobSpec",
    "ReplayRegistration",
    "ReplayState",
    "RoleUnreachable",
    "SignatureError",
    "Skip",
    "StreamsStore",
    "Subscriber",
    "event_of",
    "load_directory",
    "notification_parts",
    "open_ledger",
    "open_orchestrator",
    "principal_from_text",
]
