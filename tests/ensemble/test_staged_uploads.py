"""Staged storage in one process (`storage.type: staged`, es=3 in-process nodes): a completed
segment stays COMPLETED until a node of its ensemble uploaded it, then it is SEALED; uploads that
fail are retried in the background without holding a write; each node drops its local copy once
the segment is SEALED (and its grace passed), and the entries are then read from object storage.
The real-process faults (node processes, a frozen S3) are tests/e2e/test_staged_service.py."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from heldputs import HeldPuts

import woodpecker_idem as wp
from woodpecker_idem._core import encode_entry
from woodpecker_idem.ensemble.uploads import SegmentUploads
from woodpecker_idem.logstore.blocks import encode_record
from woodpecker_idem.logstore.staged import StagedSegmentStorage
from woodpecker_idem.types import SegmentState

WAIT_S = 60
STAGED = {
    "storage.type": "staged",
    "quorum.es": 3,
    "segment.max_entries": 20,  # rolls: several segments completed while writing
    "storage.fsync": "never",
    "storage.staged_grace_s": 0.2,
}


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.02)


def _local_files(data: Path, log_id: int, segment_id: int) -> list[str]:
    """The files the nodes keep of the segment locally (the tombstone of a dropped copy aside)."""
    return sorted(
        str(p.relative_to(data))
        for p in (data / "staged").glob(f"*/*/{log_id}/{segment_id}/*")
        if p.name != "sealed"
    )


def _payloads(log: wp.LogHandle, n: int) -> list[bytes]:
    reader = log.open_reader("earliest")
    try:
        got = []
        while len(got) < n:
            msg = reader.read_next(timeout=WAIT_S)
            assert msg is not None, f"read {len(got)} of {n}"
            got.append(msg.payload)
        return got
    finally:
        reader.close()


def test_segments_end_sealed_in_object_storage_and_are_read_there_once_local_copies_go(
    tmp_path: Path,
):
    data = tmp_path / "data"
    client = wp.connect(data, STAGED)
    try:
        log = client.open_log("staged", create=True)
        writer = log.open_writer()
        for i in range(70):
            writer.write(b"e%d" % i)
        writer.close()
        segments = log.segments()
        assert len(segments) == 4
        uploads = client.ensemble.uploads
        assert uploads is not None
        _until(lambda: all(s.state is SegmentState.SEALED for s in log.segments()), "SEALED")
        for seg in log.segments():
            _until(lambda s=seg: not _local_files(data, log.log_id, s.segment_id), "copies gone")
        engines = client.transport.engines  # type: ignore[attr-defined]
        storage = engines["node-0"].storage
        assert isinstance(storage, StagedSegmentStorage)
        assert sorted(storage.sealed_store.list(f"{log.log_id}/")) == sorted(
            f"{log.log_id}/{s.segment_id}/{name}" for s in segments for name in ("0.blk", "footer")
        )
        assert _payloads(log, 70) == [b"e%d" % i for i in range(70)]
    finally:
        client.close()


def test_failing_uploads_hold_no_write_leave_segments_completed_and_are_retried(
    tmp_path: Path, monkeypatch
):
    """Every upload fails while the gate is shut: writes go on through rolls, the completed
    segments stay COMPLETED with their local copies; once it opens, the retries seal them all,
    through other nodes as well (the first node's attempt failed), and nothing is lost."""
    gate = threading.Event()
    attempts: list[str] = []
    real = StagedSegmentStorage.upload

    def upload(self, log_id, segment_id, node_id, chunks, last):
        attempts.append(node_id)
        if not gate.is_set():
            raise OSError("object storage unreachable (test gate)")
        return real(self, log_id, segment_id, node_id, chunks, last)

    monkeypatch.setattr(StagedSegmentStorage, "upload", upload)
    data = tmp_path / "data"
    client = wp.connect(data, STAGED)
    try:
        log = client.open_log("gated", create=True)
        writer = log.open_writer(idempotent=True)
        for i in range(50):
            writer.write(b"e%d" % i, idempotency_id=f"k{i}")
        _until(lambda: bool(attempts), "an upload tried and failed")
        for i in range(50, 90):  # after a failure: writes go on, segments roll
            writer.write(b"e%d" % i, idempotency_id=f"k{i}")

        def done() -> list:
            return [s for s in log.segments() if s.state is not SegmentState.ACTIVE]

        _until(lambda: len(done()) >= 4, "four segments completed")
        # the retries go through the other nodes too (each attempt the next one)
        _until(lambda: len(set(attempts)) == 3, "uploads tried through every node")
        time.sleep(0.5)  # past the grace: nothing is dropped while not SEALED
        assert all(s.state is SegmentState.COMPLETED for s in done()), done()
        for seg in done():
            assert len(_local_files(data, log.log_id, seg.segment_id)) >= 3
        gate.set()
        writer.close()
        _until(lambda: all(s.state is SegmentState.SEALED for s in log.segments()), "SEALED")
        for seg in log.segments():
            _until(lambda s=seg: not _local_files(data, log.log_id, s.segment_id), "copies gone")
        assert _payloads(log, 90) == [b"e%d" % i for i in range(90)]
    finally:
        client.close()


def test_a_sealed_segment_is_read_from_object_storage_with_every_node_down(tmp_path: Path):
    """Once uploaded, a segment is read from its sealed copy when no node of its ensemble can
    serve it (readers and the window rebuild read through the same calls); the open segment,
    not uploaded, fails as its nodes do."""
    from woodpecker_idem.ensemble.sealed import SealedFallback
    from woodpecker_idem.errors import NodeUnavailableError
    from woodpecker_idem.testing import FaultInjectingTransport

    client = wp.connect(tmp_path / "data", {**STAGED, "storage.staged_grace_s": 3600})
    try:
        log = client.open_log("all-down", create=True)
        writer = log.open_writer()
        for i in range(45):
            writer.write(b"e%d" % i)
        writer.close()
        _until(lambda: all(s.state is SegmentState.SEALED for s in log.segments()), "SEALED")
        faults = FaultInjectingTransport(client.transport)
        client.transport = faults
        for node in faults.node_ids:
            faults.fail_node(node)
        assert _payloads(log, 45) == [b"e%d" % i for i in range(45)]
        calls = client.ensemble.calls
        assert isinstance(calls, SealedFallback) and client.ensemble.sealed_reads > 0
        seg = log.segments()[-1]
        with pytest.raises(NodeUnavailableError):  # a segment not in object storage
            calls.read(seg.nodes[0], log.log_id, seg.segment_id + 1, 0, 1)
    finally:
        client.close()


def _storages(client: wp.WoodpeckerClient) -> list[StagedSegmentStorage]:
    engines = client.transport.engines  # type: ignore[attr-defined]
    return [engines[n].storage for n in sorted(engines)]


def test_retention_that_drops_a_segment_while_it_uploads_leaves_no_object_behind(
    tmp_path: Path,
):
    """Segment 0 completes and its upload waits in a put to object storage; retention drops the
    segment meanwhile (TRUNCATED, deleted on its nodes). The upload's puts land after the
    deletion: the node deletes what they wrote once they returned, and nothing of the segment
    is left under sealed/, nor on a node's disk."""
    from woodpecker_idem.retention import RetentionPolicy, apply

    clock = wp.ManualClock()
    data = tmp_path / "data"
    client = wp.connect(data, STAGED, clock=clock)
    try:
        storages = _storages(client)
        held = HeldPuts(storages[0].sealed.store)
        for storage in storages:
            storage.sealed.store = held
        held.hold.set()
        log = client.open_log("dropped", create=True)
        writer = log.open_writer()
        for i in range(25):  # segment 0 completes at the roll, and its upload begins
            writer.write(b"e%d" % i)
        try:
            assert held.held.wait(WAIT_S), "the upload never put"
            seg0 = log.segments()[0]
            assert seg0.state is SegmentState.COMPLETED
            clock.advance(3_600_000)  # past the idempotency window and the age bound
            dropped = apply(log, RetentionPolicy(max_age_ms=60_000))
            assert [s.segment_id for s in dropped.drop] == [0]
        finally:
            held.hold.clear()
            held.release.set()
        uploads = client.ensemble.uploads
        assert uploads is not None and uploads.wait_idle(WAIT_S)
        assert log.segments()[0].state is SegmentState.TRUNCATED
        assert storages[0].sealed_store.list(f"{log.log_id}/0/") == []
        assert not list((data / "staged").glob(f"*/*/{log.log_id}/0"))
        writer.close()
    finally:
        client.close()


def _seal_another_copy(client: wp.WoodpeckerClient, log_id: int, where: Path) -> None:
    """Object storage holds segment 0 of `log_id` sealed, as this log's writer will write it
    (20 entries), with other payloads: another copy, of unknown origin."""
    from woodpecker_idem.logstore.engine import LogStoreEngine
    from woodpecker_idem.logstore.segment_files import FileSegmentStorage

    sealed = client.objects.child("sealed")
    other = LogStoreEngine(
        StagedSegmentStorage(FileSegmentStorage(where, fsync=False), sealed), "other"
    )
    for i in range(20):
        record = encode_record(encode_entry(0, i, 1, b"other-%d" % i, None, None))
        other.add_entries(log_id, 0, i, record)
    other.seal_segment(log_id, 0, 19)
    other.close()


def _write_until_the_upload_stops(
    log: wp.LogHandle, caplog: pytest.LogCaptureFixture
) -> tuple[SegmentUploads, wp.LogWriter]:
    """25 writes (segment 0 completes at the roll and its upload begins), then wait until the
    upload of segment 0 stopped at a conflict; its warnings and errors are in `caplog`. The stop
    is seen in one step: when its error is logged the segment is still pending and not yet in
    `conflicts` (checked as the error is emitted, whatever the machine's load), and once in
    `conflicts` it is pending no more."""
    uploads = log.client.ensemble.uploads
    assert uploads is not None
    key = (log.log_id, 0)
    seen_at_error: list[tuple[bool, bool]] = []  # (in conflicts, pending), per error logged

    class AtError(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                seen_at_error.append((key in uploads.conflicts, key in uploads.pending()))

    at_error = AtError()
    uploads_log = logging.getLogger("woodpecker_idem.ensemble.uploads")
    uploads_log.addHandler(at_error)
    try:
        with caplog.at_level(logging.WARNING, logger=uploads_log.name):
            writer = log.open_writer()
            for i in range(25):
                writer.write(b"e%d" % i)
            _until(lambda: key in uploads.conflicts, "the upload stopped")
    finally:
        uploads_log.removeHandler(at_error)
    assert seen_at_error == [(False, True)]
    assert key not in uploads.pending()
    return uploads, writer


def test_an_upload_meeting_a_conflict_where_the_other_node_lacks_entries_stops(
    tmp_path: Path, caplog
):
    """As below, but one node of the ensemble lacks entries of the segment (completed while its
    last batch was on the way: often, on a loaded machine) and can never upload it: the
    conflict the others found stops the upload all the same, instead of a warning every few
    seconds for ever."""
    from woodpecker_idem.errors import SegmentIncompleteError

    data = tmp_path / "data"
    client = wp.connect(data, STAGED)
    try:
        log = client.open_log("conflict", create=True)
        _seal_another_copy(client, log.log_id, tmp_path / "other")
        lacking = client.transport.engines["node-1"]  # type: ignore[attr-defined]

        def lacks_entries(log_id: int, segment_id: int, last_entry_id: int) -> object:
            raise SegmentIncompleteError(f"node-1 holds entries up to {last_entry_id - 1} only")

        lacking.seal_segment = lacks_entries
        uploads, writer = _write_until_the_upload_stops(log, caplog)
        assert uploads.pending() == [] and uploads.failed_attempts == 3
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and "node-1: SegmentIncompleteError" in errors[0], errors
        assert log.segments()[0].state is SegmentState.COMPLETED
        writer.close()
    finally:
        client.close()


def test_an_upload_meeting_a_conflicting_copy_on_every_node_stops_with_one_error(
    tmp_path: Path, caplog
):
    """Object storage holds segment 0 sealed with other entries (another copy, of unknown
    origin). Every node of the ensemble is asked once, each finds the conflict; then the upload
    stops: one error naming the objects, the segment in `uploads.conflicts` and the metric
    (until the client closes), left COMPLETED with the nodes' copies, and no retry queued. Once
    the objects are moved aside, the next writer's takeover uploads it."""
    from woodpecker_idem import metrics

    data = tmp_path / "data"
    client = wp.connect(data, STAGED)
    try:
        log = client.open_log("conflict", create=True)
        _seal_another_copy(client, log.log_id, tmp_path / "other")
        uploads, writer = _write_until_the_upload_stops(log, caplog)
        assert uploads.pending() == []  # nothing tried again
        conflicted = {node for key, node, _ in uploads.failures if key == (log.log_id, 0)}
        assert conflicted == {"node-0", "node-1", "node-2"}
        assert uploads.failed_attempts == 3
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, [r.getMessage() for r in errors]
        assert f"sealed/{log.log_id}/0/" in errors[0].getMessage()
        assert metrics.collect()["segment_upload_conflicts"] == {"conflict": 1}
        assert log.segments()[0].state is SegmentState.COMPLETED
        assert len(_local_files(data, log.log_id, 0)) >= 3  # the nodes keep their copies
        # the writer that met the conflict hands the segment over again (a completion retried:
        # seen on a loaded machine): not tried again, only a newer writer's takeover does
        uploads.submit(client.meta, log.segments()[0], writer.epoch)
        assert uploads.pending() == [] and (log.log_id, 0) in uploads.conflicts
        writer.close()
    finally:
        client.close()
    assert metrics.collect()["segment_upload_conflicts"] == {}  # left with its client

    client = wp.connect(data, STAGED)
    try:
        log = client.open_log("conflict")
        uploads = client.ensemble.uploads
        assert uploads is not None
        log.open_writer().close()  # a takeover asks again: the same conflict
        _until(lambda: (log.log_id, 0) in uploads.conflicts, "the upload stopped again")
        sealed = client.objects.child("sealed")
        for key in sealed.list(f"{log.log_id}/0/"):  # the operator moves them aside
            sealed.delete(key)
        log.open_writer().close()  # and the next takeover uploads it
        _until(lambda: all(s.state is SegmentState.SEALED for s in log.segments()), "SEALED")
        assert uploads.conflicts == {}
        assert metrics.collect()["segment_upload_conflicts"] == {}
        assert _payloads(log, 25) == [b"e%d" % i for i in range(25)]
    finally:
        client.close()
