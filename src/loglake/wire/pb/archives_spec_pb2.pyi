from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WakuMessage(_message.Message):
    __slots__ = ("payload", "content_topic", "version", "timestamp", "meta", "ephemeral")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TOPIC_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    EPHEMERAL_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    content_topic: str
    version: int
    timestamp: int
    meta: bytes
    ephemeral: bool
    def __init__(self, payload: _Optional[bytes] = ..., content_topic: _Optional[str] = ..., version: _Optional[int] = ..., timestamp: _Optional[int] = ..., meta: _Optional[bytes] = ..., ephemeral: _Optional[bool] = ...) -> None: ...

class WakuMessageArchiveMetadata(_message.Message):
    __slots__ = ("version", "to", "contentTopic")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    CONTENTTOPIC_FIELD_NUMBER: _ClassVar[int]
    version: int
    to: int
    contentTopic: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[int] = ..., to: _Optional[int] = ..., contentTopic: _Optional[_Iterable[str]] = ..., **kwargs) -> None: ...

class WakuMessageArchive(_message.Message):
    __slots__ = ("version", "metadata", "messages", "padding")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PADDING_FIELD_NUMBER: _ClassVar[int]
    version: int
    metadata: WakuMessageArchiveMetadata
    messages: _containers.RepeatedCompositeFieldContainer[WakuMessage]
    padding: bytes
    def __init__(self, version: _Optional[int] = ..., metadata: _Optional[_Union[WakuMessageArchiveMetadata, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[WakuMessage, _Mapping]]] = ..., padding: _Optional[bytes] = ...) -> None: ...

class WakuMessageArchiveIndexMetadata(_message.Message):
    __slots__ = ("version", "metadata", "offset", "num_pieces")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NUM_PIECES_FIELD_NUMBER: _ClassVar[int]
    version: int
    metadata: WakuMessageArchiveMetadata
    offset: int
    num_pieces: int
    def __init__(self, version: _Optional[int] = ..., metadata: _Optional[_Union[WakuMessageArchiveMetadata, _Mapping]] = ..., offset: _Optional[int] = ..., num_pieces: _Optional[int] = ...) -> None: ...

class WakuMessageArchiveIndex(_message.Message):
    __slots__ = ("archives",)
    class ArchivesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: WakuMessageArchiveIndexMetadata
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[WakuMessageArchiveIndexMetadata, _Mapping]] = ...) -> None: ...
    ARCHIVES_FIELD_NUMBER: _ClassVar[int]
    archives: _containers.MessageMap[str, WakuMessageArchiveIndexMetadata]
    def __init__(self, archives: _Optional[_Mapping[str, WakuMessageArchiveIndexMetadata]] = ...) -> None: ...
