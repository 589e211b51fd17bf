"""A snapshot streamed from the live window while the writer commits and evicts (issue 19 item
7): the window is read a chunk at a time, the lock taken per chunk, writes going on between. Every
snapshot must still be a snapshot of the log: a run of the commit order (what was evicted while it
was read is missing from its start, as if evicted before), holding every key committed at or below
its watermarks that was not evicted, at the position the writer gave it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import woodpecker_idem
from woodpecker_idem import _core
from woodpecker_idem.idempotency import stage as stage_module

CHUNK = 7  # entries per chunk: many chunks, so writes land between them


def slow_stream(*args: Any) -> Any:
    """A SnapshotStream of tiny chunks that yields the GIL between them."""
    stream = _core.SnapshotStream(*args, chunk_records=CHUNK)

    class Slow:
        def __iter__(self) -> Any:
            for part in stream:
                time.sleep(0.0005)
                yield part

        @property
        def done(self) -> bool:
            return stream.done

        @property
        def count(self) -> int:
            return stream.count

    return Slow()


def test_snapshots_taken_while_writing_and_evicting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stage_module, "SnapshotStream", slow_stream)
    client = woodpecker_idem.connect(
        tmp_path, {"idempotency.snapshot_interval_s": 3600, "idempotency.snapshots_kept": 100}
    )
    log = client.open_log("s", create=True)
    max_keys = 400
    w = log.open_writer(idempotent=True, window_max_keys=max_keys, window_duration_s=3600)
    positions: dict[bytes, tuple[int, int]] = {}
    batches, rows = 60, 50
    done = threading.Event()

    def write() -> None:
        try:
            for b in range(batches):
                ids = [f"k{b}-{i}" for i in range(rows)]
                result = w.write_many([b"p"] * rows, ids)
                keys = _core.explicit_keys(ids)
                for i in range(rows):
                    key = keys[16 * i : 16 * i + 16]
                    positions[key] = (result.segment_ids[i], result.entry_ids[i])
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    snapshotter = w.snapshotter  # the test drives snapshots itself
    taken: list[str] = []
    while not done.is_set():
        assert snapshotter.write_now()
        taken.append(snapshotter.last_key)
    writer.join()
    assert len(taken) >= 3
    order = sorted(positions, key=positions.__getitem__)  # commit order: one writer, in order
    index = {key: i for i, key in enumerate(order)}
    final = w.window.committed_entries()
    gaps = 0
    for key in taken:
        snap = _core.decode_snapshot(client.objects.get(key))
        entries = snap.entries()
        marks = snap.watermarks
        for k, seg, ent, _ts in entries:
            assert positions[k] == (seg, ent)  # each key at the position the writer gave it
        at = [index[e[0]] for e in entries]
        assert at == sorted(set(at))  # in commit order, once each
        for c in range(0, len(at), CHUNK):  # a chunk is read under the lock: no gap inside it
            part = at[c : c + CHUNK]
            assert part == list(range(part[0], part[0] + len(part)))
        # between chunks, what the writer evicted meanwhile is missing (as if evicted before)
        gaps += sum(1 for a, b in zip(at, at[1:], strict=False) if b != a + 1)
        # the rebuild (this snapshot, then the log above its watermarks) gives the writer's window
        rebuilt = snap.to_window()
        for k in order:
            seg, ent = positions[k]
            if ent > marks.get(seg, -1):
                rebuilt.add_committed(k, seg, ent, 0)
        assert [e[:3] for e in rebuilt.committed_entries()] == [e[:3] for e in final]
        assert len(entries) <= max_keys
    assert gaps  # the window was full: snapshots met evictions between their chunks
    w.close()
    client.close()


class CaptureAtCommit:
    """Stands in for an idempotent writer's window and takes a snapshot (in the committing
    thread, the pipeline's lock held, nothing else running) right before or right after each
    `commit_through`: a deterministic capture point between the stage's steps of a commit."""

    def __init__(self, stage: Any, where: str) -> None:
        self._stage = stage
        self._real = stage.window
        self._where = where
        self.taken: list[Any] = []  # the decoded snapshots
        stage.window = self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def commit_through(self, segment_id: int, last_entry_id: int) -> int:
        if self._where == "before":
            self._snapshot()
        committed = self._real.commit_through(segment_id, last_entry_id)
        if self._where == "after":
            self._snapshot()
        return committed

    def _snapshot(self) -> None:
        stage = self._stage
        stage.window = self._real  # the snapshot stream reads the window itself
        try:
            assert stage.snapshotter.write_now()
            raw = stage.snapshotter.store.get(stage.snapshotter.last_key)
            self.taken.append(_core.decode_snapshot(raw))
        finally:
            stage.window = self


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_snapshot_taken_inside_a_commit_holds_every_key_below_its_watermarks(
    tmp_path: Path, where: str
) -> None:
    """A snapshot captured at any point of a commit (here: just before and just after the keys
    are committed) holds every key at or below its watermarks: the rebuild reads the log only
    above them. Guards a stage that advanced the watermark before committing the keys (a
    snapshot between the two steps covered keys it did not hold, and a retry of one after a
    takeover was written again)."""
    client = woodpecker_idem.connect(
        tmp_path,
        {"idempotency.snapshot_interval_s": 3600, "idempotency.snapshot_threshold": 10**8},
    )
    log = client.open_log("s", create=True)
    w = log.open_writer(idempotent=True)
    hook = CaptureAtCommit(w._stage, where)  # noqa: SLF001 - the test places the capture
    positions: dict[bytes, tuple[int, int]] = {}
    for i in range(10):  # one commit per write, then one per batch of a write_many
        mid = w.write(b"p", idempotency_id=f"a{i}").message_id
        positions[_core.explicit_key(f"a{i}")] = (mid.segment_id, mid.entry_id)
    ids = [f"b{i}" for i in range(20)]
    result = w.write_many([b"p"] * 20, ids)
    keys = _core.explicit_keys(ids)
    for i in range(20):
        positions[keys[16 * i : 16 * i + 16]] = (result.segment_ids[i], result.entry_ids[i])
    assert len(hook.taken) >= 11
    for n, snap in enumerate(hook.taken):
        held = {k: (seg, ent) for k, seg, ent, _ts in snap.entries()}
        marks = snap.watermarks
        covered = {k for k, (seg, ent) in positions.items() if ent <= marks.get(seg, -1)}
        missing = covered - held.keys()
        assert not missing, f"snapshot {n} ({marks}) lacks {len(missing)} keys below its marks"
        assert all(positions[k] == at for k, at in held.items())
    w._stage.window = hook._real  # noqa: SLF001
    w.close()
    client.close()
