"""Metadata lost under a running client (issue 20 item 2): etcd restarted with an empty data
directory, or a metadata store restored from an older copy. The client notices that its store's
identity is gone, its writer is fenced, and no log is created over the old log's objects."""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from etcdserver import EtcdServer
from test_store_namespaces import raw_keys, s3_config

import woodpecker_idem as wp
from woodpecker_idem.errors import MetadataLostError, ObjectStoreOwnedError, WriterFencedError
from woodpecker_idem.testing.history import History

WINDOW_S = 600
MAX_KEYS = 10_000


@pytest.fixture
def own_etcd() -> Any:
    """An etcd of this test's own: it is wiped."""
    server = EtcdServer().start()
    try:
        yield server
    finally:
        server.stop()


def _wipe(server: EtcdServer) -> None:
    """Restart etcd on the same ports with an empty data directory."""
    server.terminate()
    assert server._dir is not None
    shutil.rmtree(os.path.join(server._dir, "data"))
    server.start()


def _writer(log: Any) -> Any:
    return log.open_writer(idempotent=True, window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)


@pytest.mark.s3
def test_etcd_wiped_under_a_running_client(
    tmp_path: Path, wp_connect: Any, s3_server: Any, own_etcd: EtcdServer
) -> None:
    bucket = f"wp-lost-{uuid.uuid4().hex[:12]}"
    config = s3_config(
        s3_server,
        bucket,
        **{
            "meta.type": "etcd",
            "meta.endpoints": [own_etcd.endpoint],
            "meta.prefix": "/shared",
            "meta.timeout_ms": 2000,
            "idempotency.snapshot_interval_s": 0.2,
            "idempotency.snapshot_threshold": 5,
        },
    )
    client = wp_connect(tmp_path / "host-a", config)
    log = client.open_log("orders", create=True)
    with _writer(log) as w:
        for i in range(50):
            w.write(f"p{i}".encode(), idempotency_id=f"k{i}", timeout=30)
    writer = _writer(log)
    for i in range(50, 60):
        writer.write(f"p{i}".encode(), idempotency_id=f"k{i}", timeout=30)

    _wipe(own_etcd)

    # the running writer finds out (its owner check or lease renewal) and is fenced
    deadline = time.monotonic() + 60  # a safety net: the lease renewal alone is every 10 s
    i = 60
    with pytest.raises(WriterFencedError) as info:
        while time.monotonic() < deadline:
            writer.write(f"p{i}".encode(), idempotency_id=f"k{i}", timeout=5)
            i += 1
            time.sleep(0.05)
    assert "identity of this metadata store" in str(info.value), info.value
    before = raw_keys(s3_server, bucket)

    # the running client refuses to create a log again over the old objects
    for name in ("orders", "other"):
        with pytest.raises(MetadataLostError, match="identity") as lost:
            client.open_log(name, create=True)
        assert lost.value.code == "METADATA_LOST" and not lost.value.retriable
    # a fresh client is refused too (the root belongs to the lost identity)
    with pytest.raises(ObjectStoreOwnedError):
        wp_connect(tmp_path / "host-b", config)
    assert raw_keys(s3_server, bucket) == before  # nothing written over the old log


def test_store_restored_from_an_older_copy_does_not_reuse_a_log_id(
    tmp_path: Path, wp_connect: Any
) -> None:
    """A log id whose objects exist is not handed out again (the SQLite file restored from a copy
    taken before the log was created): the new log is refused and its record undone."""
    first = wp_connect(tmp_path)
    first.list_logs()
    copy = tmp_path / "meta-backup.sqlite"
    with sqlite3.connect(tmp_path / "meta.sqlite") as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    log = first.open_log("orders", create=True)
    with _writer(log) as w:
        for i in range(30):
            w.write(f"p{i}".encode(), idempotency_id=f"k{i}", timeout=30)
    first.close()

    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"meta.sqlite{suffix}").unlink(missing_ok=True)
    shutil.copy(copy, tmp_path / "meta.sqlite")
    client = wp_connect(tmp_path)
    assert client.list_logs() == []
    with pytest.raises(MetadataLostError, match="already has objects"):
        client.open_log("payments", create=True)
    assert client.list_logs() == []  # the record was undone
    # the old log's objects are untouched
    assert client.objects.list("1/") and client.objects.list("dedup_snapshot/1/")


def test_a_footer_the_writer_did_not_write_is_not_adopted_by_position(
    tmp_path: Path, wp_connect: Any
) -> None:
    """A new log whose segment 0 already holds another log's completed entries (what a forgotten
    log leaves): the writer's add is refused there, the repair finds the old footer, and the
    pending write must not be acknowledged at the old entry its position names."""
    client = wp_connect(tmp_path)
    old = client.open_log("old", create=True)
    with _writer(old) as w:
        for i in range(50):
            w.write(f"old-{i}".encode(), idempotency_id=f"k{i}", timeout=30)
    new = client.open_log("new", create=True)
    root = Path(client.objects.root)
    shutil.copytree(root / str(old.log_id) / "0", root / str(new.log_id) / "0")

    history = History()
    writer = _writer(new)
    payload = b"new-60"
    with pytest.raises(WriterFencedError, match="other bytes"):
        history.call(
            wp.explicit_key("k60"),
            payload,
            lambda: writer.write(payload, idempotency_id="k60", timeout=30),
        )
    writer.close()
    assert not any(a.ok for a in history.attempts)
