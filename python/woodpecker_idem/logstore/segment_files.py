"""Local segment files: on a local directory a segment is an append-only file, not one per batch.

Layout under the node's directory (the same per-store namespace its object store uses):
`{log}/{segment}/data` (the writer's batches), `recovery` (copies written while completing the
segment), `fence` (empty marker), `fence-at` (the data file's length L when fenced) and `footer`
(lastEntryId). A batch is a 36-byte header (magic, first entry id, count, frame length, LAC,
CRC32C of the header) and the frame exactly as the writer built it (records of
`length | crc32c | LogEntry bytes`, or the writer's compressed unit of them: the header's flags
then carry the codec, `append.compression`; reads decompress natively).

Why fencing is as strong as create-if-absent block keys (docs/architecture.md, "Fencing"):

- The writer appends a batch (one `write` with O_APPEND), `fdatasync`s (`storage.fsync: always`;
  with `batch_ms:N` the sync is left to a background thread, see below), THEN checks that `fence`
  does not exist, and only then acks. If it exists, the add fails (`SegmentFencedError`); the
  bytes stay in the file, unacknowledged.
- The fencer creates `fence` create-if-absent and durably (`put_file`: temp + fsync + link +
  directory fsync), THEN reads the data file's length L, `fdatasync`s the data file (so every
  byte below L is on disk before L is), and records L create-if-absent in `fence-at` (the first
  fencer's L wins; a later one reads it). The segment is the batches wholly within [0, L) plus
  the recovery file; bytes past L are ignored by every process, forever.
- Every acked batch is within L: its append returned (its bytes are in the file for every
  process from then on, synced or not) before its check, in the writer's thread; the check saw
  no `fence`, so it preceded the fence's creation, which preceded reading L. So the append
  happened before L was read, and O_APPEND put its bytes below L. The fdatasync between append
  and check is for durability across power loss only; the order does not depend on it.
- Nothing appended after the fence is read: a writer appending after the fence exists finds it
  on its check and refuses; its bytes land at or past the end that the fencer's read of L will
  see, unless they land before that read, which only bytes unacked at the fence can do. Those
  are part of the segment exactly like a block landing before the fence marker (kept by
  recovery, docs/semantics.md). A fencer that died between `fence` and `fence-at` leaves the next
  fencer to read L later; that L may then include such unacknowledged appends, never less than
  every acked one.
- A reader (any process) reads the file's size S first, then looks for `fence-at`/`fence`: with
  no fence then, all of [0, S) was appended before the fence existed, so it lies below any L;
  with `fence` but no `fence-at` yet, it reads nothing new until L is known, unless the directory
  is read-only: then no fencer can record L and nothing can append, so S is final.

A torn tail (a killed writer's half batch, or zeros after a power loss) is where the valid
batches end: a header cut short, a frame running past the end, a zero-filled rest, or a final
batch whose failing records are zeros to the end (pages never written), unless the segment is
completed (its footer vouches for every entry up to lastEntryId). Anything else is damage, since
an acknowledged batch was fdatasynced before its ack: a bad header (after the last batch too) or
a final batch failing its CRC otherwise stops the scan with `SegmentDamagedError` (not retriable,
counted and logged, naming the file, the offset and how to repair it), unless it lies past the
footer's lastEntryId; a bad record read elsewhere is `CorruptEntryError` naming node, segment,
file and offset. A writer
whose write or fdatasync failed refuses every later append to that file, so a partial batch is
always the tail (and pages a failed fdatasync dropped are never assumed durable).

Durability of an ack (`storage.fsync`): `always` acks a batch after its fdatasync; `batch_ms:N`
acks it once `write` returned (in the kernel's page cache: a killed process loses nothing) and a
background thread fdatasyncs the files written since its last round at most every N ms, so a
power loss may lose the acks of the last N ms (NATS's and Kafka's default trade); `never` does
not sync. Under `batch_ms` the fence (above) and the footer (`complete`) still fdatasync the data
file first: a footer never vouches for bytes that are not on disk. Recovery copies are always
synced before their ack. A background fdatasync that fails leaves the file refusing appends, as
an inline one does.

One add is one native call (write, fdatasync unless deferred, fence check) that releases the GIL
once. The adds
of one segment are serial (the engine holds the segment's lock through the call), so a fence in
the same process always sees every acknowledged batch; group commit happens one level up, where
a writer collects the entries that arrive while its previous add is syncing into the next batch
(one sender per node and segment). Reads walk the file sequentially in native code (buffered),
resuming where the previous read stopped; a process indexes a segment by runs of consecutive
entries, once, then only the new tail.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import struct
import threading
from collections.abc import Callable

from .._core import SegmentAppender, crc32c, frame_codec, put_file, segfile_read, segfile_scan
from ..errors import (
    CorruptEntryError,
    SegmentDamagedError,
    SegmentFencedError,
    StorageUnavailableError,
)
from ..objectstore.base import ObjectStore
from ..objectstore.local import LocalObjectStore
from .blocks import decode_footer, encode_footer, encode_record
from .storage import ObjectSegmentStorage, Scan, SegmentHandle, SegmentStorage, Span

BATCH = struct.Struct("<4sHHqIIq")  # magic, version, flags, first, count, frame_len, lac
BATCH_HEADER_SIZE = BATCH.size + 4  # + crc32c of the header
BATCH_MAGIC = b"WPSB"
BATCH_VERSION = 1
FENCE_AT = struct.Struct("<4sqI")  # magic, L, crc32c
FENCE_MAGIC = b"WPFA"

DATA, RECOVERY = 0, 1  # loc = offset << 1 | file
FILE_NAMES = ("data", "recovery")
TEMP_PREFIX = ".wp-tmp-"  # as the local object store's, so its temp sweep covers ours

log = logging.getLogger(__name__)

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC
_temp_seq = itertools.count()

log = logging.getLogger(__name__)


def encode_batch_header(first: int, count: int, frame_len: int, lac: int, codec: int = 0) -> bytes:
    header = BATCH.pack(BATCH_MAGIC, BATCH_VERSION, codec, first, count, frame_len, lac)
    return header + struct.pack("<I", crc32c(header))


def decode_batch_header(buf, pos: int) -> tuple[int, int, int, int] | None:
    """(first, count, frame_len, lac) of the batch header at `pos`, or None if it is not valid."""
    magic, version, _, first, count, frame_len, lac = BATCH.unpack_from(buf, pos)
    (crc,) = struct.unpack_from("<I", buf, pos + BATCH.size)
    if magic != BATCH_MAGIC or version != BATCH_VERSION:
        return None
    if crc32c(buf[pos : pos + BATCH.size]) != crc:
        return None
    return first, count, frame_len, lac


class FileSegmentStorage(SegmentStorage):
    """Segments as append-only files below `root` (a local directory).

    `fsync=False` never syncs (`storage.fsync: never`). With `fsync` and `sync_interval_ms` > 0
    (`batch_ms:N`) a data batch is acknowledged once written and a background thread fdatasyncs
    the written files at most every N ms; otherwise (`always`) each add fdatasyncs before its ack.
    `data_syncs` counts the fdatasyncs of data files by their appenders (inline and background).
    """

    def __init__(
        self, root: str | os.PathLike[str], *, fsync: bool = True, sync_interval_ms: int = 0
    ):
        if sync_interval_ms < 0:
            raise ValueError(f"sync_interval_ms must be >= 0, not {sync_interval_ms}")
        self.root = os.path.abspath(os.fspath(root))
        self.fsync = fsync
        self.data_syncs = 0
        self._count_lock = threading.Lock()
        self.syncer = (
            _Syncer(self, sync_interval_ms / 1000) if fsync and sync_interval_ms > 0 else None
        )
        # testing only (`logstore serve --fault disk-full-after:N`, remote.py `DiskFull`): called
        # with the file's path before each append, it raises the OSError the disk would
        self.write_fault: Callable[[str], None] | None = None
        # segment files found damaged (`SegmentDamagedError`), each counted once per process
        self.damaged = 0
        self._damaged_seen: set[tuple[str, int]] = set()

    def report_damage(self, path: str, offset: int, what: str) -> bool:
        """Count and log a damaged segment file once; True the first time."""
        if (path, offset) in self._damaged_seen:
            return False
        self._damaged_seen.add((path, offset))
        self.damaged += 1
        log.warning("segment file %s is damaged at offset %d: %s", path, offset, what)
        return True

    def __repr__(self) -> str:
        return f"FileSegmentStorage({self.root!r})"

    def counted_sync(self, count: int = 1) -> None:
        with self._count_lock:
            self.data_syncs += count

    def sync_file(self, path: str) -> None:
        """fdatasync `path` if it exists (the fence and the footer: what they vouch for is on
        disk before they are)."""
        if not self.fsync:
            return
        try:
            fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def flush(self) -> None:
        """fdatasync now every file a deferred sync is pending for."""
        if self.syncer is not None:
            self.syncer.flush()

    def close(self) -> None:
        self.flush()

    def open(self, log_id: int, segment_id: int, node_id: str) -> SegmentHandle:
        return _FileHandle(self, log_id, segment_id, node_id)

    def segment_dir(self, log_id: int, segment_id: int) -> str:
        return os.path.join(self.root, str(log_id), str(segment_id))

    def sync_dir(self, path: str) -> None:
        if not self.fsync:
            return
        fd = os.open(path, _DIR_FLAGS)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def make_dirs(self, path: str) -> None:
        """mkdir -p that fsyncs the parent of each directory it creates."""
        missing: list[str] = []
        cur = path
        while not os.path.isdir(cur):
            missing.append(cur)
            cur = os.path.dirname(cur)
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            self.sync_dir(os.path.dirname(d))

    def put_new(self, path: str, data: bytes) -> bool:
        """Create `path` with `data` if absent, durably; False if it exists."""
        directory = os.path.dirname(path)
        while True:
            temp = os.path.join(directory, f"{TEMP_PREFIX}{os.getpid()}-{next(_temp_seq)}")
            outcome = put_file(temp, path, data, exclusive=True, sync=self.fsync)
            if outcome == 0:
                return True
            if outcome == 1:
                return False
            if outcome == 3:
                self.make_dirs(directory)

    def delete_segment(self, log_id: int, segment_id: int) -> None:
        shutil.rmtree(self.segment_dir(log_id, segment_id), ignore_errors=True)

    def delete_log(self, log_id: int) -> None:
        shutil.rmtree(os.path.join(self.root, str(log_id)), ignore_errors=True)


class _Syncer:
    """`batch_ms:N`: fdatasyncs the files written since its last round, at most every N ms, on a
    thread of its own that lives while some written file waits for its sync.

    It holds the native appender of each file written (not the `_Appender`'s current one), so a
    file closed before its round stays open until it is synced."""

    def __init__(self, storage: FileSegmentStorage, interval_s: float):
        self._storage = storage
        self._interval = interval_s
        self._lock = threading.Lock()
        self._pending: dict[_Appender, SegmentAppender] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def written(self, appender: _Appender, native: SegmentAppender) -> None:
        with self._lock:
            self._pending[appender] = native
            if self._thread is None:
                self._wake.clear()  # a flush's wake-up is not this thread's round
                self._thread = threading.Thread(
                    target=self._run, name="woodpecker-fdatasync", daemon=True
                )
                self._thread.start()

    def pending(self) -> int:
        """Files written since their last sync."""
        with self._lock:
            return len(self._pending)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            with self._lock:
                due, self._pending = self._pending, {}
                if not due:
                    self._thread = None
                    return
            self._sync(due)

    def _sync(self, due: dict[_Appender, SegmentAppender]) -> None:
        for appender, native in due.items():
            try:
                native.sync(True, None)
            except OSError as exc:
                appender.failed(f"background fdatasync failed ({exc})", exc)
            else:
                self._storage.counted_sync()

    def flush(self) -> None:
        """Sync every pending file in the caller's thread; the thread, woken, finds none and
        ends (a later write starts another)."""
        with self._lock:
            due, self._pending = self._pending, {}
        self._sync(due)
        self._wake.set()


class _Appender:
    """One append-only file of this process (a native `SegmentAppender`): each batch is one
    O_APPEND write, then `fdatasync` (unless deferred to the storage's `_Syncer`), then the fence
    check, in one call without the GIL."""

    def __init__(self, storage: FileSegmentStorage, path: str):
        self._storage = storage
        self.path = path
        directory = os.path.dirname(path)
        created = not os.path.exists(path)
        try:
            self._native: SegmentAppender | None = SegmentAppender(path)
        except FileNotFoundError:
            storage.make_dirs(directory)
            self._native = SegmentAppender(path)
        if created:
            storage.sync_dir(directory)  # the new name survives a crash
        self._broken: str | None = None

    def append(
        self, header: bytes, frame: bytes, fence_path: str | None, defer: bool
    ) -> tuple[int, bool]:
        """Append one batch, synced unless `defer` (then the storage's syncer syncs it within its
        interval); returns (its offset, whether `fence_path` existed after the sync). A failed
        write or sync leaves the file refusing appends: a partial batch must stay the tail, and a
        failed fdatasync may have dropped pages the kernel will not write again."""
        native = self._native
        if self._broken is not None or native is None:
            raise StorageUnavailableError(self._broken or f"{self.path}: closed")
        storage = self._storage
        syncer = storage.syncer if defer else None
        sync = storage.fsync and syncer is None
        try:
            if storage.write_fault is not None:
                storage.write_fault(self.path)
            result = native.append_sync(header, frame, sync, fence_path)
        except OSError as exc:
            self.failed(f"append failed ({exc})", exc)
            raise StorageUnavailableError(f"{self.path}: append failed ({exc})") from exc
        if sync:
            storage.counted_sync()
        elif syncer is not None:
            syncer.written(self, native)
        return result

    def failed(self, why: str, exc: OSError) -> None:
        if self._broken is None:
            self._broken = f"{self.path}: {why}"
            log.error("%s; the file takes no more appends", self._broken, exc_info=exc)

    def close(self) -> None:
        self._native = None  # the file closes with the native object


class _FileHandle(SegmentHandle):
    def __init__(self, storage: FileSegmentStorage, log_id: int, segment_id: int, node: str):
        self._storage = storage
        self._dir = storage.segment_dir(log_id, segment_id)
        self._paths = tuple(os.path.join(self._dir, n) for n in FILE_NAMES)
        self._fence = os.path.join(self._dir, "fence")
        self._fence_at = os.path.join(self._dir, "fence-at")
        self._footer = os.path.join(self._dir, "footer")
        self.where = f"{node}:{log_id}/{segment_id}"
        self._scanned = [0, 0]  # bytes of data / recovery reported so far
        self._limit: int | None = None  # L, once the fence's length is known
        self._fenced = False
        self._completed = False
        self._completed_last: int | None = None  # the footer's lastEntryId, once read
        self._max_seen = -1  # the highest entry id scanned in either file
        self._appenders: list[_Appender | None] = [None, None]
        self._cursor: dict[tuple[int, int], tuple[int, int]] = {}  # (file, entry) -> batch

    def _at(self, file: int, offset: int) -> str:
        return f"{self.where}/{FILE_NAMES[file]}@{offset}"

    # --- scanning ------------------------------------------------------------------------------

    def _fence_state(self) -> None:
        """Learn whether the segment is fenced and, once recorded, at which length."""
        if self._limit is not None:
            return
        try:
            with open(self._fence_at, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            if not self._fenced:
                self._fenced = os.path.exists(self._fence)
            return
        magic, limit, crc = FENCE_AT.unpack(data) if len(data) == FENCE_AT.size else (b"", 0, 0)
        if magic != FENCE_MAGIC or crc32c(data[: FENCE_AT.size - 4]) != crc:
            raise CorruptEntryError(f"{self.where}/fence-at: unreadable")
        self._limit = limit
        self._fenced = True

    def load(self) -> Scan:
        scan = Scan()
        if not self._completed:  # first: a completed segment's last batch is not a torn tail
            try:
                with open(self._footer, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                pass
            else:
                scan.completed_last = decode_footer(data, f"{self.where}/footer").last_entry_id
                self._completed = True
                self._completed_last = scan.completed_last
        sizes = [_size(p) for p in self._paths]  # sizes first, then the fence (see the docstring)
        self._fence_state()
        if self._limit is not None:
            data_end = min(sizes[DATA], self._limit)
        elif self._fenced and not os.access(self._dir, os.W_OK):
            # A read-only store (a takeover killed between `fence` and `fence-at`, the directory
            # then copied or mounted read-only): nothing can append any more, and no fencer can
            # record L, so the file's length is final; every acked batch lies below it.
            data_end = sizes[DATA]
        elif self._fenced:
            data_end = self._scanned[DATA]  # fenced, L not recorded yet: nothing new is trusted
        else:
            data_end = sizes[DATA]
        self._scan(DATA, data_end, scan)
        self._scan(RECOVERY, sizes[RECOVERY], scan)
        scan.fenced = self._fenced
        return scan

    def _scan(self, file: int, end: int, scan: Scan) -> None:
        """Report the whole batches in [scanned, end) of `file`; stop at a torn tail."""
        start = self._scanned[file]
        if start >= end:
            return
        runs, lac, stop, corrupt_at = segfile_scan(
            self._paths[file], start, end, completed=self._completed
        )
        if corrupt_at is not None and not self._past_the_end(runs):
            path = self._paths[file]
            what = "bad batch header, or a final batch failing its checksum (no torn write)"
            self._storage.report_damage(path, corrupt_at, what)
            raise SegmentDamagedError(
                f"{self._at(file, corrupt_at)}: {what}. An acknowledged batch was synced before "
                "its ack, so a crash cannot have left this: the file is damaged, and the "
                f"entries from offset {corrupt_at} on (acknowledged ones among them, maybe) "
                f"cannot be read. Repair: restore {path} from a backup; or, to give those entries "
                f"up, truncate it there (truncate -s {corrupt_at} {path}) and open the writer "
                "again: their keys are then new to the window"
            )
        if corrupt_at is not None:
            self._storage.report_damage(
                self._paths[file], corrupt_at, "past the footer's last entry: nothing lost"
            )
        scan.batches += [(first, last, offset << 1 | file) for first, last, offset in runs]
        self._max_seen = max([self._max_seen, *(last for _, last, _ in runs)])
        scan.lac = max(scan.lac, lac)
        self._scanned[file] = stop

    def _past_the_end(self, runs: list[tuple[int, int, int]]) -> bool:
        """Damage after the batches holding every entry up to the footer's lastEntryId lies past
        every acknowledged entry: nothing is lost, the scan just ends there."""
        if self._completed_last is None:
            return False
        self._max_seen = max([self._max_seen, *(last for _, last, _ in runs)])
        return self._max_seen >= self._completed_last

    # --- writing -------------------------------------------------------------------------------

    def _appender(self, file: int) -> _Appender:
        appender = self._appenders[file]
        if appender is None:
            appender = self._appenders[file] = _Appender(self._storage, self._paths[file])
        return appender

    def append(self, first: int, count: int, lac: int, frame: bytes, recovery: bool) -> int:
        file = RECOVERY if recovery else DATA
        header = encode_batch_header(first, count, len(frame), lac, frame_codec(frame))
        fence = None if recovery else self._fence
        # recovery copies are synced before their ack in every mode: a takeover is rare, and the
        # footer written after them vouches for them
        offset, fenced = self._appender(file).append(header, frame, fence, defer=not recovery)
        if fenced:
            raise SegmentFencedError(
                f"{self.where} is fenced; the add at {FILE_NAMES[file]}@{offset} is not part of it"
            )
        if offset == self._scanned[file]:  # ours, acked and indexed: no need to scan it again
            self._scanned[file] = offset + len(header) + len(frame)
        return offset << 1 | file

    def fence(self) -> Scan:
        self._fence_state()
        if self._limit is None:
            self._storage.make_dirs(self._dir)
            self._storage.put_new(self._fence, b"")  # durable before L is read
            self._fenced = True
            length = _size(self._paths[DATA])
            self._storage.sync_file(self._paths[DATA])  # bytes below L on disk before L is
            body = struct.pack("<4sq", FENCE_MAGIC, length)
            self._storage.put_new(self._fence_at, body + struct.pack("<I", crc32c(body)))
            self._fence_state()  # ours, or the first fencer's
        self._close_appender(DATA)
        return self.load()

    def complete(self, last_entry_id: int, batches: list[tuple[int, int, int]]) -> int | None:
        self._storage.make_dirs(self._dir)
        self._completed = True
        self._close_appender(DATA)
        self._storage.sync_file(self._paths[DATA])  # the footer vouches for these bytes
        if self._storage.put_new(self._footer, encode_footer(last_entry_id, [])):
            self._completed_last = last_entry_id
            return None
        with open(self._footer, "rb") as f:
            return decode_footer(f.read(), f"{self.where}/footer").last_entry_id

    def _close_appender(self, file: int) -> None:
        appender, self._appenders[file] = self._appenders[file], None
        if appender is not None:
            appender.close()

    def close(self) -> None:
        for file in (DATA, RECOVERY):
            self._close_appender(file)

    # --- reading -------------------------------------------------------------------------------

    def read(self, spans: list[Span]) -> list[bytes]:
        """One sequential pass per file; a read continuing where the last one stopped starts at
        the batch it stopped in, not at the start of its run."""
        out: list[bytes] = []
        start = 0
        while start < len(spans):
            file = spans[start][0] & 1
            stop = start
            while stop < len(spans) and spans[stop][0] & 1 == file:
                stop += 1
            plain = [(loc >> 1, first, lo, hi) for loc, first, lo, hi in spans[start:stop]]
            native = [self._resume(file, span) for span in plain]
            got, at, at_first, bad = segfile_read(self._paths[file], native)
            if bad is not None and native != plain:  # a stale cursor: read from the runs' starts
                got, at, at_first, bad = segfile_read(self._paths[file], native := plain)
            if bad is not None:
                offset, entry_id, why = bad
                raise CorruptEntryError(f"{self._at(file, offset)} entry {entry_id}: {why}")
            self._cursor = {(file, native[-1][3] + 1): (at, at_first)}
            out += got
            start = stop
        return out

    def _resume(self, file: int, span: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        offset, _, lo, hi = span
        cursor = self._cursor.get((file, lo))
        if cursor is not None and cursor[0] >= offset:
            return cursor[0], cursor[1], lo, hi
        return span

    def record(self, loc: int, first: int, entry_id: int) -> bytes:
        return encode_record(self.read([(loc, first, entry_id, entry_id)])[0])


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def segment_storage(
    store: ObjectStore, *, fsync: bool = True, sync_interval_ms: int = 0
) -> SegmentStorage:
    """The layout for a node on `store`: files in its directory for a local store (the same
    per-store namespace its objects use), blocks on it otherwise (S3, where every put is durable
    when it returns: `fsync` and `sync_interval_ms` apply to local files only)."""
    if isinstance(store, LocalObjectStore):
        return FileSegmentStorage(store.root, fsync=fsync, sync_interval_ms=sync_interval_ms)
    return ObjectSegmentStorage(store)
