"""`storage.fsync: batch_ms:N` on local segment files (logstore/segment_files.py): an add is
acknowledged once written to the file, and a background thread fdatasyncs at most every N ms.

Both halves: a killed writer process loses no acknowledged write (the bytes are in the kernel's
page cache once `write` returned), and the ack does not wait for an fdatasync (counted: none
happens before the interval; and an fdatasync held up in the syncer holds up no ack). The fence
and the footer still sync the data file before they are written."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from drain import Drain
from segfile_util import batches

import woodpecker_idem as wp
from woodpecker_idem._core import encode_entry
from woodpecker_idem.errors import StorageUnavailableError
from woodpecker_idem.logstore import segment_files
from woodpecker_idem.logstore.engine import LogStoreEngine
from woodpecker_idem.logstore.segment_files import FileSegmentStorage

HERE = Path(__file__).resolve().parent.parent / "support"
PACKAGE_ROOT = str(Path(wp.__file__).resolve().parent.parent)
LOG, SEG = 7, 3
NEVER = 60_000  # a batch_ms no test waits for: no background sync happens during the test


def frame(first: int, last: int) -> bytes:
    return b"".join(
        encode_entry(SEG, i, 1_700_000_000_000 + i, b"p-%d" % i, None, None)
        for i in range(first, last + 1)
    )


def storage_of(client: wp.WoodpeckerClient) -> FileSegmentStorage:
    storage = client.transport.engines["node-0"].storage  # type: ignore[attr-defined]
    assert isinstance(storage, FileSegmentStorage)
    return storage


def wait_for(what: str, cond, deadline_s: float = 60.0) -> None:
    """Liveness, not timing: poll until `cond()` (the deadline only ends a hung test)."""
    end = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.005)


def syncer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "woodpecker-fdatasync"]


# --- the ack does not wait for fdatasync ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["always", f"batch_ms:{NEVER}"])
def test_acks_before_any_fdatasync_with_batch_ms_one_per_add_with_always(tmp_path, mode):
    client = wp.connect(tmp_path / "data", {"storage.fsync": mode})
    try:
        storage = storage_of(client)
        writer = client.open_log("l", create=True).open_writer()
        # each write() waits for its ack before the next is sent: one add (one batch) each
        results = [writer.write(b"entry %d" % i) for i in range(50)]
        assert [r.message_id.entry_id for r in results] == list(range(50))
        if mode == "always":
            assert storage.syncer is None
            assert storage.data_syncs >= 50  # every ack came after its batch's fdatasync
        else:
            assert storage.syncer is not None
            assert storage.data_syncs == 0  # 50 acks, no fdatasync: none waited for one
            assert storage.syncer.pending() == 1  # the segment's file, due at the interval
        writer.close()
        assert [m.payload for m in client.open_log("l").open_reader()] == [
            b"entry %d" % i for i in range(50)
        ]
    finally:
        client.close()
    if mode != "always":
        assert storage.data_syncs == 1  # close syncs what was pending, once
        assert storage.syncer is not None and storage.syncer.pending() == 0


def test_background_fdatasync_runs_then_its_thread_ends(tmp_path):
    storage = FileSegmentStorage(tmp_path, sync_interval_ms=1)
    engine = LogStoreEngine(storage)
    engine.add_entries(LOG, SEG, 0, frame(0, 9))
    wait_for("the deferred fdatasync", lambda: storage.data_syncs >= 1)
    wait_for("nothing pending", lambda: storage.syncer.pending() == 0)
    wait_for("the syncer thread ends when idle", lambda: not syncer_threads())
    engine.add_entries(LOG, SEG, 10, frame(10, 19))  # a later write starts another round
    wait_for("the second round", lambda: storage.data_syncs >= 2)
    wait_for("idle again", lambda: not syncer_threads())
    assert engine.read(LOG, SEG, 0, 100) != []


def test_an_fdatasync_in_progress_holds_up_no_ack(tmp_path, monkeypatch):
    """The syncer's round is stuck (as on a slow disk): adds are still acknowledged, and the
    stuck round, once released, syncs the file."""
    entered, release = threading.Event(), threading.Event()
    real_sync = segment_files._Syncer._sync

    def stuck_sync(self, due):
        entered.set()
        assert release.wait(60)
        real_sync(self, due)

    monkeypatch.setattr(segment_files._Syncer, "_sync", stuck_sync)
    storage = FileSegmentStorage(tmp_path, sync_interval_ms=1)
    engine = LogStoreEngine(storage)
    engine.add_entries(LOG, SEG, 0, frame(0, 0))
    assert entered.wait(60)
    for i in range(1, 20):  # acked while the round is stuck
        assert engine.add_entries(LOG, SEG, i, frame(i, i)) == i
    assert storage.data_syncs == 0
    release.set()
    wait_for("the released round", lambda: storage.data_syncs >= 1)
    storage.close()
    assert storage.syncer.pending() == 0


# --- what the deferred sync must still order ---------------------------------------------------


def test_fence_and_footer_sync_the_data_file_before_they_exist(tmp_path, monkeypatch):
    storage = FileSegmentStorage(tmp_path, sync_interval_ms=NEVER)
    engine = LogStoreEngine(storage)
    seg_dir = tmp_path / str(LOG) / str(SEG)
    synced: list[tuple[str, bool, bool]] = []
    real = os.fdatasync

    def spy(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        synced.append(
            (os.path.basename(path), (seg_dir / "fence-at").exists(), (seg_dir / "footer").exists())
        )
        real(fd)

    monkeypatch.setattr(segment_files.os, "fdatasync", spy)
    engine.add_entries(LOG, SEG, 0, frame(0, 4))
    assert storage.data_syncs == 0 and synced == []
    assert engine.fence(LOG, SEG) == (4, -1)
    assert ("data", False, False) in synced  # before fence-at recorded L
    synced.clear()
    engine.complete(LOG, SEG, 4)
    assert ("data", True, False) in synced  # before the footer vouched for the entries
    assert (seg_dir / "footer").exists()


def test_recovery_copies_are_synced_before_their_ack(tmp_path):
    storage = FileSegmentStorage(tmp_path, sync_interval_ms=NEVER)
    engine = LogStoreEngine(storage)
    engine.add_entries(LOG, SEG, 0, frame(0, 1))
    engine.fence(LOG, SEG)
    engine.add_entries(LOG, SEG, 2, frame(2, 3), recovery=True)
    assert storage.data_syncs == 1  # the recovery copy's, inline; the data batch's is pending


class _FailingSync:
    def sync(self, sync: bool, fence: object) -> bool:
        raise OSError(5, "Input/output error")


def test_a_failed_background_fdatasync_refuses_later_appends(tmp_path, caplog):
    storage = FileSegmentStorage(tmp_path, sync_interval_ms=NEVER)
    engine = LogStoreEngine(storage)
    engine.add_entries(LOG, SEG, 0, frame(0, 0))
    syncer = storage.syncer
    assert syncer is not None
    with syncer._lock:  # the disk fails this file's sync (the native call, replaced)
        syncer._pending = {a: _FailingSync() for a in syncer._pending}  # type: ignore[misc]
    storage.flush()
    assert "background fdatasync failed" in caplog.text
    with pytest.raises(StorageUnavailableError, match="background fdatasync failed"):
        engine.add_entries(LOG, SEG, 1, frame(1, 1))
    assert storage.data_syncs == 0


# --- a process crash loses nothing ---------------------------------------------------------------


def run_child(data_dir: Path, *args: str, kill_when) -> list[list[str]]:
    """Run support/fsyncproc.py; SIGKILL it once `kill_when(lines so far)`; every whole line it
    printed, split (the pipe is read to its end after the kill)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT, env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "fsyncproc.py"), str(data_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    stderr = Drain(proc.stderr)
    lines: list[list[str]] = []
    buf = b""
    fd = proc.stdout.fileno()
    killed = False
    try:
        while True:
            if not killed and kill_when(lines):
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
                lines.append(["killed"])
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                assert proc.poll() is None or killed, f"child died: {stderr.text()[-2000:]}"
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break  # EOF: every line the child printed was read
            buf += chunk
            *whole, buf = buf.split(b"\n")
            lines += [line.decode().split() for line in whole]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        stderr.close()
        proc.stdout.close()
    assert killed and proc.returncode == -signal.SIGKILL
    return lines


def test_sigkill_right_after_acks_loses_no_acknowledged_write(tmp_path):
    """A child acknowledges writes with batch_ms:60000 (no fdatasync before the kill) and is
    SIGKILLed while writing; every acknowledgement it printed is in the log read back by a new
    client, at the id it printed."""
    data_dir = tmp_path / "data"
    lines = run_child(
        data_dir, str(NEVER), kill_when=lambda lines: sum(p[0] == "A" for p in lines) >= 300
    )
    before_kill = lines[: lines.index(["killed"])]
    assert before_kill[-1][0] == "A" and before_kill[-1][4] == "0", (
        "the kill came after an fdatasync: it proves nothing"
    )
    acks = {int(p[1]): (int(p[2]), int(p[3])) for p in lines if p[0] == "A"}
    client = wp.connect(data_dir)
    try:
        log = client.open_log("fsync")
        log.open_writer().close()  # take over: fence and complete what the killed writer left
        held = {
            (m.message_id.segment_id, m.message_id.entry_id): m.payload for m in log.open_reader()
        }
    finally:
        client.close()
    for i, at in acks.items():
        assert held.get(at) == f"payload {i}".encode(), f"acknowledged write {i} at {at} lost"
    assert len(held) >= len(acks)


def test_a_snapshot_that_outlived_lost_acks_does_not_answer_their_retries(tmp_path):
    """What a power loss under batch_ms:N leaves: the last acknowledged entries are gone, but a
    dedup snapshot written after their acks (synced on its own) is not. Simulated: the writer
    process is killed before any fdatasync of its segment, then the file is cut back at a batch
    boundary (as the page cache lost it). The next writer's window leaves the lost entries' keys
    out, so their retries write them again instead of answering with ids of missing entries."""
    data_dir = tmp_path / "data"
    n = 60
    lines = run_child(
        data_dir,
        str(NEVER),
        "idem",
        str(n),
        kill_when=lambda ls: bool(ls) and ls[-1][0] == "snapshot",
    )
    assert ["snapshot", "0"] in lines  # every ack and the snapshot, no fdatasync of the segment
    acks = {int(p[1]): (int(p[2]), int(p[3])) for p in lines if p[0] == "A"}
    assert len(acks) == n
    segment = acks[0][0]
    (data,) = [p for p in data_dir.rglob("data") if p.parent.name == str(segment)]
    offset, lost_from, _ = next(b for b in batches(data) if b[1] <= n // 2 < b[1] + b[2])
    with open(data, "r+b") as f:
        f.truncate(offset)
    client = wp.connect(data_dir)
    try:
        log = client.open_log("fsync")
        writer = log.open_writer(idempotent=True)
        retries = [writer.write(f"payload {i}".encode(), idempotency_id=f"k-{i}") for i in range(n)]
        for i, r in enumerate(retries):
            if i < lost_from:
                assert r.duplicate and (r.message_id.segment_id, r.message_id.entry_id) == acks[i]
            else:
                assert not r.duplicate, f"k-{i}: answered with the id of a lost entry"
        writer.close()
        payloads = [m.payload for m in log.open_reader()]
    finally:
        client.close()
    assert sorted(payloads) == sorted(f"payload {i}".encode() for i in range(n))
