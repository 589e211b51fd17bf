"""Staged storage (`storage.type: staged`): a node keeps the segments it holds in local files, and
a completed segment moves to object storage, where any node reads it once its local copy is gone.

- While the node holds a segment, it is a `FileSegmentStorage` segment under the node's own
  directory (`storage.staged_dir`): appends, the `storage.fsync` policy and the durable fence are
  exactly those of local segment files (`segment_files.py`), and a restarted node finds them.
- `upload` (the `SealSegment` call) writes a completed segment to the sealed store as block
  objects and a footer, the layout `ObjectSegmentStorage` reads (`{log}/{segment}/{n}.blk`, then
  `footer` last: the footer is the commit point). The blocks are cut from the entries alone
  (`UPLOAD_BLOCK_ENTRIES`, `UPLOAD_BLOCK_BYTES`), never from how this node's batches happened to
  arrive, and every put is create-if-absent: replicas hold byte-identical entries, so a second
  upload of the same segment, by a retry or by another node of the ensemble after this one died
  mid-upload, writes the same keys with the same bytes and changes nothing. An upload first
  reads what is there: blocks another upload left, cut another way (an earlier release's
  layout) or not, are kept when they hold this node's entries byte for byte, and the upload
  goes on after them; a copy holding other entries, or sealed at another end, is a conflict
  (`EntryConflictError`), which no retry resolves (the client stops at it, `uploads.py`).
- An upload and the deletion of its segment (truncation, retention, a deleted log) exclude each
  other on a node (`uploading`): a deletion that meets an upload under way marks it, and the
  upload, once its last put returned, deletes the segment again, local files and objects, and
  fails; an upload that starts during or after a deletion finds the segment gone and refuses.
  Deleting after, rather than holding the deletion until the upload ends, keeps a deletion
  (and the truncation waiting on it) from waiting for an upload S3 holds up for minutes; and
  aborting the puts at once could not help, since a put under way cannot be called back: only
  a deletion after the last put leaves nothing under `sealed/`.
- `drop_local` (the node's `LocalCopies` sweeper, once the metadata says SEALED and a grace period
  passed) leaves a tombstone (`SEALED_MARK`) in the segment's local directory, then removes its
  files. A segment with a tombstone is opened on the sealed store: reads come from object
  storage, through this node as through any other. Nothing else decides by object storage: a
  new segment (no local directory yet) opens locally without a request to it, so writes never
  wait on object storage (a frozen S3 holds uploads, never adds).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from .._core import concat
from ..errors import (
    CorruptEntryError,
    EntryConflictError,
    SegmentFencedError,
    StorageUnavailableError,
)
from ..objectstore.base import ObjectStore
from .blocks import decode_footer, encode_record
from .segment_files import FileSegmentStorage
from .storage import ObjectSegmentStorage, SealedSegment, SegmentHandle, SegmentStorage

log = logging.getLogger(__name__)

#: The prefix, below the store's objects, of sealed segments (`{root}/{store_id}/sealed/...`).
SEALED_PREFIX = "sealed"
#: The tombstone a dropped local copy leaves in its segment directory.
SEALED_MARK = "sealed"
# An uploaded block holds at most this many entries, and is closed once it holds this many bytes:
# blocks of a few MiB keep the GETs of a reader few, and cut by the entries alone (the module doc)
UPLOAD_BLOCK_ENTRIES = 4096
UPLOAD_BLOCK_BYTES = 4 << 20
#: The local files of a segment (segment_files.py) that `drop_local` removes.
LOCAL_FILES = ("data", "recovery", "fence", "fence-at", "footer")


class StagedSegmentStorage(SegmentStorage):
    """`local` holds the segments this node holds; `sealed` (an object store) the uploaded ones."""

    def __init__(self, local: FileSegmentStorage, sealed: ObjectStore):
        self.local = local
        self.sealed_store = sealed
        # uploads and reads only: no packs (they serve a takeover of an open object segment)
        self.sealed = ObjectSegmentStorage(sealed, pack_blocks=0)
        self._sweeper: LocalCopies | None = None
        # uploads against deletions (`uploading`): the uploads under way per segment, those of
        # them a deletion met, and the deletions under way ((log, None): a whole log's)
        self._guard = threading.Lock()
        self._uploading: Counter[tuple[int, int]] = Counter()
        self._deleted_meanwhile: set[tuple[int, int]] = set()
        self._deleting: Counter[tuple[int, int | None]] = Counter()

    def __repr__(self) -> str:
        return f"StagedSegmentStorage({self.local.root!r}, {self.sealed_store!r})"

    def _mark(self, log_id: int, segment_id: int) -> str:
        return os.path.join(self.local.segment_dir(log_id, segment_id), SEALED_MARK)

    def uncached(self) -> StagedSegmentStorage:
        """The local files as they are, and the sealed store read without the block cache (no
        sweeper, no thread: nothing to close)."""
        view = StagedSegmentStorage(self.local, self.sealed_store)
        view.sealed = self.sealed.uncached()
        return view

    def dropped(self, log_id: int, segment_id: int) -> bool:
        """True once the local copy was dropped (the segment is read from the sealed store)."""
        return os.path.exists(self._mark(log_id, segment_id))

    def open(self, log_id: int, segment_id: int, node_id: str) -> SegmentHandle:
        if self.dropped(log_id, segment_id):
            return self.sealed.open(log_id, segment_id, node_id)
        return self.local.open(log_id, segment_id, node_id)

    # --- upload --------------------------------------------------------------------------------

    @contextmanager
    def uploading(self, log_id: int, segment_id: int) -> Iterator[None]:
        """Hold an upload of the segment (the engine's whole `seal_segment`) against its deletion
        (the module doc). Refuses (`SegmentFencedError`) while a deletion of it runs, or when
        this node holds no copy of it (deleted, or never placed here); when a deletion met the
        upload, deletes the segment again once the upload is over, and fails."""
        key = (log_id, segment_id)
        where = f"{log_id}/{segment_id}"
        with self._guard:
            if self._deleting[key] or self._deleting[(log_id, None)]:
                raise SegmentFencedError(f"{where} is being deleted on this node: not uploaded")
            self._uploading[key] += 1
        try:
            if not os.path.isdir(self.local.segment_dir(log_id, segment_id)):
                raise SegmentFencedError(
                    f"{where}: this node holds no copy of it (deleted, or never placed here)"
                )
            yield
        finally:
            with self._guard:
                self._uploading[key] -= 1
                deleted = key in self._deleted_meanwhile
                if not self._uploading[key]:
                    del self._uploading[key]
                    self._deleted_meanwhile.discard(key)
            if deleted:
                # every put of this upload has returned: what it wrote after the deletion goes,
                # and the upload fails as deleted, whatever else it met (its copy vanishing)
                self._delete_copies(log_id, segment_id)
                raise SegmentFencedError(
                    f"{where} was deleted while this node uploaded it; what the upload wrote "
                    "is deleted too"
                )

    @contextmanager
    def _deletion(self, log_id: int, segment_id: int | None) -> Iterator[None]:
        """A deletion of a segment (or, `segment_id` None, of a whole log): marks the uploads of
        it under way, and refuses new ones until it is over (`uploading`)."""
        with self._guard:
            self._deleting[(log_id, segment_id)] += 1
            for key in self._uploading:
                if key[0] == log_id and segment_id in (None, key[1]):
                    self._deleted_meanwhile.add(key)
        try:
            yield
        finally:
            with self._guard:
                self._deleting[(log_id, segment_id)] -= 1
                if not self._deleting[(log_id, segment_id)]:
                    del self._deleting[(log_id, segment_id)]

    def upload(
        self, log_id: int, segment_id: int, node_id: str, chunks: Iterable[list[bytes]], last: int
    ) -> SealedSegment:
        """Write entries 0..`last` (`chunks`: lists of LogEntry bytes, in order) to the sealed
        store as blocks and then the footer (see the module doc); returns once every object is
        written (durable when each put returns). Blocks already there that hold the same entries
        are kept. Raises `EntryConflictError` when the sealed store holds other entries or a
        footer with another end, `CorruptEntryError` when the entries stop short of `last`."""
        handle = self.sealed.open(log_id, segment_id, node_id)
        where = f"{node_id}:{log_id}/{segment_id} upload"
        prefix = f"{log_id}/{segment_id}/"
        there = handle.load()
        kept = _kept_blocks(there.batches, where)  # (first, last, block number), in entry order
        if there.completed_last is not None and there.completed_last != last:
            raise EntryConflictError(
                f"{where}: object storage holds this segment sealed at {there.completed_last}, "
                f"not {last}"
            )
        covered = kept[-1][1] if kept else -1  # the kept blocks hold entries 0..covered
        if covered > last or (there.completed_last is not None and covered != last):
            raise EntryConflictError(
                f"{where}: object storage holds blocks of entries 0..{covered} for a segment "
                f"that ends at {last}"
            )
        held = _entries(handle, kept, where)
        blocks: list[tuple[int, int, int]] = list(kept)  # (first, last, block number)
        records: list[bytes] = []
        size = 0
        entry = 0

        def put() -> None:
            nonlocal records, size
            first = entry - len(records)
            n = handle.append(first, len(records), entry - 1, concat(records), False)
            blocks.append((first, entry - 1, n))
            records, size = [], 0

        for chunk in chunks:
            for data in chunk:
                if entry > last:
                    break
                if entry <= covered:
                    if next(held) != data:
                        raise EntryConflictError(
                            f"{where}: object storage holds entry {entry} with other bytes than "
                            "this node's copy"
                        )
                    entry += 1
                    continue
                records.append(encode_record(data))
                size += len(records[-1])
                entry += 1
                if len(records) >= UPLOAD_BLOCK_ENTRIES or size >= UPLOAD_BLOCK_BYTES:
                    put()
            if entry > last:
                break
        if entry <= last:  # before the last block: a short copy must not put a block it lacks
            raise CorruptEntryError(
                f"{where}: the local copy ends at entry {entry - 1}, not at {last}"
            )
        if records:
            put()
        other = handle.complete(last, blocks) if there.completed_last is None else last
        if other is not None and other != last:
            raise EntryConflictError(
                f"{where}: object storage holds this segment sealed at {other}, not {last}"
            )
        return SealedSegment(
            tuple(f"{prefix}{n}.blk" for _, _, n in blocks),
            f"{prefix}footer",
            last,
            tuple((n, first, end) for first, end, n in blocks),
        )

    def uploaded_end(self, log_id: int, segment_id: int) -> int | None:
        """The end the sealed store's footer records, or None while there is none."""
        data = self.sealed_store.get(f"{log_id}/{segment_id}/footer")
        if data is None:
            return None
        return decode_footer(data, f"sealed {log_id}/{segment_id}/footer").last_entry_id

    # --- dropping local copies -------------------------------------------------------------------

    def local_copies(self) -> list[tuple[int, int]]:
        """(log, segment) of the local copies not dropped, completed here or not (a node that
        was down when its segment completed keeps a copy without a footer, as stale once the
        segment is SEALED as any other)."""
        out: list[tuple[int, int]] = []
        root = self.local.root
        try:
            logs = [e for e in os.scandir(root) if e.is_dir() and e.name.isdigit()]
        except FileNotFoundError:
            return out
        for log_dir in logs:
            try:
                segments = [e for e in os.scandir(log_dir.path) if e.name.isdigit()]
            except FileNotFoundError:
                continue  # the log was deleted meanwhile
            for seg in segments:
                if not os.path.exists(os.path.join(seg.path, SEALED_MARK)):
                    out.append((int(log_dir.name), int(seg.name)))
        return sorted(out)

    def drop_local(self, log_id: int, segment_id: int) -> None:
        """Replace the local copy by a tombstone; refused (`StorageUnavailableError`) unless the
        sealed store holds the segment's footer. The tombstone is durable before any file goes,
        so a crash between leaves a segment that is read from the sealed store."""
        end = self.uploaded_end(log_id, segment_id)
        if end is None:
            raise StorageUnavailableError(
                f"{log_id}/{segment_id}: not in object storage; the local copy is kept"
            )
        directory = self.local.segment_dir(log_id, segment_id)
        self.local.put_new(self._mark(log_id, segment_id), b"%d" % end)
        for name in LOCAL_FILES:
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass
        self.local.sync_dir(directory)

    def start_sweeper(
        self,
        drop: Callable[[int, int], None],
        is_sealed: Callable[[int, int], bool],
        grace_s: float,
    ) -> LocalCopies:
        """Start dropping local copies (see `LocalCopies`); stopped by `close`."""
        self._sweeper = LocalCopies(self, drop, is_sealed, grace_s).start()
        return self._sweeper

    def _delete_copies(self, log_id: int, segment_id: int) -> None:
        self.local.delete_segment(log_id, segment_id)
        self.sealed.delete_segment(log_id, segment_id)

    def delete_segment(self, log_id: int, segment_id: int) -> None:
        with self._deletion(log_id, segment_id):
            self._delete_copies(log_id, segment_id)

    def delete_log(self, log_id: int) -> None:
        with self._deletion(log_id, None):
            self.local.delete_log(log_id)
            self.sealed.delete_log(log_id)

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.stop()
        self.local.close()
        self.sealed.close()


class LocalCopies:
    """A node's sweeper of local copies: every `interval_s`, each local copy whose segment
    `is_sealed` (the metadata says SEALED: its end is final, and it is in object storage) is
    dropped (`drop`: the engine's `drop_local`)
    once it was seen sealed for `grace_s`, so readers that were reading it locally finish first.
    A failed check or drop (metadata or object storage down) is retried at the next round."""

    def __init__(
        self,
        storage: StagedSegmentStorage,
        drop: Callable[[int, int], None],
        is_sealed: Callable[[int, int], bool],
        grace_s: float,
    ):
        self._storage = storage
        self._drop = drop
        self._is_sealed = is_sealed
        self.grace_s = grace_s
        self.interval_s = min(max(grace_s / 4, 0.05), 5.0)
        self._sealed_since: dict[tuple[int, int], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wp-staged-drop", daemon=True)
        self.dropped = 0

    def start(self) -> LocalCopies:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("dropping sealed local copies failed; tried again")

    def sweep(self) -> int:
        """One round; returns how many copies it dropped."""
        now = time.monotonic()
        dropped = 0
        local = set(self._storage.local_copies())
        for key in list(self._sealed_since):
            if key not in local:
                del self._sealed_since[key]
        for key in sorted(local):
            if key not in self._sealed_since:
                try:
                    sealed = self._is_sealed(*key)
                except Exception as exc:  # noqa: BLE001 - metadata down: asked again next round
                    log.info("segment %s/%s: state not read: %s", *key, exc)
                    continue
                if not sealed:
                    continue
                self._sealed_since[key] = now
            if now - self._sealed_since[key] < self.grace_s:
                continue
            try:
                self._drop(*key)
            except Exception as exc:  # noqa: BLE001 - object storage down: next round
                log.warning("segment %s/%s: local copy not dropped: %s", *key, exc)
                continue
            del self._sealed_since[key]
            dropped += 1
            self.dropped += 1
            log.info("segment %s/%s: sealed in object storage, local copy dropped", *key)
        return dropped

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()


def _kept_blocks(batches: list[tuple[int, int, int]], where: str) -> list[tuple[int, int, int]]:
    """The blocks an earlier upload left ((first, last, block number) from the sealed handle's
    load), in entry order; they must be blocks 0, 1, ... holding entries 0, 1, ... back to back
    (as every upload puts them), whatever their cut, else they are not an upload's."""
    kept = sorted((n, first, end) for first, end, n in batches)
    end = -1
    for i, (n, first, last) in enumerate(kept):
        if n != i or first != end + 1:
            raise EntryConflictError(
                f"{where}: object storage holds block {n} of entries {first}..{last}, which does "
                f"not follow entries 0..{end} in blocks 0..{i - 1}: not an upload's blocks"
            )
        end = last
    return [(first, last, n) for n, first, last in kept]


def _entries(
    handle: SegmentHandle, kept: list[tuple[int, int, int]], where: str
) -> Iterator[bytes]:
    """The entries of the kept blocks in order, a block at a time; a damaged one is a conflict
    (the upload cannot complete that copy, and no retry changes it)."""
    for first, last, n in kept:
        try:
            got = handle.read([(n, first, first, last)])
        except CorruptEntryError as exc:
            raise EntryConflictError(
                f"{where}: object storage holds a damaged block: {exc}"
            ) from exc
        yield from got
