"""Model-based test of the service core: random interleavings of CREATE, PUSH (single and
batched), PULL and the index service, checked after every step against a plain-Python model
of the spec's rules (index per partition from 0, +1 per push; pull = at most ``limit`` messages
from ``index`` on; consumer index starts at 0 and never goes back)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from loglake.log import MemoryLog
from loglake.streams import codec
from loglake.streams.messages import (
    CreatePartitionedStreamRequest,
    GetPartitionIndex,
    PartitionIndex,
    PullRequest,
    PullResponse,
    PushConfirm,
    SavePartitionIndex,
)
from loglake.streams.service import StreamService, worker_address
from loglake.wire.ockam import RoutingMessage, route

NAMES = st.sampled_from(["a", "b", "c"])
CLIENT = route("client")


class ServiceModel(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.svc = StreamService(MemoryLog())
        self.parts: dict[str, int] = {}
        self.data: dict[tuple[str, int], list[bytes]] = {}
        self.consumers: dict[tuple[str, str, int], int] = {}

    def call(self, dest: str, msg: object) -> list[RoutingMessage]:
        return self.svc.handle(RoutingMessage(route(dest), CLIENT, codec.encode_payload(msg)))

    @rule(name=NAMES, n=st.integers(1, 3))
    def create(self, name: str, n: int) -> None:
        replies = self.call("stream_service", CreatePartitionedStreamRequest(name, n))
        # asking for more partitions than the stream has grows it (the reference's
        # ensure_streams, stream/workers/service.ex): every partition 0..n-1 answers INIT
        self.parts[name] = max(self.parts.get(name, 0), n)
        for p in range(self.parts[name]):
            self.data.setdefault((name, p), [])
        assert len(replies) == n
        assert all(codec.decode_base(r.payload).protocol != "error" for r in replies)

    @rule(name=NAMES, p=st.integers(0, 2), datas=st.lists(st.binary(max_size=8), max_size=5))
    def push(self, name: str, p: int, datas: list[bytes]) -> None:
        dest = route(worker_address(name, p))
        msgs = [
            RoutingMessage(dest, CLIENT, codec.encode_push_request(i, d))
            for i, d in enumerate(datas)
        ]
        out = self.svc.handle_batch(msgs)
        if (name, p) not in self.data:
            assert all(codec.decode_base(o[0].payload).protocol == "error" for o in out)
            return
        log = self.data[(name, p)]
        for i, (d, o) in enumerate(zip(datas, out, strict=True)):
            assert codec.decode_response(o[0].payload, PushConfirm) == PushConfirm(
                i, "OK", len(log)
            )
            log.append(d)

    @rule(name=NAMES, p=st.integers(0, 2), index=st.integers(0, 12), limit=st.integers(0, 6))
    def pull(self, name: str, p: int, index: int, limit: int) -> None:
        (reply,) = self.call(worker_address(name, p), PullRequest(7, index, limit))
        r = codec.decode_response(reply.payload, PullResponse)
        if (name, p) not in self.data:
            assert codec.decode_base(reply.payload).protocol == "error"
            return
        log = self.data[(name, p)]
        expected = [(i, log[i]) for i in range(index, min(len(log), index + limit))]
        assert [(m.index, m.data) for m in r.messages] == expected

    @rule(client=st.sampled_from(["x", "y"]), name=NAMES, p=st.integers(0, 2))
    def get_index(self, client: str, name: str, p: int) -> None:
        (reply,) = self.call("stream_index_service", GetPartitionIndex(client, name, p))
        r = codec.decode_response(reply.payload, PartitionIndex)
        if (name, p) not in self.data:  # no record to make: the reference's index none
            assert r == PartitionIndex(client, name, p, None)
            return
        self.consumers.setdefault((client, name, p), 0)
        assert r.index == self.consumers[(client, name, p)]

    @rule(client=st.sampled_from(["x", "y"]), name=NAMES, p=st.integers(0, 2), i=st.integers(0, 9))
    def save_index(self, client: str, name: str, p: int, i: int) -> None:
        # a cast (stream/index/shard.ex): no reply, whether it lands or not
        assert self.call("stream_index_service", SavePartitionIndex(client, name, p, i)) == []
        if (name, p) not in self.data:
            return
        key = (client, name, p)
        self.consumers[key] = max(self.consumers.get(key, i), i)
        (reply,) = self.call("stream_index_service", GetPartitionIndex(client, name, p))
        assert codec.decode_response(reply.payload, PartitionIndex).index == self.consumers[key]

    @invariant()
    def log_matches_model(self) -> None:
        for (name, p), log in self.data.items():
            assert self.svc.log.next_index(name, partition=p) == len(log)


ServiceModel.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestServiceModel = ServiceModel.TestCase
