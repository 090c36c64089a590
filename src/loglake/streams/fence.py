"""The hook a part's once-only writer asks before it writes: "may I?" and "write, fenced".

Why here and not in ``node/``: the parts (events, archives, cardinal) may import only
``log``/``streams``/``wire`` (DESIGN.md, "Layout"), yet on a cluster shared by several nodes
their once-only writers (an ICRC orchestrator's journal, the archives control node, a Cardinal
consumer-group member's checkpoints, retention) must write only while their node holds the
lease of that work. So a part takes a ``Fence`` and knows nothing of leases or NATS; the node
(``node/backend.py``) hands it one backed by a JetStream lease (``streams.lease.LeaseFence``),
and everything else (the embedded log, tests, the CLI) gets ``UNFENCED``, which always may.

A fenced append is refused with ``LeaseLost`` when this process does not hold the lease (the
local view) and with ``FencedOut`` when the cluster shows a newer holder has written since
(``streams/lease.py`` says how): nothing is written then, so a holder paused past its lease
(SIGSTOP, a long GC) and resumed writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import cbor2

from loglake.streams.api import Streams

CLAIM_OP = "lease"
"""The ``op`` of a claim record (see ``claim_record``)."""


def claim_record(name: str, holder: str, token: int) -> bytes:
    """What a new holder appends to each stream its lease guards, before anything else, so
    that a former holder's appends (which expect the stream's head it last saw) are refused.
    CBOR ``{"op": "lease", "name", "holder", "token"}``: readers of guarded streams skip it
    (``is_claim``); the ICRC journal's records are CBOR maps with an ``op`` too."""
    return cbor2.dumps({"op": CLAIM_OP, "name": name, "holder": holder, "token": token})


def is_claim(data: bytes) -> bool:
    """Whether ``data`` is a claim record (cheap: checked before decoding anything else)."""
    if not data or b"lease" not in data[:16]:
        return False
    try:
        op = cbor2.loads(data)
    except Exception:  # cbor2 raises several types; all mean "not a claim"
        return False
    return isinstance(op, dict) and op.get("op") == CLAIM_OP and "token" in op


class Fence(Protocol):
    """The once-only writer's view of its lease."""

    name: str

    def holds(self) -> bool:
        """Whether this process holds the lease now (ask before a round of work)."""
        ...

    def tenure(self) -> int | None:
        """The token of this process's current hold (a new one on each acquisition), None
        while not holding: a writer whose state came from the streams rebuilds it when this
        changes, since another holder may have written meanwhile."""
        ...

    def guard(self, *streams: str) -> None:
        """Declare the streams this writer appends to: each new holder claims them as it
        takes the lease, before the former holder's next append could land."""
        ...

    def claim(self) -> None:
        """Claim every guarded stream now (if not yet under this tenure): call it before
        reading the streams to rebuild state, so nothing a former holder writes lands after
        the read. ``LeaseLost``/``FencedOut`` when not the holder."""
        ...

    def append(self, streams: Streams, stream: str, datas: Sequence[bytes]) -> list[int]:
        """Append ``datas`` to partition 0 of ``stream`` only while holding the lease; the
        indexes. ``LeaseLost``/``FencedOut`` (nothing written) otherwise."""
        ...


class Unfenced:
    """No cluster to share: every write may go (the embedded log, a single process)."""

    name = "unfenced"

    def holds(self) -> bool:
        return True

    def tenure(self) -> int | None:
        return 0

    def guard(self, *streams: str) -> None:
        pass

    def claim(self) -> None:
        pass

    def append(self, streams: Streams, stream: str, datas: Sequence[bytes]) -> list[int]:
        return streams.push_many(stream, list(datas)) if datas else []


UNFENCED = Unfenced()
