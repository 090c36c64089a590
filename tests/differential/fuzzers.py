"""Every differential fuzzer by name: its strategy, its check, and whether it needs the Node
peer. ``tests/differential/test_*.py``, the planted-bug demonstrations and ``benchmarks/fuzz.py
--diff`` all run them from here, so a fuzzer is written once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from tests.differential import archives, bare, candid, candid_batches, sds, torrents
from tests.differential._run import Check, Outcome, run
from tests.differential.peer import DiffPeer


@dataclass(frozen=True)
class Fuzzer:
    name: str
    reference: str
    strategy: st.SearchStrategy[Any]
    make_check: Callable[[DiffPeer | None], Check]
    needs_peer: bool
    share: float = 1.0
    """Batches relative to the others (a batch of bloom filters or archives costs more)."""

    def run(
        self,
        peer: DiffPeer | None,
        *,
        examples: int,
        seed: int,
        max_seconds: float,
        stop_at_first: bool = False,
    ) -> Outcome:
        return run(
            self.name,
            self.strategy,
            self.make_check(peer),
            examples=max(1, int(examples * self.share)),
            seed=seed,
            max_seconds=max_seconds,
            stop_at_first=stop_at_first,
        )


FUZZERS: dict[str, Fuzzer] = {
    f.name: f
    for f in (
        Fuzzer(
            "bare",
            "@bare-ts/lib",
            bare.batches,
            lambda peer: lambda v: bare.check(peer, v),
            True,
        ),
        Fuzzer(
            "sds-messages",
            "@waku/sds",
            sds.message_batches,
            lambda peer: lambda v: sds.check_messages(peer, v),
            True,
        ),
        Fuzzer(
            "sds-blooms",
            "@waku/sds",
            sds.bloom_batches,
            lambda peer: lambda v: sds.check_blooms(peer, v),
            True,
            share=0.25,
        ),
        Fuzzer(
            "archives",
            "protoc-built classes",
            archives.batches,
            lambda _: archives.check,
            False,
            0.5,
        ),
        Fuzzer("torrents", "libtorrent", torrents.batches, lambda _: torrents.check, False),
        Fuzzer(
            "candid",
            "@dfinity/candid",
            candid.batches,
            lambda peer: lambda v: candid.check_both(peer, v),
            True,
        ),
        Fuzzer(
            "candid-batches",
            "@dfinity/candid",
            candid_batches.batches,
            lambda peer: lambda v: candid_batches.check(peer, v),
            True,
            share=0.3,
        ),
    )
}
