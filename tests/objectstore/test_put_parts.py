"""Streamed puts (`ObjectStore.put_parts`, issue 19 item 7): a snapshot of a large window is
written a part at a time as it is encoded. The object appears whole or not at all: a failure part
way leaves the key as it was, with no temp file (local) and no multipart upload (S3) behind, and
the snapshot writer retries it."""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from woodpecker_idem._core import DedupWindow, SnapshotStream, decode_snapshot
from woodpecker_idem.errors import StorageUnavailableError
from woodpecker_idem.idempotency.snapshot import SnapshotSource, Snapshotter
from woodpecker_idem.objectstore import s3 as s3mod
from woodpecker_idem.objectstore.local import LocalObjectStore


def parts_then_fail(parts: list[bytes]) -> Iterator[bytes]:
    yield from parts
    raise StorageUnavailableError("the producer failed part way (injected)")


def test_put_parts_is_the_parts_end_to_end(object_store: Any) -> None:
    parts = [b"a" * 10, b"", os.urandom(3000), b"z"]
    assert object_store.put_parts("p/obj", iter(parts)) == 3011
    assert object_store.get("p/obj") == b"".join(parts)
    assert object_store.put_parts("p/obj", [b"new"]) == 3  # replaces
    assert object_store.get("p/obj") == b"new"
    assert object_store.put_parts("q/empty", []) == 0
    assert object_store.get("q/empty") == b""


def test_a_failure_part_way_leaves_the_key_as_it_was(object_store: Any) -> None:
    object_store.put("p/obj", b"old")
    with pytest.raises(StorageUnavailableError, match="injected"):
        object_store.put_parts("p/obj", parts_then_fail([b"x" * 100, b"y" * 100]))
    with pytest.raises(StorageUnavailableError, match="injected"):
        object_store.put_parts("p/new", parts_then_fail([b"x" * 100]))
    assert object_store.get("p/obj") == b"old"
    assert object_store.get("p/new") is None
    assert object_store.list("p/") == ["p/obj"]
    if isinstance(object_store, LocalObjectStore):
        leftovers = [p.name for p in Path(object_store.root).rglob("*") if p.is_file()]
        assert leftovers == ["obj"], leftovers  # no temp file


def bucket_uploads(store: Any) -> list[Any]:
    return store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])


@pytest.mark.s3
def test_s3_multipart_parts_and_abort(
    s3_object_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts of PART_BYTES (S3's minimum but the last); a part that fails after its retries
    aborts the upload: no object, no upload left; the next attempt writes it."""
    object_store = s3_object_store
    monkeypatch.setattr(s3mod, "PART_BYTES", 5 * 1024 * 1024)
    chunk = os.urandom(1024 * 1024)
    parts = [chunk] * 11  # three parts: 5 + 5 + 1 MiB
    sent: list[int] = []
    real = object_store.client.upload_part

    def counting(**kwargs: Any) -> Any:
        sent.append(len(kwargs["Body"]))
        return real(**kwargs)

    monkeypatch.setattr(object_store.client, "upload_part", counting)
    assert object_store.put_parts("big/obj", iter(parts)) == 11 * len(chunk)
    assert sent == [5 * len(chunk), 5 * len(chunk), len(chunk)]
    assert object_store.get("big/obj") == chunk * 11
    assert bucket_uploads(object_store) == []

    from botocore.exceptions import ClientError

    calls = 0

    def failing(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:  # the second part: refused, no retry helps
            raise ClientError(
                {"Error": {"Code": "InvalidPart", "Message": "injected"},
                 "ResponseMetadata": {"HTTPStatusCode": 400}},
                "UploadPart",
            )  # fmt: skip
        return real(**kwargs)

    monkeypatch.setattr(object_store.client, "upload_part", failing)
    with pytest.raises(StorageUnavailableError, match="InvalidPart"):
        object_store.put_parts("big/failed", iter(parts))
    assert object_store.get("big/failed") is None
    assert bucket_uploads(object_store) == []  # aborted: no parts billed forever

    # the snapshot writer counts the failure and writes the snapshot on its next attempt
    n = 400_000  # ~7.5 MB of snapshot: two parts
    window = DedupWindow(n, 3_600_000)
    window.add_committed_many(
        os.urandom(16 * n), array("q", [1]) * n, array("q", range(n)), array("q", [7]) * n
    )
    calls = 0

    def capture(now_ms: int) -> SnapshotSource:
        return SnapshotSource(SnapshotStream(window, 1, 1, now_ms, {1: n - 1}), 0)

    snapshotter = Snapshotter(
        store=object_store,
        log_id=1,
        epoch=1,
        clock_ms=lambda: 1_700_000_000_000,
        capture=capture,
        new_keys=lambda: 0,
        still_owner=lambda: True,
        interval_s=3600.0,
        threshold=10_000,
        kept=2,
    )
    try:
        assert snapshotter.write_now() is False
        assert snapshotter.failures == 1
        assert object_store.list("dedup_snapshot/") == []
        assert bucket_uploads(object_store) == []
        assert snapshotter.write_now() is True
        assert calls > 3  # the second attempt was a multipart upload too
        (key,) = object_store.list("dedup_snapshot/")
        snap = decode_snapshot(object_store.get(key))
        assert snap.entries() == window.committed_entries()
    finally:
        snapshotter.stop()
