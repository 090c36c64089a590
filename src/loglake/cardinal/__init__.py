"""Cardinal Streams for loglake: the message layer, a producer, an exactly-once consumer with
reorgs, and transports (specs/cardinal-streams.txt; reference openrelayxyz/cardinal-streams).

What a user needs is exported here. Over loglake streams (I/O): ``StreamProducer`` sends blocks,
``StreamConsumer`` polls, follows reorg channels and checkpoints, both through a
``StreamTransport`` on any ``Streams``. The sans-I/O cores they drive, for embedding elsewhere (a
Spark operator, a simulation): ``Producer`` (a block's messages), ``ChainProducer`` (when a
branch is a reorg past the threshold) and ``OrderedConsumer`` (messages in, chain updates out).

Modules: ``messages`` (one dataclass per message type), ``avro`` (the three Avro shapes, byte for
byte as the reference writes them), ``codec`` (key/value bytes ↔ messages), ``producer``,
``consumer`` (``BlockAssembler``, sans-I/O block assembly), ``ordering`` (chain updates, reorgs,
checkpoints), ``transport`` (the ``Transport`` interface and the loglake-stream transport),
``cli``.
"""

from loglake.cardinal.blocks import Block, BlockRef, ChainUpdate, ReorgEvent
from loglake.cardinal.codec import decode, encode
from loglake.cardinal.errors import (
    CardinalDecodeError,
    CheckpointError,
    PartitionMismatch,
    ProducerError,
    UnknownAncestor,
)
from loglake.cardinal.ordering import Checkpoint, OrderedConsumer
from loglake.cardinal.producer import BlockPayload, ChainProducer, Emission, Producer, SubBatch
from loglake.cardinal.transport import StreamConsumer, StreamProducer, StreamTransport, Transport

__all__ = [
    "Block",
    "BlockPayload",
    "BlockRef",
    "CardinalDecodeError",
    "ChainProducer",
    "ChainUpdate",
    "Checkpoint",
    "CheckpointError",
    "Emission",
    "OrderedConsumer",
    "PartitionMismatch",
    "Producer",
    "ProducerError",
    "ReorgEvent",
    "StreamConsumer",
    "StreamProducer",
    "StreamTransport",
    "SubBatch",
    "Transport",
    "UnknownAncestor",
    "decode",
    "encode",
]
