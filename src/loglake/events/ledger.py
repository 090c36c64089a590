"""An embedded ICRC-1/ICRC-2 token ledger kept in a loglake stream.

Why: ICRC-77 lets publishers price replays (``icrc77:pricing``) and requires ``PaymentRequired``
when payment is missing; payment needs a ledger. This one has the ICRC-1/ICRC-2 semantics the
orchestrator uses — balances, a flat ``fee`` per transfer/approve, ``approve`` (allowance per
(owner, spender)), ``transfer_from`` (spends allowance: amount + fee), ``transfer`` — with
ICRC-1 ``Account = {owner; subaccount}``. Every operation is one record in the stream
``loglake.ledger.<name>`` (CBOR), so the ledger is durable and auditable on the same log as
everything else, and :meth:`Ledger.restore` rebuilds balances from the stream's records (read by
``store.open_ledger``; the log is the source of truth, balances are derived). The ledger is
the stream's only writer, so it numbers its own blocks: block index = the number of operations
before it, which is the stream index except on a cluster shared by several nodes, where a node
taking the ledger over first appends a claim record (``streams.fence``; no block, skipped here)
so that a former holder's late block is refused.

Sans-I/O: an operation checks and applies itself in memory and queues one
:class:`~loglake.events.actions.JournalWrite` on ``writes`` — the outbox of the orchestrator
that owns the ledger, so the adapter writes the record before the reply leaves.

It is not the ICRC-1 reference ledger (no certification, archives or dedup window); a real
deployment would point the orchestrator at one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import cbor2
from icp_principal import Principal

from loglake.errors import DecodeError, LocalProtocolError
from loglake.events.actions import Action, JournalWrite
from loglake.events.journal import LEASE_OP

Account = tuple[bytes, bytes]
"""(owner principal bytes, subaccount 32 bytes; all zero = default subaccount)."""
DEFAULT_SUBACCOUNT = bytes(32)


def account(owner: Principal | bytes, subaccount: bytes | None = None) -> Account:
    raw = owner if isinstance(owner, bytes) else owner.bytes
    sub = subaccount or DEFAULT_SUBACCOUNT
    if len(sub) != 32:
        raise LedgerError("GenericError", "a subaccount is 32 bytes")
    return (raw, sub)


class LedgerError(LocalProtocolError):
    """An ICRC-1/2 error variant: ``kind`` is its tag (InsufficientFunds, …)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class LedgerBlockError(DecodeError):
    """A stored ledger block (a record of ``loglake.ledger.<name>``) that is not one the
    ledger wrote: it does not decode as a CBOR operation, or does not apply."""


def ledger_stream(name: str = "main") -> str:
    return f"loglake.ledger.{name}"


@dataclass
class Ledger:
    stream: str = ledger_stream()
    fee: int = 10
    minter: bytes = b""
    writes: list[Action] = field(default_factory=list)
    """Where records are queued (an orchestrator points this at its outbox)."""

    def __post_init__(self) -> None:
        self.balances: dict[Account, int] = {}
        self.allowances: dict[tuple[Account, Account], int] = {}
        self.blocks = 0

    def restore(self, records: Iterable[bytes]) -> None:
        """Apply the stream's records (block 0 first) to a new ledger. A block that does not
        decode or apply raises ``LedgerBlockError`` naming it (the ledger is then unusable, as
        the stream it came from is damaged), like the journal's ``JournalError``."""
        for data in records:
            try:
                op = cbor2.loads(data)
                if not isinstance(op, dict):
                    raise TypeError(f"a block is a CBOR map, not {type(op).__name__}")
                if op.get("op") == LEASE_OP:
                    continue  # a node taking the ledger over (streams.fence): not a block
                self._apply(op)
            except (
                cbor2.CBORError,
                EOFError,
                ValueError,
                KeyError,
                TypeError,
                AttributeError,
                RecursionError,
            ) as e:
                raise LedgerBlockError(
                    f"ledger block {self.blocks}: {type(e).__name__}: {e}"
                ) from None
            self.blocks += 1

    # -- queries ---------------------------------------------------------------------------
    def balance_of(self, acct: Account) -> int:
        return self.balances.get(acct, 0)

    def allowance(self, owner: Account, spender: Account) -> int:
        return self.allowances.get((owner, spender), 0)

    # -- operations (each appended to the stream before it takes effect) --------------------
    def mint(self, to: Account, amount: int, now: int) -> int:
        return self._commit({"op": "mint", "to": list(to), "amt": amount, "ts": now})

    def transfer(self, frm: Account, to: Account, amount: int, now: int) -> int:
        self._need(frm, amount + self.fee)
        return self._commit(
            {
                "op": "xfer",
                "from": list(frm),
                "to": list(to),
                "amt": amount,
                "fee": self.fee,
                "ts": now,
            }
        )

    def approve(self, owner: Account, spender: Account, amount: int, now: int) -> int:
        self._need(owner, self.fee)
        return self._commit(
            {
                "op": "approve",
                "from": list(owner),
                "spender": list(spender),
                "amt": amount,
                "fee": self.fee,
                "ts": now,
            }
        )

    def transfer_from(
        self, spender: Account, frm: Account, to: Account, amount: int, now: int
    ) -> int:
        have = self.allowance(frm, spender)
        if have < amount + self.fee:
            raise LedgerError("InsufficientAllowance", f"allowance {have} < {amount} + fee")
        self._need(frm, amount + self.fee)
        return self._commit(
            {
                "op": "xfer",
                "from": list(frm),
                "to": list(to),
                "amt": amount,
                "fee": self.fee,
                "spender": list(spender),
                "ts": now,
            }
        )

    def _need(self, acct: Account, amount: int) -> None:
        if amount < 0:
            raise LedgerError("GenericError", "negative amount")
        bal = self.balance_of(acct)
        if bal < amount:
            raise LedgerError("InsufficientFunds", f"balance {bal} < {amount}")

    def _commit(self, op: dict[str, Any]) -> int:
        self.writes.append(JournalWrite(self.stream, cbor2.dumps(op)))
        self._apply(op)
        self.blocks += 1
        return self.blocks - 1

    def _apply(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        if kind == "mint":
            to = tuple(op["to"])
            self.balances[to] = self.balances.get(to, 0) + op["amt"]
        elif kind == "approve":
            frm, sp = tuple(op["from"]), tuple(op["spender"])
            self.balances[frm] -= op["fee"]
            self.allowances[(frm, sp)] = op["amt"]
        elif kind == "xfer":
            frm, to = tuple(op["from"]), tuple(op["to"])
            self.balances[frm] -= op["amt"] + op["fee"]
            self.balances[to] = self.balances.get(to, 0) + op["amt"]
            if "spender" in op:
                key = (frm, tuple(op["spender"]))
                self.allowances[key] -= op["amt"] + op["fee"]
        else:
            raise ValueError(f"unknown ledger operation {kind!r}")
