"""The MetadataStore contract, run against every backend.

Every test in the first part uses only the abstract interface through the `meta_store` fixture (and
`meta_opener`, a picklable zero-argument callable that opens another handle on the same store, for
other threads and processes). To add a backend, add a param to `meta_opener`. The last part tests
SQLite specifics (fork safety, WAL, lock timeout).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from woodpecker_idem.errors import (
    ConfigError,
    InvalidArgumentError,
    LogExistsError,
    LogGroupSizeMismatchError,
    LogNotFoundError,
    MetadataConflictError,
    ReaderFencedError,
    StorageUnavailableError,
    WoodpeckerError,
    WriterFencedError,
)
from woodpecker_idem.meta import (
    LogGroupMeta,
    MetadataStore,
    NodeInfo,
    ReaderMeta,
    SegmentMeta,
    SqliteMetadataStore,
    TxnMeta,
    open_metadata_store,
)
from woodpecker_idem.meta.base import MIN_NODE_TTL_MS
from woodpecker_idem.types import LogMessageId, SegmentState

NOW = 1_700_000_000_000
WAIT_S = 60  # a generous deadline for what happens in the background (a lapse, a renewal)
Opener = Callable[[], MetadataStore]


@pytest.fixture(params=["sqlite", "etcd"])
def meta_opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """A picklable callable opening a new handle on one shared store (per backend)."""
    if request.param == "sqlite":
        return functools.partial(open_metadata_store, "sqlite", path=str(tmp_path / "meta.sqlite"))
    if request.param == "etcd":
        server = request.getfixturevalue("etcd_server")
        prefix = request.getfixturevalue("etcd_prefix")
        return functools.partial(
            open_metadata_store, "etcd", endpoints=[server.endpoint], prefix=prefix
        )
    raise AssertionError(f"unknown backend {request.param}")  # pragma: no cover


@pytest.fixture
def meta_store(meta_opener: Opener) -> Iterator[MetadataStore]:
    store = meta_opener()
    yield store
    store.close()


def _segment(log_id: int, segment_id: int = 0, **kw: object) -> SegmentMeta:
    fields: dict[str, object] = {
        "log_id": log_id,
        "segment_id": segment_id,
        "state": SegmentState.ACTIVE,
        "nodes": ("n1",),
        "es": 1,
        "wq": 1,
        "aq": 1,
        "created_ms": NOW,
    }
    fields.update(kw)
    return SegmentMeta(**fields)  # type: ignore[arg-type]


def _replace(seg: SegmentMeta, **kw: object) -> SegmentMeta:
    import dataclasses

    return dataclasses.replace(seg, **kw)  # type: ignore[arg-type]


# --- identity ------------------------------------------------------------------------------------


def _store_id_worker(opener: Opener) -> str:
    """Process entry point: open a handle and report the store's identity."""
    store = opener()
    try:
        return store.store_id()
    finally:
        store.close()


def test_store_id_is_created_once_and_shared_by_every_handle(meta_opener: Opener) -> None:
    """The first opens race (threads with their own handles, and processes): one identity wins,
    every handle sees it, and it survives reopening."""
    import uuid

    barrier = threading.Barrier(4)
    seen: list[str] = []
    lock = threading.Lock()

    def first_open() -> None:
        barrier.wait(timeout=30)
        sid = _store_id_worker(meta_opener)
        with lock:
            seen.append(sid)

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        procs = [pool.apply_async(_store_id_worker, (meta_opener,)) for _ in range(2)]
        threads = [threading.Thread(target=first_open) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        seen.extend(r.get(timeout=60) for r in procs)
    assert len(seen) == 6 and len(set(seen)) == 1, seen
    assert str(uuid.UUID(seen[0])) == seen[0]
    again = meta_opener()
    try:
        again.create_log("a", NOW)
        assert again.store_id() == seen[0]
    finally:
        again.close()
    assert _store_id_worker(meta_opener) == seen[0]


def test_different_stores_have_different_ids(tmp_path: Path) -> None:
    a = SqliteMetadataStore(tmp_path / "a.sqlite")
    b = SqliteMetadataStore(tmp_path / "b.sqlite")
    try:
        assert a.store_id() != b.store_id()
    finally:
        a.close()
        b.close()


# --- logs ----------------------------------------------------------------------------------------


def test_create_get_list_delete_logs(meta_store: MetadataStore) -> None:
    a = meta_store.create_log("a", NOW)
    b = meta_store.create_log("b", NOW + 1, group="g")
    assert a.name == "a" and a.created_ms == NOW and a.writer_epoch == 0
    assert a.truncated_to is None and a.group == "" and a.lease_owner == ""
    assert b.group == "g" and b.log_id > a.log_id
    assert meta_store.get_log("a") == a
    assert meta_store.get_log_by_id(b.log_id) == b
    assert [m.name for m in meta_store.list_logs()] == ["a", "b"]
    assert meta_store.delete_log("a") == a
    assert [m.name for m in meta_store.list_logs()] == ["b"]
    with pytest.raises(LogNotFoundError):
        meta_store.get_log("a")
    with pytest.raises(LogNotFoundError):
        meta_store.get_log_by_id(a.log_id)


def test_log_ids_are_never_reused(meta_store: MetadataStore) -> None:
    seen = set()
    for i in range(3):
        seen.add(meta_store.create_log(f"l{i}", NOW).log_id)
    meta_store.delete_log("l2")  # delete the newest: a naive max(id)+1 would reuse it
    meta_store.delete_log("l0")
    again = meta_store.create_log("l2", NOW)
    assert again.log_id not in seen
    assert again.log_id > max(seen)
    assert len(seen) == 3


def test_log_errors(meta_store: MetadataStore) -> None:
    meta_store.create_log("a", NOW)
    with pytest.raises(LogExistsError, match="'a'"):
        meta_store.create_log("a", NOW)
    for call in (
        lambda: meta_store.get_log("missing"),
        lambda: meta_store.get_log_by_id(10_000),
        lambda: meta_store.delete_log("missing"),
        lambda: meta_store.take_over(10_000, "w", NOW, 1000),
        lambda: meta_store.set_truncation(10_000, LogMessageId(0, 0)),
    ):
        with pytest.raises(LogNotFoundError) as info:
            call()
        assert isinstance(info.value, LookupError)
        assert info.value.code == "LOG_NOT_FOUND"


def test_bad_log_name(meta_store: MetadataStore) -> None:
    with pytest.raises(InvalidArgumentError):
        meta_store.create_log("", NOW)


def test_delete_log_removes_segments(meta_store: MetadataStore) -> None:
    m = meta_store.create_log("a", NOW)
    epoch = meta_store.take_over(m.log_id, "w", NOW, 1000)
    for sid in range(3):
        meta_store.create_segment(epoch, _segment(m.log_id, sid))
    other = meta_store.create_log("b", NOW)
    e2 = meta_store.take_over(other.log_id, "w", NOW, 1000)
    meta_store.create_segment(e2, _segment(other.log_id, 0))
    meta_store.delete_log("a")
    assert meta_store.list_segments(m.log_id) == []
    assert meta_store.get_segment(m.log_id, 0) is None
    assert len(meta_store.list_segments(other.log_id)) == 1


# --- epochs and fencing --------------------------------------------------------------------------


def test_take_over_bumps_epoch_and_records_lease(meta_store: MetadataStore) -> None:
    m = meta_store.create_log("a", NOW)
    e1 = meta_store.take_over(m.log_id, "A", NOW, 5000)
    e2 = meta_store.take_over(m.log_id, "B", NOW + 10, 5000)
    assert e2 > e1 > m.writer_epoch
    cur = meta_store.get_log("a")
    assert cur.writer_epoch == e2
    assert cur.lease_owner == "B" and cur.lease_expires_ms == NOW + 10 + 5000
    assert cur.revision > m.revision
    meta_store.renew_lease(m.log_id, e2, "B", NOW + 100, 5000)
    assert meta_store.get_log("a").lease_expires_ms == NOW + 100 + 5000
    meta_store.check_epoch(m.log_id, e2)


def test_a_released_lease_ends_now_and_only_its_epoch_releases_it(
    meta_store: MetadataStore,
) -> None:
    m = meta_store.create_log("a", NOW)
    ea = meta_store.take_over(m.log_id, "A", NOW, 30_000)
    eb = meta_store.take_over(m.log_id, "B", NOW, 30_000)
    with pytest.raises(WriterFencedError):
        meta_store.release_lease(m.log_id, ea, "A", NOW + 5)  # a taken-over writer's is not its
    assert meta_store.get_log("a").lease_expires_ms == NOW + 30_000
    meta_store.release_lease(m.log_id, eb, "B", NOW + 5)
    cur = meta_store.get_log("a")
    assert cur.lease_expires_ms <= NOW + 5 and cur.writer_epoch == eb  # ended, not taken over
    meta_store.check_epoch(m.log_id, eb)


def test_take_over_fences_the_old_writer(meta_store: MetadataStore) -> None:
    m = meta_store.create_log("a", NOW)
    ea = meta_store.take_over(m.log_id, "A", NOW, 5000)
    seg = meta_store.create_segment(ea, _segment(m.log_id, 0))
    eb = meta_store.take_over(m.log_id, "B", NOW, 5000)

    fenced = [
        lambda: meta_store.create_segment(ea, _segment(m.log_id, 1)),
        lambda: meta_store.update_segment(ea, _replace(seg, size_bytes=1)),
        lambda: meta_store.renew_lease(m.log_id, ea, "A", NOW, 5000),
        lambda: meta_store.check_epoch(m.log_id, ea),
    ]
    for call in fenced:
        with pytest.raises(WriterFencedError) as info:
            call()
        text = str(info.value)
        assert str(ea) in text and str(eb) in text and "'a'" in text  # names log and epochs
    # Nothing the fenced writer tried took effect.
    assert meta_store.get_segment(m.log_id, 1) is None
    assert meta_store.get_segment(m.log_id, 0) == seg
    assert meta_store.get_log("a").lease_owner == "B"
    # The new writer is not fenced, and an unconditioned update (epoch None) still works.
    meta_store.check_epoch(m.log_id, eb)
    done = meta_store.update_segment(eb, _replace(seg, state=SegmentState.COMPLETED))
    meta_store.update_segment(None, _replace(done, state=SegmentState.SEALED))


def test_epoch_from_the_future_is_refused(meta_store: MetadataStore) -> None:
    m = meta_store.create_log("a", NOW)
    e = meta_store.take_over(m.log_id, "A", NOW, 5000)
    with pytest.raises(WriterFencedError):
        meta_store.check_epoch(m.log_id, e + 1)
    with pytest.raises(WriterFencedError):
        meta_store.create_segment(e + 1, _segment(m.log_id))


def test_concurrent_take_over_threads_get_distinct_epochs(
    meta_store: MetadataStore, meta_opener: Opener
) -> None:
    m = meta_store.create_log("a", NOW)
    barrier = threading.Barrier(8)
    epochs: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        try:
            barrier.wait()
            e = meta_store.take_over(m.log_id, f"w{i}", NOW, 1000)
            with lock:
                epochs.append(e)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len(set(epochs)) == 8
    assert meta_store.get_log("a").writer_epoch == max(epochs)


# --- segments ------------------------------------------------------------------------------------


def test_segment_create_get_list(meta_store: MetadataStore) -> None:
    m = meta_store.create_log("a", NOW)
    e = meta_store.take_over(m.log_id, "A", NOW, 5000)
    s1 = meta_store.create_segment(e, _segment(m.log_id, 1, nodes=("n2", "n1", "n3"), es=3, wq=3))
    s0 = meta_store.create_segment(e, _segment(m.log_id, 0))
    assert s1.nodes == ("n2", "n1", "n3") and s1.es == 3 and s1.state is SegmentState.ACTIVE
    assert s1.last_entry_id == -1 and s1.revision > 0
    assert meta_store.get_segment(m.log_id, 1) == s1
    assert meta_store.get_segment(m.log_id, 7) is None
    assert meta_store.list_segments(m.log_id) == [s0, s1]
    with pytest.raises(MetadataConflictError):
        meta_store.create_segment(e, _segment(m.log_id, 1))
    meta_store.delete_segment(m.log_id, 0)
    assert meta_store.list_segments(m.log_id) == [s1]
    meta_store.delete_segment(m.log_id, 0)  # absent: not an error


def test_update_segment_cas(meta_store: MetadataStore) -> None:
    m = meta_store.create_log("a", NOW)
    e = meta_store.take_over(m.log_id, "A", NOW, 5000)
    seg = meta_store.create_segment(e, _segment(m.log_id))
    done = meta_store.update_segment(
        e,
        _replace(
            seg, state=SegmentState.COMPLETED, last_entry_id=41, completed_ms=NOW + 5, size_bytes=9
        ),
    )
    assert done.revision > seg.revision
    assert done.state is SegmentState.COMPLETED and done.last_entry_id == 41
    assert done.completed_ms == NOW + 5 and done.size_bytes == 9
    assert meta_store.get_segment(m.log_id, 0) == done
    # Writing with the stale revision loses.
    with pytest.raises(MetadataConflictError) as info:
        meta_store.update_segment(e, _replace(seg, size_bytes=100))
    assert info.value.retriable
    assert meta_store.get_segment(m.log_id, 0) == done
    # Updating a segment that does not exist is a conflict, too.
    with pytest.raises(MetadataConflictError):
        meta_store.update_segment(e, _segment(m.log_id, 9))


def _cas_increments(store: MetadataStore, log_id: int, n: int) -> int:
    """Increment segment 0's size_bytes n times with read / CAS / retry; returns conflicts seen."""
    conflicts = 0
    for _ in range(n):
        while True:
            seg = store.get_segment(log_id, 0)
            assert seg is not None
            try:
                store.update_segment(None, _replace(seg, size_bytes=seg.size_bytes + 1))
                break
            except MetadataConflictError:
                conflicts += 1
    return conflicts


def _cas_increment_worker(opener: Opener, log_id: int, n: int) -> int:
    """Process entry point: opens its own handle (nothing inherited) and increments."""
    store = opener()
    try:
        return _cas_increments(store, log_id, n)
    finally:
        store.close()


def test_cas_from_four_processes_loses_no_update(
    meta_store: MetadataStore, meta_opener: Opener
) -> None:
    m = meta_store.create_log("a", NOW)
    e = meta_store.take_over(m.log_id, "A", NOW, 5000)
    meta_store.create_segment(e, _segment(m.log_id))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = [
            pool.apply_async(_cas_increment_worker, (meta_opener, m.log_id, 25)) for _ in range(4)
        ]
        for r in results:
            r.get(timeout=60)
    seg = meta_store.get_segment(m.log_id, 0)
    assert seg is not None and seg.size_bytes == 100


def test_cas_from_threads_loses_no_update(meta_store: MetadataStore, meta_opener: Opener) -> None:
    """Threads sharing one handle and threads with their own handles, all racing."""
    m = meta_store.create_log("a", NOW)
    e = meta_store.take_over(m.log_id, "A", NOW, 5000)
    meta_store.create_segment(e, _segment(m.log_id))
    errors: list[BaseException] = []

    def run(target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    jobs: list[Callable[[], object]] = [
        functools.partial(_cas_increment_worker, meta_opener, m.log_id, 20) for _ in range(2)
    ]
    jobs += [functools.partial(_cas_increments, meta_store, m.log_id, 20) for _ in range(3)]
    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    seg = meta_store.get_segment(m.log_id, 0)
    assert seg is not None and seg.size_bytes == 100


# --- truncation ----------------------------------------------------------------------------------


def test_truncation_only_moves_forward(meta_store: MetadataStore) -> None:
    m = meta_store.create_log("a", NOW)
    assert meta_store.set_truncation(m.log_id, LogMessageId(2, 5)).truncated_to == (2, 5)
    assert meta_store.set_truncation(m.log_id, LogMessageId(1, 99)).truncated_to == (2, 5)
    assert meta_store.set_truncation(m.log_id, LogMessageId(2, 4)).truncated_to == (2, 5)
    assert meta_store.set_truncation(m.log_id, LogMessageId(2, 5)).truncated_to == (2, 5)
    after = meta_store.set_truncation(m.log_id, LogMessageId(3, 0))
    assert after.truncated_to == LogMessageId(3, 0)
    assert isinstance(meta_store.get_log("a").truncated_to, LogMessageId)
    assert meta_store.get_log("a").truncated_to == (3, 0)


# --- log groups ----------------------------------------------------------------------------------


def test_log_groups(meta_store: MetadataStore) -> None:
    assert meta_store.get_log_group("g") is None
    g = meta_store.create_log_group("g", 4, NOW)
    assert g == LogGroupMeta("g", 4, NOW)
    assert meta_store.create_log_group("g", 4, NOW + 100) == g  # returns the existing group
    assert meta_store.get_log_group("g") == g
    with pytest.raises(LogGroupSizeMismatchError) as info:
        meta_store.create_log_group("g", 5, NOW)
    assert "4" in str(info.value) and "5" in str(info.value)
    assert isinstance(info.value, ValueError)
    assert meta_store.get_log_group("g") == g
    with pytest.raises(InvalidArgumentError):
        meta_store.create_log_group("h", 0, NOW)


# --- batch identities ----------------------------------------------------------------------------


def test_txn_records_create_replace_and_list(meta_store: MetadataStore) -> None:
    m = meta_store.create_log("a", NOW)
    epoch = meta_store.take_over(m.log_id, "w", NOW, 1000)
    assert meta_store.get_txn(m.log_id, "job") is None
    assert meta_store.list_txns(m.log_id) == []
    first = TxnMeta(m.log_id, "job", 3, LogMessageId(2, 7), writer="p0", updated_ms=NOW)
    stored = meta_store.put_txn(epoch, first)
    assert stored.revision > 0
    assert meta_store.get_txn(m.log_id, "job") == stored
    with pytest.raises(MetadataConflictError):  # revision 0: must be absent
        meta_store.put_txn(epoch, first)
    done = meta_store.put_txn(epoch, TxnMeta(**{**_fields(stored), "committed": True}))
    assert done.committed and done.revision != stored.revision
    with pytest.raises(MetadataConflictError):  # a stale revision: another writer moved first
        meta_store.put_txn(epoch, TxnMeta(**{**_fields(stored), "version": 4}))
    assert meta_store.get_txn(m.log_id, "job") == done
    # app ids are free text (a query id, a name with slashes)
    other = meta_store.put_txn(epoch, TxnMeta(m.log_id, "a/b c", 0, LogMessageId(0, 0)))
    assert meta_store.list_txns(m.log_id) == [other, done]
    meta_store.delete_txn(m.log_id, "a/b c")
    meta_store.delete_txn(m.log_id, "a/b c")  # absent: nothing to do
    assert meta_store.list_txns(m.log_id) == [done]


def _fields(t: TxnMeta) -> dict[str, object]:
    return {f: getattr(t, f) for f in TxnMeta.__slots__}


def test_txn_records_are_fenced_per_log(meta_store: MetadataStore) -> None:
    m = meta_store.create_log("a", NOW)
    old = meta_store.take_over(m.log_id, "A", NOW, 1000)
    new = meta_store.take_over(m.log_id, "B", NOW, 1000)
    with pytest.raises(WriterFencedError):
        meta_store.put_txn(old, TxnMeta(m.log_id, "job", 1, LogMessageId(0, 0)))
    assert meta_store.get_txn(m.log_id, "job") is None
    meta_store.put_txn(new, TxnMeta(m.log_id, "job", 1, LogMessageId(0, 0)))
    b = meta_store.create_log("b", NOW)
    assert meta_store.get_txn(b.log_id, "job") is None  # per log
    with pytest.raises(LogNotFoundError):
        meta_store.put_txn(new, TxnMeta(999, "job", 1, LogMessageId(0, 0)))


def test_txn_records_refuse_bad_input(meta_store: MetadataStore) -> None:
    m = meta_store.create_log("a", NOW)
    epoch = meta_store.take_over(m.log_id, "w", NOW, 1000)
    for bad in (
        TxnMeta(m.log_id, "", 1, LogMessageId(0, 0)),
        TxnMeta(m.log_id, "job", -1, LogMessageId(0, 0)),
    ):
        with pytest.raises(InvalidArgumentError):
            meta_store.put_txn(epoch, bad)
    assert meta_store.list_txns(m.log_id) == []


def test_delete_log_removes_txn_records(meta_store: MetadataStore) -> None:
    m = meta_store.create_log("a", NOW)
    epoch = meta_store.take_over(m.log_id, "w", NOW, 1000)
    meta_store.put_txn(epoch, TxnMeta(m.log_id, "job", 1, LogMessageId(0, 0)))
    meta_store.delete_log("a")
    assert meta_store.list_txns(m.log_id) == []
    assert meta_store.get_txn(m.log_id, "job") is None


# --- named readers -------------------------------------------------------------------------------


def test_named_reader_created_at_start_then_resumed_at_its_commit(
    meta_store: MetadataStore,
) -> None:
    m = meta_store.create_log("a", NOW)
    assert meta_store.get_reader(m.log_id, "billing") is None
    first = meta_store.take_reader(m.log_id, "billing", "host:1", LogMessageId(2, 5), NOW)
    assert (first.position, first.epoch, first.owner) == (LogMessageId(2, 5), 1, "host:1")
    assert meta_store.get_reader(m.log_id, "billing") == first
    done = meta_store.commit_reader(m.log_id, "billing", 1, LogMessageId(3, 7), NOW + 1)
    assert done.position == LogMessageId(3, 7) and done.updated_ms == NOW + 1
    assert meta_store.get_reader(m.log_id, "billing") == done
    # a second open: the name exists, so `start` is ignored and the epoch moves on
    again = meta_store.take_reader(m.log_id, "billing", "host:2", LogMessageId(0, 0), NOW + 2)
    assert (again.position, again.epoch, again.owner) == (LogMessageId(3, 7), 2, "host:2")
    # a commit may move back too (a consumer that replays on purpose)
    back = meta_store.commit_reader(m.log_id, "billing", 2, LogMessageId(1, 0), NOW + 3)
    assert meta_store.get_reader(m.log_id, "billing") == back
    assert back.position == LogMessageId(1, 0)


def test_named_reader_open_fences_the_earlier_holder(meta_store: MetadataStore) -> None:
    m = meta_store.create_log("a", NOW)
    old = meta_store.take_reader(m.log_id, "r", "A", LogMessageId(0, 0), NOW)
    meta_store.commit_reader(m.log_id, "r", old.epoch, LogMessageId(0, 4), NOW)
    new = meta_store.take_reader(m.log_id, "r", "B", LogMessageId(0, 0), NOW)
    assert new.epoch > old.epoch
    with pytest.raises(ReaderFencedError, match=r"reader 'r'.*opened again by B") as info:
        meta_store.commit_reader(m.log_id, "r", old.epoch, LogMessageId(0, 9), NOW)
    assert info.value.code == "READER_FENCED" and not info.value.retriable
    assert meta_store.get_reader(m.log_id, "r").position == LogMessageId(0, 4)  # type: ignore[union-attr]
    meta_store.commit_reader(m.log_id, "r", new.epoch, LogMessageId(0, 9), NOW)
    # deleting the name fences its holder too
    assert meta_store.delete_reader(m.log_id, "r") is not None
    with pytest.raises(ReaderFencedError, match="deleted"):
        meta_store.commit_reader(m.log_id, "r", new.epoch, LogMessageId(0, 10), NOW)
    assert meta_store.get_reader(m.log_id, "r") is None


def _open_reader_worker(opener: Opener, log_id: int, n: int) -> list[int]:
    store = opener()
    try:
        return [
            store.take_reader(log_id, "r", "p", LogMessageId(0, 0), NOW).epoch for _ in range(n)
        ]
    finally:
        store.close()


def test_concurrent_reader_opens_get_distinct_epochs(
    meta_store: MetadataStore, meta_opener: Opener
) -> None:
    m = meta_store.create_log("a", NOW)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        results = pool.starmap(_open_reader_worker, [(meta_opener, m.log_id, 5)] * 3)
    epochs = [e for r in results for e in r]
    assert sorted(epochs) == list(range(1, 16))  # every open its own epoch: one holder at a time


def test_named_readers_list_delete_and_per_log(meta_store: MetadataStore) -> None:
    m = meta_store.create_log("a", NOW)
    b = meta_store.create_log("b", NOW)
    assert meta_store.list_readers(m.log_id) == []
    zed = meta_store.take_reader(m.log_id, "zed", "", LogMessageId(0, 0), NOW)
    slash = meta_store.take_reader(m.log_id, "a/b c", "", LogMessageId(1, 2), NOW)
    other = meta_store.take_reader(b.log_id, "zed", "", LogMessageId(5, 0), NOW)
    assert meta_store.list_readers(m.log_id) == [slash, zed]
    assert meta_store.list_readers(b.log_id) == [other]
    assert meta_store.delete_reader(m.log_id, "a/b c") == slash
    assert meta_store.delete_reader(m.log_id, "a/b c") is None  # absent: nothing to do
    assert meta_store.list_readers(m.log_id) == [zed]
    meta_store.delete_log("a")
    assert meta_store.list_readers(m.log_id) == []
    assert meta_store.list_readers(b.log_id) == [other]
    with pytest.raises(LogNotFoundError):
        meta_store.take_reader(m.log_id, "zed", "", LogMessageId(0, 0), NOW)
    for name, pos in (("", LogMessageId(0, 0)), ("x", (0, -1))):
        with pytest.raises(InvalidArgumentError):
            meta_store.take_reader(b.log_id, name, "", pos, NOW)  # type: ignore[arg-type]
    assert isinstance(other, ReaderMeta)


# --- node registry -------------------------------------------------------------------------------


def test_node_registry(meta_store: MetadataStore) -> None:
    assert meta_store.list_nodes() == []
    n2 = NodeInfo("n2", "host2:7000", NOW, {"zone": "b"})
    n1 = NodeInfo("n1", "inproc://n1", NOW, {})
    meta_store.register_node(n2)
    meta_store.register_node(n1)
    assert meta_store.list_nodes() == [n1, n2]
    moved = NodeInfo("n2", "host9:7000", NOW + 1, {"zone": "c", "rack": "r1"})
    meta_store.register_node(moved)  # re-registering replaces
    assert meta_store.list_nodes() == [n1, moved]
    meta_store.unregister_node("n1")
    meta_store.unregister_node("n1")  # absent: not an error
    assert meta_store.list_nodes() == [moved]


def _registered_node_process(opener: Opener, node: NodeInfo, ttl_ms: int, ready: Any) -> None:
    """Process entry point: a node's registration with a TTL, renewed until the process dies."""
    store = opener()
    store.register_node(node, ttl_ms)
    ready.set()
    while True:
        time.sleep(60)


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.05)


def test_a_node_registration_with_a_ttl_lives_while_renewed_and_lapses_when_its_process_dies(
    meta_store: MetadataStore, meta_opener: Opener
) -> None:
    """A node process's registration (`ttl_ms`): frozen (SIGSTOP) past its TTL it drops out of
    `list_nodes`, thawed it is back (renewed, or registered again on etcd, by the process's own
    handle), SIGKILLed it drops out for good; a registration without a TTL stays throughout,
    and the same id registered again by another process is listed again."""
    forever = NodeInfo("inproc", "inproc://inproc", NOW)
    meta_store.register_node(forever)
    node = NodeInfo("n1", "127.0.0.1:7001", NOW)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(
        target=_registered_node_process, args=(meta_opener, node, MIN_NODE_TTL_MS, ready)
    )
    child.start()
    assert child.pid is not None
    try:
        assert ready.wait(WAIT_S), "the node process did not register"
        assert meta_store.list_nodes() == [forever, node]
        os.kill(child.pid, signal.SIGSTOP)  # renewals stop: the registration lapses
        _until(lambda: meta_store.list_nodes() == [forever], "a frozen node's registration lapses")
        os.kill(child.pid, signal.SIGCONT)
        _until(lambda: meta_store.list_nodes() == [forever, node], "a thawed node is back")
        os.kill(child.pid, signal.SIGKILL)
        child.join(WAIT_S)
        _until(lambda: meta_store.list_nodes() == [forever], "a killed node's registration lapses")
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGCONT)
            os.kill(child.pid, signal.SIGKILL)
            child.join(WAIT_S)
    restarted = NodeInfo("n1", "127.0.0.1:7002", NOW + 1)
    meta_store.register_node(restarted, MIN_NODE_TTL_MS)  # the same id, from another process
    assert meta_store.list_nodes() == [forever, restarted]
    meta_store.unregister_node("n1")
    assert meta_store.list_nodes() == [forever]
    for bad in (0, MIN_NODE_TTL_MS - 1, 2.5):
        with pytest.raises(InvalidArgumentError, match="ttl_ms"):
            meta_store.register_node(node, bad)  # type: ignore[arg-type]


# --- members of a log group ----------------------------------------------------------------------


def test_group_members_live_until_their_time_runs_out(
    meta_store: MetadataStore, meta_opener: Opener
) -> None:
    assert meta_store.list_group_members("g", NOW) == []
    meta_store.join_group("g", "host:2:b", NOW, 1000)
    meta_store.join_group("g", "host:1:a", NOW, 3000)
    meta_store.join_group("other", "host:3:c", NOW, 9000)
    other = meta_opener()
    try:
        assert other.list_group_members("g", NOW) == ["host:1:a", "host:2:b"]
        assert other.list_group_members("g", NOW + 1000) == ["host:1:a"]  # b's time ran out
        other.join_group("g", "host:2:b", NOW + 1500, 1000)  # joins again: renewed
        assert meta_store.list_group_members("g", NOW + 2000) == ["host:1:a", "host:2:b"]
        meta_store.leave_group("g", "host:1:a")
        meta_store.leave_group("g", "host:1:a")  # gone: not an error
        assert other.list_group_members("g", NOW + 2000) == ["host:2:b"]
        assert other.list_group_members("other", NOW + 2000) == ["host:3:c"]
        assert other.list_group_members("g", NOW + 2500) == []
    finally:
        other.close()
    with pytest.raises(InvalidArgumentError):
        meta_store.join_group("g", "", NOW, 1000)


def test_state_survives_reopen(meta_store: MetadataStore, meta_opener: Opener) -> None:
    m = meta_store.create_log("a", NOW)
    e = meta_store.take_over(m.log_id, "A", NOW, 5000)
    seg = meta_store.create_segment(e, _segment(m.log_id))
    other = meta_opener()
    try:
        assert other.get_log("a").writer_epoch == e
        assert other.get_segment(m.log_id, 0) == seg
        with pytest.raises(WriterFencedError):
            other.check_epoch(m.log_id, e - 1)
    finally:
        other.close()


# --- open_metadata_store -------------------------------------------------------------------------


def test_open_metadata_store_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="meta.endpoints"):
        open_metadata_store("etcd", endpoints=[])
    with pytest.raises(ConfigError, match="sqlite, etcd"):
        open_metadata_store("zookeeper")
    with pytest.raises(ConfigError, match="meta.path"):
        open_metadata_store("sqlite")
    store = open_metadata_store("sqlite", path=tmp_path / "sub" / "m.sqlite")
    assert isinstance(store, SqliteMetadataStore)
    store.close()


# --- SQLite specifics ----------------------------------------------------------------------------


def _fork_child(store: SqliteMetadataStore, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    try:
        m = store.get_log("a")
        epoch = store.take_over(m.log_id, "child", NOW, 1000)
        queue.put(epoch)
    except BaseException as exc:  # pragma: no cover - reported in the parent
        queue.put(repr(exc))


def test_sqlite_new_connection_after_fork(tmp_path: Path) -> None:
    store = SqliteMetadataStore(tmp_path / "m.sqlite")
    m = store.create_log("a", NOW)  # the parent now holds a connection
    e1 = store.take_over(m.log_id, "parent", NOW, 1000)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_fork_child, args=(store, queue))
    proc.start()
    child_epoch = queue.get(timeout=30)
    proc.join(30)
    assert child_epoch == e1 + 1
    # The parent's connection still works after the child used (and exited with) the store.
    assert store.take_over(m.log_id, "parent", NOW, 1000) == e1 + 2
    store.close()


def test_sqlite_wal_mode(tmp_path: Path) -> None:
    store = SqliteMetadataStore(tmp_path / "m.sqlite")
    store.create_log("a", NOW)
    raw = sqlite3.connect(tmp_path / "m.sqlite")
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()
    store.close()


def test_sqlite_locked_maps_to_storage_unavailable(tmp_path: Path) -> None:
    store = SqliteMetadataStore(tmp_path / "m.sqlite", busy_timeout_ms=100)
    m = store.create_log("a", NOW)
    raw = sqlite3.connect(tmp_path / "m.sqlite", isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")  # hold the write lock
    try:
        with pytest.raises(StorageUnavailableError) as info:
            store.take_over(m.log_id, "A", NOW, 1000)
        assert info.value.retriable and "locked" in str(info.value)
        assert store.get_log("a").writer_epoch == 0  # WAL: reads still work
    finally:
        raw.execute("ROLLBACK")
        raw.close()
    assert store.take_over(m.log_id, "A", NOW, 1000) == 1
    store.close()


def test_sqlite_rejects_memory_and_closed(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        SqliteMetadataStore(":memory:")
    store = SqliteMetadataStore(tmp_path / "m.sqlite")
    store.close()
    with pytest.raises(WoodpeckerError):
        store.list_logs()


def test_sqlite_store_pickles_as_a_reopen(tmp_path: Path) -> None:
    import pickle

    store = SqliteMetadataStore(tmp_path / "m.sqlite", busy_timeout_ms=250)
    store.create_log("a", NOW)
    copy = pickle.loads(pickle.dumps(store))
    assert copy is not store and copy.path == store.path
    assert copy.get_log("a") == store.get_log("a")
    copy.close()
    store.close()


def _open_at(path: str, start: float) -> str:
    """Process entry point: open a fresh store at `start` (wall clock) and report how it went."""
    import time

    while time.time() < start:
        pass
    try:
        SqliteMetadataStore(path).close()
    except Exception as exc:  # reported to the parent, which asserts on it
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def test_sqlite_processes_opening_a_new_store_together_all_open(tmp_path: Path) -> None:
    """Switching a new file to WAL takes an exclusive lock, which SQLite refuses at once (no busy
    wait) while another process opens the file: processes starting together must still open."""
    import time

    ctx = multiprocessing.get_context("spawn")  # not fork: this process runs threads
    with ctx.Pool(6) as pool:
        assert pool.map(str, range(6), chunksize=1)  # every worker up before the first round
        for round_ in range(20):
            path = str(tmp_path / f"m{round_}.sqlite")
            start = time.time() + 0.3
            outcomes = [pool.apply_async(_open_at, (path, start)) for _ in range(6)]
            assert [o.get(timeout=60) for o in outcomes] == ["ok"] * 6, round_
