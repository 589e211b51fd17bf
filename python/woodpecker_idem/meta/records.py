"""What every metadata backend shares: argument checks, fencing messages, and the protobuf record
encoding (`proto/meta.proto`) for backends that store records as values (etcd).

Why here: the backends must refuse the same input with the same error, and a record written by one
version must read back the same, so neither lives in a backend module.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

from .._proto import meta_pb2 as pb
from ..errors import (
    CorruptEntryError,
    InvalidArgumentError,
    InvalidTypeError,
    MetadataConflictError,
    ReaderFencedError,
    WriterFencedError,
)
from ..types import LogMessageId, SegmentState
from .base import LogGroupMeta, LogMeta, NodeInfo, ReaderMeta, SegmentMeta, TxnMeta

M = TypeVar("M")


def check_name(what: str, name: object) -> str:
    if not isinstance(name, str):
        raise InvalidTypeError(f"{what} must be a str, got {type(name).__name__}")
    if not name:
        raise InvalidArgumentError(f"{what} must not be empty")
    return name


def check_group(group: object) -> str:
    if not isinstance(group, str):
        raise InvalidTypeError(f"group must be a str, got {type(group).__name__}")
    return group


def check_txn(txn: object) -> TxnMeta:
    if not isinstance(txn, TxnMeta):
        raise InvalidTypeError(f"txn must be a TxnMeta, got {type(txn).__name__}")
    check_name("txn app id", txn.app_id)
    for what, value in (("version", txn.version), ("revision", txn.revision)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgumentError(f"txn {what} must be an int >= 0, got {value!r}")
    return txn


def txn_conflict(txn: TxnMeta, have: int) -> MetadataConflictError:
    now = "it does not exist" if have == 0 else f"it is at revision {have}"
    want = "it to be absent" if txn.revision == 0 else f"revision {txn.revision}"
    return MetadataConflictError(
        f"batch record of app {txn.app_id!r} in log id {txn.log_id}: expected {want} but {now}"
    )


def check_partitions(partitions: object) -> int:
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise InvalidTypeError(f"partitions must be an int, got {type(partitions).__name__}")
    if partitions < 1:
        raise InvalidArgumentError(f"partitions must be >= 1, got {partitions}")
    return partitions


def state_value(state: object) -> str:
    """Accept the enum (or its exact value) and store the value, so records always parse back."""
    try:
        return SegmentState(state).value
    except ValueError:
        allowed = ", ".join(s.value for s in SegmentState)
        raise InvalidArgumentError(
            f"segment state must be one of {allowed}, got {state!r}"
        ) from None


def fenced(name: str, log_id: int, op: str, epoch: int, current: int) -> WriterFencedError:
    return WriterFencedError(
        f"log {name!r} (id {log_id}): {op} by writer epoch {epoch} refused, "
        f"current writer epoch is {current}"
    )


def check_reader(name: object, position: object) -> LogMessageId:
    """A reader's name and a position to record (a LogMessageId or a pair of ints >= 0)."""
    check_name("reader name", name)
    if not isinstance(position, tuple) or len(position) != 2:
        raise InvalidTypeError(
            f"reader position must be a LogMessageId, got {type(position).__name__}"
        )
    for part in position:
        if isinstance(part, bool) or not isinstance(part, int) or part < 0:
            raise InvalidArgumentError(f"reader position must be two ints >= 0, got {position!r}")
    return LogMessageId(*position)


def reader_fenced(
    log_id: int, name: str, op: str, epoch: int, current: ReaderMeta | None
) -> ReaderFencedError:
    if current is None:
        why = "the reader was deleted"
    else:
        who = f" by {current.owner}" if current.owner else ""
        why = f"it was opened again{who} (reader epoch {current.epoch})"
    return ReaderFencedError(
        f"reader {name!r} of log id {log_id}: {op} by reader epoch {epoch} refused: {why}; "
        "only the newest open of a name commits"
    )


# A named reader's record is JSON, like a batch identity's (read only by this package).


def encode_reader(r: ReaderMeta) -> bytes:
    return json.dumps(
        {
            "position": [r.position.segment_id, r.position.entry_id],
            "epoch": r.epoch,
            "owner": r.owner,
            "updated_ms": r.updated_ms,
        },
        sort_keys=True,
    ).encode()


def decode_reader(log_id: int, name: str, data: bytes, revision: int) -> ReaderMeta:
    return parse(f"reader {name!r}", data, lambda d: _decode_reader(log_id, name, d, revision))


def _decode_reader(log_id: int, name: str, data: bytes, revision: int) -> ReaderMeta:
    r = json.loads(data)
    return ReaderMeta(
        log_id=log_id,
        name=name,
        position=LogMessageId(*r["position"]),
        epoch=int(r["epoch"]),
        owner=str(r.get("owner", "")),
        updated_ms=int(r.get("updated_ms", 0)),
        revision=revision,
    )


# --- protobuf records ---------------------------------------------------------------------------


def parse(what: str, data: bytes, decode: Callable[[bytes], M]) -> M:
    """`decode(data)`; bytes that are not such a record are `CorruptEntryError` naming `what`,
    never a raw protobuf or value error."""
    try:
        return decode(data)
    except CorruptEntryError:
        raise
    except Exception as exc:  # DecodeError, ValueError of an enum or int, ...
        raise CorruptEntryError(
            f"metadata record {what} cannot be parsed ({type(exc).__name__}: {exc}); "
            f"{len(data)} bytes"
        ) from exc


def parse_int(what: str, data: bytes) -> int:
    return parse(what, data, int)


def encode_log(m: LogMeta) -> bytes:
    trunc = m.truncated_to
    return pb.LogRecord(
        log_id=m.log_id,
        name=m.name,
        created_ms=m.created_ms,
        writer_epoch=m.writer_epoch,
        lease_owner=m.lease_owner,
        lease_expires_ms=m.lease_expires_ms,
        truncated_segment_id=-1 if trunc is None else trunc.segment_id,
        truncated_entry_id=-1 if trunc is None else trunc.entry_id,
        group=m.group,
    ).SerializeToString()


def decode_log(data: bytes, revision: int) -> LogMeta:
    return parse("log", data, lambda d: _decode_log(d, revision))


def _decode_log(data: bytes, revision: int) -> LogMeta:
    r = pb.LogRecord.FromString(data)
    trunc = None
    if r.truncated_segment_id >= 0:
        trunc = LogMessageId(r.truncated_segment_id, r.truncated_entry_id)
    return LogMeta(
        log_id=r.log_id,
        name=r.name,
        created_ms=r.created_ms,
        writer_epoch=r.writer_epoch,
        lease_owner=r.lease_owner,
        lease_expires_ms=r.lease_expires_ms,
        truncated_to=trunc,
        group=r.group,
        revision=revision,
    )


def encode_segment(s: SegmentMeta) -> bytes:
    return pb.SegmentRecord(
        log_id=s.log_id,
        segment_id=s.segment_id,
        state=state_value(s.state),  # the enum by name
        nodes=list(s.nodes),
        es=s.es,
        wq=s.wq,
        aq=s.aq,
        created_ms=s.created_ms,
        last_entry_id=s.last_entry_id,
        completed_ms=s.completed_ms,
        size_bytes=s.size_bytes,
    ).SerializeToString()


def decode_segment(data: bytes, revision: int) -> SegmentMeta:
    return parse("segment", data, lambda d: _decode_segment(d, revision))


def _decode_segment(data: bytes, revision: int) -> SegmentMeta:
    r = pb.SegmentRecord.FromString(data)
    return SegmentMeta(
        log_id=r.log_id,
        segment_id=r.segment_id,
        state=SegmentState(pb.SegmentStateProto.Name(r.state)),
        nodes=tuple(r.nodes),
        es=r.es,
        wq=r.wq,
        aq=r.aq,
        created_ms=r.created_ms,
        last_entry_id=r.last_entry_id,
        completed_ms=r.completed_ms,
        size_bytes=r.size_bytes,
        revision=revision,
    )


def encode_node(n: NodeInfo) -> bytes:
    return pb.NodeRecord(
        node_id=n.node_id, address=n.address, registered_ms=n.registered_ms, labels=n.labels
    ).SerializeToString()


def decode_node(data: bytes) -> NodeInfo:
    return parse("node", data, lambda d: _decode_node(d))


def _decode_node(data: bytes) -> NodeInfo:
    r = pb.NodeRecord.FromString(data)
    return NodeInfo(r.node_id, r.address, r.registered_ms, dict(r.labels))


def encode_group(g: LogGroupMeta) -> bytes:
    return pb.LogGroupRecord(
        name=g.name, partitions=g.partitions, created_ms=g.created_ms
    ).SerializeToString()


def decode_group(data: bytes) -> LogGroupMeta:
    return parse("group", data, lambda d: _decode_group(d))


def _decode_group(data: bytes) -> LogGroupMeta:
    r = pb.LogGroupRecord.FromString(data)
    return LogGroupMeta(r.name, r.partitions, r.created_ms)


# A batch identity's record is JSON, not a protobuf message: it is read only by this package, and
# JSON needs no generated code. Its fields are TxnMeta's (without log id, app id and revision,
# which are in the key and the store).


def encode_txn(t: TxnMeta) -> bytes:
    return json.dumps(
        {
            "version": t.version,
            "start": [t.start.segment_id, t.start.entry_id],
            "committed": t.committed,
            "writer": t.writer,
            "updated_ms": t.updated_ms,
        },
        sort_keys=True,
    ).encode()


def decode_txn(log_id: int, app_id: str, data: bytes, revision: int) -> TxnMeta:
    return parse(
        f"batch identity {app_id!r}", data, lambda d: _decode_txn(log_id, app_id, d, revision)
    )


def _decode_txn(log_id: int, app_id: str, data: bytes, revision: int) -> TxnMeta:
    r = json.loads(data)
    return TxnMeta(
        log_id=log_id,
        app_id=app_id,
        version=int(r["version"]),
        start=LogMessageId(*r["start"]),
        committed=bool(r["committed"]),
        writer=str(r.get("writer", "")),
        updated_ms=int(r.get("updated_ms", 0)),
        revision=revision,
    )
