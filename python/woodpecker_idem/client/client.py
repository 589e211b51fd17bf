"""connect(): the entry point. Embedded by default: in-process LogStore, local directory, SQLite."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..clock import SYSTEM_CLOCK, Clock
from ..config import Config, load_config, parse_fsync
from ..errors import ConfigError, InvalidTypeError, LogNotFoundError
from ..logstore.engine import LogStoreEngine
from ..logstore.transport import InProcessTransport, LogStoreTransport
from ..meta import MetadataStore, NodeInfo, open_metadata_store
from ..objectstore import ObjectStore, open_object_store
from ..objectstore.owner import claim_root
from .log import LogHandle

if TYPE_CHECKING:
    from .writer import LogWriter

log = logging.getLogger(__name__)

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
    ):
        self.config = config
        self.data_dir = data_dir
        self.clock = clock
        self.meta = meta
        self.objects = objects
        self.transport = transport
        self._writers: weakref.WeakSet[LogWriter] = weakref.WeakSet()
        self._writers_lock = threading.Lock()

    def _track(self, writer: LogWriter) -> LogWriter:
        with self._writers_lock:
            self._writers.add(writer)
        return writer

    def create_log(self, name: str) -> LogHandle:
        _check_name(name)
        meta = self.meta.create_log(name, self.clock.now_ms())
        return LogHandle(self, meta.log_id, meta.name)

    def open_log(self, name: str, create: bool = False) -> LogHandle:
        _check_name(name)
        try:
            meta = self.meta.get_log(name)
        except LogNotFoundError:
            if not create:
                raise
            return self.create_log(name)
        return LogHandle(self, meta.log_id, meta.name)

    def list_logs(self) -> list[str]:
        return [m.name for m in self.meta.list_logs()]

    def delete_log(self, name: str) -> None:
        """Remove the log's entries, snapshots and metadata."""
        meta = self.meta.get_log(name)
        for node in self.transport.node_ids:
            self.transport.delete_log(node, meta.log_id)
        self.objects.delete_prefix(f"dedup_snapshot/{meta.log_id}/")
        self.meta.delete_log(name)

    def close(self, timeout: float | None = 30.0) -> None:
        """Close every writer opened through this client (each flushes for up to `timeout`
        first, like `LogWriter.close`), then the stores: no writer thread outlives them."""
        with self._writers_lock:
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
        from ..errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"log name {name!r} must be 1-255 characters, without '/' or surrounding spaces"
        )


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
    root = Path(data_dir if data_dir is not None else DEFAULT_DATA_DIR)
    root.mkdir(parents=True, exist_ok=True)
    meta, objects = _open_stores(cfg, root)
    if transport is None:
        es = cfg.quorum.es
        if es == 1:
            engines = {"node-0": LogStoreEngine(objects, "node-0")}
        else:
            engines = {
                f"node-{i}": LogStoreEngine(objects.child(f"nodes/node-{i}"), f"node-{i}")
                for i in range(es)
            }
        transport = InProcessTransport(engines)
        for node_id in engines:
            meta.register_node(NodeInfo(node_id, f"inproc://{node_id}"))
    return WoodpeckerClient(cfg, root, clock or SYSTEM_CLOCK, meta, objects, transport)
