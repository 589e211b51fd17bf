"""Local segment files: on a local directory a segment is an append-only file, not one per batch.

Layout under the node's directory (the same per-store namespace its object store uses):
`{log}/{segment}/data` (the writer's batches), `recovery` (copies written while completing the
segment), `fence` (empty marker), `fence-at` (the data file's length L when fenced) and `footer`
(lastEntryId). A batch is a 36-byte header (magic, first entry id, count, frame length, LAC,
CRC32C of the header) and the frame exactly as the writer built it (records of
`length | crc32c | LogEntry bytes`).

Why fencing is as strong as create-if-absent block keys (DESIGN.md section 3):

- The writer appends a batch (one `write` with O_APPEND), `fdatasync`s, THEN checks that `fence`
  does not exist, and only then acks. If it exists, the add fails (`SegmentFencedError`); the
  bytes stay in the file, unacknowledged.
- The fencer creates `fence` create-if-absent and durably (`put_file`: temp + fsync + link +
  directory fsync), THEN reads the data file's length L, and records it create-if-absent in
  `fence-at` (the first fencer's L wins; a later one reads it). The segment is the batches wholly
  within [0, L) plus the recovery file; bytes past L are ignored by every process, forever.
- Every acked batch is within L: its append preceded its fdatasync, which preceded its check; the
  check saw no `fence`, so it preceded the fence's creation, which preceded reading L. So the
  append happened before L was read, and O_APPEND put its bytes below L.
- Nothing appended after the fence is read: a writer appending after the fence exists finds it
  on its check and refuses; its bytes land at or past the end that the fencer's read of L will
  see, unless they land before that read, which only bytes unacked at the fence can do. Those
  are part of the segment exactly like a block landing before the fence marker (kept by
  recovery, DESIGN.md 1.1(b)). A fencer that died between `fence` and `fence-at` leaves the next
  fencer to read L later; that L may then include such unacknowledged appends, never less than
  every acked one.
- A reader (any process) reads the file's size S first, then looks for `fence-at`/`fence`: with
  no fence then, all of [0, S) was appended before the fence existed, so it lies below any L;
  with `fence` but no `fence-at` yet, it reads nothing new until L is known.

A torn tail (a killed writer's half batch, or zeros after a power loss) is where the valid
batches end: a header cut short, a frame running past the end, a zero-filled remainder, or a
final batch whose records fail their CRC. A bad header or record anywhere else is corruption
(`CorruptEntryError` naming node, segment, file and offset). A writer whose write failed midway
refuses every later append to that file, so a partial batch is always the tail.

Appends of one file share their `fdatasync` (group commit): batches appended while a sync runs
are covered by the next one, and a sync and the fence check after it answer every batch it
covers. Reads map the file and walk it sequentially.
"""

from __future__ import annotations

import errno
import itertools
import logging
import mmap
import os
import shutil
import struct
import threading
from typing import NoReturn

from .._core import crc32c, put_file
from ..errors import CorruptEntryError, SegmentFencedError, StorageUnavailableError
from ..objectstore.base import ObjectStore
from ..objectstore.local import LocalObjectStore
from .blocks import RECORD_HEADER, decode_footer, encode_footer
from .storage import ObjectSegmentStorage, Scan, SegmentHandle, SegmentStorage, Span

log = logging.getLogger(__name__)

BATCH = struct.Struct("<4sHHqIIq")  # magic, version, flags, first, count, frame_len, lac
BATCH_HEADER_SIZE = BATCH.size + 4  # + crc32c of the header
BATCH_MAGIC = b"WPSB"
BATCH_VERSION = 1
FENCE_AT = struct.Struct("<4sqI")  # magic, L, crc32c
FENCE_MAGIC = b"WPFA"

DATA, RECOVERY = 0, 1  # loc = offset << 1 | file
FILE_NAMES = ("data", "recovery")
TEMP_PREFIX = ".wp-tmp-"  # as the local object store's, so its temp sweep covers ours

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC
_temp_seq = itertools.count()


def encode_batch_header(first: int, count: int, frame_len: int, lac: int) -> bytes:
    header = BATCH.pack(BATCH_MAGIC, BATCH_VERSION, 0, first, count, frame_len, lac)
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


def _frame_ok(buf, start: int, end: int, count: int) -> bool:
    """Whether the frame [start, end) holds exactly `count` records with valid CRCs."""
    pos = start
    for _ in range(count):
        if end - pos < RECORD_HEADER.size:
            return False
        length, crc = RECORD_HEADER.unpack_from(buf, pos)
        pos += RECORD_HEADER.size
        if pos + length > end or crc32c(buf[pos : pos + length]) != crc:
            return False
        pos += length
    return pos == end


class FileSegmentStorage(SegmentStorage):
    """Segments as append-only files below `root` (a local directory)."""

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True):
        self.root = os.path.abspath(os.fspath(root))
        self.fsync = fsync

    def __repr__(self) -> str:
        return f"FileSegmentStorage({self.root!r})"

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


class _Appender:
    """One append-only file of this process: O_APPEND writes and group-commit fdatasync."""

    def __init__(self, storage: FileSegmentStorage, path: str):
        self._storage = storage
        self.path = path
        directory = os.path.dirname(path)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_CLOEXEC
        try:
            self._fd = os.open(path, flags | os.O_EXCL, 0o666)
            created = True
        except FileExistsError:
            self._fd = os.open(path, flags, 0o666)
            created = False
        except FileNotFoundError:
            storage.make_dirs(directory)
            self._fd = os.open(path, flags, 0o666)
            created = True
        if created:
            storage.sync_dir(directory)  # the new name survives a crash
        self._broken: str | None = None
        self._cond = threading.Condition()
        self._written = 0  # end offset of our last append
        self._synced = 0  # everything below is durable (and was checked against the fence)
        self._synced_fenced = False
        self._syncing = False

    def append(self, header: bytes, frame: bytes) -> int:
        """Append one batch; returns its offset. Not durable until `sync_through` returns."""
        size = len(header) + len(frame)
        with self._cond:
            if self._broken is not None:
                raise StorageUnavailableError(self._broken)
        try:
            n = os.writev(self._fd, [header, frame])
            why = "short write"
        except OSError as exc:
            n, why = -1, str(exc)
        if n != size:
            # a partial batch may be in the file: it must stay the tail, so no more appends here
            self._fail(f"{self.path}: append failed ({why})")
        end = os.lseek(self._fd, 0, os.SEEK_CUR)  # O_APPEND: just past our bytes
        with self._cond:
            self._written = max(self._written, end)
        return end - size

    def _fail(self, why: str) -> NoReturn:
        with self._cond:
            self._broken = why
            self._cond.notify_all()
        raise StorageUnavailableError(why)

    def sync_through(self, end: int, fence_path: str | None) -> bool:
        """Make every byte below `end` durable; returns whether `fence_path` existed after the
        sync that covered them (group commit: one sync answers every batch written before it)."""
        with self._cond:
            while self._synced < end:
                if self._broken is not None:
                    raise StorageUnavailableError(self._broken)
                if not self._syncing:
                    self._syncing = True
                    break
                self._cond.wait()
            else:
                return self._synced_fenced
            target = self._written
        return self._sync(target, fence_path)

    def _sync(self, target: int, fence_path: str | None) -> bool:
        """fdatasync then the fence check, as one step of the group commit (caller is the leader).

        A failed fdatasync may have dropped dirty pages (the kernel does not retry them), so the
        file takes no more appends: the segment gets completed from what is durable.
        """
        try:
            if self._storage.fsync:
                os.fdatasync(self._fd)
            fenced = fence_path is not None and os.path.exists(fence_path)
        except OSError as exc:
            with self._cond:
                self._syncing = False
            self._fail(f"{self.path}: fdatasync failed ({exc})")
        with self._cond:
            self._syncing = False
            self._synced = max(self._synced, target)
            self._synced_fenced = fenced
            self._cond.notify_all()
        return fenced

    def close(self, fence_path: str | None) -> None:
        """Settle every append (a last sync and fence check if one is pending), then close."""
        with self._cond:
            while self._syncing:
                self._cond.wait()
            pending = self._synced < self._written and self._broken is None
            if pending:
                self._syncing = True
        try:
            if pending:
                self._sync(self._written, fence_path)
        except StorageUnavailableError:
            pass  # the waiting commits see the failure themselves
        finally:
            with self._cond:
                self._broken = self._broken or f"{self.path}: closed"
                self._cond.notify_all()
            os.close(self._fd)


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
        self._appenders: list[_Appender | None] = [None, None]

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
        sizes = [_size(p) for p in self._paths]  # sizes first, then the fence (see the docstring)
        self._fence_state()
        if self._limit is not None:
            data_end = min(sizes[DATA], self._limit)
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
        pos = self._scanned[file]
        if pos >= end:
            return
        with _Mapped(self._paths[file]) as buf:
            end = min(end, len(buf))
            while end - pos >= BATCH_HEADER_SIZE:
                header = decode_batch_header(buf, pos)
                if header is None:
                    if buf[pos:end].count(0) == end - pos:
                        break  # zeros after a power loss: unacknowledged, the tail
                    raise CorruptEntryError(f"{self._at(file, pos)}: bad batch header")
                first, count, frame_len, lac = header
                stop = pos + BATCH_HEADER_SIZE + frame_len
                if stop > end:
                    break  # the frame runs past the end: torn (or still being written)
                if (
                    stop == end
                    and not self._completed
                    and not _frame_ok(buf, pos + BATCH_HEADER_SIZE, stop, count)
                ):
                    break  # a final batch with bad records: torn (unless the footer covers it)
                if count:
                    scan.batches.append((first, first + count - 1, pos << 1 | file))
                scan.lac = max(scan.lac, lac)
                pos = stop
        self._scanned[file] = pos

    # --- writing -------------------------------------------------------------------------------

    def _appender(self, file: int) -> _Appender:
        appender = self._appenders[file]
        if appender is None:
            appender = self._appenders[file] = _Appender(self._storage, self._paths[file])
        return appender

    def append(self, first: int, count: int, lac: int, frame: bytes, recovery: bool) -> int:
        file = RECOVERY if recovery else DATA
        header = encode_batch_header(first, count, len(frame), lac)
        offset = self._appender(file).append(header, frame)
        return offset << 1 | file

    def commit(self, loc: int, recovery: bool) -> None:
        file = loc & 1
        appender = self._appenders[file]
        assert appender is not None, "commit without append"
        offset = loc >> 1
        end = offset + 1  # any byte of the batch: the sync covering it covers the whole write
        fence = None if recovery else self._fence
        if appender.sync_through(end, fence):
            raise SegmentFencedError(
                f"{self.where} is fenced; the add at {FILE_NAMES[file]}@{offset} is not part of it"
            )

    def fence(self) -> Scan:
        self._fence_state()
        if self._limit is None:
            self._storage.make_dirs(self._dir)
            self._storage.put_new(self._fence, b"")  # durable before L is read
            self._fenced = True
            body = struct.pack("<4sq", FENCE_MAGIC, _size(self._paths[DATA]))
            self._storage.put_new(self._fence_at, body + struct.pack("<I", crc32c(body)))
            self._fence_state()  # ours, or the first fencer's
        self._close_appender(DATA)
        return self.load()

    def complete(self, last_entry_id: int, batches: list[tuple[int, int, int]]) -> int | None:
        self._storage.make_dirs(self._dir)
        self._completed = True
        self._close_appender(DATA)
        if self._storage.put_new(self._footer, encode_footer(last_entry_id, [])):
            return None
        with open(self._footer, "rb") as f:
            return decode_footer(f.read(), f"{self.where}/footer").last_entry_id

    def _close_appender(self, file: int) -> None:
        appender, self._appenders[file] = self._appenders[file], None
        if appender is not None:
            appender.close(None if file == RECOVERY else self._fence)

    def close(self) -> None:
        for file in (DATA, RECOVERY):
            self._close_appender(file)

    # --- reading -------------------------------------------------------------------------------

    def read(self, spans: list[Span]) -> list[bytes]:
        out: list[bytes] = []
        maps: dict[int, _Mapped] = {}
        try:
            for loc, first, lo, hi in spans:
                file, offset = loc & 1, loc >> 1
                mapped = maps.get(file)
                if mapped is None:
                    mapped = maps[file] = _Mapped(self._paths[file])
                    mapped.__enter__()
                self._read_batch(mapped.buf, file, offset, first, lo, hi, out)
        finally:
            for mapped in maps.values():
                mapped.__exit__()
        return out

    def _read_batch(self, buf, file: int, offset: int, first: int, lo: int, hi: int, out) -> None:
        pos = offset + BATCH_HEADER_SIZE
        unpack = RECORD_HEADER.unpack_from
        for eid in range(first, hi + 1):
            try:
                length, crc = unpack(buf, pos)
            except struct.error:
                where = f"{self._at(file, offset)} entry {eid}"
                raise CorruptEntryError(f"{where}: truncated") from None
            pos += 8
            if eid >= lo:
                data = buf[pos : pos + length]
                if len(data) != length or crc32c(data) != crc:
                    raise CorruptEntryError(
                        f"{self._at(file, offset)} entry {eid}: checksum mismatch"
                    )
                out.append(data)
            pos += length

    def record(self, loc: int, first: int, entry_id: int) -> bytes:
        file, offset = loc & 1, loc >> 1
        with _Mapped(self._paths[file]) as buf:
            pos = offset + BATCH_HEADER_SIZE
            for _ in range(first, entry_id):
                pos += RECORD_HEADER.size + RECORD_HEADER.unpack_from(buf, pos)[0]
            length, _ = RECORD_HEADER.unpack_from(buf, pos)
            return bytes(buf[pos : pos + RECORD_HEADER.size + length])


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


class _Mapped:
    """A read-only map of a whole file (empty bytes for an empty or missing file)."""

    def __init__(self, path: str):
        self._path = path
        self._map: mmap.mmap | None = None
        self.buf: mmap.mmap | bytes = b""

    def __enter__(self):
        try:
            fd = os.open(self._path, os.O_RDONLY | _O_CLOEXEC)
        except FileNotFoundError:
            return self.buf
        try:
            if os.fstat(fd).st_size:
                self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                self.buf = self._map
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
        finally:
            os.close(fd)
        return self.buf

    def __exit__(self, *exc: object) -> None:
        if self._map is not None:
            self._map.close()


def segment_storage(store: ObjectStore, *, fsync: bool = True) -> SegmentStorage:
    """The layout for a node on `store`: files in its directory for a local store (the same
    per-store namespace its objects use), blocks on it otherwise (S3)."""
    if isinstance(store, LocalObjectStore):
        return FileSegmentStorage(store.root, fsync=fsync)
    return ObjectSegmentStorage(store)
