"""S3 ObjectStore through boto3, against AWS or any S3-compatible endpoint.

Create-if-absent is `PutObject` with `If-None-Match: *`. botocore's own retries are off: this module
retries connection errors, 5xx and throttling itself with exponential backoff inside a total time
budget, so it knows when an attempt is *ambiguous* (the request may have landed although no answer
came back). If a later attempt of the same conditional put then gets 412, the object is read back:
the same bytes mean the earlier attempt was ours (True), different bytes mean another writer won.
boto3 is imported lazily so `import woodpecker_idem` stays light.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from woodpecker_idem.errors import ConfigError, StorageUnavailableError
from woodpecker_idem.objectstore.base import ObjectStore
from woodpecker_idem.objectstore.local import as_bytes, validate_key, validate_prefix

if TYPE_CHECKING:
    from botocore.client import BaseClient

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Service error codes worth another attempt (besides every 5xx).
_RETRIABLE_CODES = frozenset(
    {
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequests",
        "InternalError",
        "ServiceUnavailable",
        "ConditionalRequestConflict",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_NO_BUCKET_CODES = frozenset({"NoSuchBucket"})


class _Retry(Exception):
    """Internal: this attempt failed transiently; `ambiguous` if the request may have landed."""

    def __init__(self, cause: BaseException, *, ambiguous: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.ambiguous = ambiguous


class S3ObjectStore(ObjectStore):
    """Keys live under `root/` in `bucket`; thread-safe (one boto3 client, a connection pool)."""

    def __init__(
        self,
        *,
        bucket: str,
        endpoint_url: str | None = None,
        root: str = "",
        region: str = "us-east-1",
        access_key: str | None = None,
        secret_key: str | None = None,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 5.0,
        retry_budget_s: float = 30.0,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 2.0,
        max_pool_connections: int = 32,
        create_bucket: bool = True,
        client: BaseClient | None = None,
    ) -> None:
        """`client` lets tests inject a pre-built (or wrapped) boto3 S3 client."""
        from woodpecker_idem.errors import InvalidArgumentError

        if not bucket or not isinstance(bucket, str):
            raise InvalidArgumentError("bucket must be a non-empty str")
        for name, value in (
            ("connect_timeout_s", connect_timeout_s),
            ("read_timeout_s", read_timeout_s),
            ("retry_budget_s", retry_budget_s),
            ("backoff_initial_s", backoff_initial_s),
            ("backoff_max_s", backoff_max_s),
        ):
            if not value > 0:
                raise InvalidArgumentError(f"{name} must be > 0, got {value!r}")
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.region = region
        root = (root or "").strip("/")
        if root:
            validate_prefix(root, name="root")
        self.root = root
        self._prefix = f"{root}/" if root else ""
        self.retry_budget_s = retry_budget_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._auto_create = create_bucket
        self._bucket_ready = False
        self._bucket_lock = threading.Lock()
        if client is None:
            client = _make_client(
                endpoint_url=endpoint_url,
                region=region,
                access_key=access_key,
                secret_key=secret_key,
                connect_timeout_s=connect_timeout_s,
                read_timeout_s=read_timeout_s,
                max_pool_connections=max_pool_connections,
            )
        self.client = client

    def __repr__(self) -> str:
        return (
            f"S3ObjectStore(endpoint={self._endpoint_name()!r}, bucket={self.bucket!r}, "
            f"root={self.root!r})"
        )

    # --- helpers -------------------------------------------------------------------------------

    def _endpoint_name(self) -> str:
        return self.endpoint_url or f"s3.{self.region}.amazonaws.com"

    def _full(self, key: str) -> str:
        return self._prefix + key

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        """Run `fn` with bounded retries; raise StorageUnavailableError when the budget is spent."""
        deadline = time.monotonic() + self.retry_budget_s
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except _Retry as r:
                delay = self._backoff(attempt)
                if time.monotonic() + delay > deadline:
                    raise self._unavailable(op, key, attempt, r.cause) from r.cause
                logger.debug("s3 %s %r attempt %d failed (%s); retrying", op, key, attempt, r)
                time.sleep(delay)

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter: half fixed, half random (avoids retry stampedes)."""
        cap = min(self.backoff_max_s, self.backoff_initial_s * (2 ** (attempt - 1)))
        return cap / 2 + random.uniform(0, cap / 2)

    def _unavailable(
        self, op: str, key: str, attempts: int, cause: BaseException
    ) -> StorageUnavailableError:
        return StorageUnavailableError(
            f"object storage at {self._endpoint_name()} (bucket {self.bucket!r}) unavailable: "
            f"{op} {key!r} failed after {attempts} attempt(s) within {self.retry_budget_s:g}s: "
            f"{type(cause).__name__}: {cause}"
        )

    def _classify(self, op: str, key: str, exc: BaseException) -> None:
        """Turn a boto error into `_Retry` or a final error; returns only for handled codes."""
        from botocore.exceptions import (
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            HTTPClientError,
            IncompleteReadError,
            ResponseStreamingError,
        )
        from botocore.exceptions import (
            ConnectionError as BotoConnectionError,
        )

        if isinstance(exc, EndpointConnectionError | ConnectTimeoutError):
            raise _Retry(exc, ambiguous=False)  # never connected: the request was not sent
        if isinstance(
            exc,
            BotoConnectionError | HTTPClientError | IncompleteReadError | ResponseStreamingError,
        ):
            raise _Retry(exc, ambiguous=True)
        if isinstance(exc, ClientError):
            code, status = _error_code(exc)
            if status >= 500 or code in _RETRIABLE_CODES or status == 429:
                # A 409 ConditionalRequestConflict means ours was refused: not ambiguous.
                raise _Retry(exc, ambiguous=code != "ConditionalRequestConflict")
            if code == "InvalidBucketName":
                raise ConfigError(
                    f"objectstore.bucket {self.bucket!r} is not a valid bucket name "
                    f"(3-63 lowercase letters, digits, '.', '-')"
                ) from exc
            raise StorageUnavailableError(
                f"object storage at {self._endpoint_name()} (bucket {self.bucket!r}) refused "
                f"{op} {key!r}: {code} (HTTP {status}): {exc}"
            ) from exc
        raise exc

    def _ensure_ready(self) -> None:
        if not self._bucket_ready and self._auto_create:
            self.ensure_bucket()

    # --- bucket --------------------------------------------------------------------------------

    def ensure_bucket(self) -> None:
        """Create the bucket if it is missing (idempotent; a concurrent creator is fine)."""
        from botocore.exceptions import ClientError

        with self._bucket_lock:
            if self._bucket_ready:
                return

            def attempt() -> None:
                try:
                    self.client.head_bucket(Bucket=self.bucket)
                    return
                except ClientError as exc:
                    code, status = _error_code(exc)
                    if status != 404 and code not in ("NoSuchBucket", "NotFound", "404"):
                        self._classify("head_bucket", self.bucket, exc)
                except Exception as exc:  # noqa: BLE001 - classified below
                    self._classify("head_bucket", self.bucket, exc)
                kwargs: dict[str, Any] = {"Bucket": self.bucket}
                if self.region and self.region != "us-east-1":
                    kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
                try:
                    self.client.create_bucket(**kwargs)
                    logger.info("created bucket %r at %s", self.bucket, self._endpoint_name())
                except ClientError as exc:
                    code, _ = _error_code(exc)
                    if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        self._classify("create_bucket", self.bucket, exc)
                except Exception as exc:  # noqa: BLE001 - classified below
                    self._classify("create_bucket", self.bucket, exc)

            self._call("ensure_bucket", self.bucket, attempt)
            self._bucket_ready = True

    # --- contract ------------------------------------------------------------------------------

    def put(self, key: str, data: bytes, *, if_none_match: bool = False) -> bool:
        """PutObject (conditional with `If-None-Match: *`); ambiguous retries resolved by bytes."""
        from botocore.exceptions import ClientError

        validate_key(key)
        payload = bytes(as_bytes(data))
        self._ensure_ready()
        full = self._full(key)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": full, "Body": payload}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        maybe_landed = False  # an earlier attempt of this call may have written the object

        def attempt() -> bool:
            nonlocal maybe_landed
            try:
                return one_try()
            except _Retry as r:
                maybe_landed = maybe_landed or r.ambiguous
                raise

        def one_try() -> bool:
            try:
                self.client.put_object(**kwargs)
                return True
            except ClientError as exc:
                code, status = _error_code(exc)
                if if_none_match and (status == 412 or code == "PreconditionFailed"):
                    if not maybe_landed:
                        return False
                    # Maybe our own earlier attempt: compare bytes (read has its own retries).
                    current = self._get_full(full, op="put")
                    ours = current == payload
                    logger.info(
                        "s3 put %r: 412 after an ambiguous attempt; object %s",
                        key,
                        "matches our bytes (our put landed)" if ours else "differs (lost race)",
                    )
                    return ours
                if code in _NO_BUCKET_CODES and self._auto_create:
                    self._bucket_ready = False
                    self.ensure_bucket()
                    raise _Retry(exc, ambiguous=False) from exc
                self._classify("put", key, exc)
                raise
            except _Retry:
                raise
            except Exception as exc:  # noqa: BLE001 - classified (retry or final error)
                self._classify("put", key, exc)
                raise

        return self._call("put", key, attempt)

    def get(self, key: str) -> bytes | None:
        """GetObject; None if absent."""
        validate_key(key)
        self._ensure_ready()
        return self._get_full(self._full(key), op="get")

    def _get_full(self, full: str, *, op: str) -> bytes | None:
        from botocore.exceptions import ClientError

        def attempt() -> bytes | None:
            try:
                resp = self.client.get_object(Bucket=self.bucket, Key=full)
                body = resp["Body"]
                try:
                    return body.read()
                finally:
                    body.close()
            except ClientError as exc:
                code, status = _error_code(exc)
                if code in _NOT_FOUND_CODES or (status == 404 and code not in _NO_BUCKET_CODES):
                    return None
                if code in _NO_BUCKET_CODES:
                    return None  # nothing was ever stored
                self._classify(op, full, exc)
                raise
            except _Retry:
                raise
            except Exception as exc:  # noqa: BLE001
                self._classify(op, full, exc)
                raise

        return self._call(op, full, attempt)

    def list(self, prefix: str) -> list[str]:
        """ListObjectsV2, every page; keys returned without the root prefix, sorted."""
        validate_prefix(prefix)
        self._ensure_ready()
        full_prefix = self._full(prefix)
        strip = len(self._prefix)
        keys: list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full_prefix}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call("list", prefix, functools.partial(self._list_page, kwargs))
            keys.extend(obj["Key"][strip:] for obj in page.get("Contents", ()))
            if not page.get("IsTruncated"):
                break
            token = page.get("NextContinuationToken")
            if not token:
                break
        keys.sort()
        return keys

    def _list_page(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        try:
            return self.client.list_objects_v2(**kwargs)
        except ClientError as exc:
            code, _ = _error_code(exc)
            if code in _NO_BUCKET_CODES:
                return {}
            self._classify("list", kwargs["Prefix"], exc)
            raise
        except Exception as exc:  # noqa: BLE001
            self._classify("list", kwargs["Prefix"], exc)
            raise

    def delete(self, key: str) -> None:
        """DeleteObject; S3 already treats an absent key as success."""
        validate_key(key)
        self._ensure_ready()
        full = self._full(key)

        def attempt() -> None:
            from botocore.exceptions import ClientError

            try:
                self.client.delete_object(Bucket=self.bucket, Key=full)
            except ClientError as exc:
                code, _ = _error_code(exc)
                if code in _NO_BUCKET_CODES or code in _NOT_FOUND_CODES:
                    return
                self._classify("delete", key, exc)
                raise
            except Exception as exc:  # noqa: BLE001
                self._classify("delete", key, exc)
                raise

        self._call("delete", key, attempt)

    def delete_prefix(self, prefix: str) -> int:
        """Batched DeleteObjects (1000 keys a request) instead of one request per key."""
        keys = self.list(prefix)
        for i in range(0, len(keys), 1000):
            batch = keys[i : i + 1000]
            request = {"Objects": [{"Key": self._full(k)} for k in batch], "Quiet": True}

            def attempt(req: dict[str, Any] = request) -> dict[str, Any]:
                try:
                    return self.client.delete_objects(Bucket=self.bucket, Delete=req)
                except Exception as exc:  # noqa: BLE001
                    self._classify("delete_prefix", prefix, exc)
                    raise

            resp = self._call("delete_prefix", prefix, attempt)
            errors = resp.get("Errors") or []
            if errors:
                first = errors[0]
                raise StorageUnavailableError(
                    f"object storage at {self._endpoint_name()} could not delete "
                    f"{len(errors)} of {len(batch)} keys under {prefix!r}: "
                    f"{first.get('Key')!r}: {first.get('Code')} {first.get('Message')}"
                )
        return len(keys)

    def close(self) -> None:
        """Close the client's connection pool."""
        close = getattr(self.client, "close", None)
        if close is not None:
            close()


def _error_code(exc: Any) -> tuple[str, int]:
    """(error code, HTTP status) of a botocore ClientError."""
    resp = getattr(exc, "response", None) or {}
    code = str(resp.get("Error", {}).get("Code", ""))
    status = int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if not status and code.isdigit():
        status = int(code)
    return code, status


def _make_client(
    *,
    endpoint_url: str | None,
    region: str,
    access_key: str | None,
    secret_key: str | None,
    connect_timeout_s: float,
    read_timeout_s: float,
    max_pool_connections: int,
) -> BaseClient:
    """A boto3 S3 client: short timeouts, no botocore retries, path-style for custom endpoints."""
    import boto3
    from botocore.config import Config

    options: dict[str, Any] = {
        "connect_timeout": connect_timeout_s,
        "read_timeout": read_timeout_s,
        # We retry ourselves, and must see every attempt to know whether a put may have landed.
        # botocore's `max_attempts` counts *retries* (max_attempts=1 means 2 tries: a hidden retry
        # that would turn "our put landed, then 412" into False); total_max_attempts=1 is one try.
        "retries": {"total_max_attempts": 1, "mode": "standard"},
        "max_pool_connections": max_pool_connections,
    }
    if endpoint_url:
        options["s3"] = {"addressing_style": "path"}
        # Many S3-compatible servers reject the newer default CRC trailers; records carry CRCs.
        options["request_checksum_calculation"] = "when_required"
        options["response_checksum_validation"] = "when_required"
    session = boto3.session.Session()
    return session.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=Config(**options),
    )
