"""Local segment files (logstore/segment_files.py): the node rules on the `files` layout, the fence
protocol across processes, torn tails, corruption, group commit and the number of files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from segfile_util import batches, flip, flip_entry_byte, locate

import woodpecker_idem
from woodpecker_idem._core import SegmentAppender, encode_entry
from woodpecker_idem.errors import (
    CorruptEntryError,
    EntryConflictError,
    SegmentDamagedError,
    SegmentFencedError,
)
from woodpecker_idem.logstore.blocks import decode_entry
from woodpecker_idem.logstore.engine import LogStoreEngine
from woodpecker_idem.logstore.segment_files import (
    BATCH_HEADER_SIZE,
    FileSegmentStorage,
    encode_batch_header,
)

LOG, SEG = 7, 3
PYTHONPATH = str(Path(woodpecker_idem.__file__).resolve().parent.parent)


def frame(first: int, last: int, tag: bytes = b"payload") -> bytes:
    return b"".join(
        encode_entry(SEG, i, 1_700_000_000_000 + i, b"%s-%d" % (tag, i), None, None)
        for i in range(first, last + 1)
    )


def payloads(raw: list[bytes]) -> list[bytes]:
    return [decode_entry(r, "t").payload for r in raw]


def engine(root: Path, fsync: bool = False) -> LogStoreEngine:
    return LogStoreEngine(FileSegmentStorage(root, fsync=fsync), "node-0")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "objects"


def seg_dir(root: Path, seg: int = SEG) -> Path:
    return root / str(LOG) / str(seg)


def test_roundtrip_one_file_and_fresh_engine_rebuilds(root):
    e = engine(root)
    assert e.add_entries(LOG, SEG, 0, frame(0, 4)) == 4
    assert e.add_entries(LOG, SEG, 5, frame(5, 9), lac=4) == 9
    assert e.add_entries(LOG, SEG, 10, b"", lac=9) == 9  # a LAC-only update is kept too
    assert sorted(p.name for p in seg_dir(root).iterdir()) == ["data"]
    assert [(first, count) for _, first, count in batches(seg_dir(root) / "data")] == [
        (0, 5),
        (5, 5),
        (10, 0),
    ]
    assert payloads(e.read(LOG, SEG, 3, 4)) == [b"payload-%d" % i for i in range(3, 7)]
    other = engine(root)  # another process's view
    assert other.last_add_confirmed(LOG, SEG) == (9, 9)
    assert payloads(other.read(LOG, SEG, 0, 100)) == [b"payload-%d" % i for i in range(10)]
    # entries after the LAC-only update continue the run another process reads in one pass
    e.add_entries(LOG, SEG, 10, frame(10, 12), lac=9)
    fresh = engine(root)
    assert payloads(fresh.read(LOG, SEG, 0, 100)) == [b"payload-%d" % i for i in range(13)]
    assert payloads(fresh.read(LOG, SEG, 8, 2)) == [b"payload-8", b"payload-9"]
    assert payloads(fresh.read(LOG, SEG, 10, 100)) == [b"payload-%d" % i for i in range(10, 13)]


def test_resend_acks_without_writing_and_conflict_is_refused(root):
    e = engine(root)
    e.add_entries(LOG, SEG, 0, frame(0, 4))
    size = (seg_dir(root) / "data").stat().st_size
    assert e.add_entries(LOG, SEG, 0, frame(0, 4)) == 4
    assert (seg_dir(root) / "data").stat().st_size == size
    assert e.add_entries(LOG, SEG, 3, frame(3, 7)) == 7  # only 5..7 are appended
    assert [(f, c) for _, f, c in batches(seg_dir(root) / "data")] == [(0, 5), (5, 3)]
    with pytest.raises(EntryConflictError):
        engine(root).add_entries(LOG, SEG, 6, frame(6, 6, tag=b"other"))


def test_fence_refuses_data_and_recovery_copies_go_to_their_own_file(root):
    e = engine(root)
    e.add_entries(LOG, SEG, 0, frame(0, 4))
    fencer = engine(root)
    assert fencer.fence(LOG, SEG) == (4, -1)
    with pytest.raises(SegmentFencedError):
        e.add_entries(LOG, SEG, 5, frame(5, 6))
    with pytest.raises(SegmentFencedError):  # and every retry too
        e.add_entries(LOG, SEG, 5, frame(5, 6))
    assert fencer.add_entries(LOG, SEG, 5, frame(5, 6), recovery=True) == 6
    fencer.complete(LOG, SEG, 6)
    names = sorted(p.name for p in seg_dir(root).iterdir())
    assert names == ["data", "fence", "fence-at", "footer", "recovery"]
    third = engine(root)
    assert payloads(third.read(LOG, SEG, 0, 100)) == [b"payload-%d" % i for i in range(7)]
    with pytest.raises(SegmentFencedError):
        third.add_entries(LOG, SEG, 7, frame(7, 7))
    with pytest.raises(EntryConflictError):
        third.complete(LOG, SEG, 5)


def test_append_landing_before_the_fence_is_kept_and_after_it_never_read(root):
    """The fencing race on files, one step at a time: the stale writer's batch
    written before the fencer reads L is part of the segment but never acknowledged (the check
    after its sync sees the fence); a batch written after L is never read by anyone."""
    e = engine(root)
    e.add_entries(LOG, SEG, 0, frame(0, 4))
    data, fence = seg_dir(root) / "data", seg_dir(root) / "fence"
    stale = SegmentAppender(str(data))  # the stale writer's file, in the middle of an add
    stale.append(encode_batch_header(5, 5, len(frame(5, 9)), 4), frame(5, 9))  # written ...
    fencer = engine(root)
    assert fencer.fence(LOG, SEG)[0] == 9  # below L: part of the segment
    assert stale.sync(True, str(fence)) is True  # ... synced, then the check: refused, no ack
    late = frame(10, 11)
    offset, fenced = stale.append_sync(
        encode_batch_header(10, 2, len(late), 9), late, True, str(fence)
    )
    assert fenced
    limit = int.from_bytes((seg_dir(root) / "fence-at").read_bytes()[4:12], "little")
    assert offset == limit  # the late batch lies past L
    assert fencer.last_add_confirmed(LOG, SEG)[0] == 9
    fencer.complete(LOG, SEG, 9)
    for reader in (fencer, engine(root)):
        assert payloads(reader.read(LOG, SEG, 0, 100)) == [b"payload-%d" % i for i in range(10)]
        assert reader.read(LOG, SEG, 10, 10) == []
    # and the writer's own engine refuses on its next add (its check after the sync)
    with pytest.raises(SegmentFencedError):
        e.add_entries(LOG, SEG, 5, frame(5, 9))


CHILD = textwrap.dedent(
    """
    import sys
    from woodpecker_idem._core import SegmentAppender, encode_entry
    from woodpecker_idem.errors import SegmentFencedError
    from woodpecker_idem.logstore.engine import LogStoreEngine
    from woodpecker_idem.logstore.segment_files import FileSegmentStorage

    e = LogStoreEngine(FileSegmentStorage(sys.argv[1], fsync=True), "node-0")
    i = 0
    while i < 100_000:  # bounded, so a broken fence fails the test instead of hanging it
        rec = encode_entry(3, i, 1, b"child-%d" % i, None, None)
        try:
            e.add_entries(7, 3, i, rec, lac=i - 1)
        except SegmentFencedError as exc:
            print("FENCED", i, exc, flush=True)
            break
        print("ACK", i, flush=True)
        i += 1
    else:
        print("DONE", i, flush=True)
    """
)


def test_fence_across_processes_keeps_every_acked_entry(root):
    """A child appends (durably) in a loop while this process fences: every entry the child saw
    acknowledged is in the completed segment, and nothing past the fence's L is read."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
    )
    try:
        acked: list[int] = []
        assert child.stdout is not None
        while len(acked) < 200:
            line = child.stdout.readline()
            assert line.startswith("ACK"), line
            acked.append(int(line.split()[1]))
        fencer = engine(root, fsync=True)
        last, _ = fencer.fence(LOG, SEG)
        rest = child.stdout.read()
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    lines = rest.splitlines()
    acked += [int(x.split()[1]) for x in lines if x.startswith("ACK")]
    assert lines[-1].startswith("FENCED"), lines[-3:]
    assert acked == list(range(len(acked)))
    assert max(acked) <= last, f"acked {max(acked)} beyond the fence's end {last}"
    fencer.complete(LOG, SEG, last)
    want = [b"child-%d" % i for i in range(last + 1)]
    for reader in (fencer, engine(root)):
        assert payloads(reader.read(LOG, SEG, 0, 10**6)) == want
        assert reader.read(LOG, SEG, last + 1, 10) == []


def test_torn_tail_ends_the_segment(root):
    e = engine(root)
    e.add_entries(LOG, SEG, 0, frame(0, 4))
    e.add_entries(LOG, SEG, 5, frame(5, 9))
    data = seg_dir(root) / "data"
    whole = data.read_bytes()
    offset = batches(data)[-1][0]
    for cut in (offset + 3, offset + BATCH_HEADER_SIZE + 10, len(whole) - 1):
        data.write_bytes(whole[:cut])  # a killed writer's half batch
        fresh = engine(root)
        assert fresh.last_add_confirmed(LOG, SEG)[0] == 4
    data.write_bytes(whole[:offset] + bytes(len(whole) - offset))  # zeros after a power loss
    fresh = engine(root)
    assert fresh.fence(LOG, SEG)[0] == 4
    fresh.complete(LOG, SEG, 4)
    assert payloads(engine(root).read(LOG, SEG, 0, 100)) == [b"payload-%d" % i for i in range(5)]


def test_final_batch_with_a_bad_record_is_damage_not_a_tail(root):
    """A bit flip in the final batch: an acknowledged batch was synced, so this is no torn write
    (issue 20 item 5); reported naming the file and offset, not cut off as the tail."""
    e = engine(root)
    e.add_entries(LOG, SEG, 0, frame(0, 4))
    e.add_entries(LOG, SEG, 5, frame(5, 9))
    path, offset = flip_entry_byte(seg_dir(root), 7)
    with pytest.raises(SegmentDamagedError, match=rf"data@{offset}: .*truncate -s {offset}"):
        engine(root).last_add_confirmed(LOG, SEG)
    e.complete(LOG, SEG, 9)  # the footer vouches for 5..9: reads report the damaged entry
    fresh = engine(root)
    with pytest.raises(CorruptEntryError, match=r"node-0:7/3/data@\d+ entry 7: checksum"):
        fresh.read(LOG, SEG, 0, 100)


def test_crc_failure_in_the_middle_is_corruption_naming_the_offset(root):
    e = engine(root)
    for first in range(0, 30, 5):
        e.add_entries(LOG, SEG, first, frame(first, first + 4))
    path, offset = flip_entry_byte(seg_dir(root), 12)
    fresh = engine(root)
    assert fresh.last_add_confirmed(LOG, SEG)[0] == 29  # a damaged entry does not end the file
    assert payloads(fresh.read(LOG, SEG, 0, 12)) == [b"payload-%d" % i for i in range(12)]
    with pytest.raises(CorruptEntryError) as exc:
        fresh.read(LOG, SEG, 0, 100)
    assert f"node-0:{LOG}/{SEG}/data@{offset} entry 12: checksum mismatch" in str(exc.value)
    assert payloads(fresh.read(LOG, SEG, 15, 100)) == [b"payload-%d" % i for i in range(15, 30)]
    # a damaged batch header in the middle: the file cannot be walked past it
    flip(path, batches(path)[1][0] + 8)
    with pytest.raises(CorruptEntryError, match=rf"{LOG}/{SEG}/data@\d+: bad batch header"):
        engine(root).fence(LOG, SEG)


FULL_DISK = textwrap.dedent(
    """
    import resource, sys
    from woodpecker_idem._core import SegmentAppender, encode_entry
    from woodpecker_idem.errors import StorageUnavailableError
    from woodpecker_idem.logstore.engine import LogStoreEngine
    from woodpecker_idem.logstore.segment_files import FileSegmentStorage

    root, size = sys.argv[1], int(sys.argv[2])
    e = LogStoreEngine(FileSegmentStorage(root, fsync=False), "node-0")
    e.last_add_confirmed(7, 3)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 50, size + 50))  # a disk full midway
    frame = b"".join(encode_entry(3, i, 1, b"x" * 100, None, None) for i in range(5, 10))
    for attempt in range(2):
        try:
            e.add_entries(7, 3, 5, frame)
        except StorageUnavailableError as exc:
            print("REFUSED", exc, flush=True)
    """
)


def test_failed_append_leaves_the_partial_batch_as_the_tail(root):
    """A write cut short (disk full) leaves a partial batch; the file takes no more appends, so
    it stays the tail, and the segment completes at the last whole batch."""
    engine(root).add_entries(LOG, SEG, 0, frame(0, 4))
    size = (seg_dir(root) / "data").stat().st_size
    out = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(root), str(size)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        timeout=60,
    )
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all(x.startswith("REFUSED") for x in lines), (out.stdout, out.stderr)
    assert "append failed" in lines[0] and "closed" not in lines[1]
    assert size < (seg_dir(root) / "data").stat().st_size <= size + 50  # a partial batch
    fencer = engine(root)
    assert fencer.fence(LOG, SEG)[0] == 4
    fencer.complete(LOG, SEG, 4)
    assert len(engine(root).read(LOG, SEG, 0, 100)) == 5


def test_delete_removes_files(root):
    e = engine(root)
    e.add_entries(LOG, SEG, 0, frame(0, 4))
    e.add_entries(LOG, SEG + 1, 0, frame(0, 1))
    e.delete_segment(LOG, SEG)
    assert not seg_dir(root).exists() and seg_dir(root, SEG + 1).exists()
    e.delete_log(LOG)
    assert not (root / str(LOG)).exists()
    assert e.read(LOG, SEG, 0, 10) == []


def test_sync_writes_leave_a_handful_of_files_per_segment(tmp_path, wp_connect):
    """10,000 sync writes through the client: one data file (plus footer) per segment."""
    client = wp_connect(tmp_path, {"append.linger_ms": 0, "storage.fsync": "never"})
    handle = client.create_log("many")
    writer = handle.open_writer()
    ids = [writer.write(b"x" * 100).message_id for _ in range(10_000)]
    writer.close()
    seg_root = Path(client.objects.root) / str(handle.log_id)
    for seg in handle.segments():
        files = sorted(p.name for p in (seg_root / str(seg.segment_id)).iterdir())
        assert files == ["data", "footer"], files
    got = [m.message_id for m in handle.open_reader()]
    assert got == ids
    loc = locate(seg_root / "0", 9_999)
    assert loc[0].name == "data"
