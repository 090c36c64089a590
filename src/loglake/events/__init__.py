"""ICRC-72 pub/sub with ICRC-77 event replay. See docs/events.md.

The public face of the part. Four role cores, sans-I/O (they take calls and a clock, and queue
actions; they hold no log, socket or file):
:class:`Orchestrator`, :class:`Broadcaster`, :class:`Publisher`, :class:`Subscriber`.

The adapters, which do the I/O (their names say which):
:class:`HttpRoleServer` serves one core over HTTP (aiohttp, one role per process);
:class:`HttpEventsClient` calls a role over HTTP (signed Candid); :class:`InProcessNetwork` runs
cores together in one process (tests, simulations, benchmarks); :class:`StreamsStore` performs
the cores' storage actions on a ``loglake.streams.Streams`` (an embedded log or a
``loglake serve`` node), and :func:`open_orchestrator` / :func:`open_ledger` rebuild a core from
its streams.
"""

from typing import Any

from loglake.events.actions import (
    Action,
    AppendEvents,
    Call,
    JournalWrite,
    ReadBounds,
    ReadRange,
    StorageAction,
)
from loglake.events.broadcaster import Broadcaster
from loglake.events.client import CallRejected, HttpEventsClient
from loglake.events.codec import METHODS
from loglake.events.filters import Filter, ImproperConfig
from loglake.events.identity import Identity, SignatureError, principal_from_text
from loglake.events.journal import JournalError
from loglake.events.ledger import Ledger, LedgerError, account
from loglake.events.messages import (
    C_CAPABLE,
    C_PRICING,
    C_REPLAY,
    C_SUB_FILTER,
    C_SUB_SKIP,
    C_SUB_STOPPED,
    H_REPLAY_END_ID,
    H_REPLAY_ID,
    Err,
    Event,
    EventNotification,
    GetReplays,
    Ok,
    OrchestrationFilter,
    Registration,
    ReplayRegistration,
    ReplayState,
    ReplayStatus,
    ReplayStatusUpdate,
)
from loglake.events.network import InProcessNetwork
from loglake.events.orchestrator import Orchestrator, Quotas
from loglake.events.publisher import Publisher, StoredEventError
from loglake.events.role import Role, UnknownMethod
from loglake.events.store import StreamsStore, open_ledger, open_orchestrator
from loglake.events.subscriber import Subscriber

_LAZY = {"HttpRoleServer": "loglake.events.server", "load_directory": "loglake.events.server"}
"""Imported on first use: they pull in aiohttp, which the cores and the client never need."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "C_CAPABLE",
    "C_PRICING",
    "C_REPLAY",
    "C_SUB_FILTER",
    "C_SUB_SKIP",
    "C_SUB_STOPPED",
    "H_REPLAY_END_ID",
    "H_REPLAY_ID",
    "METHODS",
    "Action",
    "AppendEvents",
    "Broadcaster",
    "Call",
    "CallRejected",
    "Err",
    "Event",
    "EventNotification",
    "Filter",
    "GetReplays",
    "HttpEventsClient",
    "HttpRoleServer",
    "Identity",
    "ImproperConfig",
    "InProcessNetwork",
    "JournalError",
    "JournalWrite",
    "Ledger",
    "LedgerError",
    "Ok",
    "OrchestrationFilter",
    "Orchestrator",
    "Publisher",
    "Quotas",
    "ReadBounds",
    "ReadRange",
    "Registration",
    "ReplayRegistration",
    "ReplayState",
    "ReplayStatus",
    "ReplayStatusUpdate",
    "Role",
    "SignatureError",
    "StorageAction",
    "StoredEventError",
    "StreamsStore",
    "Subscriber",
    "UnknownMethod",
    "account",
    "load_directory",
    "open_ledger",
    "open_orchestrator",
    "principal_from_text",
]
