from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SegmentStateProto(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTIVE: _ClassVar[SegmentStateProto]
    COMPLETED: _ClassVar[SegmentStateProto]
    SEALED: _ClassVar[SegmentStateProto]
    TRUNCATED: _ClassVar[SegmentStateProto]
ACTIVE: SegmentStateProto
COMPLETED: SegmentStateProto
SEALED: SegmentStateProto
TRUNCATED: SegmentStateProto

class LogRecord(_message.Message):
    __slots__ = ("log_id", "name", "created_ms", "writer_epoch", "lease_owner", "lease_expires_ms", "truncated_segment_id", "truncated_entry_id", "group")
    LOG_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    WRITER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_MS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    log_id: int
    name: str
    created_ms: int
    writer_epoch: int
    lease_owner: str
    lease_expires_ms: int
    truncated_segment_id: int
    truncated_entry_id: int
    group: str
    def __init__(self, log_id: _Optional[int] = ..., name: _Optional[str] = ..., created_ms: _Optional[int] = ..., writer_epoch: _Optional[int] = ..., lease_owner: _Optional[str] = ..., lease_expires_ms: _Optional[int] = ..., truncated_segment_id: _Optional[int] = ..., truncated_entry_id: _Optional[int] = ..., group: _Optional[str] = ...) -> None: ...

class SegmentRecord(_message.Message):
    __slots__ = ("log_id", "segment_id", "state", "nodes", "es", "wq", "aq", "created_ms", "last_entry_id", "completed_ms", "size_bytes")
    LOG_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    ES_FIELD_NUMBER: _ClassVar[int]
    WQ_FIELD_NUMBER: _ClassVar[int]
    AQ_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_MS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    log_id: int
    segment_id: int
    state: SegmentStateProto
    nodes: _containers.RepeatedScalarFieldContainer[str]
    es: int
    wq: int
    aq: int
    created_ms: int
    last_entry_id: int
    completed_ms: int
    size_bytes: int
    def __init__(self, log_id: _Optional[int] = ..., segment_id: _Optional[int] = ..., state: _Optional[_Union[SegmentStateProto, str]] = ..., nodes: _Optional[_Iterable[str]] = ..., es: _Optional[int] = ..., wq: _Optional[int] = ..., aq: _Optional[int] = ..., created_ms: _Optional[int] = ..., last_entry_id: _Optional[int] = ..., completed_ms: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class NodeRecord(_message.Message):
    __slots__ = ("node_id", "address", "registered_ms", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_MS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    registered_ms: int
    labels: _containers.ScalarMap[str, str]
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., registered_ms: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class LogGroupRecord(_message.Message):
    __slots__ = ("name", "partitions", "created_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: int
    created_ms: int
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[int] = ..., created_ms: _Optional[int] = ...) -> None: ...
