"""WoodpeckerClient: owns one set of stores and the ensemble layer, and hands out LogHandles.

Built by the composition root (`woodpecker_idem.connect`); this package does not import it."""

from __future__ import annotations

import os
import socket
import threading
import weakref
from pathlib import Path
from typing import TypeVar

from .. import registry
from ..args import bool_arg, timeout_arg
from ..clock import Clock
from ..config import Config, check_value
from ..ensemble import Ensemble, LogContext
from ..errors import (
    ClientClosedError,
    InvalidArgumentError,
    InvalidTypeError,
    LogExistsError,
    LogNotFoundError,
    MetadataLostError,
)
from ..logstore.transport import LogStoreTransport
from ..meta import MetadataStore
from ..objectstore import ObjectStore
from ..retention import RetentionPolicy, RetentionRunner
from ..types import LogMessageId
from .group import GroupReader, GroupWriter
from .log import ClosableWriter, LogHandle, WriterFactory

W = TypeVar("W", bound=ClosableWriter)

MAX_GROUP_PARTITIONS = 4096  # as a Spark sink's
DELETE_LEASE_MS = 2_000  # the lease the delete takes with the log's last epoch (gone with it)
DELETE_OWNER_PREFIX = "delete_log:"  # that lease's owner: `verify` tells a delete under way by it


class WoodpeckerClient:
    """Owns the stores and the ensemble layer (the nodes, their senders, the background work of
    every writer); hands out LogHandles."""

    def __init__(
        self,
        config: Config,
        data_dir: Path,
        clock: Clock,
        meta: MetadataStore,
        objects: ObjectStore,
        ensemble: Ensemble,
        writers: WriterFactory,
    ):
        self.config = config
        self.data_dir = data_dir
        self.clock = clock
        self.meta = meta
        self.objects = objects
        self.ensemble = ensemble
        # LogHandle.open_writer builds its writer with this (given by the composition root: the
        # client does not import the writer pipeline above it)
        self.writers = writers
        self._writers: weakref.WeakSet[ClosableWriter] = weakref.WeakSet()
        self._writers_lock = threading.Lock()
        self._handles: weakref.WeakKeyDictionary[ClosableWriter, LogHandle] = (
            weakref.WeakKeyDictionary()
        )
        self._retention: RetentionRunner | None = None
        self._retention_of: dict[str, RetentionPolicy] = {}  # set_retention, by log name
        self._closed = False
        if ensemble.uploads is not None:  # staged storage: its conflicts are a metric
            registry.add_uploads(ensemble.uploads)

    @property
    def transport(self) -> LogStoreTransport:
        """How the client reaches its nodes, below the ensemble layer's senders and deadlines
        (node calls that need a deadline go through `ensemble.calls`)."""
        return self.ensemble.transport

    @transport.setter
    def transport(self, transport: LogStoreTransport) -> None:
        """Reach the nodes through `transport` from now on (tests wrap the transport in a fault
        injector before they open a writer; `connect(transport=...)` is the public way)."""
        self.ensemble.transport = transport

    @property
    def closed(self) -> bool:
        """True once `close()` has begun: every later call through the client fails."""
        return self._closed

    def check_open(self) -> None:
        """`ClientClosedError` (not retriable) once the client is closed: a call must not reach
        a closed store and come back as a retriable storage error."""
        if self._closed:
            raise ClientClosedError(f"client is closed (data_dir {str(self.data_dir)!r})")

    def track(self, writer: W, handle: LogHandle | None = None) -> W:
        """`writer` (opened through a LogHandle of this client) is closed when the client is;
        with its `handle`, the metrics see it and retention applies to its log."""
        with self._writers_lock:
            self._writers.add(writer)
            if handle is not None:
                self._handles[writer] = handle
                registry.add(writer, handle)
                self._start_retention_locked()
        return writer

    def _start_retention_locked(self) -> None:
        """The first writer starts the retention runner, if the config or a log sets a bound."""
        if self._retention is not None or self._closed or not self._handles:
            return
        policy = RetentionPolicy.from_config(self.config)
        if policy.enabled or any(p.enabled for p in self._retention_of.values()):
            self._retention = RetentionRunner(
                policy,
                self.config.retention.check_interval_s,
                self.writing_logs,
                lambda handle: self._retention_of.get(handle.name, policy),
                self._window_ms,
            )
            registry.add_runner(self._retention)

    def set_retention(
        self,
        name: str,
        *,
        max_age_s: float | None = None,
        max_bytes: int | str | None = None,
    ) -> RetentionPolicy:
        """Retention bounds of one log, over `retention.max_age_s` / `retention.max_bytes` of the
        config: None keeps the config's bound, 0 means no bound. Applied in the background while
        this client writes the log (checked like the config keys); returns the log's policy."""
        self.check_open()
        _check_name(name)
        age = None if max_age_s is None else check_value("retention.max_age_s", max_age_s)
        size = None if max_bytes is None else check_value("retention.max_bytes", max_bytes)
        policy = RetentionPolicy.from_config(self.config).override(age, size)
        with self._writers_lock:
            self._retention_of[name] = policy
            self._start_retention_locked()
        return policy

    def _window_ms(self, handle: LogHandle) -> int:
        """The longest dedup window over the log: the config's, or a live writer's own if it
        was opened with a longer one (`open_writer(window_duration_s=...)`)."""
        longest = int(self.config.idempotency.window_duration_s * 1000)
        with self._writers_lock:
            pairs = list(self._handles.items())
        for writer, h in pairs:
            window = getattr(writer, "window", None) if h.log_id == handle.log_id else None
            if window is not None and registry.is_live(writer):
                longest = max(longest, int(window.window_ms))
        return longest

    def writing_logs(self) -> list[LogHandle]:
        """The logs this client has a live writer on (open and not fenced), one handle each."""
        with self._writers_lock:
            pairs = list(self._handles.items())
        live = {h.log_id: h for w, h in pairs if registry.is_live(w)}
        return list(live.values())

    @property
    def retention(self) -> RetentionRunner | None:
        """The background retention runner (None until a writer opens with a bound set)."""
        return self._retention

    def context(self, log_id: int, name: str) -> LogContext:
        """What a writer or reader of the log is given (not the client)."""
        transport = self.ensemble.transport
        return LogContext(
            log_id=log_id,
            name=name,
            config=self.config,
            clock=self.clock,
            meta=self.meta,
            objects=self.objects,
            ensemble=self.ensemble,
            transport=transport,
            calls=self.ensemble.calls_through(transport),
            client_closed=lambda: self._closed,
        )

    def threads(self) -> list[threading.Thread]:
        """The client's own background threads (its ensemble layer's: node senders, the
        scheduler), however many writers it has open."""
        return self.ensemble.threads()

    def store_id(self) -> str:
        """The metadata store's identity (a UUID made when the store was created); object keys
        live under it: `{objectstore.root}/{store_id}/...`."""
        self.check_open()
        return self.meta.store_id()

    def open_group_writer(
        self, group: str, partitions: int, *, idempotent: bool = True
    ) -> GroupWriter:
        """Join `group` (P = `partitions` logs `{group}-{route}`, created if missing; an existing
        group keeps its P) as one of its producers: the writer owns a share of its routes and
        writes the keys of those (`client/group.py`, docs/semantics.md). Closed with the client."""
        self.check_open()
        _check_name(group)
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise InvalidTypeError(f"partitions must be an int, not {type(partitions).__name__}")
        if not 1 <= partitions <= MAX_GROUP_PARTITIONS:
            raise InvalidArgumentError(
                f"partitions must be 1..{MAX_GROUP_PARTITIONS}, not {partitions}"
            )
        bool_arg(idempotent, "idempotent")
        return self.track(GroupWriter(self, group, partitions, idempotent=idempotent))

    def open_group_reader(
        self,
        group: str,
        start: str | LogMessageId = "earliest",
        *,
        name: str | None = None,
        start_time_ms: int | None = None,
    ) -> GroupReader:
        """Read every log of `group` (a Spark sink's or group writers'): one reader per route,
        taken in turns; `start`, `name` and `start_time_ms` as `LogHandle.open_reader`'s, for
        each route (`client/group.py`)."""
        self.check_open()
        _check_name(group)
        return GroupReader(self, group, start, name=name, start_time_ms=start_time_ms)

    def create_log(self, name: str) -> LogHandle:
        self.check_open()
        _check_name(name)
        meta = self.meta.create_log(name, self.clock.now_ms())
        found = self._objects_of(meta.log_id)
        if found:
            # Log ids are never reused, so objects under a new id were written by a log this
            # metadata store no longer knows: a writer of the new log would adopt that log's
            # snapshot and sealed segments as its own. Undo the record; write nothing there.
            self.meta.delete_log(name)
            raise MetadataLostError(
                f"log {name!r}: its new id {meta.log_id} already has objects ({found[0]!r} in "
                f"{self.objects!r}): the metadata store ({self.meta!r}) has lost the records of "
                "an earlier log with that id (restored from an older copy, or its data lost). "
                "The log was not created; restore the metadata store, or start a new "
                "deployment (another objectstore.root and metadata store)"
            )
        return LogHandle(self, meta.log_id, meta.name)

    def _objects_of(self, log_id: int) -> list[str]:
        """Objects below the log's prefixes: its segments (on each in-process node), snapshots
        and kept keys. Empty for a log the store has just created."""
        prefixes = [f"{log_id}/", f"dedup_snapshot/{log_id}/"]
        prefixes += [f"nodes/{node}/{log_id}/" for node in self.transport.node_ids]
        for prefix in prefixes:
            found = self.objects.list(prefix)
            if found:
                return found
        return []

    def open_log(self, name: str, create: bool = False) -> LogHandle:
        self.check_open()
        _check_name(name)
        bool_arg(create, "create")
        try:
            meta = self.meta.get_log(name)
        except LogNotFoundError:
            if not create:
                raise
            try:
                return self.create_log(name)
            except LogExistsError:  # another client created it meanwhile: open that one
                meta = self.meta.get_log(name)
        return LogHandle(self, meta.log_id, meta.name)

    def list_logs(self) -> list[str]:
        self.check_open()
        return [m.name for m in self.meta.list_logs()]

    def delete_log(self, name: str) -> None:
        """Remove the log's entries, snapshots and metadata. A writer still writing it, in this
        process or another, is fenced first: nothing is acknowledged once the delete is
        committed, and its next write fails with `WriterFencedError`. (A segment such a writer
        still had open stays on its nodes, fenced, so that its adds keep meeting the fence.)"""
        self.check_open()
        _check_name(name)
        meta = self.meta.get_log(name)
        # A new epoch refuses the live writer's metadata writes (a roll, a repair's seal); then
        # each unfinished segment is fenced on its nodes, which refuses its adds. Its acks end
        # here, before the records go (the last step commits the delete).
        owner = f"{DELETE_OWNER_PREFIX}{socket.gethostname()}:{os.getpid()}"
        self.meta.take_over(meta.log_id, owner, self.clock.now_ms(), DELETE_LEASE_MS)
        segments = self.meta.list_segments(meta.log_id)
        self.ensemble.fence_segments(segments)
        self.ensemble.delete_log(meta.log_id, segments)
        self.objects.delete_prefix(f"dedup_snapshot/{meta.log_id}/")
        self.meta.delete_log(name)

    def close(self, timeout: float | None = 30.0) -> None:
        """Close every writer opened through this client (each flushes for up to `timeout`
        first, like `LogWriter.close`), then the stores: no writer thread outlives them.
        Idempotent; every later call through the client raises `ClientClosedError`."""
        timeout = timeout_arg(timeout)
        with self._writers_lock:
            if self._closed:
                return
            self._closed = True
            writers = list(self._writers)
            retention, self._retention = self._retention, None
        if retention is not None:
            retention.stop()
        for writer in writers:
            writer.close(timeout)
        self.ensemble.close()  # its tasks cancelled and joined before the stores close
        self.meta.close()
        self.objects.close()

    def __enter__(self) -> WoodpeckerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_name(name: object) -> None:
    if not isinstance(name, str):
        raise InvalidTypeError(f"log name must be a str, not {type(name).__name__}")
    if not name or len(name) > 255 or "/" in name or name != name.strip():
        raise InvalidArgumentError(
            f"log name {name!r} must be 1-255 characters, without '/' or surrounding spaces"
        )
