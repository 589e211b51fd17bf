"""Object storage: the `ObjectStore` contract, a local-directory backend and an S3 backend.

`S3ObjectStore` is exported lazily (PEP 562) so importing this package never imports boto3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from woodpecker_idem.errors import ConfigError
from woodpecker_idem.objectstore.base import ObjectStore
from woodpecker_idem.objectstore.local import LocalObjectStore

if TYPE_CHECKING:
    from woodpecker_idem.objectstore.s3 import S3ObjectStore

__all__ = ["LocalObjectStore", "ObjectStore", "S3ObjectStore", "open_object_store"]


def __getattr__(name: str) -> Any:
    if name == "S3ObjectStore":
        from woodpecker_idem.objectstore.s3 import S3ObjectStore

        return S3ObjectStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_object_store(
    type: str,  # noqa: A002 - mirrors the `objectstore.type` config key
    *,
    path: str | None = None,
    endpoint_url: str | None = None,
    bucket: str | None = None,
    root: str = "",
    region: str | None = "us-east-1",
    access_key: str | None = None,
    secret_key: str | None = None,
    **options: Any,
) -> ObjectStore:
    """Build the backend named by `objectstore.type` ("local" or "s3").

    Extra keyword `options` go to the backend (local: `fsync`; s3: `profile`,
    `connect_timeout_s`, `read_timeout_s`, `retry_budget_s`, `probe_timeout_s`,
    `backoff_initial_s`, `backoff_max_s`, `max_pool_connections`, `create_bucket`, `sse`,
    `sse_kms_key_id`).
    """
    kind = type.strip().lower() if isinstance(type, str) else type
    if kind == "local":
        if not path:
            raise ConfigError("objectstore.path is required when objectstore.type is 'local'")
        root = root.strip("/")
        if root:
            import os

            from woodpecker_idem.objectstore.local import validate_prefix

            path = os.path.join(path, validate_prefix(root, name="root"))
        return LocalObjectStore(path, **options)
    if kind == "s3":
        if not bucket:
            raise ConfigError("objectstore.bucket is required when objectstore.type is 's3'")
        from woodpecker_idem.objectstore.s3 import S3ObjectStore

        return S3ObjectStore(
            bucket=bucket,
            endpoint_url=endpoint_url,
            root=root,
            region=region,
            access_key=access_key,
            secret_key=secret_key,
            **options,
        )
    raise ConfigError(f"objectstore.type must be 'local' or 's3', got {type!r}")
