"""Cardinal Streams for loglake: the message layer, a producer, an exactly-once consumer with
reorgs, and transports (specs/cardinal-streams.txt; reference openrelayxyz/cardinal-streams).

Modules: ``messages`` (one dataclass per message type), ``avro`` (the three Avro shapes, byte for
byte as the reference writes them), ``codec`` (key/value bytes ↔ messages), ``producer``,
``consumer`` (sans-I/O block assembly), ``ordering`` (chain updates, reorgs, checkpoints),
``transport`` (the ``Transport`` interface and the loglake-stream transport), ``cli``.
"""

from loglake.cardinal.blocks import Block, BlockRef, ChainUpdate, ReorgEvent
from loglake.cardinal.codec import decode, encode
from loglake.cardinal.consumer import Consumer
from loglake.cardinal.ordering import Checkpoint, OrderedConsumer, OrderedProcessor
from loglake.cardinal.producer import BlockPayload, Producer

__all__ = [
    "Block",
    "BlockPayload",
    "BlockRef",
    "ChainUpdate",
    "Checkpoint",
    "Consumer",
    "OrderedConsumer",
    "OrderedProcessor",
    "Producer",
    "ReorgEvent",
    "decode",
    "encode",
]
