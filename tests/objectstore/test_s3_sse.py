"""S3 server-side encryption (issue 22 item 5): with `objectstore.sse` every object the client
writes carries the `x-amz-server-side-encryption` header (and the KMS key with
`objectstore.sse_kms_key_id`), so a bucket policy that denies unencrypted puts accepts ours:
segment blocks, dedup snapshots (one PutObject and multipart), the OWNER marker, everything.
moto records the header it was sent and applies no default of its own (checked below), so these
tests fail if a write path leaves it out."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

import woodpecker_idem as wp
from woodpecker_idem.config import Config
from woodpecker_idem.errors import ConfigError, StorageAccessError
from woodpecker_idem.idempotency.snapshot import list_snapshots
from woodpecker_idem.objectstore import open_object_store
from woodpecker_idem.objectstore import s3 as s3mod

pytestmark = pytest.mark.s3

MiB = 1024 * 1024


def aws(server: Any, service: str) -> Any:
    import boto3

    return boto3.client(
        service,
        endpoint_url=server.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def s3_config(server: Any, bucket: str, **extra: Any) -> dict[str, Any]:
    return {
        "objectstore.type": "s3",
        "objectstore.endpoint_url": server.endpoint_url,
        "objectstore.bucket": bucket,
        "objectstore.region": "us-east-1",
        "objectstore.access_key_id": "testing",
        "objectstore.secret_access_key": "testing",
        "objectstore.create_bucket": True,
        "segment.max_entries": 20,  # several segments, so several block objects
        **extra,
    }


def heads(server: Any, bucket: str) -> dict[str, dict[str, Any]]:
    """HeadObject of every object in the bucket, by key."""
    s3 = aws(server, "s3")
    keys = [
        obj["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for obj in page.get("Contents", ())
    ]
    return {key: s3.head_object(Bucket=bucket, Key=key) for key in keys}


def write_and_close(tmp_path: Path, config: dict[str, Any]) -> None:
    """An idempotent writer writes 60 keyed entries (3 segments), closes (a final snapshot), and
    a 6 MiB snapshot-like object goes through the client's store as a multipart upload."""
    client = wp.connect(tmp_path, config)
    try:
        log = client.create_log("orders")
        w = log.open_writer(idempotent=True)
        for i in range(60):
            w.write(f"payload-{i}".encode(), idempotency_id=f"order-{i}")
        w.close()
        assert list_snapshots(client.objects, log.log_id), "closing the writer wrote no snapshot"
        chunk = os.urandom(MiB)
        assert client.objects.put_parts("big/multipart", [chunk] * 6) == 6 * MiB
    finally:
        client.close()


def assert_kinds(objects: dict[str, dict[str, Any]]) -> None:
    """The run wrote every kind of object the tests mean to check."""
    names = list(objects)
    assert any(k.endswith("/OWNER") or k == "OWNER" for k in names), names
    assert sum(k.endswith(".blk") for k in names) >= 3, names
    assert any("/dedup_snapshot/" in k for k in names), names
    multipart = [k for k in names if k.endswith("big/multipart")]
    assert multipart and objects[multipart[0]]["ETag"].endswith('-2"'), "not a 2-part upload"


def test_without_sse_no_header_is_sent_and_moto_adds_none(tmp_path: Path, s3_server: Any) -> None:
    """The control: with objectstore.sse null moto reports no encryption, so the header seen in
    the other tests is the one we sent."""
    bucket = f"wp-sse-none-{uuid.uuid4().hex[:12]}"
    write_and_close(tmp_path, s3_config(s3_server, bucket))
    objects = heads(s3_server, bucket)
    assert_kinds(objects)
    assert all("ServerSideEncryption" not in h for h in objects.values()), objects


@pytest.mark.parametrize("sse", ["AES256", "aws:kms"])
def test_every_object_written_carries_the_sse_header(
    tmp_path: Path, s3_server: Any, sse: str
) -> None:
    """Blocks, snapshots, the multipart object and the OWNER marker: each one's HeadObject says
    the encryption asked for (aws:kms without a key id: the AWS-managed key, no SSEKMSKeyId)."""
    bucket = f"wp-sse-{uuid.uuid4().hex[:12]}"
    write_and_close(tmp_path, s3_config(s3_server, bucket, **{"objectstore.sse": sse}))
    objects = heads(s3_server, bucket)
    assert_kinds(objects)
    wrong = {k: h.get("ServerSideEncryption") for k, h in objects.items()}
    assert set(wrong.values()) == {sse}, wrong
    assert all("SSEKMSKeyId" not in h for h in objects.values())


def test_sse_kms_with_a_key_of_our_own(tmp_path: Path, s3_server: Any) -> None:
    """objectstore.sse_kms_key_id goes with every object written (moto's KMS made the key)."""
    key_arn = aws(s3_server, "kms").create_key(Description="woodpecker test")["KeyMetadata"]["Arn"]
    bucket = f"wp-sse-kms-{uuid.uuid4().hex[:12]}"
    config = s3_config(
        s3_server, bucket, **{"objectstore.sse": "aws:kms", "objectstore.sse_kms_key_id": key_arn}
    )
    write_and_close(tmp_path, config)
    objects = heads(s3_server, bucket)
    assert_kinds(objects)
    got = {k: (h.get("ServerSideEncryption"), h.get("SSEKMSKeyId")) for k, h in objects.items()}
    assert set(got.values()) == {("aws:kms", key_arn)}, got


class _PolicyClient:
    """A boto3 client behind a bucket policy that denies, with S3's plain 403, any request that
    creates an object without `x-amz-server-side-encryption: AES256` (moto does not evaluate
    bucket policies)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _require(self, operation: str, kwargs: dict[str, Any]) -> None:
        from botocore.exceptions import ClientError

        if kwargs.get("ServerSideEncryption") != "AES256":
            raise ClientError(
                {
                    "Error": {"Code": "AccessDenied", "Message": "Access Denied"},
                    "ResponseMetadata": {"HTTPStatusCode": 403},
                },
                operation,
            )

    def put_object(self, **kwargs: Any) -> Any:
        self._require("PutObject", kwargs)
        return self._client.put_object(**kwargs)

    def create_multipart_upload(self, **kwargs: Any) -> Any:
        self._require("CreateMultipartUpload", kwargs)
        return self._client.create_multipart_upload(**kwargs)


def test_a_bucket_policy_requiring_encryption_passes_with_sse(s3_server: Any) -> None:
    """Without objectstore.sse the put is refused and the error points at objectstore.sse; with
    it, puts and multipart puts go through."""
    bucket = f"wp-sse-policy-{uuid.uuid4().hex[:12]}"
    aws(s3_server, "s3").create_bucket(Bucket=bucket)

    def store(**sse: Any) -> Any:
        return open_object_store(
            "s3",
            endpoint_url=s3_server.endpoint_url,
            bucket=bucket,
            root="r",
            access_key="testing",
            secret_key="testing",
            client=_PolicyClient(aws(s3_server, "s3")),
            **sse,
        )

    plain = store()
    with pytest.raises(StorageAccessError, match="objectstore.sse") as info:
        plain.put("a", b"x")
    assert "bucket policy" in str(info.value)
    with pytest.raises(StorageAccessError, match="objectstore.sse"):
        plain.put_parts("big", [os.urandom(MiB)] * 6)

    encrypted = store(sse="AES256")
    assert encrypted.put("a", b"x", if_none_match=True)
    assert encrypted.put_parts("big", [os.urandom(MiB)] * 6) == 6 * MiB
    assert encrypted.child("sub").put("b", b"y")  # a child store keeps the encryption
    assert {k: h["ServerSideEncryption"] for k, h in heads(s3_server, bucket).items()} == {
        "r/a": "AES256",
        "r/big": "AES256",
        "r/sub/b": "AES256",
    }


def test_kms_refusals_name_the_kms_permissions_and_the_key() -> None:
    """A 403 with aws:kms is often the KMS key policy: the error names the permissions. A KMS
    error (no such key, key disabled) is final at once, naming objectstore.sse_kms_key_id."""
    from botocore.exceptions import ClientError

    class Refusing:
        def __init__(self, code: str, status: int) -> None:
            self.error = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
            self.calls = 0

        def put_object(self, **kwargs: Any) -> Any:
            self.calls += 1
            raise ClientError(self.error, "PutObject")  # type: ignore[arg-type]

    def store(client: Refusing) -> Any:
        s = s3mod.S3ObjectStore(
            bucket="b-kms", sse="aws:kms", sse_kms_key_id="alias/wal", client=client
        )
        s._bucket_ready = True
        return s

    with pytest.raises(StorageAccessError, match="kms:GenerateDataKey") as info:
        store(Refusing("AccessDenied", 403)).put("k", b"x")
    assert "alias/wal" in str(info.value)
    missing = Refusing("KMS.NotFoundException", 400)
    with pytest.raises(StorageAccessError, match="objectstore.sse_kms_key_id") as info:
        store(missing).put("k", b"x")
    assert "alias/wal" in str(info.value) and missing.calls == 1


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"objectstore.sse": "aes256"}, "did you mean 'AES256'"),
        ({"objectstore.sse": "kms"}, "did you mean 'aws:kms'"),
        ({"objectstore.sse": "SSE-KMS"}, "is written 'aws:kms'"),
        ({"objectstore.sse": "aws:kms:dsse"}, "one of null, AES256, aws:kms"),
        ({"objectstore.sse": True}, "one of null, AES256, aws:kms"),
        ({"objectstore.sse_kms_key_id": "alias/wal"}, "objectstore.sse is null"),
        (
            {
                "objectstore.sse": "AES256",
                "objectstore.sse_kms_key_id": "alias/wal",
                "objectstore.type": "s3",
                "objectstore.bucket": "b",
            },
            "objectstore.sse is 'AES256'",
        ),
        ({"objectstore.sse": "aws:kms", "objectstore.sse_kms_key_id": ""}, "non-empty"),
        ({"objectstore.sse": "AES256"}, "objectstore.type is 'local'"),  # not silently ignored
    ],
)
def test_config_refuses_bad_sse_settings(config: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_dict(config)
    text = str(info.value)
    assert expected in text
    assert next(iter(config)) in text or "objectstore.sse_kms_key_id" in text


def test_config_accepts_sse_settings_from_the_environment() -> None:
    from woodpecker_idem.config import load_config

    cfg = load_config(
        env={
            "WOODPECKER_OBJECTSTORE_TYPE": "s3",
            "WOODPECKER_OBJECTSTORE_BUCKET": "b",
            "WOODPECKER_OBJECTSTORE_SSE": "aws:kms",
            "WOODPECKER_OBJECTSTORE_SSE_KMS_KEY_ID": "alias/wal",
        }
    )
    assert (cfg.objectstore.sse, cfg.objectstore.sse_kms_key_id) == ("aws:kms", "alias/wal")
    assert load_config(env={"WOODPECKER_OBJECTSTORE_SSE": ""}).objectstore.sse is None


def test_the_store_refuses_bad_sse_arguments() -> None:
    from woodpecker_idem.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="objectstore.sse"):
        s3mod.S3ObjectStore(bucket="b-sse", sse="aes256", client=object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="objectstore.sse_kms_key_id"):
        s3mod.S3ObjectStore(
            bucket="b-sse",
            sse="AES256",
            sse_kms_key_id="alias/x",
            client=object(),  # type: ignore[arg-type]
        )
