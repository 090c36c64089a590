"""A replay whose batch is more than one pull of a ``loglake serve`` node answers: the
publisher's namespaces on a real stream server over TCP (``BackgroundServer`` on loopback,
``StreamClient``), the rest of the system in process on a fake clock (``World``).

A stream service answers a pull with at most ``max_pull_bytes`` (8 MiB) of records; the
publisher read each replay batch (``ReadRange``) with one pull, so a batch of larger events
replayed the first 8 MiB of it and skipped the rest without a word."""

from __future__ import annotations

from loglake.events import ReplayState, StreamsStore
from loglake.log import MemoryLog
from loglake.streams.client import StreamClient
from loglake.streams.server import BackgroundServer
from loglake.streams.service import DEFAULT_MAX_PULL_BYTES, StreamService
from tests.events.world import NS, World, blob

N, SIZE = 2_000, 6_000  # 12 MB of events in one replay batch: over one pull's 8 MiB


def test_a_replay_batch_over_one_pull_of_the_stream_service_is_replayed_whole():
    assert N * SIZE > DEFAULT_MAX_PULL_BYTES
    w = World(batch_size=N)
    with (
        BackgroundServer(StreamService(MemoryLog())) as srv,
        StreamClient(port=srv.port, timeout=30) as client,
    ):
        w.net.stores[w.p["pub"].bytes] = StreamsStore(client)
        w.register_publication()
        w.publish_blobs(N, SIZE, 100)
        assert len(client.pull(NS, 0, N)) < N  # one pull: not the whole batch
        w.subscribe("bob")
        r = w.replay("bob", 0, N)
        w.net.run()
        notes = w.bob.take()
    assert [n.event_id for n in notes] == list(range(N))
    assert all(n.data == {"Blob": blob(n.event_id, SIZE)} for n in notes)
    assert w.status("bob", r.value).status == ReplayState("completed", N)
