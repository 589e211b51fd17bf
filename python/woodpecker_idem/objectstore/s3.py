"""S3 ObjectStore through boto3, against AWS or any S3-compatible endpoint.

Create-if-absent is `PutObject` with `If-None-Match: *`. botocore's own retries are off: this module
retries connection errors, 5xx and throttling itself with exponential backoff inside a total time
budget, so it knows when an attempt is *ambiguous* (the request may have landed although no answer
came back). If a later attempt of the same conditional put then gets 412, the object is read back:
the same bytes mean the earlier attempt was ours (True), different bytes mean another writer won.
boto3 is imported lazily so `import woodpecker_idem` stays light.

Server-side encryption (`sse`: "AES256" or "aws:kms", with an optional KMS key id) is requested
on every request that creates an object (PutObject, CreateMultipartUpload), so a bucket policy that
denies unencrypted puts accepts ours; reads need no header for SSE-S3 or SSE-KMS.

Errors a retry cannot fix (no credentials, access denied, no such bucket) become
`StorageAccessError`s naming the bucket, the endpoint and what to change. A missing bucket is
created only when `create_bucket` is set, and only before first use: a bucket deleted under a
running client is an error, never silently recreated empty.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from woodpecker_idem.errors import ConfigError, StorageAccessError, StorageUnavailableError
from woodpecker_idem.objectstore.base import ObjectStore
from woodpecker_idem.objectstore.local import as_bytes, validate_key, validate_prefix
from woodpecker_idem.retry import Backoff, retry_call

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
#: Service error codes that mean "these credentials may not do this" (besides every 403).
_ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AuthorizationHeaderMalformed",
    }
)
_CREDENTIALS_HINT = (
    "set objectstore.access_key_id and objectstore.secret_access_key, or objectstore.profile, "
    "or the usual AWS environment variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
    "AWS_PROFILE) or ~/.aws/credentials"
)


#: `objectstore.sse` values: the `x-amz-server-side-encryption` header (None: not sent).
SSE_VALUES = (None, "AES256", "aws:kms")

#: Bytes per part of a multipart upload (`put_parts`): S3 refuses parts below 5 MiB but the last,
#: and a part is held whole while it is sent, so this is about what a streamed put holds at once.
PART_BYTES = 5 * 1024 * 1024


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
        region: str | None = "us-east-1",
        access_key: str | None = None,
        secret_key: str | None = None,
        profile: str | None = None,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 5.0,
        retry_budget_s: float = 30.0,
        probe_timeout_s: float = 5.0,
        backoff_initial_s: float = 0.05,
        backoff_max_s: float = 2.0,
        max_pool_connections: int = 32,
        create_bucket: bool = False,
        sse: str | None = None,
        sse_kms_key_id: str | None = None,
        client: BaseClient | None = None,
    ) -> None:
        """`client` lets tests inject a pre-built (or wrapped) boto3 S3 client; `child` shares one.

        `create_bucket`: create a missing bucket at first use (`probe`), instead of refusing it.
        `sse`: "AES256" (SSE-S3) or "aws:kms" (SSE-KMS, with the key `sse_kms_key_id`, or the
        AWS-managed aws/s3 key when None) on every object written; None sends no header.
        """
        from woodpecker_idem.errors import InvalidArgumentError

        if not bucket or not isinstance(bucket, str):
            raise InvalidArgumentError("bucket must be a non-empty str")
        for name, value in (
            ("connect_timeout_s", connect_timeout_s),
            ("read_timeout_s", read_timeout_s),
            ("retry_budget_s", retry_budget_s),
            ("probe_timeout_s", probe_timeout_s),
            ("backoff_initial_s", backoff_initial_s),
            ("backoff_max_s", backoff_max_s),
        ):
            if not value > 0:
                raise InvalidArgumentError(f"{name} must be > 0, got {value!r}")
        if sse not in SSE_VALUES:
            raise InvalidArgumentError(
                f"sse must be one of None, 'AES256', 'aws:kms' (objectstore.sse), got {sse!r}"
            )
        if sse_kms_key_id is not None and (sse != "aws:kms" or not sse_kms_key_id):
            raise InvalidArgumentError(
                "sse_kms_key_id (objectstore.sse_kms_key_id) must be a non-empty str, and only "
                f"with sse='aws:kms'; got {sse_kms_key_id!r} with sse={sse!r}"
            )
        self.sse = sse
        self.sse_kms_key_id = sse_kms_key_id
        # The arguments of every call that creates an object: a bucket policy may deny a
        # PutObject (and a CreateMultipartUpload) that does not carry them.
        self._sse_args: dict[str, str] = {}
        if sse is not None:
            self._sse_args["ServerSideEncryption"] = sse
        if sse_kms_key_id is not None:
            self._sse_args["SSEKMSKeyId"] = sse_kms_key_id
        self.bucket = bucket
        self.endpoint_url = endpoint_url
        self.region = region
        root = (root or "").strip("/")
        if root:
            validate_prefix(root, name="root")
        self.root = root
        self._prefix = f"{root}/" if root else ""
        self.retry_budget_s = retry_budget_s
        self.probe_timeout_s = probe_timeout_s
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
                profile=profile,
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
        if self.endpoint_url:
            return self.endpoint_url
        return f"https://s3.{self.region}.amazonaws.com" if self.region else "AWS S3"

    def _full(self, key: str) -> str:
        return self._prefix + key

    def _call(self, op: str, key: str, fn: Callable[[], T], budget_s: float | None = None) -> T:
        """Run `fn` with bounded retries; raise StorageUnavailableError when the budget is spent."""
        budget = self.retry_budget_s if budget_s is None else budget_s
        backoff = Backoff(self.backoff_initial_s, self.backoff_max_s, budget_s=budget)

        def on_retry(exc: BaseException, attempt: int) -> None:
            logger.debug("s3 %s %r attempt %d failed (%s); retrying", op, key, attempt, exc)

        try:
            return retry_call(fn, lambda exc: isinstance(exc, _Retry), backoff, on_retry)
        except _Retry as r:
            raise self._unavailable(op, key, backoff.attempts, budget, r.cause) from r.cause

    def _unavailable(
        self, op: str, key: str, attempts: int, budget_s: float, cause: BaseException
    ) -> StorageUnavailableError:
        return StorageUnavailableError(
            f"object storage at {self._endpoint_name()} (bucket {self.bucket!r}) unavailable: "
            f"{op} {key!r} failed after {attempts} attempt(s) within {budget_s:g}s: "
            f"{type(cause).__name__}: {cause}. Check objectstore.endpoint_url and that the "
            "server is up; the budget is objectstore.retry_budget_s (objectstore.probe_timeout_s "
            "at connect)"
        )

    def _no_bucket(self) -> StorageAccessError:
        return StorageAccessError(
            f"bucket {self.bucket!r} does not exist at {self._endpoint_name()}: create it (for "
            f"example `aws s3 mb s3://{self.bucket}`), or set objectstore.create_bucket: true "
            "to have connect() create it. If it existed, it was deleted while in use and the "
            "objects in it are gone"
        )

    def _denied(self, op: str, key: str, detail: str) -> StorageAccessError:
        return StorageAccessError(
            f"object storage at {self._endpoint_name()} (bucket {self.bucket!r}) refused {op} "
            f"{key!r}: {detail}. Check the credentials ({_CREDENTIALS_HINT}) and that they may "
            f"list, get, put and delete objects in this bucket{self._sse_hint(op)}"
        )

    def _sse_hint(self, op: str) -> str:
        """What encryption may have to do with a refusal: S3 answers a put a bucket policy denies
        for want of encryption headers, and a KMS permission missing, with a plain 403."""
        if self.sse == "aws:kms":
            key = self.sse_kms_key_id or "aws/s3"
            return (
                "; with objectstore.sse: aws:kms they also need kms:GenerateDataKey and "
                f"kms:Decrypt on the KMS key {key!r} (objectstore.sse_kms_key_id): writers both "
                "(a multipart upload decrypts too), readers kms:Decrypt"
            )
        if op.startswith("put"):
            now = "no encryption header" if self.sse is None else f"objectstore.sse {self.sse!r}"
            return (
                f"; if a bucket policy requires server-side encryption headers ({now} is sent), "
                "set objectstore.sse (and objectstore.sse_kms_key_id) as the policy asks"
            )
        return ""

    def _classify(self, op: str, key: str, exc: BaseException) -> None:
        """Turn a boto error into `_Retry` or a final error; returns only for handled codes."""
        from botocore.exceptions import (
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            HTTPClientError,
            IncompleteReadError,
            NoCredentialsError,
            PartialCredentialsError,
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
        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            raise StorageAccessError(
                f"no usable S3 credentials for bucket {self.bucket!r} at "
                f"{self._endpoint_name()} ({exc}): {_CREDENTIALS_HINT}"
            ) from exc
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
            if code in _NO_BUCKET_CODES:
                raise self._no_bucket() from exc
            if status == 403 or code in _ACCESS_CODES:
                raise self._denied(op, key, f"{code or 'Forbidden'} (HTTP {status})") from exc
            if code.startswith("KMS."):  # no such key, key disabled, ...: a retry cannot fix it
                if self.sse == "aws:kms":
                    which = f"objectstore.sse_kms_key_id ({self.sse_kms_key_id or 'aws/s3'!r})"
                else:  # the bucket's default encryption names the key
                    which = "the KMS key of the bucket's default encryption"
                raise StorageAccessError(
                    f"object storage at {self._endpoint_name()} (bucket {self.bucket!r}) refused "
                    f"{op} {key!r}: {code} (HTTP {status}): {exc}. Check {which}: the key must "
                    "exist, be enabled, be in the bucket's region and allow these credentials"
                ) from exc
            raise StorageUnavailableError(
                f"object storage at {self._endpoint_name()} (bucket {self.bucket!r}) refused "
                f"{op} {key!r}: {code} (HTTP {status}): {exc}"
            ) from exc
        raise exc

    def _ensure_ready(self) -> None:
        if not self._bucket_ready:
            self.ensure_bucket()

    # --- bucket --------------------------------------------------------------------------------

    def probe(self) -> None:
        """Within `probe_timeout_s`: the endpoint answers, the credentials are accepted and the
        bucket exists (created if `create_bucket`); otherwise a clear error (connect() calls it)."""
        self.ensure_bucket(budget_s=self.probe_timeout_s)

    def ensure_bucket(self, budget_s: float | None = None) -> None:
        """HeadBucket once per store; a missing bucket is created if `create_bucket`, else it is
        a `StorageAccessError` (a concurrent creator is fine)."""
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
                        raise
                except Exception as exc:  # noqa: BLE001 - classified below
                    self._classify("head_bucket", self.bucket, exc)
                    raise
                if not self._auto_create:
                    raise self._no_bucket()
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
                        raise
                except Exception as exc:  # noqa: BLE001 - classified below
                    self._classify("create_bucket", self.bucket, exc)
                    raise

            self._call("head_bucket", self.bucket, attempt, budget_s)
            self._bucket_ready = True

    # --- contract ------------------------------------------------------------------------------

    def child(self, prefix: str) -> S3ObjectStore:
        """Keys under `root/prefix/` in the same bucket, through this store's boto3 client."""
        validate_key(prefix, name="prefix")
        child = S3ObjectStore(
            bucket=self.bucket,
            endpoint_url=self.endpoint_url,
            root=f"{self._prefix}{prefix}",
            region=self.region,
            retry_budget_s=self.retry_budget_s,
            probe_timeout_s=self.probe_timeout_s,
            backoff_initial_s=self.backoff_initial_s,
            backoff_max_s=self.backoff_max_s,
            create_bucket=self._auto_create,
            sse=self.sse,
            sse_kms_key_id=self.sse_kms_key_id,
            client=self.client,
        )
        child._bucket_ready = self._bucket_ready
        return child

    def put(self, key: str, data: bytes, *, if_none_match: bool = False) -> bool:
        """PutObject (conditional with `If-None-Match: *`); ambiguous retries resolved by bytes."""
        from botocore.exceptions import ClientError

        validate_key(key)
        payload = bytes(as_bytes(data))
        self._ensure_ready()
        full = self._full(key)
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": full,
            "Body": payload,
            **self._sse_args,
        }
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
                self._classify("put", key, exc)
                raise
            except _Retry:
                raise
            except Exception as exc:  # noqa: BLE001 - classified (retry or final error)
                self._classify("put", key, exc)
                raise

        return self._call("put", key, attempt)

    def put_parts(self, key: str, parts: Iterable[bytes]) -> int:
        """The parts end to end, sent as they come: a multipart upload of PART_BYTES parts (the
        object appears only when it completes), or one PutObject if they come to less than one
        part. Each request is retried as `put` is; a failure aborts the upload, so no object and
        no parts are left (S3 bills parts of an upload never completed nor aborted)."""
        validate_key(key)
        self._ensure_ready()
        full = self._full(key)
        pending: list[bytes] = []
        size = 0
        total = 0
        upload_id: str | None = None
        done: list[dict[str, Any]] = []
        try:
            for part in parts:
                pending.append(bytes(as_bytes(part)))
                size += len(part)
                if size < PART_BYTES:
                    continue
                if upload_id is None:
                    upload_id = self._create_upload(key, full)
                body = b"".join(pending)
                pending.clear()
                size = 0
                done.append(self._upload_part(key, full, upload_id, len(done) + 1, body))
                total += len(body)
                del body
            body = b"".join(pending)
            pending.clear()
            if upload_id is None:  # smaller than a part: one put
                self.put(key, body)
                return len(body)
            if body:
                done.append(self._upload_part(key, full, upload_id, len(done) + 1, body))
                total += len(body)
            del body
            self._complete_upload(key, full, upload_id, done)
            upload_id = None
            return total
        finally:
            if upload_id is not None:
                self._abort_upload(key, full, upload_id)

    def _s3_call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        """`fn` (one S3 request) with `_call`'s retries, its errors classified as `put`'s are."""

        def attempt() -> T:
            try:
                return fn()
            except _Retry:
                raise
            except Exception as exc:  # noqa: BLE001 - classified (retry or final error)
                self._classify(op, key, exc)
                raise

        return self._call(op, key, attempt)

    def _create_upload(self, key: str, full: str) -> str:
        resp = self._s3_call(
            "put (create multipart upload)",
            key,
            # The encryption is the upload's: its parts and the object take it from here.
            lambda: self.client.create_multipart_upload(
                Bucket=self.bucket, Key=full, **self._sse_args
            ),
        )
        return str(resp["UploadId"])

    def _upload_part(
        self, key: str, full: str, upload_id: str, number: int, body: bytes
    ) -> dict[str, Any]:
        """One part (a retry sends the same number again, which replaces it)."""
        resp = self._s3_call(
            f"put (part {number})",
            key,
            lambda: self.client.upload_part(
                Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=body
            ),
        )
        return {"ETag": resp["ETag"], "PartNumber": number}

    def _complete_upload(
        self, key: str, full: str, upload_id: str, done: list[dict[str, Any]]
    ) -> None:
        from botocore.exceptions import ClientError

        tried = False

        def complete() -> None:
            nonlocal tried
            try:
                self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=full,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": done},
                )
            except ClientError as exc:
                code, _ = _error_code(exc)
                if tried and code == "NoSuchUpload":
                    # an earlier attempt completed it (its answer was lost): the upload is gone
                    # because the object exists
                    logger.info("s3 put %r: multipart upload completed by an earlier attempt", key)
                    return
                raise
            finally:
                tried = True

        self._s3_call("put (complete multipart upload)", key, complete)

    def _abort_upload(self, key: str, full: str, upload_id: str) -> None:
        """Best effort: an upload left behind holds parts, never an object."""
        try:
            self._s3_call(
                "put (abort multipart upload)",
                key,
                lambda: self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=full, UploadId=upload_id
                ),
            )
        except Exception as exc:  # noqa: BLE001 - the put's own error is the one to raise
            logger.warning(
                "s3 put %r: could not abort multipart upload %s (its parts stay until a bucket "
                "lifecycle rule removes them): %s",
                key,
                upload_id,
                exc,
            )

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
                self._classify(op, full, exc)  # a missing bucket is an error, not "absent"
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
        try:
            return self.client.list_objects_v2(**kwargs)
        except Exception as exc:  # noqa: BLE001 - a missing bucket too: an error, not "empty"
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
                if code in _NOT_FOUND_CODES:
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
    region: str | None,
    access_key: str | None,
    secret_key: str | None,
    profile: str | None,
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
    from botocore.exceptions import ProfileNotFound

    try:
        session = boto3.session.Session(profile_name=profile)
    except ProfileNotFound as exc:
        raise ConfigError(
            f"objectstore.profile {profile!r} is not in the AWS config or credentials files "
            f"({exc}); name an existing profile, or set objectstore.access_key_id and "
            "objectstore.secret_access_key"
        ) from exc
    return session.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=Config(**options),
    )
