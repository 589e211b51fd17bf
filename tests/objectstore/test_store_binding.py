"""One metadata store, one object-store root (issue 20 item 1): a metadata store records where its
objects live when a client first uses it, and a client of that store pointed at another root is
refused before it writes anything, so it can never complete the log's segments there as empty."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_store_namespaces import judge, raw_keys, s3_config

import woodpecker_idem as wp
from woodpecker_idem.errors import ObjectStoreOwnedError
from woodpecker_idem.testing.history import History

WINDOW_S = 600
MAX_KEYS = 10_000


def _write(writer: Any, history: History, sent: dict[str, Any], keys: range) -> None:
    for i in keys:
        key, payload = f"k{i}", f"payload-{i}".encode()
        start = history.now()
        result = writer.write(payload, idempotency_id=key, timeout=30)
        history.ok(wp.explicit_key(key), payload, result, start)
        sent[key] = (result.message_id, payload)


@pytest.mark.s3
def test_a_second_root_for_one_etcd_prefix_is_refused(
    tmp_path: Path, wp_connect: Any, s3_server: Any, etcd_server: Any, etcd_prefix: str
) -> None:
    bucket = f"wp-bind-{uuid.uuid4().hex[:12]}"
    meta = {
        "meta.type": "etcd",
        "meta.endpoints": [etcd_server.endpoint],
        "meta.prefix": etcd_prefix,
    }
    a = wp_connect(tmp_path / "host-a", s3_config(s3_server, bucket, "orders", **meta))
    history: History = History()
    sent: dict[str, Any] = {}
    log = a.open_log("orders", create=True)
    with log.open_writer(
        idempotent=True, window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS
    ) as w:
        _write(w, history, sent, range(50))
    writer = log.open_writer(idempotent=True, window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    _write(writer, history, sent, range(50, 100))  # acknowledged into the ACTIVE segment

    # host B: the same etcd prefix and bucket, another root
    with pytest.raises(ObjectStoreOwnedError) as info:
        wp_connect(tmp_path / "host-b", s3_config(s3_server, bucket, "orders-b", **meta))
    text = str(info.value)
    assert f"s3://{bucket}/orders" in text and f"s3://{bucket}/orders-b" in text
    assert "objectstore.root" in text and "meta.prefix" in text  # what to change
    # B wrote nothing: no owner marker claimed for the other root, no segment sealed
    assert not any(k.startswith("orders-b/") for k in raw_keys(s3_server, bucket))
    assert log.segments()[-1].state is wp.SegmentState.ACTIVE

    # A goes on acknowledging, and every acknowledged write is in the log once
    _write(writer, history, sent, range(100, 110))
    writer.close()
    judge(a, "orders", history, sent)

    # the right root still connects from another host
    again = wp_connect(tmp_path / "host-c", s3_config(s3_server, bucket, "orders", **meta))
    judge(again, "orders", history, sent)


def test_a_sqlite_store_moved_to_another_local_root_is_refused(
    tmp_path: Path, wp_connect: Any
) -> None:
    """The local form of the same mistake: one meta.path, another objectstore.root."""
    a = wp_connect(tmp_path, {"objectstore.root": "one"})
    a.open_log("orders", create=True)
    a.close()
    with pytest.raises(ObjectStoreOwnedError, match="local:one"):
        wp_connect(tmp_path, {"objectstore.root": "two"})
    assert not (tmp_path / "objects" / "two" / "OWNER").exists()
    assert wp_connect(tmp_path, {"objectstore.root": "one"}).list_logs() == ["orders"]


def test_a_segment_is_not_sealed_empty_on_storage_that_lacks_the_log(
    tmp_path: Path, wp_connect: Any
) -> None:
    """Recovery finds none of the ACTIVE segment's files, and none of the sealed segment before
    it either: this is not where the log lives, so the segment is left ACTIVE, not sealed as
    empty over its writer's acknowledged entries."""
    client = wp_connect(tmp_path, {"append.timeout_ms": 3000})
    log = client.open_log("orders", create=True)
    with log.open_writer() as w:
        for i in range(10):
            w.write(f"a{i}".encode())
    writer = log.open_writer()
    for i in range(10):
        writer.write(f"b{i}".encode())  # acknowledged into the ACTIVE segment 1
    log_dir = Path(client.objects.root) / str(log.log_id)
    moved = tmp_path / "elsewhere"
    log_dir.rename(moved)  # the next writer's storage lacks the log's objects

    other = wp_connect(tmp_path, {"append.timeout_ms": 3000})
    with pytest.raises(wp.CorruptEntryError, match="does not hold the log"):
        other.open_log("orders").open_writer()
    assert [s.state for s in log.segments()] == [wp.SegmentState.SEALED, wp.SegmentState.ACTIVE]

    shutil.rmtree(log_dir)  # what the refused takeover left there (its fence)
    moved.rename(log_dir)  # back where it lives: every acknowledged entry is there
    other.close()  # its engine cached the fence it made there
    third = wp_connect(tmp_path)
    with third.open_log("orders").open_writer():
        pass
    got = [m.payload for m in third.open_log("orders").open_reader()]
    assert got == [f"a{i}".encode() for i in range(10)] + [f"b{i}".encode() for i in range(10)]
