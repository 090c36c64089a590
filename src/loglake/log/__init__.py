"""loglake.log — the storage engine and the contract (``Log``) every part programs against.

``open_log(data_dir)`` opens the embedded, crash-safe engine (``SegmentLog``); ``MemoryLog`` is
the volatile one for tests and simulations. Both follow ``loglake.log.api``.
"""

from loglake.log.api import (
    CorruptSegment,
    CorruptStore,
    CreateFailed,
    Durability,
    Entry,
    InvalidIndex,
    InvalidStreamName,
    InvalidTimestamp,
    Log,
    LogClosed,
    LogError,
    LogLocked,
    PartitionHealth,
    PartitionInfo,
    QuotaExceeded,
    ReadOnlyLog,
    Record,
    RetentionFailed,
    SealFailure,
    StorageFailed,
    StorageFailure,
    StreamConfig,
    StreamExists,
    StreamInfo,
    UnknownPartition,
    UnknownStream,
)
from loglake.log.memory import MemoryLog
from loglake.log.segment_log import SegmentLog, open_log

__all__ = [
    "CorruptSegment",
    "CorruptStore",
    "CreateFailed",
    "Durability",
    "Entry",
    "InvalidIndex",
    "InvalidStreamName",
    "InvalidTimestamp",
    "Log",
    "LogClosed",
    "LogError",
    "LogLocked",
    "MemoryLog",
    "PartitionHealth",
    "PartitionInfo",
    "QuotaExceeded",
    "ReadOnlyLog",
    "Record",
    "RetentionFailed",
    "SealFailure",
    "SegmentLog",
    "StorageFailed",
    "StorageFailure",
    "StreamConfig",
    "StreamExists",
    "StreamInfo",
    "UnknownPartition",
    "UnknownStream",
    "open_log",
]
