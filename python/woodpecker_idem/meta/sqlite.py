"""SQLite `MetadataStore`: the embedded default, one file shared safely by processes and threads.

Why it is safe across processes: WAL mode (readers never block the writer), a `busy_timeout` so a
writer waits for another instead of failing at once, and every mutation inside `BEGIN IMMEDIATE`,
which takes the write lock up front so a read-then-write (compare-and-swap, epoch check) can never
interleave with another writer. Each thread gets its own connection, and a forked child opens new
ones: SQLite connections must never cross a fork.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import (
    ClientClosedError,
    ConfigError,
    InvalidArgumentError,
    InvalidTypeError,
    LogExistsError,
    LogGroupSizeMismatchError,
    LogNotFoundError,
    MetadataConflictError,
    StorageReadOnlyError,
    StorageUnavailableError,
)
from ..retry import Backoff, retry_call
from ..types import LogMessageId, SegmentState
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

log = logging.getLogger(__name__)

DEFAULT_BUSY_TIMEOUT_MS = 10_000

# 2: the store has an identity (`store_identity`); objects live under it. Tables added since
# (txns, readers, node_leases) are created by any writable open (CREATE IF NOT EXISTS); a
# read-only open of a file without them reads them as empty.
_SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_info (
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS store_identity (
    store_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS store_objects (
    location TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS logs (
    log_id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    created_ms INTEGER NOT NULL,
    writer_epoch INTEGER NOT NULL DEFAULT 0,
    lease_owner TEXT NOT NULL DEFAULT '',
    lease_expires_ms INTEGER NOT NULL DEFAULT 0,
    trunc_segment_id INTEGER,
    trunc_entry_id INTEGER,
    grp TEXT NOT NULL DEFAULT '',
    revision INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS segments (
    log_id INTEGER NOT NULL,
    segment_id INTEGER NOT NULL,
    state TEXT NOT NULL,
    nodes TEXT NOT NULL,
    es INTEGER NOT NULL,
    wq INTEGER NOT NULL,
    aq INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    last_entry_id INTEGER NOT NULL DEFAULT -1,
    completed_ms INTEGER NOT NULL DEFAULT 0,
    size_bytes INTEGER NOT NULL DEFAULT 0,
    revision INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (log_id, segment_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log_groups (
    name TEXT PRIMARY KEY,
    partitions INTEGER NOT NULL,
    created_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS txns (
    log_id INTEGER NOT NULL,
    app_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    start_segment_id INTEGER NOT NULL,
    start_entry_id INTEGER NOT NULL,
    committed INTEGER NOT NULL,
    writer TEXT NOT NULL,
    updated_ms INTEGER NOT NULL,
    revision INTEGER NOT NULL,
    PRIMARY KEY (log_id, app_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS readers (
    log_id INTEGER NOT NULL,
    name TEXT NOT NULL,
    segment_id INTEGER NOT NULL,
    entry_id INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    owner TEXT NOT NULL,
    updated_ms INTEGER NOT NULL,
    revision INTEGER NOT NULL,
    PRIMARY KEY (log_id, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_members (
    group_name TEXT NOT NULL,
    member TEXT NOT NULL,
    expires_ms INTEGER NOT NULL,
    PRIMARY KEY (group_name, member)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    registered_ms INTEGER NOT NULL,
    labels TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS node_leases (
    node_id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    ttl_ms INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL
) WITHOUT ROWID;
"""

_LOG_COLUMNS = (
    "log_id, name, created_ms, writer_epoch, lease_owner, lease_expires_ms, "
    "trunc_segment_id, trunc_entry_id, grp, revision"
)
_SEG_COLUMNS = (
    "log_id, segment_id, state, nodes, es, wq, aq, created_ms, last_entry_id, completed_ms, "
    "size_bytes, revision"
)


_TXN_COLUMNS = (
    "log_id, app_id, version, start_segment_id, start_entry_id, committed, writer, updated_ms, "
    "revision"
)


def _row_to_txn(row: tuple[Any, ...]) -> TxnMeta:
    return TxnMeta(
        log_id=row[0],
        app_id=row[1],
        version=row[2],
        start=LogMessageId(row[3], row[4]),
        committed=bool(row[5]),
        writer=row[6],
        updated_ms=row[7],
        revision=row[8],
    )


_READER_COLUMNS = "log_id, name, segment_id, entry_id, epoch, owner, updated_ms, revision"


def _row_to_reader(row: tuple[Any, ...]) -> ReaderMeta:
    return ReaderMeta(
        log_id=row[0],
        name=row[1],
        position=LogMessageId(row[2], row[3]),
        epoch=row[4],
        owner=row[5],
        updated_ms=row[6],
        revision=row[7],
    )


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _row_to_log(row: tuple[Any, ...]) -> LogMeta:
    trunc = None if row[6] is None else LogMessageId(row[6], row[7])
    return LogMeta(
        log_id=row[0],
        name=row[1],
        created_ms=row[2],
        writer_epoch=row[3],
        lease_owner=row[4],
        lease_expires_ms=row[5],
        truncated_to=trunc,
        group=row[8],
        revision=row[9],
    )


def _segment_fields(seg: SegmentMeta) -> tuple[Any, ...]:
    """The stored columns after (log_id, segment_id), in `_SEG_COLUMNS` order."""
    return (
        rec.state_value(seg.state),
        json.dumps(list(seg.nodes)),
        seg.es,
        seg.wq,
        seg.aq,
        seg.created_ms,
        seg.last_entry_id,
        seg.completed_ms,
        seg.size_bytes,
    )


def _row_to_segment(row: tuple[Any, ...]) -> SegmentMeta:
    return SegmentMeta(
        log_id=row[0],
        segment_id=row[1],
        state=SegmentState(row[2]),
        nodes=tuple(json.loads(row[3])),
        es=row[4],
        wq=row[5],
        aq=row[6],
        created_ms=row[7],
        last_entry_id=row[8],
        completed_ms=row[9],
        size_bytes=row[10],
        revision=row[11],
    )


class SqliteMetadataStore(MetadataStore):
    """`MetadataStore` on one SQLite file; safe to share between threads and processes."""

    _store_id: str  # read (or created) with the schema

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
    ):
        text = os.fspath(path)
        if not text or text == ":memory:" or text.startswith("file:"):
            # Per-thread connections to ":memory:" would each see a different empty database.
            raise InvalidArgumentError(
                f"SqliteMetadataStore path must be a file path, got {text!r}"
            )
        if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int):
            raise InvalidTypeError("busy_timeout_ms must be an int")
        if busy_timeout_ms < 0:
            raise InvalidArgumentError(f"busy_timeout_ms must be >= 0, got {busy_timeout_ms}")
        self._path = Path(text)
        self._busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._lock = threading.Lock()
        # Operations running now: close() waits for them, because closing a connection while
        # another thread runs a statement on it crashes the process (sqlite3 is not guarded).
        self._in_use = 0
        self._idle = threading.Condition(self._lock)
        # (pid, connection) of every connection opened; close() closes this process's own.
        self._conns: list[tuple[int, sqlite3.Connection]] = []
        # Connections inherited across fork: kept referenced so they are never closed (or
        # finalised) in the child, which could disturb the parent's locks and WAL.
        self._inherited: list[sqlite3.Connection] = []
        self._owner_pid = os.getpid()
        self._closed = False
        self._renewals = _Renewals(self._renew_node, busy_timeout_ms / 1000)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        # A directory we cannot write (a read-only mount, a copy of someone else's data): the
        # logs can still be read; every mutation fails with StorageReadOnlyError.
        self._read_only = not os.access(self._path.parent, os.W_OK) or (
            self._path.exists() and not os.access(self._path, os.W_OK)
        )
        if not self._read_only:
            self._init_schema()
        elif not self._path.exists():
            raise StorageReadOnlyError(
                f"SQLite metadata store {self._path} does not exist and its directory is "
                "read-only: there is nothing to read and nothing can be written"
            )
        else:
            self._check_read_only_schema()

    def _check_read_only_schema(self) -> None:
        """Read-only: the file must already hold a schema this version reads (nothing is made)."""
        rows = self._read("schema", "SELECT version FROM schema_info")
        if not rows or rows[0][0] != _SCHEMA_VERSION:
            raise StorageUnavailableError(
                f"SQLite metadata store {self._path} (read-only) has schema version "
                f"{rows[0][0] if rows else None}; this version of woodpecker_idem reads "
                f"version {_SCHEMA_VERSION}"
            )
        # schema 2 always has its identity: it is created in the transaction that writes version 2
        self._store_id = self._read("schema", "SELECT store_id FROM store_identity")[0][0]

    @property
    def read_only(self) -> bool:
        """True when the file or its directory is not writable: reads only."""
        return self._read_only

    def __reduce__(self) -> tuple[object, ...]:
        """Pickles as (path, timeout): the receiving process opens its own connections."""
        return (_reopen, (str(self._path), self._busy_timeout_ms))

    @property
    def path(self) -> Path:
        return self._path

    # --- connections and transactions ---------------------------------------------------------

    def _connect_read_only(self) -> sqlite3.Connection:
        """Read-only: no WAL switch, no schema. SQLite cannot make the WAL index (-shm) in a
        read-only directory; when none is there (the last writer closed cleanly), the file is
        opened immutable, which is right while nothing can write it through this directory."""
        uri = self._path.resolve().as_uri()
        error: sqlite3.OperationalError | None = None
        for query in ("?mode=ro", "?mode=ro&immutable=1"):
            try:
                conn = sqlite3.connect(
                    uri + query,
                    uri=True,
                    timeout=self._busy_timeout_ms / 1000.0,
                    isolation_level=None,
                    check_same_thread=False,
                )
            except sqlite3.OperationalError as exc:
                error = exc
                continue
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
                return conn
            except sqlite3.OperationalError as exc:
                conn.close()
                error = exc
        assert error is not None
        raise self._unavailable("open (read-only)", error)

    def _connect(self) -> sqlite3.Connection:
        if self._read_only:
            return self._connect_read_only()
        # Switching to WAL takes an exclusive lock, and SQLite answers SQLITE_BUSY at once
        # (without its busy handler) when another process is opening or recovering the same
        # file: two processes starting together saw that. Retry the open within busy_timeout.
        try:
            return retry_call(
                self._connect_once,
                lambda exc: isinstance(exc, sqlite3.OperationalError) and _is_busy(exc),
                Backoff(initial_s=0.01, max_s=0.5, budget_s=self._busy_timeout_ms / 1000.0),
            )
        except sqlite3.OperationalError as exc:
            raise self._unavailable("open", exc) from exc

    def _connect_once(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout_ms / 1000.0,
            isolation_level=None,  # autocommit: we issue BEGIN IMMEDIATE ourselves
            check_same_thread=False,  # used by one thread; close() may run on another
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":  # WAL persists in the file: only its creator sets it
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning("SQLite %s: journal_mode is %s, not wal", self._path, mode)
            # Epochs and fencing decisions must survive power loss: fsync every commit.
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
        except BaseException:
            conn.close()
            raise
        return conn

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise self._closed_error()
        pid = os.getpid()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == pid:
            return conn
        with self._lock:
            if pid != self._owner_pid:
                # First use after a fork: every connection we know of belongs to the parent.
                self._inherited.extend(c for _, c in self._conns)
                self._conns = []
                self._owner_pid = pid
                log.debug("SQLite %s: new connections after fork (pid %d)", self._path, pid)
        conn = self._connect()  # outside the lock: opening may wait on busy_timeout
        with self._lock:
            if self._closed:  # close() ran while we were opening
                conn.close()
                raise self._closed_error()
            self._conns.append((pid, conn))
        self._local.conn = conn
        self._local.pid = pid
        return conn

    def _closed_error(self) -> ClientClosedError:
        """Closed is final (its client closed it), not a storage outage to retry."""
        return ClientClosedError(f"client is closed: SQLite metadata store {self._path} is closed")

    def _unavailable(self, op: str, exc: sqlite3.OperationalError) -> StorageUnavailableError:
        if _is_busy(exc):
            return StorageUnavailableError(
                f"SQLite metadata store {self._path} stayed locked for "
                f"{self._busy_timeout_ms} ms during {op}: {exc}"
            )
        return StorageUnavailableError(
            f"SQLite metadata store {self._path} failed during {op}: {exc}"
        )

    @contextmanager
    def _write(self, op: str) -> Iterator[sqlite3.Connection]:
        """One mutation: BEGIN IMMEDIATE takes the write lock first, so reads inside see the latest
        committed state and nothing else can commit between our check and our write."""
        if self._read_only:
            raise StorageReadOnlyError(
                f"SQLite metadata store {self._path} is read-only (its file or directory is not "
                f"writable): {op} cannot write; the logs can only be read"
            )
        with self._session() as conn:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise self._unavailable(op, exc) from exc
            try:
                yield conn
            except BaseException:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:  # pragma: no cover - rollback after a failed statement
                    log.debug("SQLite rollback failed after error in %s", op, exc_info=True)
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise self._unavailable(op, exc) from exc

    def _read(self, op: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._session() as conn:
            try:
                return conn.execute(sql, args).fetchall()
            except sqlite3.OperationalError as exc:
                raise self._unavailable(op, exc) from exc

    @contextmanager
    def _session(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, counted as in use until the operation ends (see close)."""
        with self._lock:
            if self._closed:
                raise self._closed_error()
            self._in_use += 1
        try:
            yield self._conn()
        finally:
            with self._lock:
                self._in_use -= 1
                if not self._in_use:
                    self._idle.notify_all()

    def _init_schema(self) -> None:
        with self._write("schema") as conn:
            try:
                # Statement by statement: executescript() would COMMIT our transaction.
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        conn.execute(stmt)
                row = conn.execute("SELECT version FROM schema_info").fetchone()
                if row is None:
                    conn.execute("INSERT INTO schema_info(version) VALUES (?)", (_SCHEMA_VERSION,))
                elif row[0] == 1 and not conn.execute("SELECT 1 FROM logs LIMIT 1").fetchone():
                    conn.execute("UPDATE schema_info SET version = ?", (_SCHEMA_VERSION,))
                elif row[0] == 1:
                    raise ConfigError(
                        f"SQLite metadata store {self._path} was created by an earlier version "
                        "of woodpecker_idem: its logs' objects use the old key layout (without a "
                        "store identity), which this version does not read. There is no "
                        "migration; start with a new data directory (or meta.path)"
                    )
                elif row[0] != _SCHEMA_VERSION:
                    raise StorageUnavailableError(
                        f"SQLite metadata store {self._path} has schema version {row[0]}; "
                        f"this version of woodpecker_idem reads version {_SCHEMA_VERSION}"
                    )
                ident = conn.execute("SELECT store_id FROM store_identity").fetchone()
                if ident is None:
                    ident = (str(uuid.uuid4()),)
                    conn.execute("INSERT INTO store_identity(store_id) VALUES (?)", ident)
                self._store_id = ident[0]
            except sqlite3.OperationalError as exc:
                raise self._unavailable("schema", exc) from exc

    def store_id(self) -> str:
        """Read once at open (it never changes)."""
        return self._store_id

    def bound_objects(self) -> str | None:
        try:
            rows = self._read("bound_objects", "SELECT location FROM store_objects")
        except StorageUnavailableError:  # read-only, from before locations were recorded
            if not self._read_only:
                raise
            return None
        return str(rows[0][0]) if rows else None

    def bind_objects(self, location: str) -> str:
        with self._write("bind_objects") as conn:
            row = conn.execute("SELECT location FROM store_objects").fetchone()
            if row is None:
                conn.execute("INSERT INTO store_objects(location) VALUES (?)", (location,))
                return location
            return str(row[0])

    @staticmethod
    def _log_row(conn: sqlite3.Connection, log_id: int) -> tuple[Any, ...]:
        row = conn.execute(
            f"SELECT {_LOG_COLUMNS} FROM logs WHERE log_id = ?", (log_id,)
        ).fetchone()
        if row is None:
            raise LogNotFoundError(f"log id {log_id} does not exist")
        return row

    @staticmethod
    def _check_epoch_in(conn: sqlite3.Connection, log_id: int, epoch: int, op: str) -> None:
        row = conn.execute(
            "SELECT name, writer_epoch FROM logs WHERE log_id = ?", (log_id,)
        ).fetchone()
        if row is None:
            raise LogNotFoundError(f"log id {log_id} does not exist")
        name, current = row
        if current != epoch:
            raise rec.fenced(name, log_id, op, epoch, current)

    # --- logs ---------------------------------------------------------------------------------

    def create_log(self, name: str, now_ms: int, group: str = "") -> LogMeta:
        rec.check_name("log name", name)
        rec.check_group(group)
        with self._write("create_log") as conn:
            if conn.execute("SELECT 1 FROM logs WHERE name = ?", (name,)).fetchone():
                raise LogExistsError(f"log {name!r} already exists")
            cur = conn.execute(
                "INSERT INTO logs(name, created_ms, grp) VALUES (?, ?, ?)", (name, now_ms, group)
            )
            row = self._log_row(conn, int(cur.lastrowid or 0))
        meta = _row_to_log(row)
        log.info("created log %r (id %d)", name, meta.log_id)
        return meta

    def get_log(self, name: str) -> LogMeta:
        rows = self._read("get_log", f"SELECT {_LOG_COLUMNS} FROM logs WHERE name = ?", (name,))
        if not rows:
            raise LogNotFoundError(f"log {name!r} does not exist")
        return _row_to_log(rows[0])

    def get_log_by_id(self, log_id: int) -> LogMeta:
        rows = self._read(
            "get_log_by_id", f"SELECT {_LOG_COLUMNS} FROM logs WHERE log_id = ?", (log_id,)
        )
        if not rows:
            raise LogNotFoundError(f"log id {log_id} does not exist")
        return _row_to_log(rows[0])

    def list_logs(self) -> list[LogMeta]:
        rows = self._read("list_logs", f"SELECT {_LOG_COLUMNS} FROM logs ORDER BY log_id")
        return [_row_to_log(r) for r in rows]

    def delete_log(self, name: str) -> LogMeta:
        with self._write("delete_log") as conn:
            row = conn.execute(
                f"SELECT {_LOG_COLUMNS} FROM logs WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                raise LogNotFoundError(f"log {name!r} does not exist")
            conn.execute("DELETE FROM segments WHERE log_id = ?", (row[0],))
            conn.execute("DELETE FROM txns WHERE log_id = ?", (row[0],))
            conn.execute("DELETE FROM readers WHERE log_id = ?", (row[0],))
            conn.execute("DELETE FROM logs WHERE log_id = ?", (row[0],))
        log.info("deleted log %r (id %d)", name, row[0])
        return _row_to_log(row)

    # --- writer epoch and lease ----------------------------------------------------------------

    def take_over(self, log_id: int, owner: str, now_ms: int, lease_ms: int) -> int:
        with self._write("take_over") as conn:
            row = self._log_row(conn, log_id)
            epoch = row[3] + 1
            conn.execute(
                "UPDATE logs SET writer_epoch = ?, lease_owner = ?, lease_expires_ms = ?, "
                "revision = revision + 1 WHERE log_id = ?",
                (epoch, owner, now_ms + lease_ms, log_id),
            )
        log.info("log %r (id %d): writer %r took over at epoch %d", row[1], log_id, owner, epoch)
        return epoch

    def renew_lease(self, log_id: int, epoch: int, owner: str, now_ms: int, lease_ms: int) -> None:
        with self._write("renew_lease") as conn:
            self._check_epoch_in(conn, log_id, epoch, "renew_lease")
            conn.execute(
                "UPDATE logs SET lease_owner = ?, lease_expires_ms = ?, revision = revision + 1 "
                "WHERE log_id = ?",
                (owner, now_ms + lease_ms, log_id),
            )

    def check_epoch(self, log_id: int, epoch: int) -> None:
        rows = self._read(
            "check_epoch", "SELECT name, writer_epoch FROM logs WHERE log_id = ?", (log_id,)
        )
        if not rows:
            raise LogNotFoundError(f"log id {log_id} does not exist")
        name, current = rows[0]
        if current != epoch:
            raise rec.fenced(name, log_id, "check_epoch", epoch, current)

    # --- segments -----------------------------------------------------------------------------

    def create_segment(self, epoch: int, seg: SegmentMeta) -> SegmentMeta:
        with self._write("create_segment") as conn:
            self._check_epoch_in(conn, seg.log_id, epoch, "create_segment")
            exists = conn.execute(
                "SELECT revision FROM segments WHERE log_id = ? AND segment_id = ?",
                (seg.log_id, seg.segment_id),
            ).fetchone()
            if exists is not None:
                raise MetadataConflictError(
                    f"segment {seg.segment_id} of log id {seg.log_id} already exists"
                )
            conn.execute(
                f"INSERT INTO segments({_SEG_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,1)",
                (seg.log_id, seg.segment_id, *_segment_fields(seg)),
            )
            row = self._segment_row(conn, seg.log_id, seg.segment_id)
        return _row_to_segment(row)

    @staticmethod
    def _segment_row(conn: sqlite3.Connection, log_id: int, segment_id: int) -> tuple[Any, ...]:
        return conn.execute(
            f"SELECT {_SEG_COLUMNS} FROM segments WHERE log_id = ? AND segment_id = ?",
            (log_id, segment_id),
        ).fetchone()

    def update_segment(self, epoch: int | None, seg: SegmentMeta) -> SegmentMeta:
        with self._write("update_segment") as conn:
            if epoch is not None:
                self._check_epoch_in(conn, seg.log_id, epoch, "update_segment")
            cur = conn.execute(
                "UPDATE segments SET state = ?, nodes = ?, es = ?, wq = ?, aq = ?, created_ms = ?, "
                "last_entry_id = ?, completed_ms = ?, size_bytes = ?, revision = revision + 1 "
                "WHERE log_id = ? AND segment_id = ? AND revision = ?",
                (*_segment_fields(seg), seg.log_id, seg.segment_id, seg.revision),
            )
            if cur.rowcount != 1:
                found = conn.execute(
                    "SELECT revision FROM segments WHERE log_id = ? AND segment_id = ?",
                    (seg.log_id, seg.segment_id),
                ).fetchone()
                now = "it does not exist" if found is None else f"it is at revision {found[0]}"
                raise MetadataConflictError(
                    f"segment {seg.segment_id} of log id {seg.log_id}: update expected revision "
                    f"{seg.revision} but {now}"
                )
            row = self._segment_row(conn, seg.log_id, seg.segment_id)
        return _row_to_segment(row)

    def get_segment(self, log_id: int, segment_id: int) -> SegmentMeta | None:
        rows = self._read(
            "get_segment",
            f"SELECT {_SEG_COLUMNS} FROM segments WHERE log_id = ? AND segment_id = ?",
            (log_id, segment_id),
        )
        return _row_to_segment(rows[0]) if rows else None

    def list_segments(self, log_id: int) -> list[SegmentMeta]:
        rows = self._read(
            "list_segments",
            f"SELECT {_SEG_COLUMNS} FROM segments WHERE log_id = ? ORDER BY segment_id",
            (log_id,),
        )
        return [_row_to_segment(r) for r in rows]

    def delete_segment(self, log_id: int, segment_id: int) -> None:
        with self._write("delete_segment") as conn:
            conn.execute(
                "DELETE FROM segments WHERE log_id = ? AND segment_id = ?", (log_id, segment_id)
            )

    def set_truncation(self, log_id: int, to: LogMessageId) -> LogMeta:
        to = LogMessageId(*to)
        with self._write("set_truncation") as conn:
            row = self._log_row(conn, log_id)
            current = None if row[6] is None else LogMessageId(row[6], row[7])
            if current is None or to > current:
                conn.execute(
                    "UPDATE logs SET trunc_segment_id = ?, trunc_entry_id = ?, "
                    "revision = revision + 1 WHERE log_id = ?",
                    (to.segment_id, to.entry_id, log_id),
                )
                row = self._log_row(conn, log_id)
            else:
                log.debug(
                    "log id %d: truncation to %s ignored (already at %s)", log_id, to, current
                )
        return _row_to_log(row)

    # --- log groups ---------------------------------------------------------------------------

    def create_log_group(self, name: str, partitions: int, now_ms: int) -> LogGroupMeta:
        rec.check_name("log group name", name)
        rec.check_partitions(partitions)
        with self._write("create_log_group") as conn:
            row = conn.execute(
                "SELECT name, partitions, created_ms FROM log_groups WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO log_groups(name, partitions, created_ms) VALUES (?, ?, ?)",
                    (name, partitions, now_ms),
                )
                row = (name, partitions, now_ms)
        group = LogGroupMeta(name=row[0], partitions=row[1], created_ms=row[2])
        if group.partitions != partitions:
            raise LogGroupSizeMismatchError(
                f"log group {name!r} exists with {group.partitions} partitions, not {partitions}"
            )
        return group

    def get_log_group(self, name: str) -> LogGroupMeta | None:
        rows = self._read(
            "get_log_group",
            "SELECT name, partitions, created_ms FROM log_groups WHERE name = ?",
            (name,),
        )
        return LogGroupMeta(*rows[0]) if rows else None

    def list_log_groups(self) -> list[LogGroupMeta]:
        rows = self._read(
            "list_log_groups", "SELECT name, partitions, created_ms FROM log_groups ORDER BY name"
        )
        return [LogGroupMeta(*row) for row in rows]

    def delete_log_group(self, name: str) -> LogGroupMeta | None:
        with self._write("delete_log_group") as conn:
            row = conn.execute(
                "SELECT name, partitions, created_ms FROM log_groups WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                return None
            conn.execute("DELETE FROM log_groups WHERE name = ?", (name,))
        log.info("deleted log group %r", name)
        return LogGroupMeta(*row)

    # --- batch identities ---------------------------------------------------------------------

    def put_txn(self, epoch: int, txn: TxnMeta) -> TxnMeta:
        rec.check_txn(txn)
        fields = (
            txn.version,
            txn.start.segment_id,
            txn.start.entry_id,
            int(txn.committed),
            txn.writer,
            txn.updated_ms,
        )
        with self._write("put_txn") as conn:
            self._check_epoch_in(conn, txn.log_id, epoch, "put_txn")
            found = conn.execute(
                "SELECT revision FROM txns WHERE log_id = ? AND app_id = ?",
                (txn.log_id, txn.app_id),
            ).fetchone()
            have = 0 if found is None else found[0]
            if have != txn.revision:
                raise rec.txn_conflict(txn, have)
            conn.execute(
                f"INSERT INTO txns({_TXN_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT(log_id, app_id) DO UPDATE SET version = excluded.version, "
                "start_segment_id = excluded.start_segment_id, "
                "start_entry_id = excluded.start_entry_id, committed = excluded.committed, "
                "writer = excluded.writer, updated_ms = excluded.updated_ms, "
                "revision = excluded.revision",
                (txn.log_id, txn.app_id, *fields, have + 1),
            )
        return dataclasses.replace(txn, revision=have + 1)

    def _read_txns(self, op: str, where: str, args: tuple[Any, ...]) -> list[TxnMeta]:
        try:
            rows = self._read(
                op, f"SELECT {_TXN_COLUMNS} FROM txns WHERE {where} ORDER BY app_id", args
            )
        except StorageUnavailableError:
            if self._read_only and not self._read(
                op, "SELECT 1 FROM sqlite_master WHERE name = 'txns'"
            ):
                return []  # a read-only file from before batch identities: none recorded
            raise
        return [_row_to_txn(r) for r in rows]

    def get_txn(self, log_id: int, app_id: str) -> TxnMeta | None:
        found = self._read_txns("get_txn", "log_id = ? AND app_id = ?", (log_id, app_id))
        return found[0] if found else None

    def list_txns(self, log_id: int) -> list[TxnMeta]:
        return self._read_txns("list_txns", "log_id = ?", (log_id,))

    def delete_txn(self, log_id: int, app_id: str) -> None:
        with self._write("delete_txn") as conn:
            conn.execute("DELETE FROM txns WHERE log_id = ? AND app_id = ?", (log_id, app_id))

    # --- named readers -----------------------------------------------------------------------

    @staticmethod
    def _reader_row(conn: sqlite3.Connection, log_id: int, name: str) -> ReaderMeta | None:
        row = conn.execute(
            f"SELECT {_READER_COLUMNS} FROM readers WHERE log_id = ? AND name = ?",
            (log_id, name),
        ).fetchone()
        return None if row is None else _row_to_reader(row)

    def take_reader(
        self, log_id: int, name: str, owner: str, start: LogMessageId, now_ms: int
    ) -> ReaderMeta:
        start = rec.check_reader(name, start)
        with self._write("take_reader") as conn:
            self._log_row(conn, log_id)  # LogNotFoundError
            old = self._reader_row(conn, log_id, name)
            if old is None:
                new = ReaderMeta(log_id, name, start, 1, owner, now_ms, 1)
            else:
                new = dataclasses.replace(
                    old,
                    epoch=old.epoch + 1,
                    owner=owner,
                    updated_ms=now_ms,
                    revision=old.revision + 1,
                )
            conn.execute(
                f"INSERT OR REPLACE INTO readers({_READER_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)",
                (log_id, name, *new.position, new.epoch, owner, now_ms, new.revision),
            )
        log.info("log id %d: reader %r opened at epoch %d by %s", log_id, name, new.epoch, owner)
        return new

    def commit_reader(
        self, log_id: int, name: str, epoch: int, position: LogMessageId, now_ms: int
    ) -> ReaderMeta:
        position = rec.check_reader(name, position)
        with self._write("commit_reader") as conn:
            old = self._reader_row(conn, log_id, name)
            if old is None or old.epoch != epoch:
                raise rec.reader_fenced(log_id, name, "commit", epoch, old)
            new = dataclasses.replace(
                old, position=position, updated_ms=now_ms, revision=old.revision + 1
            )
            conn.execute(
                "UPDATE readers SET segment_id = ?, entry_id = ?, updated_ms = ?, revision = ? "
                "WHERE log_id = ? AND name = ?",
                (*position, now_ms, new.revision, log_id, name),
            )
        return new

    def _read_readers(self, op: str, where: str, args: tuple[Any, ...]) -> list[ReaderMeta]:
        try:
            rows = self._read(
                op, f"SELECT {_READER_COLUMNS} FROM readers WHERE {where} ORDER BY name", args
            )
        except StorageUnavailableError:
            if self._read_only and not self._read(
                op, "SELECT 1 FROM sqlite_master WHERE name = 'readers'"
            ):
                return []  # a read-only file from before named readers: none recorded
            raise
        return [_row_to_reader(r) for r in rows]

    def get_reader(self, log_id: int, name: str) -> ReaderMeta | None:
        found = self._read_readers("get_reader", "log_id = ? AND name = ?", (log_id, name))
        return found[0] if found else None

    def list_readers(self, log_id: int) -> list[ReaderMeta]:
        return self._read_readers("list_readers", "log_id = ?", (log_id,))

    def delete_reader(self, log_id: int, name: str) -> ReaderMeta | None:
        with self._write("delete_reader") as conn:
            old = self._reader_row(conn, log_id, name)
            if old is not None:
                conn.execute("DELETE FROM readers WHERE log_id = ? AND name = ?", (log_id, name))
        return old

    # --- node registry ------------------------------------------------------------------------
    #
    # A registration with a TTL has a row in `node_leases` too: its expiry (wall-clock ms: every
    # process on this host reads the same clock), moved forward by this handle's renewal thread
    # every third of the TTL. A lapsed row is not deleted, only skipped by `list_nodes`, so the
    # renewal of a process that was merely frozen brings its node back.

    def register_node(self, node: NodeInfo, ttl_ms: int | None = None) -> None:
        rec.check_name("node_id", node.node_id)
        check_node_ttl(ttl_ms)
        labels = json.dumps(dict(node.labels), sort_keys=True)
        row = (node.node_id, node.address, node.registered_ms, labels)
        registered = "SELECT node_id, address, registered_ms, labels FROM nodes"
        if ttl_ms is None and self._read_only and row in self._read("register_node", registered):
            return  # registered already: nothing to write (a client on a read-only directory)
        with self._write("register_node") as conn:
            conn.execute(
                "INSERT INTO nodes(node_id, address, registered_ms, labels) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(node_id) DO UPDATE SET address = excluded.address, "
                "registered_ms = excluded.registered_ms, labels = excluded.labels",
                row,
            )
            if ttl_ms is None:
                conn.execute("DELETE FROM node_leases WHERE node_id = ?", (node.node_id,))
            else:
                conn.execute(
                    "INSERT OR REPLACE INTO node_leases(node_id, address, ttl_ms, expires_ms) "
                    "VALUES (?, ?, ?, ?)",
                    (node.node_id, node.address, ttl_ms, _wall_ms() + ttl_ms),
                )
        if ttl_ms is None:
            self._renewals.drop(node.node_id)
        else:
            self._renewals.keep(node.node_id, node.address, ttl_ms)

    def _renew_node(self, node_id: str, address: str, ttl_ms: int) -> None:
        """One renewal (on the renewal thread): only a registration still at our address (a node
        registered again elsewhere under the same id is not ours to keep)."""
        with self._write("renew node registration") as conn:
            conn.execute(
                "UPDATE node_leases SET expires_ms = ? WHERE node_id = ? AND address = ?",
                (_wall_ms() + ttl_ms, node_id, address),
            )

    def unregister_node(self, node_id: str) -> None:
        self._renewals.drop(node_id)
        with self._write("unregister_node") as conn:
            conn.execute("DELETE FROM nodes WHERE node_id = ?", (node_id,))
            conn.execute("DELETE FROM node_leases WHERE node_id = ?", (node_id,))

    def list_nodes(self) -> list[NodeInfo]:
        sql = (
            "SELECT n.node_id, n.address, n.registered_ms, n.labels FROM nodes n "
            "LEFT JOIN node_leases l ON l.node_id = n.node_id "
            "WHERE l.expires_ms IS NULL OR l.expires_ms > ? ORDER BY n.node_id"
        )
        try:
            rows = self._read("list_nodes", sql, (_wall_ms(),))
        except StorageUnavailableError:
            if self._read_only and not self._read(
                "list_nodes", "SELECT 1 FROM sqlite_master WHERE name = 'node_leases'"
            ):  # a read-only file from before registrations had a TTL: none has one
                rows = self._read(
                    "list_nodes",
                    "SELECT node_id, address, registered_ms, labels FROM nodes ORDER BY node_id",
                )
            else:
                raise
        return [NodeInfo(r[0], r[1], r[2], json.loads(r[3])) for r in rows]

    # --- members of a log group -----------------------------------------------------------

    def join_group(self, group: str, member: str, now_ms: int, ttl_ms: int) -> None:
        rec.check_group(group)
        rec.check_name("member", member)
        with self._write("join_group") as conn:
            conn.execute(
                "DELETE FROM group_members WHERE group_name = ? AND expires_ms <= ?",
                (group, now_ms),
            )
            conn.execute(
                "INSERT INTO group_members(group_name, member, expires_ms) VALUES (?, ?, ?) "
                "ON CONFLICT(group_name, member) DO UPDATE SET expires_ms = excluded.expires_ms",
                (group, member, now_ms + ttl_ms),
            )

    def leave_group(self, group: str, member: str) -> None:
        with self._write("leave_group") as conn:
            conn.execute(
                "DELETE FROM group_members WHERE group_name = ? AND member = ?", (group, member)
            )

    def list_group_members(self, group: str, now_ms: int) -> list[str]:
        rows = self._read(
            "list_group_members",
            "SELECT member FROM group_members WHERE group_name = ? AND expires_ms > ? "
            "ORDER BY member",
            (group, now_ms),
        )
        return [r[0] for r in rows]

    # --- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close this process's connections (all threads); inherited ones are left alone.

        Operations already running are let finish first (up to the busy timeout); if one is
        still running then, the connections are left to the garbage collector, not closed
        under it. Node registrations this handle renewed are no longer renewed: they lapse
        within their TTL unless unregistered first."""
        self._renewals.close()
        with self._lock:
            self._closed = True
            deadline = time.monotonic() + self._busy_timeout_ms / 1000 + 1.0
            while self._in_use and (left := deadline - time.monotonic()) > 0:
                self._idle.wait(left)
            if self._in_use:
                log.warning(
                    "SQLite %s: closing with %d operation(s) still running; their connections "
                    "are left open",
                    self._path,
                    self._in_use,
                )
                return
            pid = os.getpid()
            mine = [c for p, c in self._conns if p == pid]
            self._conns = []
        for conn in mine:
            try:
                conn.close()
            except sqlite3.Error:  # pragma: no cover
                log.debug("closing SQLite connection failed", exc_info=True)

    def __repr__(self) -> str:
        return f"SqliteMetadataStore({str(self._path)!r})"


def _reopen(path: str, busy_timeout_ms: int) -> SqliteMetadataStore:
    return SqliteMetadataStore(path, busy_timeout_ms=busy_timeout_ms)


def _wall_ms() -> int:
    return int(time.time() * 1000)


class _Renewals:
    """The renewal thread of one store handle: moves the expiry of the node registrations it
    made forward every third of their TTL, until they are dropped or the handle closes. Errors
    (the file locked for longer than busy_timeout) are logged and the next round tries again:
    a registration that lapses meanwhile comes back with the next renewal that lands."""

    def __init__(self, renew: Callable[[str, str, int], None], join_s: float):
        self._renew = renew  # (node id, address, ttl ms): one renewal
        self._join_s = join_s
        self._held: dict[str, tuple[str, int]] = {}  # node id -> (address, ttl ms)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def keep(self, node_id: str, address: str, ttl_ms: int) -> None:
        with self._lock:
            self._held[node_id] = (address, ttl_ms)
            alive = self._thread is not None and self._thread.is_alive()
            if not alive or self._pid != os.getpid():  # a forked child has no thread of ours
                self._pid = os.getpid()
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, name="sqlite-node-renewal", daemon=True
                )
                self._thread.start()
        self._wake.set()  # a shorter TTL than before: the next round comes sooner

    def drop(self, node_id: str) -> None:
        with self._lock:
            self._held.pop(node_id, None)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                held = dict(self._held)
            for node_id, (address, ttl_ms) in held.items():
                try:
                    self._renew(node_id, address, ttl_ms)
                except ClientClosedError:
                    return
                except Exception as exc:  # noqa: BLE001 - the thread must outlive any error
                    log.warning("node %s: registration not renewed: %s", node_id, exc)
            ttl_ms = min((t for _, t in held.values()), default=3_000)
            self._wake.wait(max(0.1, ttl_ms / 3000))
            self._wake.clear()

    def close(self) -> None:
        with self._lock:
            self._held.clear()
            thread = self._thread if self._pid == os.getpid() else None
        self._stop.set()
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._join_s + 1)
