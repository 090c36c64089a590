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
``cli``. The pipeline's block job uses the same cores from here (``assemble_block``, the reorg
messages, ``open_envelope``). Names are imported on first use, so it does not load the transports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loglake.faces import lazy_face

if TYPE_CHECKING:
    from loglake.cardinal.blocks import Block, BlockRef, ChainUpdate, ReorgEvent
    from loglake.cardinal.codec import decode, encode
    from loglake.cardinal.consumer import (
        DEFAULT_REORG_THRESHOLD,
        MAX_REORG_THRESHOLD,
        assemble_block,
        assemble_blocks,
    )
    from loglake.cardinal.errors import (
        CardinalDecodeError,
        CheckpointError,
        PartitionMismatch,
        ProducerError,
        UnknownAncestor,
    )
    from loglake.cardinal.messages import REORG, REORG_COMPLETE, ZERO_HASH, Reorg
    from loglake.cardinal.ordering import Checkpoint, OrderedConsumer
    from loglake.cardinal.producer import (
        BlockPayload,
        ChainProducer,
        Emission,
        Producer,
        SubBatch,
        reorg_channel_name,
    )
    from loglake.cardinal.transport import (
        StreamConsumer,
        StreamProducer,
        StreamTransport,
        Transport,
        channel_segment,
        heaviest_batch,
        open_envelope,
        source_name,
    )

_FACE = {
    "Block": "loglake.cardinal.blocks",
    "BlockPayload": "loglake.cardinal.producer",
    "BlockRef": "loglake.cardinal.blocks",
    "CardinalDecodeError": "loglake.cardinal.errors",
    "ChainProducer": "loglake.cardinal.producer",
    "ChainUpdate": "loglake.cardinal.blocks",
    "Checkpoint": "loglake.cardinal.ordering",
    "CheckpointError": "loglake.cardinal.errors",
    "DEFAULT_REORG_THRESHOLD": "loglake.cardinal.consumer",
    "Emission": "loglake.cardinal.producer",
    "MAX_REORG_THRESHOLD": "loglake.cardinal.consumer",
    "OrderedConsumer": "loglake.cardinal.ordering",
    "PartitionMismatch": "loglake.cardinal.errors",
    "Producer": "loglake.cardinal.producer",
    "ProducerError": "loglake.cardinal.errors",
    "REORG": "loglake.cardinal.messages",
    "REORG_COMPLETE": "loglake.cardinal.messages",
    "Reorg": "loglake.cardinal.messages",
    "ReorgEvent": "loglake.cardinal.blocks",
    "StreamConsumer": "loglake.cardinal.transport",
    "StreamProducer": "loglake.cardinal.transport",
    "StreamTransport": "loglake.cardinal.transport",
    "SubBatch": "loglake.cardinal.producer",
    "Transport": "loglake.cardinal.transport",
    "UnknownAncestor": "loglake.cardinal.errors",
    "ZERO_HASH": "loglake.cardinal.messages",
    "assemble_block": "loglake.cardinal.consumer",
    "assemble_blocks": "loglake.cardinal.consumer",
    "channel_segment": "loglake.cardinal.transport",
    "decode": "loglake.cardinal.codec",
    "encode": "loglake.cardinal.codec",
    "heaviest_batch": "loglake.cardinal.transport",
    "open_envelope": "loglake.cardinal.transport",
    "reorg_channel_name": "loglake.cardinal.producer",
    "source_name": "loglake.cardinal.transport",
}
"""Each public name and the module that defines it, imported on first use: a Spark task that
needs one decoder does not pay for the nodes, BitTorrent or the storage engine."""


__getattr__, __dir__ = lazy_face(__name__, _FACE)


__all__ = [
    "DEFAULT_REORG_THRESHOLD",
    "MAX_REORG_THRESHOLD",
    "REORG",
    "REORG_COMPLETE",
    "ZERO_HASH",
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
    "Reorg",
    "ReorgEvent",
    "StreamConsumer",
    "StreamProducer",
    "StreamTransport",
    "SubBatch",
    "Transport",
    "UnknownAncestor",
    "assemble_block",
    "assemble_blocks",
    "channel_segment",
    "decode",
    "encode",
    "heaviest_batch",
    "open_envelope",
    "reorg_channel_name",
    "source_name",
]
