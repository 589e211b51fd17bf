"""Staged storage in service mode (`storage.type: staged`): three LogStore node processes keep the
segments they hold in local files and upload each completed one to S3 (moto's server, a process
of its own), each test judged by the history checker (exactly once, nothing acknowledged lost,
every accepted write ends), which reads the nodes' raw storage: local files, or S3 once a node
dropped its copy.

- writes through rolls: every segment ends SEALED, in S3, the nodes' local files gone, and every
  entry is still read (through the checker and a reader);
- S3 frozen (SIGSTOP) while segments complete: writes go on, the segments stay COMPLETED with
  their local copies; thawed, the uploads resume and seal them all;
- a node SIGKILLed while its upload is in flight (S3 frozen first, so the kill lands inside it):
  the upload is retried through another node and the segment still ends SEALED;
- a restarted staged node still refuses a fenced writer (the fence is a local file).
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from nodeserver import LogStoreNode
from servicestream import WAIT_S, Stream, judge, start_all, until, until_answers
from slowprofile import size

import woodpecker_idem as wp
from woodpecker_idem._core import encode_entry
from woodpecker_idem.errors import NodeUnavailableError, SegmentFencedError
from woodpecker_idem.logstore.blocks import encode_record
from woodpecker_idem.testing import History
from woodpecker_idem.types import SegmentState

LONG_TTL = ("--registry-ttl", "600")  # a killed node stays placeable (es=3 over three nodes)


@pytest.fixture
def s3(monkeypatch) -> Iterator[object]:
    from s3server import MotoS3Server

    # the node processes inherit these (moto takes any key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with MotoS3Server() as server:
        yield server


def _config(tmp_path: Path, s3: object) -> dict[str, object]:
    return {
        "quorum.nodes": "registry",
        "quorum.es": 3,
        "quorum.call_timeout_ms": 2_000,
        "append.timeout_ms": 10_000,
        "segment.max_entries": 60,  # rolls: segments complete (and upload) while writing
        "storage.type": "staged",
        "storage.staged_dir": str(tmp_path / "staged"),
        "storage.staged_grace_s": 0.5,
        "storage.fsync": "never",
        "objectstore.type": "s3",
        "objectstore.endpoint_url": s3.endpoint_url,  # type: ignore[attr-defined]
        "objectstore.bucket": f"wp-staged-{uuid.uuid4().hex[:10]}",
        "objectstore.region": "us-east-1",
        "objectstore.create_bucket": True,
        # a frozen S3 fails a put within seconds, so an upload is retried soon after the thaw
        "objectstore.read_timeout_s": 2,
        "objectstore.retry_budget_s": 4,
    }


def _nodes(tmp_path: Path, config: dict[str, object], args: tuple[str, ...] = ()):
    return start_all(
        [LogStoreNode(f"n{i}", tmp_path / "data", config, args=args) for i in range(3)]
    )


def _local_files(tmp_path: Path, log_id: int) -> list[str]:
    """The segment files the nodes keep locally of the log (tombstones of dropped copies aside)."""
    return sorted(
        str(p.relative_to(tmp_path))
        for p in (tmp_path / "staged").glob(f"*/*/{log_id}/*/*")
        if p.name != "sealed"
    )


def _all_sealed_and_dropped(tmp_path: Path, client: wp.WoodpeckerClient, log) -> None:
    """Every segment SEALED, in S3 (its footer), and no node keeps a local file of it."""
    until(
        lambda: all(s.state is SegmentState.SEALED for s in log.segments()),
        "every segment SEALED",
    )
    sealed = client.objects.child("sealed")
    for seg in log.segments():
        assert sealed.get(f"{log.log_id}/{seg.segment_id}/footer") is not None, seg
    try:
        until(lambda: not _local_files(tmp_path, log.log_id), "the nodes dropped their copies")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still kept: {_local_files(tmp_path, log.log_id)}") from None


def _read_all(log, history: History) -> None:
    """A reader reads every acknowledged payload (from S3 once the nodes dropped their copies)."""
    acked = {a.payload for a in history.attempts if a.ok}
    reader = log.open_reader("earliest")
    try:
        seen: set[bytes] = set()
        while not acked <= seen:
            msg = reader.read_next(timeout=WAIT_S)
            assert msg is not None, f"{len(acked - seen)} acknowledged payloads not read"
            seen.add(msg.payload)
    finally:
        reader.close()


def test_staged_segments_end_sealed_in_s3_and_are_read_there_after_the_nodes_dropped_them(
    tmp_path, s3
):
    config = _config(tmp_path, s3)
    nodes = _nodes(tmp_path, config)
    try:
        client = wp.connect(tmp_path / "data", config)
        try:
            log = client.open_log("staged", create=True)
            writer = log.open_writer(idempotent=True)
            history = History(client.clock)
            stream = Stream(writer, history, threads=2)
            stream.until_acked(200, "writes through rolls")
            stream.stop()
            writer.close()
            assert len(log.segments()) >= 3
            _all_sealed_and_dropped(tmp_path, client, log)
            judge(history, log)  # the checker's raw reads: from S3 now, through each node
            _read_all(log, history)
        finally:
            client.close()
    finally:
        for node in nodes:
            node.stop()


def _s3_frozen(tmp_path: Path, s3, threads: int, per_phase: int) -> None:
    config = _config(tmp_path, s3)
    nodes = _nodes(tmp_path, config)
    try:
        client = wp.connect(tmp_path / "data", config)
        try:
            uploads = client.ensemble.uploads
            assert uploads is not None
            log = client.open_log("frozen-s3", create=True)
            writer = log.open_writer(idempotent=True)
            history = History(client.clock)
            stream = Stream(writer, history, threads)
            stream.until_acked(per_phase, "writes before the freeze")
            s3.freeze()
            frozen_ns = time.monotonic_ns()
            try:
                done_before = {
                    s.segment_id for s in log.segments() if s.state is not SegmentState.ACTIVE
                }
                acked = stream.acked_now()
                stream.until_acked(acked + per_phase, "writes go on while S3 is frozen")

                failed_before = len(uploads.failures)

                def done_in_freeze() -> list:
                    return [
                        s
                        for s in log.segments()
                        if s.state is not SegmentState.ACTIVE and s.segment_id not in done_before
                    ]

                until(lambda: len(done_in_freeze()) >= 2, "segments complete in the freeze")
                assert uploads.pending(), "no upload waits for S3"
                # an upload met the frozen S3 and failed, and the next attempt began
                until(lambda: len(uploads.failures) > failed_before, "an upload failed on S3")
                # a segment completed in the freeze cannot be in S3: it is not SEALED, and each
                # node keeps its local copy
                for seg in done_in_freeze():
                    assert seg.state is SegmentState.COMPLETED, seg
                    kept = f"*/*/{log.log_id}/{seg.segment_id}/data"
                    assert len(list((tmp_path / "staged").glob(kept))) == 3, seg
            finally:
                s3.thaw()
            thawed_ns = time.monotonic_ns()
            new_in_freeze = [
                a
                for a in history.attempts
                if a.ok and not a.duplicate and frozen_ns < a.start.ns and a.end.ns < thawed_ns
            ]
            assert new_in_freeze, "no new write was acknowledged while S3 was frozen"
            acked = stream.acked_now()
            stream.until_acked(acked + per_phase, "writes after the thaw")
            stream.stop()
            writer.close()
            _all_sealed_and_dropped(tmp_path, client, log)  # the uploads resumed
            judge(history, log)
        finally:
            client.close()
    finally:
        for node in nodes:
            node.stop()


def test_s3_frozen_during_segment_uploads_writes_go_on_and_uploads_resume(tmp_path, s3):
    _s3_frozen(tmp_path, s3, threads=2, per_phase=100)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_s3_frozen_during_many_segment_uploads_under_four_threads(tmp_path, s3):
    _s3_frozen(tmp_path, s3, threads=4, per_phase=size(1500, 300))


def _killed_mid_upload(tmp_path: Path, s3, threads: int, cycles: int) -> None:
    """Each cycle freezes S3 (an upload that starts now stays in flight), SIGKILLs the node the
    upload in flight goes through, thaws S3, waits for that segment to be sealed through another
    node, and restarts the victim. A kill that did not land inside the upload (the victim had
    answered already, or lacked entries and said so) is counted as missed, and the cycle goes
    again."""
    config = _config(tmp_path, s3)
    nodes = _nodes(tmp_path, config, args=LONG_TTL)
    by_id = {n.node_id: n for n in nodes}
    try:
        client = wp.connect(tmp_path / "data", config)
        try:
            uploads = client.ensemble.uploads
            assert uploads is not None
            log = client.open_log("killed-mid-upload", create=True)
            writer = log.open_writer(idempotent=True)
            history = History(client.clock)
            stream = Stream(writer, history, threads=threads)
            landed, missed = 0, []
            while landed < cycles:
                assert len(missed) <= cycles, f"{landed} kills inside an upload; missed: {missed}"
                stream.until_acked(stream.acked_now() + 30, "writes before the freeze")
                s3.freeze()  # an upload that starts now stays in flight: the kill lands in it
                try:
                    until(lambda: uploads.in_flight is not None, "an upload in flight")
                    in_flight = uploads.in_flight
                    assert in_flight is not None
                    key, victim = in_flight
                    before = Counter(uploads.failures)
                    by_id[victim].kill()
                finally:
                    s3.thaw()

                def sealed(key=key) -> list[str]:
                    return [n for k, n in uploads.sealed_by if k == key]

                until(lambda: bool(sealed()), "the segment sealed")
                new = Counter(uploads.failures) - before
                ended = [e for k, n, e in uploads.failures if k == key and n == victim]
                cut = [
                    e
                    for (k, n, e) in new
                    if (k, n) == (key, victim)
                    and "seal_segment failed: UNAVAILABLE" in e
                    and "not connected" not in e  # a later call to the dead node
                ]
                if sealed() == [victim]:
                    # the victim's answer was already on its way when the kill landed (its puts
                    # made before the freeze): sealed through it, not a kill inside an upload,
                    # so the cycle goes again
                    assert not cut, cut
                    missed.append((key, victim, ["sealed through it before the kill"]))
                elif cut:
                    landed += 1  # the kill cut the call: it failed on the lost connection
                else:
                    # a node lacking entries of the segment (an earlier victim, down while it was
                    # written, or one completed while its last batch was on the way) answered at
                    # once that it lacks them, just before the kill: not a kill inside an
                    # upload, so the cycle goes again
                    assert any("SegmentIncompleteError" in e for e in ended), ended
                    missed.append((key, victim, ended))
                stream.until_acked(stream.acked_now() + 30, "writes after the kill")
                by_id[victim].start()  # its stale copy is dropped once it sees it SEALED
                until_answers(client, victim)  # the checker reads every replica
            stream.stop()
            writer.close()
            _all_sealed_and_dropped(tmp_path, client, log)
            judge(history, log)
        finally:
            client.close()
    finally:
        for node in nodes:
            node.stop()


def test_a_node_killed_mid_upload_leaves_the_segment_to_be_sealed_through_another(tmp_path, s3):
    _killed_mid_upload(tmp_path, s3, threads=2, cycles=1)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_nodes_killed_mid_upload_again_and_again_under_four_threads(tmp_path, s3):
    _killed_mid_upload(tmp_path, s3, threads=4, cycles=size(6, 2))


def test_a_restarted_staged_node_still_refuses_a_fenced_writer(tmp_path, s3):
    config = _config(tmp_path, s3)
    nodes = _nodes(tmp_path, config)
    try:
        client = wp.connect(tmp_path / "data", config)
        try:
            node = nodes[0]
            calls = client.transport
            frame = encode_record(encode_entry(0, 0, 1, b"x", None, None))
            assert calls.add_entries(node.node_id, 99, 0, 0, frame) == 0
            assert calls.fence(node.node_id, 99, 0)[0] == 0
            node.kill()  # SIGKILL: nothing drained
            node.start()
            until(lambda: _answers(calls, node.node_id), "the restarted node answers")
            later = encode_record(encode_entry(0, 1, 1, b"y", None, None))
            with pytest.raises(SegmentFencedError):
                calls.add_entries(node.node_id, 99, 0, 1, later)
            assert len(calls.read(node.node_id, 99, 0, 0, 10)) == 1  # what it held, kept
        finally:
            client.close()
    finally:
        for node in nodes:
            node.stop()


def _answers(calls, node_id: str) -> bool:
    try:
        calls.last_add_confirmed(node_id, 99, 0)
    except NodeUnavailableError:
        return False
    return True


FULL = re.compile(r"fault disk-full: (\d+) appends refused")


def test_a_node_whose_disk_fills_up_is_dropped_and_replaced_and_nothing_is_lost(
    tmp_path, s3, caplog
):
    """Four staged nodes, es=3; the disk of n0 (in the first segment's ensemble) fills up after
    40 appends (`logstore serve --fault disk-full-after:40`, testing only): the writer gets a
    clear error naming the node and the full disk, drops n0 from the segment, goes on at aq=2,
    and places the next segment on the others; every segment still ends SEALED."""
    # n0 is dropped at its first refused append: with retries, a segment whose other two nodes
    # ack faster than the retries' backoff completes first, and its sends to n0 are then skipped
    config = {**_config(tmp_path, s3), "append.max_retries": 0}
    nodes = start_all(
        [
            LogStoreNode(
                f"n{i}",
                tmp_path / "data",
                config,
                args=("--fault", "disk-full-after:40") if i == 0 else (),
            )
            for i in range(4)
        ]
    )
    stopped = False
    try:
        client = wp.connect(tmp_path / "data", config)
        try:
            live = client.ensemble.directory.live
            until(lambda: live() == ["n0", "n1", "n2", "n3"], "every node registered")
            log = client.open_log("disk-full", create=True)
            writer = log.open_writer(idempotent=True)
            history = History(client.clock)
            stream = Stream(writer, history, threads=2)
            assert "n0" in log.segments()[0].nodes  # the fault meets this stream's writes
            stream.until_acked(300, "writes through the full disk")
            stream.stop()
            writer.close()
            dropped = [
                r.getMessage()
                for r in caplog.records
                if "node n0 dropped" in r.getMessage()
                and "No space left on device" in r.getMessage()
            ]
            assert dropped, "no clear error named n0's full disk"
            segments = log.segments()
            assert any("n0" not in s.nodes for s in segments), "n0 was never replaced"
            _all_sealed_and_dropped(tmp_path, client, log)
            judge(history, log)
        finally:
            client.close()
        for node in nodes:
            node.stop()  # SIGTERM: the node reports its count as it exits
        stopped = True
        refused = [int(c) for c in FULL.findall(nodes[0].output())]
        assert refused and refused[0] > 0, nodes[0].output()[-2000:]
    finally:
        if not stopped:
            for node in nodes:
                node.stop()


def test_the_disk_full_fault_takes_a_count():
    from woodpecker_idem.logstore.remote import DiskFull, DropReplies, parse_fault

    assert isinstance(parse_fault("drop-replies:0.5"), DropReplies)
    full = parse_fault("disk-full-after:2")
    assert isinstance(full, DiskFull)
    full.check("a")
    full.check("a")
    with pytest.raises(OSError, match="No space left"):
        full.check("a")
    assert full.failed == 1
    for bad in ("disk-full-after:x", "disk-full-after:-1", "disk-full", "freeze:1"):
        with pytest.raises(wp.InvalidArgumentError, match="disk-full-after"):
            parse_fault(bad)
