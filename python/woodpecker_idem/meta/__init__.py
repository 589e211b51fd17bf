"""Metadata stores: the backend-neutral contract (`base`) and its backends.

`open_metadata_store` is the one place that maps a `meta.type` config value to a backend, so callers
(client, CLI, Spark workers) never import a backend module directly.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..errors import ConfigError
from .base import (
    LogGroupMeta,
    LogMeta,
    MetadataStore,
    NodeInfo,
    ReaderMeta,
    SegmentMeta,
    TxnMeta,
)
from .sqlite import SqliteMetadataStore

__all__ = [
    "LogGroupMeta",
    "LogMeta",
    "MetadataStore",
    "NodeInfo",
    "ReaderMeta",
    "SegmentMeta",
    "SqliteMetadataStore",
    "TxnMeta",
    "open_metadata_store",
]

META_TYPES = ("sqlite", "etcd")


def open_metadata_store(
    type: str,  # shadows the builtin on purpose: it is the `meta.type` config key
    *,
    path: str | os.PathLike[str] | None = None,
    endpoints: Sequence[str] | None = None,
    prefix: str = "/woodpecker",
    timeout_ms: int = 5_000,
    ca_cert: str | None = None,
    client_cert: str | None = None,
    client_key: str | None = None,
    user: str | None = None,
    password: str | None = None,
) -> MetadataStore:
    """Open the metadata backend named by `meta.type`.

    sqlite needs `path` (the config resolves its default, `<data_dir>/meta.sqlite`); etcd uses
    `endpoints`, `prefix` and `timeout_ms` (the deadline of every call), and for TLS and
    authentication `ca_cert`, `client_cert` and `client_key` (PEM files), `user` and `password`.
    """
    if type == "sqlite":
        if path is None:
            raise ConfigError("meta.path is required when meta.type is 'sqlite'")
        return SqliteMetadataStore(path)
    if type == "etcd":
        if not endpoints:
            raise ConfigError("meta.endpoints is required when meta.type is 'etcd'")
        from .etcd import EtcdMetadataStore  # imports etcd3gw only when etcd is used
        from .etcd_client import EtcdSecurity

        security = EtcdSecurity(ca_cert, client_cert, client_key, user, password)
        return EtcdMetadataStore(endpoints, prefix, timeout_ms=timeout_ms, security=security)
    raise ConfigError(
        f"meta.type = {type!r} is invalid: allowed values are {', '.join(META_TYPES)}"
    )
