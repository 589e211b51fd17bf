"""The newest snapshot is read while the takeover runs (`SnapshotPrefetch`, issue 32 item 1): the
rebuild uses what was read instead of reading it again, judges it against the metadata as the
takeover left it, and reads it itself when the prefetch never started."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import woodpecker_idem as wp
from woodpecker_idem.idempotency.snapshot import SnapshotPrefetch, list_snapshots
from woodpecker_idem.objectstore.local import LocalObjectStore


def _log_with_snapshot(tmp_path: Path, wp_connect: Any) -> tuple[Any, Any, list[Any]]:
    client = wp_connect(tmp_path, {"segment.max_entries": 50})
    log = client.open_log("orders", create=True)
    writer = log.open_writer(idempotent=True)
    ids = writer.write_many([b"p%d" % i for i in range(120)], [f"k{i}" for i in range(120)])
    assert writer.snapshotter.write_now()
    writer.write_many([b"q%d" % i for i in range(30)], [f"g{i}" for i in range(30)])
    return client, log, ids  # the writer is left open: the next open is a takeover


def test_a_takeover_reads_the_newest_snapshot_once(
    tmp_path: Path, wp_connect: Any, monkeypatch: Any
) -> None:
    client, log, ids = _log_with_snapshot(tmp_path, wp_connect)
    reads: list[str] = []
    get = LocalObjectStore.get

    def counting_get(self: Any, key: str) -> Any:
        if "dedup_snapshot/" in key:
            reads.append(key)
        return get(self, key)

    monkeypatch.setattr(LocalObjectStore, "get", counting_get)
    with log.open_writer(idempotent=True) as writer:
        assert writer.recovery.snapshot_key_count == 120
        assert writer.recovery.entries_replayed == 30  # the gap after the snapshot
        assert reads == [list_snapshots(client.objects, log.log_id)[-1]]
        again = writer.write_many([b"p%d" % i for i in range(120)], [f"k{i}" for i in range(120)])
        assert bytes(again.duplicate) == b"\x01" * 120  # every key still a duplicate
        assert (again.segment_ids, again.entry_ids) == (ids.segment_ids, ids.entry_ids)


class _Held:
    """A scheduler whose workers are all busy: submitted tasks wait until `release()`."""

    def __init__(self) -> None:
        self.tasks: list[Any] = []

    def submit(self, key: Any, fn: Any, *args: Any) -> bool:
        self.tasks.append((fn, args))
        return True

    def release(self) -> None:
        for fn, args in self.tasks:
            fn(*args)


def test_a_prefetch_not_started_is_read_by_the_rebuild_and_never_runs(
    tmp_path: Path, wp_connect: Any, monkeypatch: Any
) -> None:
    client, log, _ = _log_with_snapshot(tmp_path, wp_connect)
    held = _Held()
    prefetch = SnapshotPrefetch(client.objects, log.log_id, held)  # type: ignore[arg-type]
    assert prefetch.take() is None  # not started: the caller reads it itself
    reads: list[str] = []
    get = LocalObjectStore.get
    monkeypatch.setattr(
        LocalObjectStore, "get", lambda self, key: reads.append(key) or get(self, key)
    )
    held.release()  # the worker frees up later: the task sees it was taken, and reads nothing
    assert reads == []


def test_take_waits_for_a_read_under_way(tmp_path: Path, wp_connect: Any, monkeypatch: Any) -> None:
    client, log, _ = _log_with_snapshot(tmp_path, wp_connect)
    entered, go = threading.Event(), threading.Event()
    get = LocalObjectStore.get

    def slow_get(self: Any, key: str) -> Any:
        entered.set()
        assert go.wait(60)
        return get(self, key)

    monkeypatch.setattr(LocalObjectStore, "get", slow_get)
    held = _Held()
    prefetch = SnapshotPrefetch(client.objects, log.log_id, held)  # type: ignore[arg-type]
    worker = threading.Thread(target=held.release)
    worker.start()
    assert entered.wait(60)
    taken: list[Any] = []
    taker = threading.Thread(target=lambda: taken.append(prefetch.take()))
    taker.start()
    taker.join(0.2)
    assert taker.is_alive()  # waits for the read under way rather than reading again
    go.set()
    taker.join(60)
    worker.join(60)
    key, snap = taken[0]
    assert key == list_snapshots(client.objects, log.log_id)[-1]
    assert isinstance(snap, wp._core.Snapshot) and len(snap) == 120
