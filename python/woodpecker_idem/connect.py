"""The composition root: config -> stores -> transport -> client, and which dedup stage a writer
gets (the window for idempotent writers, none for plain ones).
`connect()` is the entry point; embedded by default (in-process LogStore, local directory,
SQLite). Only this module knows every layer: the packages below it do not import it."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .client.client import WoodpeckerClient
from .client.log import LogHandle
from .clock import SYSTEM_CLOCK, Clock
from .config import Config, load_config, parse_fsync
from .ensemble import Ensemble
from .errors import ConfigError, InvalidArgumentError, InvalidTypeError, StorageReadOnlyError
from .idempotency.stage import WindowStage
from .logstore.engine import LogStoreEngine
from .logstore.segment_files import FileSegmentStorage, segment_storage
from .logstore.staged import SEALED_PREFIX, StagedSegmentStorage
from .logstore.transport import InProcessTransport, LogStoreTransport
from .meta import MetadataStore, NodeInfo, open_metadata_store
from .objectstore import ObjectStore, open_object_store
from .objectstore.owner import check_binding, claim_root, objects_location
from .types import SegmentState
from .writer.api import IdempotentLogWriter, LogWriter

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
            sse=oc.sse,
            sse_kms_key_id=oc.sse_kms_key_id,
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


def open_object_root(cfg: Config, data_dir: Path) -> ObjectStore:
    """The object store at `objectstore.root` itself (above the store ids), probed: where the
    owner marker lives (`woodpecker-idem verify` reads it)."""
    return _object_store(cfg, data_dir)


def _open_stores(cfg: Config, data_dir: Path) -> tuple[MetadataStore, ObjectStore]:
    """Object storage first (probed before any metadata is written), then the metadata store, then
    the identity of both, each way: the objects returned live under the metadata store's identity,
    because its log ids mean nothing to another store (`ObjectStoreOwnedError` if another owns the
    root), and the metadata store's objects live at one bucket and root only (the same error if
    this client names another: it would complete the log's segments there as empty)."""
    base = _object_store(cfg, data_dir)
    meta: MetadataStore | None = None
    try:
        meta = open_metadata_store(
            cfg.meta.type,
            path=cfg.meta.path or str(data_dir / "meta.sqlite"),
            endpoints=cfg.meta.endpoints,
            prefix=cfg.meta.prefix,
            timeout_ms=cfg.meta.timeout_ms,
            ca_cert=cfg.meta.ca_cert,
            client_cert=cfg.meta.client_cert,
            client_key=cfg.meta.client_key,
            user=cfg.meta.user,
            password=cfg.meta.password,
        )
        oc = cfg.objectstore
        location = objects_location(oc.type, oc.bucket, oc.root)
        bound = meta.bound_objects()  # read first: a client refused here writes nothing
        check_binding(location, bound, meta.store_id(), repr(meta))
        objects = claim_root(base, meta.store_id(), repr(base), repr(meta))
        if bound is None:
            # recorded once the root is claimed: a store refused by the root's owner stays free
            # to be pointed at another root
            try:
                bound = meta.bind_objects(location)
            except StorageReadOnlyError:  # a read-only data directory records nothing
                bound = location
            check_binding(location, bound, meta.store_id(), repr(meta))
        return meta, objects
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
    root = _data_dir(DEFAULT_DATA_DIR if data_dir is None else data_dir)
    try:
        meta, objects = _open_stores(cfg, root)
    except OSError as exc:  # objectstore.path or meta.path unusable (a file, no permission)
        raise InvalidArgumentError(
            f"cannot open the stores of data_dir {str(root)!r}: {exc.strerror or exc} "
            f"({exc.filename!r})"
        ) from exc
    deadline_s = cfg.quorum.call_timeout_ms / 1000
    if transport is None and cfg.quorum.nodes == "registry":  # service mode
        from .logstore.remote import GrpcTransport, Tls

        q = cfg.quorum
        tls = None
        if q.tls_ca_cert is not None or q.tls_client_cert is not None:
            tls = Tls(q.tls_ca_cert, q.tls_client_cert, q.tls_client_key)
        remote = GrpcTransport({}, timeout_s=deadline_s, tls=tls)
        ensemble = Ensemble(
            remote,
            deadline_s=deadline_s,
            registry=meta,
            on_nodes=remote.set_nodes,
            staged=cfg.storage.type == "staged",
            sealed_store=_sealed_store(cfg, objects),
        )
        ensemble.directory.live()  # the nodes known before the first call (then watched)
        return WoodpeckerClient(
            cfg, root, clock or SYSTEM_CLOCK, meta, objects, ensemble, open_writer
        )
    if transport is None:
        es = cfg.quorum.es
        if cfg.storage.type == "staged":
            staged = Path(cfg.storage.staged_dir) if cfg.storage.staged_dir else root / "staged"
            engines = {
                f"node-{i}": _staged_engine(cfg, staged, meta, objects, f"node-{i}")
                for i in range(es)
            }
        elif es == 1:
            engines = {"node-0": _engine(cfg, objects, "node-0")}
        else:
            engines = {
                f"node-{i}": _engine(cfg, objects.child(f"nodes/node-{i}"), f"node-{i}")
                for i in range(es)
            }
        transport = InProcessTransport(engines)
        for node_id in engines:
            meta.register_node(NodeInfo(node_id, f"inproc://{node_id}"))
    ensemble = Ensemble(
        transport,
        deadline_s=deadline_s,
        staged=cfg.storage.type == "staged",
        sealed_store=_sealed_store(cfg, objects),
    )
    return WoodpeckerClient(cfg, root, clock or SYSTEM_CLOCK, meta, objects, ensemble, open_writer)


def _engine(cfg: Config, objects: ObjectStore, node_id: str) -> LogStoreEngine:
    """A LogStore node over `objects` with the config's `storage.fsync` policy."""
    policy = parse_fsync(cfg.storage.fsync)
    storage = segment_storage(
        objects,
        fsync=policy.mode != "never",
        sync_interval_ms=policy.batch_ms if policy.mode == "batch" else 0,
    )
    return LogStoreEngine(storage, node_id)


def _sealed_store(cfg: Config, objects: ObjectStore) -> ObjectStore | None:
    """Staged storage: where uploaded segments live (every node's, and the client's reads)."""
    return objects.child(SEALED_PREFIX) if cfg.storage.type == "staged" else None


def _staged_engine(
    cfg: Config, staged_dir: Path, meta: MetadataStore, objects: ObjectStore, node_id: str
) -> LogStoreEngine:
    """A staged-storage node (`storage.type: staged`): the segments it holds as local files under
    `staged_dir/{store id}/{node_id}` with the `storage.fsync` policy, sealed ones under
    `sealed/` of the store's objects (shared by every node: any node reads them), and a sweeper
    dropping the local copy of a segment once the metadata says SEALED for
    `storage.staged_grace_s`."""
    policy = parse_fsync(cfg.storage.fsync)
    local = FileSegmentStorage(
        staged_dir / meta.store_id() / node_id,
        fsync=policy.mode != "never",
        sync_interval_ms=policy.batch_ms if policy.mode == "batch" else 0,
    )
    storage = StagedSegmentStorage(local, objects.child(SEALED_PREFIX))
    engine = LogStoreEngine(storage, node_id)

    def is_sealed(log_id: int, segment_id: int) -> bool:
        seg = meta.get_segment(log_id, segment_id)
        return seg is not None and seg.state is SegmentState.SEALED

    storage.start_sweeper(engine.drop_local, is_sealed, cfg.storage.staged_grace_s)
    return engine


def open_node(
    config: Config | Mapping[str, Any] | str | os.PathLike | None,
    data_dir: str | os.PathLike | None,
    node_id: str,
) -> tuple[LogStoreEngine, MetadataStore, ObjectStore]:
    """A LogStore node of the deployment `config` names (`woodpecker-idem logstore serve`): its
    engine over `nodes/{node_id}/` of the store's objects (where the in-process nodes of an es > 1
    client keep theirs), and the metadata store it registers in. Close both stores when done."""
    cfg = _config(config)
    if cfg.storage.type == "staged" and not cfg.storage.staged_dir:
        raise ConfigError(
            "invalid config storage.staged_dir = None: a LogStore node with storage.type staged "
            "keeps the segments it holds in a local directory; set storage.staged_dir to one "
            "on the node's own disk (the node's files go under <staged_dir>/<store id>/<node id>)"
        )
    root = _data_dir(DEFAULT_DATA_DIR if data_dir is None else data_dir)
    meta, objects = _open_stores(cfg, root)
    try:
        if cfg.storage.type == "staged":
            engine = _staged_engine(cfg, Path(cfg.storage.staged_dir), meta, objects, node_id)
        else:
            engine = _engine(cfg, objects.child(f"nodes/{node_id}"), node_id)
    except BaseException:
        meta.close()
        objects.close()
        raise
    return engine, meta, objects


def open_writer(
    handle: LogHandle,
    idempotent: bool,
    window_duration_s: float | None = None,
    window_max_keys: int | None = None,
    compression: str | None = None,
) -> LogWriter | IdempotentLogWriter:
    """A log's writer: one write pipeline, with the dedup window as its stage when `idempotent`
    (the window options are checked before the log is taken over), else with none. A
    `compression` given is checked as `append.compression` is (before the takeover too)."""
    ctx = handle.client.context(handle.log_id, handle.name)
    if compression is not None:
        ctx = dataclasses.replace(
            ctx, config=ctx.config.with_overrides({"append.compression": compression})
        )
    if not idempotent:
        return LogWriter(ctx)
    stage = WindowStage(
        ctx,
        window_duration_s=window_duration_s,
        window_max_keys=window_max_keys,
    )
    return IdempotentLogWriter(ctx, stage)
