"""loglake.log — the storage engine and the contract (``Log``) every part programs against."""

from loglake.log.api import (
    CorruptSegment,
    Durability,
    Entry,
    IndexRegression,
    InvalidStreamName,
    Log,
    LogError,
    PartitionInfo,
    Record,
    StreamConfig,
    StreamExists,
    StreamInfo,
    UnknownPartition,
    UnknownStream,
)
from loglake.log.memory import MemoryLog

__all__ = [
    "CorruptSegment",
    "Durability",
    "Entry",
    "IndexRegression",
    "InvalidStreamName",
    "Log",
    "LogError",
    "MemoryLog",
    "PartitionInfo",
    "Record",
    "StreamConfig",
    "StreamExists",
    "StreamInfo",
    "UnknownPartition",
    "UnknownStream",
]
