"""One metadata store per object-store root (issue 13 items 2 and 3): object keys live under the
metadata store's identity, connect() claims `objectstore.root` with an owner marker, and a second
metadata store on the same bucket and root is refused before it can read or write anything."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

import woodpecker_idem as wp
from woodpecker_idem.errors import ConfigError, ObjectStoreOwnedError
from woodpecker_idem.meta import SqliteMetadataStore
from woodpecker_idem.testing.history import History

WINDOW_S = 600
MAX_KEYS = 10_000


def s3_config(server: Any, bucket: str, root: str = "woodpecker", **extra: Any) -> dict[str, Any]:
    return {
        "objectstore.type": "s3",
        "objectstore.endpoint_url": server.endpoint_url,
        "objectstore.bucket": bucket,
        "objectstore.root": root,
        "objectstore.region": "us-east-1",
        "objectstore.access_key_id": "testing",
        "objectstore.secret_access_key": "testing",
        "objectstore.create_bucket": True,
        "segment.max_entries": 25,
        **extra,
    }


def write_keys(client: Any, log_name: str, prefix: str, n: int) -> tuple[History, dict[str, Any]]:
    """Idempotent writes of keys `{prefix}{i}` (each sent twice), recorded for the checker."""
    history = History()
    sent: dict[str, Any] = {}
    handle = client.open_log(log_name, create=True)
    with handle.open_writer(
        idempotent=True, window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS
    ) as writer:
        for attempt in range(2):
            for i in range(n):
                key = f"{prefix}{i}"
                payload = f"{prefix}payload-{i}".encode()
                start = history.now()
                result = writer.write(payload, idempotency_id=key, timeout=30)
                history.ok(wp.explicit_key(key), payload, result, start)
                assert result.duplicate is (attempt == 1)
                sent[key] = (result.message_id, payload)
    return history, sent


def judge(client: Any, log_name: str, history: History, sent: dict[str, Any]) -> None:
    """The checker passes and every acknowledged id holds the bytes written for it."""
    messages = list(client.open_log(log_name).open_reader("earliest"))
    verdict = history.check(messages, WINDOW_S * 1000, MAX_KEYS)
    assert verdict.ok, verdict.summary()
    by_id = {m.message_id: m.payload for m in messages}
    assert {by_id[mid] for mid, _ in sent.values()} == {p for _, p in sent.values()}
    assert all(by_id[mid] == payload for mid, payload in sent.values())
    assert len(messages) == len(sent)


def raw_keys(server: Any, bucket: str) -> list[str]:
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=server.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(obj["Key"] for page in pages for obj in page.get("Contents", ()))


# --- two SQLite data directories on one bucket ---------------------------------------------------


@pytest.mark.s3
def test_second_data_dir_on_the_same_bucket_and_root_is_refused(
    tmp_path: Path, wp_connect: Any, s3_server: Any
) -> None:
    bucket = f"wp-ns-{uuid.uuid4().hex[:12]}"
    config = s3_config(s3_server, bucket)
    a = wp_connect(tmp_path / "host-a", config)
    history, sent = write_keys(a, "orders", "a-", 40)  # two segments and a bit

    with pytest.raises(ObjectStoreOwnedError) as info:
        wp_connect(tmp_path / "host-b", config)
    text = str(info.value)
    assert bucket in text and "woodpecker" in text  # which bucket and root
    assert a.meta.store_id() in text  # who owns it
    assert "objectstore.root" in text and "meta" in text  # what to change
    assert isinstance(info.value, wp.WoodpeckerError)

    # host A's data is whole, and A goes on writing after the refusal
    judge(a, "orders", history, sent)
    more, more_sent = write_keys(a, "orders", "a2-", 5)
    history.attempts.extend(more.attempts)
    judge(a, "orders", history, {**sent, **more_sent})
    # every object is A's: the marker, or a key under A's identity
    keys = raw_keys(s3_server, bucket)
    owner = f"woodpecker/{a.meta.store_id()}/"
    assert "woodpecker/OWNER" in keys
    assert all(k == "woodpecker/OWNER" or k.startswith(owner) for k in keys), keys
    assert any(k.startswith(owner + "dedup_snapshot/") for k in keys)

    # a fresh client on A's data directory (same metadata store) is A: it reads everything
    again = wp_connect(tmp_path / "host-a", config)
    judge(again, "orders", history, {**sent, **more_sent})


@pytest.mark.s3
def test_data_dirs_with_different_roots_share_a_bucket_independently(
    tmp_path: Path, wp_connect: Any, s3_server: Any
) -> None:
    bucket = f"wp-ns-{uuid.uuid4().hex[:12]}"
    a = wp_connect(tmp_path / "host-a", s3_config(s3_server, bucket, root="team-a"))
    b = wp_connect(tmp_path / "host-b", s3_config(s3_server, bucket, root="team-b"))
    # the same log name gets the same numeric id in both metadata stores
    history_a, sent_a = write_keys(a, "orders", "a-", 30)
    history_b, sent_b = write_keys(b, "orders", "b-", 30)
    assert a.open_log("orders").log_id == b.open_log("orders").log_id
    judge(a, "orders", history_a, sent_a)
    judge(b, "orders", history_b, sent_b)
    keys = raw_keys(s3_server, bucket)
    for root, client in (("team-a", a), ("team-b", b)):
        mine = [k for k in keys if k.startswith(f"{root}/")]
        assert f"{root}/OWNER" in mine
        assert all(
            k == f"{root}/OWNER" or k.startswith(f"{root}/{client.meta.store_id()}/") for k in mine
        )
    # deleting A's log leaves B's alone
    a.delete_log("orders")
    judge(b, "orders", history_b, sent_b)


def test_local_directory_shared_by_two_metadata_stores_is_refused(
    tmp_path: Path, wp_connect: Any
) -> None:
    shared = tmp_path / "shared-objects"
    config = {"objectstore.path": str(shared)}
    a = wp_connect(tmp_path / "a", config)
    history, sent = write_keys(a, "events", "k", 10)
    with pytest.raises(ObjectStoreOwnedError, match="objectstore.root"):
        wp_connect(tmp_path / "b", config)
    judge(a, "events", history, sent)
    marker = json.loads((shared / "woodpecker" / "OWNER").read_bytes())
    assert marker["store_id"] == a.meta.store_id()
    assert (shared / "woodpecker" / a.meta.store_id()).is_dir()
    # another root in the same directory is another namespace
    b = wp_connect(tmp_path / "b", {**config, "objectstore.root": "other"})
    history_b, sent_b = write_keys(b, "events", "k", 10)
    judge(b, "events", history_b, sent_b)
    judge(a, "events", history, sent)


def test_embedded_default_layout(tmp_path: Path, wp_connect: Any) -> None:
    client = wp_connect(tmp_path)
    write_keys(client, "log", "k", 3)
    store_id = client.meta.store_id()
    assert str(uuid.UUID(store_id)) == store_id
    objects = tmp_path / "objects" / "woodpecker"
    assert json.loads((objects / "OWNER").read_bytes())["store_id"] == store_id
    log_id = client.open_log("log").log_id
    assert (objects / store_id / str(log_id) / "0" / "data").stat().st_size > 0
    client.close()
    # reopening the same data directory is the same store
    again = wp_connect(tmp_path)
    assert again.meta.store_id() == store_id
    assert [m.payload for m in again.open_log("log").open_reader()] == [
        b"kpayload-0",
        b"kpayload-1",
        b"kpayload-2",
    ]


def test_a_foreign_owner_object_is_refused(tmp_path: Path, wp_connect: Any) -> None:
    root = tmp_path / "objects" / "woodpecker"
    root.mkdir(parents=True)
    (root / "OWNER").write_bytes(b"not json")
    with pytest.raises(ObjectStoreOwnedError, match="something else"):
        wp_connect(tmp_path)


def test_a_data_dir_from_before_store_identities_is_refused(tmp_path: Path) -> None:
    """Schema 1 had no identity and kept objects at `{log_id}/...`: refused, not misread."""
    old = tmp_path / "old"
    old.mkdir()
    store = SqliteMetadataStore(old / "meta.sqlite")
    store.create_log("legacy", 0)
    store.close()
    with sqlite3.connect(old / "meta.sqlite") as conn:  # what an earlier version left
        conn.execute("UPDATE schema_info SET version = 1")
        conn.execute("DROP TABLE store_identity")
    with pytest.raises(ConfigError, match="earlier version") as info:
        wp.connect(old)
    assert "new data directory" in str(info.value)

    # a schema-1 store without logs holds no objects: it is upgraded in place
    empty = tmp_path / "empty"
    empty.mkdir()
    SqliteMetadataStore(empty / "meta.sqlite").close()
    with sqlite3.connect(empty / "meta.sqlite") as conn:
        conn.execute("UPDATE schema_info SET version = 1")
        conn.execute("DROP TABLE store_identity")
    client = wp.connect(empty)
    try:
        assert uuid.UUID(client.meta.store_id())
        client.open_log("new", create=True).open_writer().close()
    finally:
        client.close()


# --- one metadata store, several data directories ------------------------------------------------


@pytest.mark.s3
def test_takeover_by_another_data_dir_on_s3(
    tmp_path: Path, s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host A (its own data directory) writes with ids and is SIGKILLed; host B (another data
    directory) takes over, recovers the window from what A left on S3 (snapshot, log), resends every
    key: A's acknowledged keys come back as duplicates at A's ids, every key is in the log once.
    The metadata store is one SQLite file named by meta.path, standing in for a shared etcd."""
    from test_idem_sigkill import run_round

    n = 800

    bucket = f"wp-takeover-{uuid.uuid4().hex[:12]}"
    shared = {
        "OBJECTSTORE_TYPE": "s3",
        "OBJECTSTORE_ENDPOINT_URL": s3_server.endpoint_url,
        "OBJECTSTORE_BUCKET": bucket,
        "OBJECTSTORE_REGION": "us-east-1",
        "OBJECTSTORE_CREATE_BUCKET": "true",
        "OBJECTSTORE_ACCESS_KEY_ID": "testing",
        "OBJECTSTORE_SECRET_ACCESS_KEY": "testing",
        "META_PATH": str(tmp_path / "shared-meta.sqlite"),
    }
    for name, value in shared.items():  # the producers (tests/support/idemproc.py) read these
        monkeypatch.setenv(f"WOODPECKER_{name}", value)

    host_a = run_round(tmp_path / "host-a", n, kill_after_new=n // 3, kill_delay=None, timeout=120)
    assert host_a.killed and host_a.acks
    host_b = run_round(tmp_path / "host-b", n, kill_after_new=None, kill_delay=None, timeout=120)
    assert not host_b.killed and len(host_b.acks) == n

    history = History()
    acked_by_a = {}
    for host, rnd in (("a", host_a), ("b", host_b)):
        for key, mid, dup, at in rnd.acks:
            result = wp.WriteResult(mid, dup)
            history.ok(wp.explicit_key(key), f"payload of {key}".encode(), result, end=at)
            if host == "a":
                acked_by_a[key] = mid
            elif key in acked_by_a:
                assert (mid, dup) == (acked_by_a[key], True), (key, mid, dup)
    for key in host_a.in_flight():  # in flight when A was killed: it may have landed
        history.failed(wp.explicit_key(key), f"payload of {key}".encode(), "host A SIGKILLed")

    client = wp.connect(tmp_path / "host-c")  # a third data directory reads it all
    try:
        messages = list(client.open_log("sigkill").open_reader("earliest"))
        verdict = history.check(messages, 3600 * 1000, 100_000)
        assert verdict.ok, verdict.summary()
        assert len(messages) == n
        assert {m.idempotency_key for m in messages} == {
            wp.explicit_key(f"k-{i}") for i in range(n)
        }
        store_id = client.meta.store_id()
    finally:
        client.close()
    keys = raw_keys(s3_server, bucket)
    assert all(k == "woodpecker/OWNER" or k.startswith(f"woodpecker/{store_id}/") for k in keys)
    assert any("/dedup_snapshot/" in k for k in keys)
