from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LogEntry(_message.Message):
    __slots__ = ("segment_id", "entry_id", "timestamp_ms", "payload", "properties", "idempotency_key")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    entry_id: int
    timestamp_ms: int
    payload: bytes
    properties: _containers.ScalarMap[str, str]
    idempotency_key: bytes
    def __init__(self, segment_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., payload: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., idempotency_key: _Optional[bytes] = ...) -> None: ...

class SegmentFooter(_message.Message):
    __slots__ = ("last_entry_id", "blocks")
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    last_entry_id: int
    blocks: _containers.RepeatedCompositeFieldContainer[BlockIndex]
    def __init__(self, last_entry_id: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[BlockIndex, _Mapping]]] = ...) -> None: ...

class BlockIndex(_message.Message):
    __slots__ = ("block", "first_entry_id", "last_entry_id")
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    block: int
    first_entry_id: int
    last_entry_id: int
    def __init__(self, block: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., last_entry_id: _Optional[int] = ...) -> None: ...

class AddEntriesRequest(_message.Message):
    __slots__ = ("log_id", "segment_id", "first_entry_id", "frame", "lac", "recovery")
    LOG_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_FIELD_NUMBER: _ClassVar[int]
    log_id: int
    segment_id: int
    first_entry_id: int
    frame: bytes
    lac: int
    recovery: bool
    def __init__(self, log_id: _Optional[int] = ..., segment_id: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., frame: _Optional[bytes] = ..., lac: _Optional[int] = ..., recovery: _Optional[bool] = ...) -> None: ...

class AddEntriesResponse(_message.Message):
    __slots__ = ("last_entry_id",)
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    last_entry_id: int
    def __init__(self, last_entry_id: _Optional[int] = ...) -> None: ...

class SegmentRequest(_message.Message):
    __slots__ = ("log_id", "segment_id", "last_entry_id")
    LOG_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    log_id: int
    segment_id: int
    last_entry_id: int
    def __init__(self, log_id: _Optional[int] = ..., segment_id: _Optional[int] = ..., last_entry_id: _Optional[int] = ...) -> None: ...

class LastEntryResponse(_message.Message):
    __slots__ = ("last_entry_id", "lac")
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    last_entry_id: int
    lac: int
    def __init__(self, last_entry_id: _Optional[int] = ..., lac: _Optional[int] = ...) -> None: ...

class CompletedEndResponse(_message.Message):
    __slots__ = ("last_entry_id",)
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    last_entry_id: int
    def __init__(self, last_entry_id: _Optional[int] = ...) -> None: ...

class LogRequest(_message.Message):
    __slots__ = ("log_id",)
    LOG_ID_FIELD_NUMBER: _ClassVar[int]
    log_id: int
    def __init__(self, log_id: _Optional[int] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("log_id", "segment_id", "from_entry_id", "max_entries")
    LOG_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    log_id: int
    segment_id: int
    from_entry_id: int
    max_entries: int
    def __init__(self, log_id: _Optional[int] = ..., segment_id: _Optional[int] = ..., from_entry_id: _Optional[int] = ..., max_entries: _Optional[int] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, entries: _Optional[_Iterable[bytes]] = ...) -> None: ...

class SealSegmentRequest(_message.Message):
    __slots__ = ("log_id", "segment_id", "last_entry_id")
    LOG_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    log_id: int
    segment_id: int
    last_entry_id: int
    def __init__(self, log_id: _Optional[int] = ..., segment_id: _Optional[int] = ..., last_entry_id: _Optional[int] = ...) -> None: ...

class SealSegmentResponse(_message.Message):
    __slots__ = ("block_keys", "footer_key", "footer")
    BLOCK_KEYS_FIELD_NUMBER: _ClassVar[int]
    FOOTER_KEY_FIELD_NUMBER: _ClassVar[int]
    FOOTER_FIELD_NUMBER: _ClassVar[int]
    block_keys: _containers.RepeatedScalarFieldContainer[str]
    footer_key: str
    footer: SegmentFooter
    def __init__(self, block_keys: _Optional[_Iterable[str]] = ..., footer_key: _Optional[str] = ..., footer: _Optional[_Union[SegmentFooter, _Mapping]] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
