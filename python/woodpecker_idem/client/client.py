"""connect(): the entry point. Embedded by default: in-process LogStore, local directory, SQLite."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..args import bool_arg, timeout_arg
from ..clock import SYSTEM_CLOCK, Clock
from ..config import Config, load_config, parse_fsync
from ..errors import (
    ClientClosedError,
    ConfigError,
    InvalidArgumentError,
    InvalidTypeError,
    LogExistsError,
    LogNotFoundError,
)
from ..logstore.engine import LogStoreEngine
from ..logstore.segment_files import segment_storage
from ..logstore.transport import InProcessTransport, LogStoreTransport
from ..meta import MetadataStore, NodeInfo, open_metadata_store
from ..objectstore import ObjectStore, open_object_store
from ..objectstore.owner import claim_root
from .log import ClosableWriter, IdempotentWriterFactory, LogHandle

log = logging.getLogger(__name__)

W = TypeVar("W", bound=ClosableWriter)

DEFAULT_DATA_DIR = "./woodpecker-data"


def _config(config: Config | Mapping[str, Any] | str | os.PathLike | None) -> Config:
    if config is None:
        return load_config()
    if isinstance(config, Config):
        return config
    if isinstance(config, Mapping):
        return load_config(overrides=config)
    if isinstance(config, (str, os.PathLike)):
        return load_config(config)
    raise InvalidTypeError(f"config must be a Config, a mapping or a YAML path, not {config!r}")


class WoodpeckerClient:
    """Owns the stores and the transport; hands out LogHandles."""

    def __init__(
        self,
        config: Config,
        data_dir: Path,
        clock: Clock,
        meta: MetadataStore,
        objects: ObjectStore,
        transport: LogStoreTransport,
        idempotent_writer: IdempotentWriterFactory | None = None,
    ):
        self.config = config
        self.data_dir = data_dir
        self.clock = clock
        self.meta = meta
        self.objects = objects
        self.transport = transport
        # open_writer(idempotent=True) builds its writer with this (given by the composition
        # root: client/ does not import the layer above it)
        self.idempotent_writer = idempotent_writer
        self._writers: weakref.WeakSet[ClosableWriter] = weakref.WeakSet()
        self._writers_lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once `close()` has begun: every later call through the client fails."""
        return self._closed

    def check_open(self) -> None:
        """`ClientClosedError` (not retriable) once the client is closed: a call must not reach
        a closed store and come back as a retriable storage error."""
        if self._closed:
            raise ClientClosedError(f"client is closed (data_dir {str(self.data_dir)!r})")

    def _track(self, writer: W) -> W:
        with self._writers_lock:
            self._writers.add(writer)
        return writer

    def create_log(self, name: str) -> LogHandle:
        self.check_open()
        _check_name(name)
        meta = self.meta.create_log(name, self.clock.now_ms())
        return LogHandle(self, meta.log_id, meta.name)

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
        """Remove the log's entries, snapshots and metadata."""
        self.check_open()
        _check_name(name)
        meta = self.meta.get_log(name)
        for node in self.transport.node_ids:
            self.transport.delete_log(node, meta.log_id)
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
        for writer in writers:
            writer.close(timeout)
        self.transport.close()
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


def _data_dir(data_dir: object) -> Path:
    """The data directory, created if missing; a path that cannot be one fails here, named.

    An existing directory this process cannot write is fine: its logs can still be read (the
    metadata store opens read-only, and writers fail with `StorageReadOnlyError`)."""
    if not isinstance(data_dir, (str, os.PathLike)):
        raise InvalidTypeError(f"data_dir must be a str or a path, not {type(data_dir).__name__}")
    text = os.fspath(data_dir)
    if not isinstance(text, str) or not text:
        raise InvalidArgumentError(f"data_dir must be a non-empty str path, not {data_dir!r}")
    root = Path(text)
    if root.exists() and not root.is_dir():
        raise InvalidArgumentError(f"data_dir {text!r} is not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a parent is a file, no permission, a read-only file system, ...
        raise InvalidArgumentError(
            f"data_dir {text!r} cannot be created: {exc.strerror or exc}"
        ) from exc
    return root


def _object_store(cfg: Config, data_dir: Path) -> ObjectStore:
    """The store at `objectstore.root`, probed: unreachable storage, bad credentials or a missing
    bucket fail here, within `objectstore.probe_timeout_s`, before any metadata is written."""
    oc = cfg.objectstore
    if oc.type == "local":
        path = Path(oc.path) if oc.path else data_dir / "objects"
        store = open_object_store(
            "local",
            path=str(path),
            root=oc.root,
            fsync=parse_fsync(cfg.storage.fsync).mode != "never",
        )
    else:
        store = open_object_store(
            "s3",
            endpoint_url=oc.endpoint_url,
            bucket=oc.bucket,
            root=oc.root,
            region=oc.region,
            access_key=oc.access_key_id,
            secret_key=oc.secret_access_key,
            profile=oc.profile,
            create_bucket=oc.create_bucket,
            probe_timeout_s=oc.probe_timeout_s,
            connect_timeout_s=oc.connect_timeout_s,
            read_timeout_s=oc.read_timeout_s,
            retry_budget_s=oc.retry_budget_s,
        )
    try:
        store.probe()
    except BaseException:
        store.close()
        raise
    return store


def _open_stores(cfg: Config, data_dir: Path) -> tuple[MetadataStore, ObjectStore]:
    """Object storage first (probed before any metadata is written), then the metadata store, then
    the owner marker: the objects returned live under the metadata store's identity, because its
    log ids mean nothing to another store (`ObjectStoreOwnedError` if another owns the root)."""
    base = _object_store(cfg, data_dir)
    meta: MetadataStore | None = None
    try:
        meta = open_metadata_store(
            cfg.meta.type,
            path=cfg.meta.path or str(data_dir / "meta.sqlite"),
            endpoints=cfg.meta.endpoints,
            prefix=cfg.meta.prefix,
            timeout_ms=cfg.meta.timeout_ms,
        )
        return meta, claim_root(base, meta.store_id(), repr(base), repr(meta))
    except BaseException:
        if meta is not None:
            meta.close()
        base.close()
        raise


def connect(
    data_dir: str | os.PathLike | None = None,
    config: Config | Mapping[str, Any] | str | os.PathLike | None = None,
    *,
    clock: Clock | None = None,
    transport: LogStoreTransport | None = None,
) -> WoodpeckerClient:
    """Open a client. Without arguments: embedded mode under ./woodpecker-data.

    `transport` replaces the in-process LogStore nodes (tests inject faults this way).
    """
    cfg = _config(config)
    if cfg.storage.type != "object":
        raise ConfigError(
            f"storage.type={cfg.storage.type!r} is not available yet; use 'object' "
            "(staged LogStore nodes come with service mode)"
        )
    root = _data_dir(DEFAULT_DATA_DIR if data_dir is None else data_dir)
    try:
        meta, objects = _open_stores(cfg, root)
    except OSError as exc:  # objectstore.path or meta.path unusable (a file, no permission)
        raise InvalidArgumentError(
            f"cannot open the stores of data_dir {str(root)!r}: {exc.strerror or exc} "
            f"({exc.filename!r})"
        ) from exc
    if transport is None:
        es = cfg.quorum.es
        fsync = parse_fsync(cfg.storage.fsync).mode != "never"
        if es == 1:
            engines = {"node-0": LogStoreEngine(segment_storage(objects, fsync=fsync), "node-0")}
        else:
            engines = {
                f"node-{i}": LogStoreEngine(
                    segment_storage(objects.child(f"nodes/node-{i}"), fsync=fsync), f"node-{i}"
                )
                for i in range(es)
            }
        transport = InProcessTransport(engines)
        for node_id in engines:
            meta.register_node(NodeInfo(node_id, f"inproc://{node_id}"))
    # The composition root: the idempotent layer is wired in here (the client's package does
    # not import it)
    from ..idempotency.writer import IdempotentLogWriter

    return WoodpeckerClient(
        cfg, root, clock or SYSTEM_CLOCK, meta, objects, transport, IdempotentLogWriter
    )
