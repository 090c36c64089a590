"""SDS (Scalable Data Sync) and SDS-R for loglake, byte-compatible with @waku/sds 0.0.8.

Spec: specs/sds-scalable-data-sync.txt. Layout (STYLE.md): ``messages`` (dataclasses), ``codec``
(bytes ↔ messages), ``bloom`` (the filter), ``history`` (the local log), ``repair`` (SDS-R),
``events``, ``participant`` (the sans-I/O state machine), ``channel`` (binding to loglake
streams), ``chat`` / ``cli`` (the demo), ``sim`` (the simulator), ``reference`` (a driver for
@waku/sds used by tests and benchmarks).

What a user needs is exported here: ``SdsChannel`` (one participant on a loglake stream: the
I/O), the sans-I/O ``Participant`` it drives, the events a user acts on (sent, delivered,
acknowledged, missing, lost, dropped) and the columnar decoder and bloom filter the pipeline's
audit job runs. The wire messages, the repair and sync events and the codec stay in their modules.
Names are imported on first use: a Spark task that decodes a batch does not load the channel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loglake.faces import lazy_face

if TYPE_CHECKING:
    from loglake.sds.bloom import BloomFilter, contains, contains_batch, positions_batch
    from loglake.sds.channel import SdsChannel, decode_hint
    from loglake.sds.columnar import (
        DECODED_SCHEMA,
        HISTORY_DICTIONARY,
        HISTORY_RUN_COLUMNS,
        IdIndex,
        decode_batches,
        dictionary_reference,
        first_rows,
        history_dictionary,
        history_lists,
        value_indices,
    )
    from loglake.sds.errors import (
        DropReason,
        DuplicateContent,
        SdsDecodeError,
        SdsError,
        SdsLocalError,
    )
    from loglake.sds.events import (
        EphemeralReceived,
        Event,
        MessageAcknowledged,
        MessageDelivered,
        MessageDropped,
        MessagePossiblyAcknowledged,
        MessageSent,
        MessagesLost,
        MessagesMissing,
        Outgoing,
        Output,
    )
    from loglake.sds.participant import Participant, ParticipantOptions
    from loglake.sds.repair import RepairConfig

_FACE = {
    "BloomFilter": "loglake.sds.bloom",
    "DECODED_SCHEMA": "loglake.sds.columnar",
    "HISTORY_DICTIONARY": "loglake.sds.columnar",
    "HISTORY_RUN_COLUMNS": "loglake.sds.columnar",
    "DropReason": "loglake.sds.errors",
    "DuplicateContent": "loglake.sds.errors",
    "EphemeralReceived": "loglake.sds.events",
    "IdIndex": "loglake.sds.columnar",
    "first_rows": "loglake.sds.columnar",
    "Event": "loglake.sds.events",
    "MessageAcknowledged": "loglake.sds.events",
    "MessageDelivered": "loglake.sds.events",
    "MessageDropped": "loglake.sds.events",
    "MessagePossiblyAcknowledged": "loglake.sds.events",
    "MessageSent": "loglake.sds.events",
    "MessagesLost": "loglake.sds.events",
    "MessagesMissing": "loglake.sds.events",
    "Outgoing": "loglake.sds.events",
    "Output": "loglake.sds.events",
    "Participant": "loglake.sds.participant",
    "ParticipantOptions": "loglake.sds.participant",
    "RepairConfig": "loglake.sds.repair",
    "SdsChannel": "loglake.sds.channel",
    "SdsDecodeError": "loglake.sds.errors",
    "SdsError": "loglake.sds.errors",
    "SdsLocalError": "loglake.sds.errors",
    "contains": "loglake.sds.bloom",
    "contains_batch": "loglake.sds.bloom",
    "decode_batches": "loglake.sds.columnar",
    "decode_hint": "loglake.sds.channel",
    "dictionary_reference": "loglake.sds.columnar",
    "history_dictionary": "loglake.sds.columnar",
    "history_lists": "loglake.sds.columnar",
    "positions_batch": "loglake.sds.bloom",
    "value_indices": "loglake.sds.columnar",
}
"""Each public name and the module that defines it, imported on first use: a Spark task that
needs one decoder does not pay for the nodes, BitTorrent or the storage engine."""


__getattr__, __dir__ = lazy_face(__name__, _FACE)


__all__ = [
    "DECODED_SCHEMA",
    "HISTORY_DICTIONARY",
    "HISTORY_RUN_COLUMNS",
    "BloomFilter",
    "DropReason",
    "DuplicateContent",
    "EphemeralReceived",
    "Event",
    "IdIndex",
    "MessageAcknowledged",
    "MessageDelivered",
    "MessageDropped",
    "MessagePossiblyAcknowledged",
    "MessageSent",
    "MessagesLost",
    "MessagesMissing",
    "Outgoing",
    "Output",
    "Participant",
    "ParticipantOptions",
    "RepairConfig",
    "SdsChannel",
    "SdsDecodeError",
    "SdsError",
    "SdsLocalError",
    "contains",
    "contains_batch",
    "decode_batches",
    "decode_hint",
    "dictionary_reference",
    "first_rows",
    "history_dictionary",
    "history_lists",
    "positions_batch",
    "value_indices",
]
