"""``icrc72_update_publication`` from a hostile publisher (review 9, ICRC §1): a call of 100
ever-larger heads, each a ~1,000-octet Nat, was journalled as 100 records of ~1 KB (26 MiB
from 300 calls of one key). Now a call journals one head per namespace, the last, and a head
past 2**64 (a stream index) is refused; over real HTTP, the orchestrator's journal counted."""

from __future__ import annotations

from loglake.events.actions import JournalWrite
from loglake.events.client import HttpEventsClient
from loglake.events.identity import Identity
from loglake.events.messages import Err, Ok, Registration
from loglake.events.orchestrator import HEAD_KEY
from loglake.events.publisher import publication_config
from loglake.events.server import HttpRoleServer
from loglake.events.store import StreamsStore, open_ledger, open_orchestrator
from loglake.log import MemoryLog
from loglake.streams.api import LocalStreams
from tests.events.served import serve


def test_a_call_of_many_heads_journals_one_small_record():
    me, bc = Identity.generate(), Identity.generate()
    store = StreamsStore(LocalStreams(MemoryLog()))
    journalled: list[bytes] = []
    perform = store.perform_many

    def counting(actions):
        journalled.extend(
            a.record
            for a in actions
            if isinstance(a, JournalWrite) and a.stream.startswith("loglake.events.orchestrator")
        )
        return perform(actions)

    store.perform_many = counting  # type: ignore[method-assign]  # (counts, then performs)
    core = open_orchestrator(store, me.principal, [bc.principal], None, open_ledger(store, fee=1))
    port, stop = serve(HttpRoleServer(core, me, {}, store))
    try:
        pub = HttpEventsClient(f"http://127.0.0.1:{port}", Identity.generate(), timeout=30)
        reg = pub.call("icrc72_register_publication", [Registration("a.ns", publication_config(0))])
        assert isinstance(reg[0], Ok)
        before = len(journalled)
        ups = [("a.ns", HEAD_KEY, {"Nat": 1000 + k}) for k in range(100)]
        assert pub.call("icrc72_update_publication", ups) == [Ok(True)] * 100
        assert len(journalled) - before == 1  # one per item before: 100
        assert core.publications["a.ns"].head == 1099
        big = [("a.ns", HEAD_KEY, {"Nat": (1 << 7100) + k}) for k in range(3)]
        out = pub.call("icrc72_update_publication", big)
        assert all(isinstance(r, Err) and r.tag == "ImproperConfig" for r in out), out
        assert len(journalled) - before == 1 and core.publications["a.ns"].head == 1099
        assert max(len(r) for r in journalled[before:]) < 200
    finally:
        stop()
