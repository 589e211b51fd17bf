"""A full disk under the local object store (issue 22, docs/operations.md "A full disk"): a put
that finds no space fails with StorageUnavailableError naming the store and what to do, so the
snapshot writer counts it and retries (one warning per outage), as for an S3 outage, instead of
logging a traceback at every retry."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from woodpecker_idem._core import DedupWindow, SnapshotStream
from woodpecker_idem.errors import StorageUnavailableError
from woodpecker_idem.idempotency.snapshot import SnapshotSource, Snapshotter
from woodpecker_idem.objectstore import local
from woodpecker_idem.objectstore.local import LocalObjectStore


def _full(*args: object, **kwargs: object) -> int:
    raise OSError(errno.ENOSPC, "No space left on device", str(args[0]))


def test_a_put_on_a_full_disk_is_storage_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalObjectStore(tmp_path)
    monkeypatch.setattr(local, "put_file", _full)
    with pytest.raises(StorageUnavailableError, match="No space left on device; free space"):
        store.put("a/b", b"x")
    monkeypatch.undo()
    assert store.put("a/b", b"x") and store.get("a/b") == b"x"


def test_snapshots_on_a_full_disk_are_counted_and_retried_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = LocalObjectStore(tmp_path)
    window = DedupWindow(100, 60_000)

    def capture(now_ms: int) -> SnapshotSource:
        return SnapshotSource(SnapshotStream(window, 1, 1, now_ms, {}), 0)

    snapshotter = Snapshotter(
        store=store,
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
        monkeypatch.setattr(local, "write_all", _full)  # snapshots are streamed: put_parts
        with caplog.at_level(logging.WARNING, logger="woodpecker_idem"):
            assert snapshotter.write_now() is False
            assert snapshotter.write_now() is False
        assert snapshotter.failures == 2
        assert [r.levelname for r in caplog.records] == ["WARNING"]  # once per outage
        monkeypatch.undo()
        assert snapshotter.write_now() is True
        assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [
            "snapshot_00000000000000000001_00000001700000000000"
        ]  # no temp file left by the failed ones
    finally:
        snapshotter.stop()
