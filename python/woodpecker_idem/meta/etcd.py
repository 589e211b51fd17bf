"""etcd `MetadataStore`: one shared view of every log for clients on many hosts (`meta.type: etcd`).

Keys under `{prefix}/#/` (records are `proto/meta.proto` messages; ids zero-padded so that key
order is numeric order). `#` is a reserved path component: no prefix may contain it, so one
deployment's keys never fall under another's, even when one prefix is nested in the other (`/x`
and `/x/logs`): every key of prefix P starts with `P/#/`, and the first `/#/` in a key ends its
prefix. Without it, `/x`'s range over `/x/logs/` would read (and its delete_log delete) the keys
of `/x/logs`.

    store_id                    the store's identity, a UUID created once (create-if-absent)
    objects                     where the store's objects live (bucket and root), recorded once
    next_log_id                 the last log id allocated (a counter moved by transactions)
    names/{name}                log id
    logs/{log_id}               LogRecord; its mod revision is LogMeta.revision
    epochs/{log_id}             the writer epoch, alone, so writes can compare it in their txn
    writers/{log_id}            the current writer's owner, attached to its etcd lease
    segments/{log_id}/{seg_id}  SegmentRecord; its mod revision is SegmentMeta.revision
    groups/{name}, nodes/{id}   LogGroupRecord, NodeRecord
    txns/{log_id}/{app_id}      a batch identity's record (JSON, records.encode_txn); its mod
                                revision is TxnMeta.revision
    readers/{log_id}/{name}     a named reader's position and epoch (JSON, records.encode_reader);
                                its mod revision is ReaderMeta.revision

Every change is one etcd transaction: a take-over bumps the epoch, the log record and the writer
key together; a writer's write compares `epochs/{log_id}` in the same transaction that makes it.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import uuid
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from typing import TypeVar

from ..errors import (
    ConfigError,
    InvalidArgumentError,
    LogExistsError,
    LogGroupSizeMismatchError,
    LogNotFoundError,
    MetadataConflictError,
    MetadataLostError,
    StorageUnavailableError,
)
from ..retry import Backoff
from ..types import LogMessageId
from . import records as rec
from .base import (
    LogGroupMeta,
    LogMeta,
    MetadataStore,
    NodeInfo,
    ReaderMeta,
    SegmentMeta,
    TxnMeta,
    check_node_ttl,
)
from .etcd_client import (
    KV,
    NO_SECURITY,
    EtcdGateway,
    EtcdSecurity,
    LeaseKeeper,
    absent,
    delete,
    get,
    present,
    put,
    range_kvs,
    same_mod,
    same_value,
    unb64,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_MS = 5_000
RESERVED = "#"  # the path component between a prefix and its keys (see the module docstring)
T = TypeVar("T")


class _Retry(Exception):
    """A compare failed because another client moved first: read again and retry."""


class EtcdMetadataStore(MetadataStore):
    """`MetadataStore` on etcd >= 3.4; safe to share between threads, picklable for processes."""

    def __init__(
        self,
        endpoints: Sequence[str],
        prefix: str = "/woodpecker",
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        security: EtcdSecurity = NO_SECURITY,
    ):
        if not isinstance(prefix, str) or not prefix.startswith("/"):
            raise InvalidArgumentError(f"etcd key prefix must start with '/', got {prefix!r}")
        if RESERVED in prefix.split("/"):
            raise InvalidArgumentError(
                f"etcd key prefix {prefix!r} must not contain the path component {RESERVED!r}: "
                "it separates a prefix from its keys"
            )
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 1:
            raise InvalidArgumentError(f"timeout_ms must be an int >= 1, got {timeout_ms!r}")
        self._endpoints = tuple(endpoints)
        self._prefix = prefix.rstrip("/")
        self._timeout_ms = timeout_ms
        self._security = security
        self._gw = EtcdGateway(self._endpoints, timeout_ms / 1000, security)
        self._leases = LeaseKeeper(self._gw, self._replace_lease)
        # the nodes this handle registered with a TTL (their leases are in the keeper)
        self._nodes_lock = threading.Lock()
        self._registered: dict[str, NodeInfo] = {}
        self._node_epochs = itertools.count(1)
        try:
            self._store_id = self._identity()  # also the first contact: unreachable fails here
        except BaseException:
            self._gw.close()
            raise

    def __reduce__(self) -> tuple[object, ...]:
        """Pickles as (endpoints, prefix, timeout, security): the receiving process opens its own
        sessions (and reads the certificate files at the same paths)."""
        return (_reopen, (self._endpoints, self._prefix, self._timeout_ms, self._security))

    @property
    def lease_errors(self) -> int:
        """Keep-alive failures so far (the keeper logs and retries each)."""
        return self._leases.errors

    def store_id(self) -> str:
        return self._store_id

    def bound_objects(self) -> str | None:
        kvs = self._range("bound objects", self._k("objects"))
        return unb64(kvs[0]["value"]).decode() if kvs else None

    def bind_objects(self, location: str) -> str:
        key = self._k("objects")
        out = self._txn("bind objects", [absent(key)], [put(key, location)], [get(key)])
        if out.get("succeeded"):
            return location
        return unb64(range_kvs(out["responses"][0])[0]["value"]).decode()

    # --- plumbing -------------------------------------------------------------------------------

    def _k(self, *parts: object) -> str:
        names = [f"{p:020d}" if isinstance(p, int) else str(p) for p in parts]
        return "/".join([self._prefix, RESERVED, *names])

    def _txn(self, op: str, compare: list[KV], success: list[KV], failure: list[KV]) -> KV:
        body = {"compare": compare, "success": success, "failure": failure}
        return self._gw.call(op, "kv/txn", body, write=True)

    def _range(self, op: str, key: str, prefix: bool = False) -> list[KV]:
        body = get(key, prefix)["request_range"]
        return range_kvs(self._gw.call(op, "kv/range", body, write=False))

    def _cas_loop(self, op: str, attempt: Callable[[], T]) -> T:
        """Run `attempt` until no other client moves first (`_Retry`), within the deadline."""
        backoff = Backoff(initial_s=0.005, max_s=0.2, budget_s=self._timeout_ms / 1000)
        while True:
            try:
                return attempt()
            except _Retry:
                if not backoff.wait():
                    raise StorageUnavailableError(
                        f"etcd at {', '.join(self._endpoints)}: {op} kept conflicting with other "
                        f"clients for {self._timeout_ms} ms (meta.timeout_ms)"
                    ) from None

    def _identity(self) -> str:
        key, new = self._k("store_id"), str(uuid.uuid4())
        old = f"{self._prefix}/store_id"  # where a store of the layout without `#` kept it
        out = self._txn(
            "store identity", [absent(key), absent(old)], [put(key, new)], [get(key), get(old)]
        )
        if out.get("succeeded"):
            return new
        found = range_kvs(out["responses"][0])
        if found:
            return unb64(found[0]["value"]).decode()
        raise ConfigError(
            f"etcd at {', '.join(self._endpoints)}: the keys under prefix {self._prefix!r} were "
            "written by an earlier version of woodpecker_idem (without the reserved '#' "
            "component that keeps nested prefixes apart), which this version does not read. "
            "There is no migration; use a new meta.prefix (and objectstore.root)"
        )

    def _check_identity(self, op: str, found: list[KV] | None = None) -> None:
        """`MetadataLostError` if this store's identity key is gone or replaced (`found`: its
        range, when a transaction read it already). A running client caches the identity, so
        without this, etcd restarted with an empty data directory would look like an empty store
        to it, and it would create log id 1 again over the old log's objects."""
        kvs = self._range(op, self._k("store_id")) if found is None else found
        now = unb64(kvs[0]["value"]).decode() if kvs else None
        if now == self._store_id:
            return
        what = "is gone" if now is None else f"was replaced by {now}"
        raise MetadataLostError(
            f"etcd at {', '.join(self._endpoints)} (prefix {self._prefix!r}): the identity of this "
            f"metadata store, {self._store_id}, {what}: etcd lost its data (restarted with an "
            f"empty data directory?). {op} refused: nothing is written over the old logs' "
            "objects. Restore etcd from a backup (or start a new deployment: another "
            "meta.prefix and objectstore.root)"
        )

    def _log_kv(self, op: str, log_id: int) -> tuple[LogMeta, int]:
        kvs = self._range(op, self._k("logs", log_id))
        if not kvs:
            self._check_identity(op)
            raise LogNotFoundError(f"log id {log_id} does not exist")
        rev = int(kvs[0]["mod_revision"])
        return rec.decode_log(unb64(kvs[0].get("value")), rev), rev

    def _explain_refusal(
        self, op: str, log_id: int, epoch: int | None, responses: list[KV]
    ) -> None:
        """After a failed conditional write whose failure branch read [epoch, log, ...]: raise
        LogNotFoundError or WriterFencedError if that is why; return if it was something else."""
        epoch_kvs, log_kvs = range_kvs(responses[0]), range_kvs(responses[1])
        if not epoch_kvs or not log_kvs:
            self._check_identity(op)
            raise LogNotFoundError(f"log id {log_id} does not exist")
        current = rec.parse_int("epoch", unb64(epoch_kvs[0].get("value")) or b"0")
        if epoch is not None and current != epoch:
            name = rec.decode_log(unb64(log_kvs[0].get("value")), 0).name
            if current > epoch:
                self._leases.release(log_id, epoch)
            raise rec.fenced(name, log_id, op, epoch, current)

    # --- logs -------------------------------------------------------------------------------

    def create_log(self, name: str, now_ms: int, group: str = "") -> LogMeta:
        rec.check_name("log name", name)
        rec.check_group(group)
        counter, name_key = self._k("next_log_id"), self._k("names", name)
        ident = self._k("store_id")

        def attempt() -> LogMeta:
            kvs = self._range("create_log", counter)
            last = rec.parse_int("next_log_id", unb64(kvs[0]["value"])) if kvs else 0
            held = same_mod(counter, int(kvs[0]["mod_revision"])) if kvs else absent(counter)
            meta = LogMeta(log_id=last + 1, name=name, created_ms=now_ms, group=group)
            out = self._txn(
                "create_log",
                [held, absent(name_key), same_value(ident, self._store_id)],
                [
                    put(counter, str(meta.log_id)),
                    put(name_key, str(meta.log_id)),
                    put(self._k("logs", meta.log_id), rec.encode_log(meta)),
                    put(self._k("epochs", meta.log_id), "0"),
                ],
                [get(name_key), get(ident)],
            )
            if out.get("succeeded"):
                return replace(meta, revision=int(out["header"]["revision"]))
            self._check_identity("create_log", range_kvs(out["responses"][1]))
            if range_kvs(out["responses"][0]):
                raise LogExistsError(f"log {name!r} already exists")
            raise _Retry

        meta = self._cas_loop("create_log", attempt)
        log.info("created log %r (id %d) in etcd", name, meta.log_id)
        return meta

    def get_log(self, name: str) -> LogMeta:
        kvs = self._range("get_log", self._k("names", name))
        try:
            if kvs:
                log_id = rec.parse_int(f"names/{name}", unb64(kvs[0]["value"]))
                return self._log_kv("get_log", log_id)[0]
        except LogNotFoundError:
            pass  # deleted between the two reads
        raise LogNotFoundError(f"log {name!r} does not exist")

    def get_log_by_id(self, log_id: int) -> LogMeta:
        return self._log_kv("get_log_by_id", log_id)[0]

    def list_logs(self) -> list[LogMeta]:
        kvs = self._range("list_logs", self._k("logs", ""), prefix=True)
        return [rec.decode_log(unb64(kv.get("value")), int(kv["mod_revision"])) for kv in kvs]

    def delete_log(self, name: str) -> LogMeta:
        def attempt() -> LogMeta:
            meta = self.get_log(name)
            i = meta.log_id
            out = self._txn(
                "delete_log",
                [same_mod(self._k("logs", i), meta.revision)],
                [delete(self._k(key, i)) for key in ("logs", "epochs", "writers")]
                + [delete(self._k("names", name)), delete(self._k("segments", i, ""), True)]
                + [delete(self._k("txns", i, ""), True), delete(self._k("readers", i, ""), True)],
                [],
            )
            if not out.get("succeeded"):
                raise _Retry
            return meta

        meta = self._cas_loop("delete_log", attempt)
        self._leases.release(meta.log_id)
        log.info("deleted log %r (id %d) from etcd", name, meta.log_id)
        return meta

    # --- writer epoch and lease ------------------------------------------------------------------

    def take_over(self, log_id: int, owner: str, now_ms: int, lease_ms: int) -> int:
        ttl = max(2, math.ceil(lease_ms / 1000))
        lease = self._leases.grant(ttl)

        def attempt() -> int:
            meta, rev = self._log_kv("take_over", log_id)
            epoch = meta.writer_epoch + 1
            expires = now_ms + lease_ms
            new = replace(meta, writer_epoch=epoch, lease_owner=owner, lease_expires_ms=expires)
            out = self._txn(
                "take_over",
                [same_mod(self._k("logs", log_id), rev)],
                [
                    put(self._k("logs", log_id), rec.encode_log(new)),
                    put(self._k("epochs", log_id), str(epoch)),
                    put(self._k("writers", log_id), owner, lease),
                ],
                [],
            )
            if not out.get("succeeded"):
                raise _Retry
            return epoch

        try:
            epoch = self._cas_loop("take_over", attempt)
        except BaseException:
            self._leases.revoke(lease)
            raise
        self._leases.hold(log_id, epoch, lease, ttl)
        log.info("log id %d: writer %r took over at epoch %d (etcd)", log_id, owner, epoch)
        return epoch

    def release_lease(self, log_id: int, epoch: int, owner: str, now_ms: int) -> None:
        super().release_lease(log_id, epoch, owner, now_ms)
        self._leases.release(log_id, epoch)  # revoked: the writers key goes with it

    def renew_lease(self, log_id: int, epoch: int, owner: str, now_ms: int, lease_ms: int) -> None:
        def attempt() -> None:
            meta, rev = self._log_kv("renew_lease", log_id)
            new = replace(meta, lease_owner=owner, lease_expires_ms=now_ms + lease_ms)
            out = self._txn(
                "renew_lease",
                [*self._guarded(epoch, log_id), same_mod(self._k("logs", log_id), rev)],
                [put(self._k("logs", log_id), rec.encode_log(new))],
                [get(self._k("epochs", log_id)), get(self._k("logs", log_id))],
            )
            if not out.get("succeeded"):
                self._explain_refusal("renew_lease", log_id, epoch, out["responses"])
                raise _Retry

        self._cas_loop("renew_lease", attempt)

    def _replace_lease(self, held: Hashable, epoch: int, ttl: int) -> None:
        """The keeper found a lease expired (etcd was away): a node's is registered again; a
        writer's gets a new one, if the writer still holds the epoch."""
        if isinstance(held, tuple):
            self._replace_node_lease(held[1], ttl)
            return
        assert isinstance(held, int)
        log_id = held
        try:
            meta = self.get_log_by_id(log_id)
        except LogNotFoundError:
            self._leases.release(log_id)
            return
        lease = self._leases.grant(ttl)
        key = self._k("writers", log_id)
        out = self._txn(
            "lease renewal",
            [same_value(self._k("epochs", log_id), str(epoch))],
            [put(key, meta.lease_owner, lease)],
            [],
        )
        if out.get("succeeded"):
            self._leases.hold(log_id, epoch, lease, ttl)
        else:
            self._leases.revoke(lease)
            self._leases.release(log_id, epoch)

    def check_epoch(self, log_id: int, epoch: int) -> None:
        meta = self.get_log_by_id(log_id)
        if meta.writer_epoch != epoch:
            raise rec.fenced(meta.name, log_id, "check_epoch", epoch, meta.writer_epoch)

    # --- segments --------------------------------------------------------------------------------

    def _guarded(self, epoch: int | None, log_id: int) -> list[KV]:
        return [] if epoch is None else [same_value(self._k("epochs", log_id), str(epoch))]

    def create_segment(self, epoch: int, seg: SegmentMeta) -> SegmentMeta:
        key, value = self._k("segments", seg.log_id, seg.segment_id), rec.encode_segment(seg)
        out = self._txn(
            "create_segment",
            [*self._guarded(epoch, seg.log_id), absent(key)],
            [put(key, value)],
            [get(self._k("epochs", seg.log_id)), get(self._k("logs", seg.log_id))],
        )
        if not out.get("succeeded"):
            self._explain_refusal("create_segment", seg.log_id, epoch, out["responses"])
            raise MetadataConflictError(
                f"segment {seg.segment_id} of log id {seg.log_id} already exists"
            )
        return rec.decode_segment(value, int(out["header"]["revision"]))

    def update_segment(self, epoch: int | None, seg: SegmentMeta) -> SegmentMeta:
        key, value = self._k("segments", seg.log_id, seg.segment_id), rec.encode_segment(seg)
        out = self._txn(
            "update_segment",
            [*self._guarded(epoch, seg.log_id), present(key), same_mod(key, seg.revision)],
            [put(key, value)],
            [get(self._k("epochs", seg.log_id)), get(self._k("logs", seg.log_id)), get(key)],
        )
        if not out.get("succeeded"):
            responses = out["responses"]
            if epoch is not None:
                self._explain_refusal("update_segment", seg.log_id, epoch, responses)
            found = range_kvs(responses[2])
            now = f"it is at revision {found[0]['mod_revision']}" if found else "it does not exist"
            raise MetadataConflictError(
                f"segment {seg.segment_id} of log id {seg.log_id}: update expected revision "
                f"{seg.revision} but {now}"
            )
        return rec.decode_segment(value, int(out["header"]["revision"]))

    def get_segment(self, log_id: int, segment_id: int) -> SegmentMeta | None:
        kvs = self._range("get_segment", self._k("segments", log_id, segment_id))
        return _segment(kvs[0]) if kvs else None

    def list_segments(self, log_id: int) -> list[SegmentMeta]:
        kvs = self._range("list_segments", self._k("segments", log_id, ""), prefix=True)
        return [_segment(kv) for kv in kvs]

    def delete_segment(self, log_id: int, segment_id: int) -> None:
        self._txn("delete_segment", [], [delete(self._k("segments", log_id, segment_id))], [])

    def set_truncation(self, log_id: int, to: LogMessageId) -> LogMeta:
        to = LogMessageId(*to)

        def attempt() -> LogMeta:
            meta, rev = self._log_kv("set_truncation", log_id)
            if meta.truncated_to is not None and to <= meta.truncated_to:
                return meta
            new = replace(meta, truncated_to=to)
            key = self._k("logs", log_id)
            out = self._txn(
                "set_truncation", [same_mod(key, rev)], [put(key, rec.encode_log(new))], []
            )
            if not out.get("succeeded"):
                raise _Retry
            return replace(new, revision=int(out["header"]["revision"]))

        return self._cas_loop("set_truncation", attempt)

    # --- log groups and nodes -----------------------------------------------------------------

    def create_log_group(self, name: str, partitions: int, now_ms: int) -> LogGroupMeta:
        rec.check_name("log group name", name)
        rec.check_partitions(partitions)
        key = self._k("groups", name)
        group = LogGroupMeta(name, partitions, now_ms)
        out = self._txn(
            "create_log_group", [absent(key)], [put(key, rec.encode_group(group))], [get(key)]
        )
        if not out.get("succeeded"):
            group = rec.decode_group(unb64(range_kvs(out["responses"][0])[0]["value"]))
        if group.partitions != partitions:
            raise LogGroupSizeMismatchError(
                f"log group {name!r} exists with {group.partitions} partitions, not {partitions}"
            )
        return group

    def get_log_group(self, name: str) -> LogGroupMeta | None:
        kvs = self._range("get_log_group", self._k("groups", name))
        return rec.decode_group(unb64(kvs[0]["value"])) if kvs else None

    def list_log_groups(self) -> list[LogGroupMeta]:
        kvs = self._range("list_log_groups", self._k("groups", ""), prefix=True)
        return sorted((rec.decode_group(unb64(kv["value"])) for kv in kvs), key=lambda g: g.name)

    def delete_log_group(self, name: str) -> LogGroupMeta | None:
        key = self._k("groups", name)
        out = self._txn("delete_log_group", [present(key)], [get(key), delete(key)], [])
        if not out.get("succeeded"):
            return None
        log.info("deleted log group %r from etcd", name)
        return rec.decode_group(unb64(range_kvs(out["responses"][0])[0]["value"]))

    # --- batch identities ---------------------------------------------------------------------

    def put_txn(self, epoch: int, txn: TxnMeta) -> TxnMeta:
        rec.check_txn(txn)
        key = self._k("txns", txn.log_id, txn.app_id)
        held = absent(key) if txn.revision == 0 else same_mod(key, txn.revision)
        out = self._txn(
            "put_txn",
            [*self._guarded(epoch, txn.log_id), held],
            [put(key, rec.encode_txn(txn))],
            [get(self._k("epochs", txn.log_id)), get(self._k("logs", txn.log_id)), get(key)],
        )
        if not out.get("succeeded"):
            responses = out["responses"]
            self._explain_refusal("put_txn", txn.log_id, epoch, responses)
            found = range_kvs(responses[2])
            raise rec.txn_conflict(txn, int(found[0]["mod_revision"]) if found else 0)
        return replace(txn, revision=int(out["header"]["revision"]))

    def _txns(self, op: str, log_id: int, app_id: str | None) -> list[TxnMeta]:
        if app_id is None:
            kvs = self._range(op, self._k("txns", log_id, ""), prefix=True)
        else:
            kvs = self._range(op, self._k("txns", log_id, app_id))
        head = len(self._k("txns", log_id, ""))
        out = [
            rec.decode_txn(
                log_id,
                unb64(kv["key"]).decode()[head:],
                unb64(kv["value"]),
                int(kv["mod_revision"]),
            )
            for kv in kvs
        ]
        return sorted(out, key=lambda t: t.app_id)

    def get_txn(self, log_id: int, app_id: str) -> TxnMeta | None:
        found = self._txns("get_txn", log_id, app_id)
        return found[0] if found else None

    def list_txns(self, log_id: int) -> list[TxnMeta]:
        return self._txns("list_txns", log_id, None)

    def delete_txn(self, log_id: int, app_id: str) -> None:
        self._txn("delete_txn", [], [delete(self._k("txns", log_id, app_id))], [])

    # --- named readers -------------------------------------------------------------------------

    def _reader_kv(self, op: str, log_id: int, name: str) -> tuple[ReaderMeta | None, int]:
        """The reader's record and its mod revision (None, 0 when absent)."""
        kvs = self._range(op, self._k("readers", log_id, name))
        if not kvs:
            return None, 0
        rev = int(kvs[0]["mod_revision"])
        return rec.decode_reader(log_id, name, unb64(kvs[0]["value"]), rev), rev

    def take_reader(
        self, log_id: int, name: str, owner: str, start: LogMessageId, now_ms: int
    ) -> ReaderMeta:
        start = rec.check_reader(name, start)
        key, log_key = self._k("readers", log_id, name), self._k("logs", log_id)

        def attempt() -> ReaderMeta:
            old, rev = self._reader_kv("take_reader", log_id, name)
            if old is None:
                new = ReaderMeta(log_id, name, start, 1, owner, now_ms)
            else:
                new = replace(old, epoch=old.epoch + 1, owner=owner, updated_ms=now_ms)
            held = absent(key) if old is None else same_mod(key, rev)
            out = self._txn(
                "take_reader",
                [held, present(log_key)],
                [put(key, rec.encode_reader(new))],
                [get(log_key)],
            )
            if out.get("succeeded"):
                return replace(new, revision=int(out["header"]["revision"]))
            if not range_kvs(out["responses"][0]):
                self._check_identity("take_reader")
                raise LogNotFoundError(f"log id {log_id} does not exist")
            raise _Retry

        new = self._cas_loop("take_reader", attempt)
        log.info("log id %d: reader %r opened at epoch %d by %s", log_id, name, new.epoch, owner)
        return new

    def commit_reader(
        self, log_id: int, name: str, epoch: int, position: LogMessageId, now_ms: int
    ) -> ReaderMeta:
        position = rec.check_reader(name, position)
        key = self._k("readers", log_id, name)

        def attempt() -> ReaderMeta:
            old, rev = self._reader_kv("commit_reader", log_id, name)
            if old is None or old.epoch != epoch:
                raise rec.reader_fenced(log_id, name, "commit", epoch, old)
            new = replace(old, position=position, updated_ms=now_ms)
            out = self._txn(
                "commit_reader", [same_mod(key, rev)], [put(key, rec.encode_reader(new))], []
            )
            if not out.get("succeeded"):
                raise _Retry  # changed since we read it: read again (an open fences us then)
            return replace(new, revision=int(out["header"]["revision"]))

        return self._cas_loop("commit_reader", attempt)

    def get_reader(self, log_id: int, name: str) -> ReaderMeta | None:
        return self._reader_kv("get_reader", log_id, name)[0]

    def list_readers(self, log_id: int) -> list[ReaderMeta]:
        kvs = self._range("list_readers", self._k("readers", log_id, ""), prefix=True)
        head = len(self._k("readers", log_id, ""))
        out = [
            rec.decode_reader(
                log_id,
                unb64(kv["key"]).decode()[head:],
                unb64(kv["value"]),
                int(kv["mod_revision"]),
            )
            for kv in kvs
        ]
        return sorted(out, key=lambda r: r.name)

    def delete_reader(self, log_id: int, name: str) -> ReaderMeta | None:
        key = self._k("readers", log_id, name)
        out = self._txn("delete_reader", [present(key)], [get(key), delete(key)], [])
        if not out.get("succeeded"):
            return None
        kv = range_kvs(out["responses"][0])[0]
        return rec.decode_reader(log_id, name, unb64(kv["value"]), int(kv["mod_revision"]))

    def register_node(self, node: NodeInfo, ttl_ms: int | None = None) -> None:
        """With `ttl_ms`, the key is attached to a lease of this handle's keeper: a node process
        that dies stops the keep-alives and etcd deletes the key when the lease runs out."""
        rec.check_name("node_id", node.node_id)
        check_node_ttl(ttl_ms)
        key, held = self._k("nodes", node.node_id), ("node", node.node_id)
        if ttl_ms is None:
            self._leases.release(held)
            self._txn("register_node", [], [put(key, rec.encode_node(node))], [])
            return
        ttl = math.ceil(ttl_ms / 1000)
        lease = self._leases.grant(ttl)
        try:
            self._txn("register_node", [], [put(key, rec.encode_node(node), lease)], [])
        except BaseException:
            self._leases.revoke(lease)
            raise
        with self._nodes_lock:
            self._registered[node.node_id] = node
        # a later epoch replaces the lease held before (a registration again: the old is revoked)
        self._leases.hold(held, next(self._node_epochs), lease, ttl)

    def _replace_node_lease(self, node_id: str, ttl: int) -> None:
        """The node's lease ran out (this process was frozen, or etcd away past the TTL) and
        etcd deleted its key: register it again, under a new lease."""
        # under the lock: an `unregister_node` meanwhile waits, so it cannot delete the key
        # before this puts it back (which would leave the node registered after it left)
        with self._nodes_lock:
            node = self._registered.get(node_id)
            if node is None:
                self._leases.release(("node", node_id))
                return
            lease = self._leases.grant(ttl)
            key = self._k("nodes", node_id)
            try:
                self._txn("register_node", [], [put(key, rec.encode_node(node), lease)], [])
            except BaseException:
                self._leases.revoke(lease)
                raise
            self._leases.hold(("node", node_id), next(self._node_epochs), lease, ttl)
        log.info("node %s registered again in etcd (its lease had run out)", node_id)

    def unregister_node(self, node_id: str) -> None:
        with self._nodes_lock:
            self._registered.pop(node_id, None)
            self._leases.release(("node", node_id))  # revoked by the keeper: the key goes too
        self._txn("unregister_node", [], [delete(self._k("nodes", node_id))], [])

    def list_nodes(self) -> list[NodeInfo]:
        kvs = self._range("list_nodes", self._k("nodes", ""), prefix=True)
        return sorted((rec.decode_node(unb64(kv["value"])) for kv in kvs), key=lambda n: n.node_id)

    # --- members of a log group -----------------------------------------------------------

    def join_group(self, group: str, member: str, now_ms: int, ttl_ms: int) -> None:
        rec.check_group(group)
        rec.check_name("member", member)
        stale = [
            delete(kv_key)
            for kv_key, expires in self._members(group)
            if expires <= now_ms and not kv_key.endswith("/" + member)
        ]
        key = self._k("groups", group, "members", member)
        self._txn("join_group", [], [*stale, put(key, str(now_ms + ttl_ms))], [])

    def leave_group(self, group: str, member: str) -> None:
        self._txn("leave_group", [], [delete(self._k("groups", group, "members", member))], [])

    def list_group_members(self, group: str, now_ms: int) -> list[str]:
        live = [key for key, expires in self._members(group) if expires > now_ms]
        return sorted(key.rsplit("/", 1)[1] for key in live)

    def _members(self, group: str) -> list[tuple[str, int]]:
        """(key, expiry) of every member record of `group`, live or not."""
        kvs = self._range("group_members", self._k("groups", group, "members", ""), prefix=True)
        return [(unb64(kv["key"]).decode(), int(unb64(kv["value"]))) for kv in kvs]

    # --- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the lease keeper (revoking this store's leases), then close the sessions."""
        self._leases.close()
        self._gw.close()

    def __repr__(self) -> str:
        return f"EtcdMetadataStore({list(self._endpoints)!r}, {self._prefix!r})"


def _segment(kv: KV) -> SegmentMeta:
    return rec.decode_segment(unb64(kv.get("value")), int(kv["mod_revision"]))


def _reopen(
    endpoints: tuple[str, ...],
    prefix: str,
    timeout_ms: int,
    security: EtcdSecurity = NO_SECURITY,
) -> EtcdMetadataStore:
    return EtcdMetadataStore(endpoints, prefix, timeout_ms=timeout_ms, security=security)
