"""What the four sans-I/O role cores share: the outbox of actions and method dispatch.

A core never performs I/O: it holds no log, stream, socket or file. Its methods take the
caller's principal, the decoded argument and ``now`` (nanoseconds, from the adapter's clock or a
test's fake clock) and return the decoded result; what it wants done — calls to other roles,
appends, reads — is queued as actions (``actions.py``) in ``outbox``. An adapter (``server.py``
over HTTP, ``network.py`` in one process) drains the outbox, performs the actions in order and
hands results back: replies to calls with :meth:`Role.on_reply`, storage results with
:meth:`Role.on_result`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from icp_principal import Principal

from loglake.errors import LocalProtocolError
from loglake.events.actions import Action, Call, StorageAction
from loglake.events.messages import EventNotification
from loglake.wire.icrc16 import Value

__all__ = ["Call", "RateLimited", "Role", "SysEmitter", "UnknownMethod"]


class UnknownMethod(LocalProtocolError):
    pass


class RateLimited(LocalProtocolError):
    """A call refused because its caller made too many of its kind in the window (one the
    method's result type has no error for: ``icrc77_get_replays``); an HTTP adapter answers it
    429 with ``Retry-After``."""

    retriable = True

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        """Seconds until the caller's oldest call in the window leaves it."""


@dataclass
class SysEmitter:
    """Numbers system notifications per namespace (event id = position in that namespace)."""

    source: Principal
    next_ids: dict[str, int] = field(default_factory=dict)
    next_notification: int = 0

    def notification(self, namespace: str, data: Value, now: int) -> EventNotification:
        eid = self.next_ids.get(namespace, 0)
        self.next_ids[namespace] = eid + 1
        self.next_notification += 1
        return EventNotification(
            self.next_notification,
            eid,
            eid - 1 if eid else None,
            now,
            namespace,
            data,
            None,
            self.source,
            None,
        )


def check_positive(**values: int) -> None:
    """``ValueError`` naming the first of ``values`` below 1. A core's sizes and windows: the
    CLI refuses 0 (``--batch-size 0`` left a replay running for ever, sending nothing), and a
    core built in Python must refuse what its command line does."""
    for name, value in values.items():
        if not value >= 1:
            raise ValueError(f"{name} must be >= 1, not {value!r}")


class Role:
    """Base of the cores: ``outbox`` and a method table."""

    methods: dict[str, Callable[..., Any]]

    def __init__(self, principal: Principal) -> None:
        self.principal = principal
        self.outbox: list[Action] = []
        self.methods = {}

    def take_outbox(self) -> list[Action]:
        out = self.outbox[:]
        self.outbox.clear()  # the same list: a ledger may share it
        return out

    def dispatch(self, caller: Principal, method: str, arg: Any, now: int) -> Any:
        try:
            fn = self.methods[method]
        except KeyError:
            raise UnknownMethod(f"{type(self).__name__} has no method {method!r}") from None
        return fn(caller, arg, now)

    def on_reply(self, call: Call, reply: Any, now: int) -> None:
        """A queued call returned ``reply`` (or an exception object if it failed)."""

    def on_result(self, action: StorageAction, result: Any, now: int) -> None:
        """A queued storage action was performed and gave ``result``."""

    def pump(self, now: int) -> bool:
        """Do background work (a publisher's replays); return True if anything was queued."""
        return False
