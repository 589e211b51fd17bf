"""S3 that fails clearly (issue 13 item 4): connect() probes the store within a short budget, and
credential, permission, missing-bucket and endpoint problems are `WoodpeckerError`s that name the
bucket and the endpoint and say what to do, raised before any metadata is written."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import woodpecker_idem as wp
from woodpecker_idem.errors import ConfigError, StorageAccessError, StorageUnavailableError

pytestmark = pytest.mark.s3


def s3_config(endpoint: str, bucket: str, **extra: Any) -> dict[str, Any]:
    return {
        "objectstore.type": "s3",
        "objectstore.endpoint_url": endpoint,
        "objectstore.bucket": bucket,
        "objectstore.region": "us-east-1",
        "objectstore.access_key_id": "testing",
        "objectstore.secret_access_key": "testing",
        **extra,
    }


def boto(server: Any) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=server.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing in the AWS credential chain: no env keys, no files, no instance metadata."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_missing_bucket_is_refused_at_connect_and_nothing_is_created(
    tmp_path: Path, s3_server: Any
) -> None:
    bucket = f"wp-missing-{uuid.uuid4().hex[:12]}"
    with pytest.raises(StorageAccessError) as info:
        wp.connect(tmp_path / "d", s3_config(s3_server.endpoint_url, bucket))
    text = str(info.value)
    assert bucket in text and s3_server.endpoint_url in text
    assert "objectstore.create_bucket" in text and "create it" in text
    assert not (tmp_path / "d" / "meta.sqlite").exists()  # no metadata written
    names = [b["Name"] for b in boto(s3_server).list_buckets()["Buckets"]]
    assert bucket not in names  # and no bucket created behind the user's back


def test_create_bucket_true_creates_it(tmp_path: Path, s3_server: Any) -> None:
    bucket = f"wp-create-{uuid.uuid4().hex[:12]}"
    client = wp.connect(
        tmp_path, s3_config(s3_server.endpoint_url, bucket, **{"objectstore.create_bucket": True})
    )
    try:
        log = client.open_log("l", create=True)
        with log.open_writer() as w:
            w.write(b"x")
    finally:
        client.close()
    assert bucket in [b["Name"] for b in boto(s3_server).list_buckets()["Buckets"]]


def test_dead_endpoint_fails_connect_fast_before_any_metadata(tmp_path: Path) -> None:
    from serverproc import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"
    config = s3_config(endpoint, "some-bucket", **{"objectstore.probe_timeout_s": 1.5})
    t0 = time.monotonic()
    with pytest.raises(StorageUnavailableError) as info:
        wp.connect(tmp_path, config)
    assert time.monotonic() - t0 < 4.0
    text = str(info.value)
    assert endpoint in text and "some-bucket" in text and "objectstore.endpoint_url" in text
    assert not (tmp_path / "meta.sqlite").exists()


def test_dead_endpoint_default_budget_is_a_few_seconds(tmp_path: Path) -> None:
    from serverproc import free_port

    t0 = time.monotonic()
    with pytest.raises(StorageUnavailableError):
        wp.connect(tmp_path, s3_config(f"http://127.0.0.1:{free_port()}", "b-dead"))
    assert time.monotonic() - t0 < 8.0  # was 29 s, after open_log had recorded the log


def test_missing_credentials_name_the_keys_to_set(
    tmp_path: Path, s3_server: Any, no_aws_credentials: None
) -> None:
    config = s3_config(s3_server.endpoint_url, "wp-nocreds")
    del config["objectstore.access_key_id"], config["objectstore.secret_access_key"]
    with pytest.raises(StorageAccessError) as info:
        wp.connect(tmp_path, config)
    text = str(info.value)
    assert "wp-nocreds" in text and s3_server.endpoint_url in text
    assert "objectstore.access_key_id" in text and "AWS_ACCESS_KEY_ID" in text
    assert not (tmp_path / "meta.sqlite").exists()


def test_credentials_from_config_are_used(
    tmp_path: Path, s3_server: Any, no_aws_credentials: None
) -> None:
    config = s3_config(
        s3_server.endpoint_url,
        f"wp-creds-{uuid.uuid4().hex[:12]}",
        **{"objectstore.create_bucket": True},
    )
    client = wp.connect(tmp_path, config)
    try:
        with client.open_log("l", create=True).open_writer() as w:
            assert w.write(b"x").message_id == wp.LogMessageId(0, 0)
    finally:
        client.close()


def test_credentials_from_a_profile(
    tmp_path: Path, s3_server: Any, no_aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds = tmp_path / "credentials"
    creds.write_text("[wp]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    config = s3_config(
        s3_server.endpoint_url,
        f"wp-profile-{uuid.uuid4().hex[:12]}",
        **{"objectstore.create_bucket": True, "objectstore.profile": "wp"},
    )
    del config["objectstore.access_key_id"], config["objectstore.secret_access_key"]
    client = wp.connect(tmp_path / "ok", config)
    client.close()
    with pytest.raises(ConfigError, match="objectstore.profile 'nope'"):
        wp.connect(tmp_path / "bad", {**config, "objectstore.profile": "nope"})


def test_access_denied_at_probe_names_bucket_and_credentials(s3_server: Any) -> None:
    from botocore.exceptions import ClientError

    from woodpecker_idem.objectstore import open_object_store

    store = open_object_store(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        bucket="wp-denied",
        access_key="testing",
        secret_key="testing",
    )
    calls = []

    def head_bucket(**kwargs: Any) -> None:
        calls.append(kwargs)  # what S3 answers a HEAD with a key that may not list the bucket
        error = {"Code": "403", "Message": "Forbidden"}
        reply = {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 403}}
        raise ClientError(reply, "HeadBucket")  # type: ignore[arg-type]

    store.client.head_bucket = head_bucket
    with pytest.raises(StorageAccessError) as info:
        store.probe()
    assert len(calls) == 1  # not retried: waiting cannot fix a permission
    text = str(info.value)
    assert "wp-denied" in text and s3_server.endpoint_url in text and "credentials" in text
    store.close()


def test_bucket_deleted_under_a_running_writer_names_the_bucket(
    tmp_path: Path, s3_server: Any
) -> None:
    bucket = f"wp-deleted-{uuid.uuid4().hex[:12]}"
    config = s3_config(
        s3_server.endpoint_url,
        bucket,
        **{"objectstore.create_bucket": True, "append.max_retries": 0},
    )
    client = wp.connect(tmp_path, config)
    try:
        log = client.open_log("l", create=True)
        writer = log.open_writer()
        acked = writer.write(b"before", timeout=10).message_id
        s3 = boto(s3_server)
        for key in [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", ())]:
            s3.delete_object(Bucket=bucket, Key=key)
        s3.delete_bucket(Bucket=bucket)

        # The first write after the deletion fails on the node and stays pending while the
        # segment cannot be completed; writes after it are refused with the node's error.
        deadline = time.monotonic() + 30
        while True:
            try:
                writer.write(b"after", timeout=2)
                pytest.fail("a write to a deleted bucket was acknowledged")
            except wp.WoodpeckerError as exc:
                if bucket in str(exc) and "does not exist" in str(exc):
                    assert isinstance(exc, wp.QuorumUnavailableError), repr(exc)
                    break
            except TimeoutError:
                pass
            assert time.monotonic() < deadline, "no write error named the deleted bucket"
        with pytest.raises(StorageAccessError, match=bucket) as info:
            list(client.open_log("l").open_reader("earliest"))
        assert "entries missing" not in str(info.value)
        assert acked == wp.LogMessageId(0, 0)
        writer.close(5)
    finally:
        client.close(5)
