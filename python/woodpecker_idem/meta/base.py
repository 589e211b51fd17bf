"""The metadata contract: logs, segments, writer epochs, nodes — every change a compare-and-swap.

Backends: SQLite (embedded default, safe across processes) and etcd (service mode). One contract
suite (`tests/meta/test_meta_contract.py`) runs against each.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ..errors import InvalidArgumentError
from ..types import LogMessageId, SegmentState


@dataclass(frozen=True, slots=True)
class LogMeta:
    log_id: int
    name: str
    created_ms: int
    writer_epoch: int = 0
    lease_owner: str = ""
    lease_expires_ms: int = 0
    truncated_to: LogMessageId | None = None  # entries before it are gone
    group: str = ""  # log group name ("" if none)
    revision: int = 0


@dataclass(frozen=True, slots=True)
class SegmentMeta:
    log_id: int
    segment_id: int
    state: SegmentState
    nodes: tuple[str, ...]  # LogStore node ids, ensemble order
    es: int
    wq: int
    aq: int
    created_ms: int
    last_entry_id: int = -1  # set on completion: the last entry in the segment (-1: empty)
    completed_ms: int = 0
    size_bytes: int = 0
    revision: int = 0  # assigned by the store; pass the one you read to update


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: str
    address: str  # "inproc://name" or "host:port"
    registered_ms: int = 0
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LogGroupMeta:
    name: str
    partitions: int
    created_ms: int


@dataclass(frozen=True, slots=True)
class TxnMeta:
    """The latest batch of one writing application in one log (a Spark job's `txnAppId`, or a
    streaming query): its version (`txnVersion`, or the micro-batch id), where the batch's entries
    start in the log, and whether all of them were written. A replay of an unfinished batch reads
    back from `start` what its earlier attempts wrote; a finished one is not written again."""

    log_id: int
    app_id: str
    version: int
    start: LogMessageId  # every entry the batch wrote in this log is at or after it
    committed: bool = False
    writer: str = ""  # who writes it (a Spark partition): one writer per batch and log
    updated_ms: int = 0
    revision: int = 0  # assigned by the store; pass the one you read to replace it


@dataclass(frozen=True, slots=True)
class ReaderMeta:
    """A named reader of one log (`LogHandle.open_reader(name=...)`): its committed position (the
    next entry it returns when it opens again) and its epoch (bumped by every open, so the
    reader an open took over can no longer commit)."""

    log_id: int
    name: str
    position: LogMessageId
    epoch: int = 1
    owner: str = ""  # who opened it last (host:pid), for operators
    updated_ms: int = 0
    revision: int = 0  # assigned by the store


#: The shortest registration a node may ask for: etcd grants leases in whole seconds and refuses
#: TTLs shorter than its election timeout, and a renewal (every third of it) must have time to land.
MIN_NODE_TTL_MS = 2_000


def check_node_ttl(ttl_ms: int | None) -> None:
    if ttl_ms is None:
        return
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms < MIN_NODE_TTL_MS:
        raise InvalidArgumentError(
            f"a node registration's ttl_ms must be an int >= {MIN_NODE_TTL_MS}, got {ttl_ms!r}"
        )


class MetadataStore(ABC):
    """Every method is atomic. Writer-issued changes carry the writer's epoch and fail with
    `WriterFencedError` when the log's epoch has moved on."""

    # --- identity ---
    @abstractmethod
    def store_id(self) -> str:
        """This store's identity: a UUID created atomically with the store and never changed.

        Object keys live under it (`{objectstore.root}/{store_id}/...`), because log ids are only
        unique within one store."""

    @abstractmethod
    def bound_objects(self) -> str | None:
        """Where this store's objects live (see `bind_objects`); None if not recorded yet."""

    @abstractmethod
    def bind_objects(self, location: str) -> str:
        """Record, create-if-absent, where this store's objects live (`location` names the bucket
        and root); returns the location recorded, which differs from `location` when the store
        was bound to another one first.

        The owner marker makes a root belong to one metadata store; this makes a metadata store
        belong to one root: a client of the same store pointed at another root would complete
        the log's segments there as empty while the real writer goes on acknowledging."""

    # --- logs ---
    @abstractmethod
    def create_log(self, name: str, now_ms: int, group: str = "") -> LogMeta:
        """New log with the next numeric id; `LogExistsError` if the name is taken."""

    @abstractmethod
    def get_log(self, name: str) -> LogMeta:
        """`LogNotFoundError` if absent."""

    @abstractmethod
    def get_log_by_id(self, log_id: int) -> LogMeta:
        """`LogNotFoundError` if absent."""

    @abstractmethod
    def list_logs(self) -> list[LogMeta]:
        """All logs, ordered by log id."""

    @abstractmethod
    def delete_log(self, name: str) -> LogMeta:
        """Remove the log and all its segment records; returns what was removed."""

    # --- writer epoch and lease ---
    @abstractmethod
    def take_over(self, log_id: int, owner: str, now_ms: int, lease_ms: int) -> int:
        """Bump the writer epoch (one transaction) and record the lease; returns the new epoch."""

    @abstractmethod
    def renew_lease(self, log_id: int, epoch: int, owner: str, now_ms: int, lease_ms: int) -> None:
        """Extend the lease; `WriterFencedError` if `epoch` is no longer current."""

    def release_lease(self, log_id: int, epoch: int, owner: str, now_ms: int) -> None:
        """A writer closed cleanly: its lease ends now, not a TTL later (so `drop-group` right
        after a job is not refused); `WriterFencedError` if `epoch` is no longer current."""
        self.renew_lease(log_id, epoch, owner, now_ms, 0)

    @abstractmethod
    def check_epoch(self, log_id: int, epoch: int) -> None:
        """`WriterFencedError` if `epoch` is no longer the log's current writer epoch."""

    # --- segments ---
    @abstractmethod
    def create_segment(self, epoch: int, seg: SegmentMeta) -> SegmentMeta:
        """Create if absent, conditioned on epoch. `MetadataConflictError` if it exists."""

    @abstractmethod
    def update_segment(self, epoch: int | None, seg: SegmentMeta) -> SegmentMeta:
        """Compare-and-swap on `seg.revision` (and on epoch unless None); returns the stored record
        with its new revision. `MetadataConflictError` on a revision mismatch."""

    @abstractmethod
    def get_segment(self, log_id: int, segment_id: int) -> SegmentMeta | None: ...

    @abstractmethod
    def list_segments(self, log_id: int) -> list[SegmentMeta]:
        """Segments of a log, ordered by segment id."""

    @abstractmethod
    def delete_segment(self, log_id: int, segment_id: int) -> None: ...

    @abstractmethod
    def set_truncation(self, log_id: int, to: LogMessageId) -> LogMeta:
        """Move the truncation point forward (never back); returns the updated log."""

    # --- log groups (Spark) ---
    @abstractmethod
    def create_log_group(self, name: str, partitions: int, now_ms: int) -> LogGroupMeta:
        """Create, or return the existing group; `LogGroupSizeMismatchError` if the size differs."""

    @abstractmethod
    def get_log_group(self, name: str) -> LogGroupMeta | None: ...

    @abstractmethod
    def list_log_groups(self) -> list[LogGroupMeta]:
        """All log groups, ordered by name."""

    @abstractmethod
    def delete_log_group(self, name: str) -> LogGroupMeta | None:
        """Remove the group's record (not its logs: delete those first); returns what was
        removed, or None if there was no such group."""

    # --- batch identities (exactly-once beyond the dedup window) ---
    @abstractmethod
    def put_txn(self, epoch: int, txn: TxnMeta) -> TxnMeta:
        """Record `txn` for (log, app): created when `txn.revision` is 0 (`MetadataConflictError`
        if a record exists), else replaced if the stored revision is still `txn.revision`;
        conditioned on the writer epoch (`WriterFencedError`). Returns it with its new revision."""

    @abstractmethod
    def get_txn(self, log_id: int, app_id: str) -> TxnMeta | None: ...

    @abstractmethod
    def list_txns(self, log_id: int) -> list[TxnMeta]:
        """The log's records, ordered by app id."""

    @abstractmethod
    def delete_txn(self, log_id: int, app_id: str) -> None:
        """Forget one app's record in one log (absent: nothing to do). `delete_log` removes all."""

    # --- named readers (durable reader positions) ---
    @abstractmethod
    def take_reader(
        self, log_id: int, name: str, owner: str, start: LogMessageId, now_ms: int
    ) -> ReaderMeta:
        """Open reader `name` of the log in one transaction: create it at `start` (epoch 1) if
        it is new, else bump its epoch and keep its committed position (`start` is ignored).
        Returns the record; `LogNotFoundError` if the log does not exist."""

    @abstractmethod
    def commit_reader(
        self, log_id: int, name: str, epoch: int, position: LogMessageId, now_ms: int
    ) -> ReaderMeta:
        """Record `position` as the reader's committed position, if `epoch` is still its epoch;
        `ReaderFencedError` if another open took the name over or the reader was deleted."""

    @abstractmethod
    def get_reader(self, log_id: int, name: str) -> ReaderMeta | None: ...

    @abstractmethod
    def list_readers(self, log_id: int) -> list[ReaderMeta]:
        """The log's named readers, ordered by name."""

    @abstractmethod
    def delete_reader(self, log_id: int, name: str) -> ReaderMeta | None:
        """Forget a named reader (its live holder's next commit is refused); returns what was
        removed, or None if there was no such reader. `delete_log` removes all of them."""

    # --- node registry ---
    @abstractmethod
    def register_node(self, node: NodeInfo, ttl_ms: int | None = None) -> None:
        """Register `node` (replacing a registration of the same id). Without `ttl_ms` it stays
        until `unregister_node` (in-process nodes, which live and die with their client). With
        `ttl_ms` it lives while this handle is open: the handle renews it in the background
        (etcd: a lease kept alive; SQLite: an expiry moved forward), and a process that dies
        without unregistering (SIGKILL, a lost host) drops out of `list_nodes` within about
        `ttl_ms` once renewals stop. A registration that lapsed while its process was frozen,
        or its store away, is made again by the next renewal. `InvalidArgumentError` for a
        `ttl_ms` below `MIN_NODE_TTL_MS`."""

    @abstractmethod
    def unregister_node(self, node_id: str) -> None:
        """Remove the node now (and stop renewing it, if this handle registered it)."""

    @abstractmethod
    def list_nodes(self) -> list[NodeInfo]:
        """Registered nodes ordered by node id, without those whose registration lapsed."""

    # --- members of a log group (group writers) ---
    @abstractmethod
    def join_group(self, group: str, member: str, now_ms: int, ttl_ms: int) -> None:
        """Record `member` of `group` as live until `now_ms + ttl_ms` (a member renews by joining
        again); members of the group whose time ran out are dropped."""

    @abstractmethod
    def leave_group(self, group: str, member: str) -> None:
        """`member` left `group` (a clean close): it is not live from now on."""

    @abstractmethod
    def list_group_members(self, group: str, now_ms: int) -> list[str]:
        """The members of `group` live at `now_ms`, ordered by id."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
