"""Rust core of woodpecker_idem: idempotency keys, the dedup window and the dedup snapshot codec.

The contract is `docs/core-api.md`. Errors are the classes of `woodpecker_idem.errors`:
`InvalidArgumentError` (a `ValueError`) for a bad value, `InvalidTypeError` (a `TypeError`) for a
wrong type, both naming the argument, and `SnapshotCorruptError` for undecodable snapshots.

"Bytes-like" means bytes, bytearray, memoryview, array.array or any C-contiguous buffer (its raw
bytes are used). `bytes` is read in place; other buffers are copied once while the GIL is held,
because a writable exporter could change under a batch that runs without the GIL.
"""

import os
from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar, final, overload

from typing_extensions import Buffer

_B = TypeVar("_B", bound=Buffer)  # any one buffer type: `list[bytes]` is not a `list[Buffer]`
_T = TypeVar("_T", bound=tuple[Any, ...])

__all__ = [
    "KEY_SIZE",
    "SNAPSHOT_FORMAT_VERSION",
    "__version__",
    "DedupWindow",
    "Completions",
    "EntryKeys",
    "KeyPipe",
    "NodeChannel",
    "NodeServer",
    "Payloads",
    "RpcError",
    "SegmentAppender",
    "StoredEntry",
    "Snapshot",
    "SnapshotStream",
    "WindowEntry",
    "arrow_canonical_json",
    "arrow_content_keys",
    "arrow_explicit_keys",
    "arrow_first_misrouted",
    "arrow_rows",
    "check_entries",
    "chunk_end",
    "concat",
    "content_key",
    "content_keys",
    "content_keys_arrow",
    "count_records",
    "decompress_frame",
    "frame_codec",
    "crc32c",
    "decode_entries",
    "decode_entry_keys",
    "decode_messages",
    "decode_snapshot",
    "encode_entry",
    "encode_frame",
    "encode_snapshot",
    "explicit_key",
    "explicit_keys",
    "put_file",
    "route_keys",
    "segfile_read",
    "segfile_scan",
    "write_results",
]

__version__: str
"""The package version, from `Cargo.toml` (PEP 440 spelling); `woodpecker_idem.__version__`."""

KEY_SIZE: int
"""Length of every idempotency key (16): keys are MD5 digests, so one fixed size fits all tables."""

SNAPSHOT_FORMAT_VERSION: int
"""Snapshot format version this build writes (2: framed, streamed); it reads 1 and 2."""

# --- keys ------------------------------------------------------------------------------------

def content_key(payload: Buffer) -> bytes:
    """Key of an entry written without an explicit id: MD5 of the payload bytes.

    Identical payloads get identical keys in every process, which is what makes a blind retry
    idempotent. The empty payload is allowed.

    Args:
        payload: The entry payload (bytes-like). Properties are not part of the key.

    Raises:
        InvalidTypeError: `payload` is not bytes-like (a `str` must be encoded by the caller).
    """

def explicit_key(idempotency_id: str | bytes) -> bytes:
    """Key of an entry written with a business idempotency id.

    MD5 over the domain tag `b"woodpecker-idem/explicit-id/v1\\x00"` and the id, so an id can
    never collide with the content key of a payload with the same bytes.

    Args:
        idempotency_id: 1..=1024 bytes; a `str` is taken as UTF-8.

    Raises:
        InvalidArgumentError: `idempotency_id` is empty, longer than 1024 bytes, or a `str` that
            is not encodable as UTF-8.
        InvalidTypeError: `idempotency_id` is neither `str` nor `bytes`.
    """

def content_keys(payloads: Sequence[Buffer] | Payloads) -> bytes:
    """Content keys of many payloads at once, concatenated (N*16 bytes).

    One call per batch keeps Python overhead out of the per-entry cost: hashing runs without the
    GIL and large batches (about 2 MiB of work: 16,384 short payloads, or fewer long ones) are
    split over the available cores.

    Args:
        payloads: A sequence (list, tuple or other iterable) of bytes-like payloads, or a
            `Payloads` (read in place).

    Raises:
        InvalidTypeError: `payloads` is a lone str/bytes or not iterable, or `payloads[i]` is
            not bytes-like (the message names the index).
    """

def content_keys_arrow(offsets: Buffer, data: Buffer, *, large: bool = False) -> bytes:
    """Content keys of an Arrow binary column without building Python objects per row.

    Args:
        offsets: The column's offsets buffer: N+1 little-endian int32 (int64 with `large`)
            offsets into `data`. Offsets need not start at 0 (sliced arrays). An empty buffer is
            an empty column.
        data: The column's value buffer.
        large: True for `large_binary` / `large_string` columns (int64 offsets).

    Returns:
        N*16 bytes, the MD5 of each value.

    Raises:
        InvalidArgumentError: `offsets` is not a whole number of offsets, is negative, decreasing,
            or points past the end of `data`.
        InvalidTypeError: `offsets` or `data` is not bytes-like.
    """

def explicit_keys(ids: Sequence[str | bytes]) -> bytes:
    """Explicit keys of many ids at once, concatenated (N*16 bytes); see `explicit_key`.

    Raises:
        InvalidArgumentError: `ids[i]` is empty, longer than 1024 bytes, or not UTF-8 encodable.
        InvalidTypeError: `ids` is not a sequence, or `ids[i]` is neither `str` nor `bytes`.
    """

def crc32c(data: Buffer, value: int | None = None) -> int:
    """CRC32C (Castagnoli) of `data`, the checksum used by snapshots and stored entries.

    Args:
        data: Bytes-like input.
        value: A previous result, to checksum a stream chunk by chunk
            (`crc32c(b, crc32c(a)) == crc32c(a + b)`); None (the default) starts from 0.

    Raises:
        InvalidArgumentError: `value` is outside 0..=2**32-1.
        InvalidTypeError: `data` is not bytes-like or `value` is not an int.
    """

# --- keys over Arrow data (Spark, polars, Kafka batches) -------------------------------------
#
# `_ArrowData` is any object exporting the Arrow PyCapsule interface: `__arrow_c_array__` (pyarrow
# Array, RecordBatch) or `__arrow_c_stream__` (ChunkedArray, Table, polars objects). It is read
# zero-copy; keys, routes and JSON are computed with the GIL released. Row numbers in errors count
# across chunks from 0.

_ArrowData = Any  # private: not a runtime name

def arrow_explicit_keys(column: _ArrowData) -> bytes:
    """Explicit keys (as `explicit_key`) of a key column, N*16 bytes.

    string -> its UTF-8 bytes, binary -> as is, any integer type -> its decimal text (`7`, `-12`),
    so the same id gives the same key whatever the column type.

    Raises:
        InvalidArgumentError: a null, an empty id or an id over 1024 bytes (names the row).
        InvalidTypeError: not Arrow data, or a column of another type.
    """

def arrow_content_keys(column: _ArrowData) -> bytes:
    """Content keys (MD5 of the value bytes, as `content_key`) of a binary or string column.

    Raises:
        InvalidArgumentError: a null value (names the row).
        InvalidTypeError: not Arrow data, or a column of another type.
    """

def arrow_canonical_json(batch: _ArrowData, exclude: Sequence[str] = ...) -> list[bytes]:
    """Canonical JSON of each row of a record batch or table (columns in `exclude` left out).

    The format (identical in every process, whatever the column types): fields sorted by the UTF-8
    bytes of their names, no whitespace, nulls as `null`; strings as UTF-8 escaping only `"`, `\\`
    and control characters (like `json.dumps(ensure_ascii=False)`); integers in decimal;
    decimal128 as its exact text; floats in ECMAScript's shortest round-trip form (RFC 8785:
    `1`, `0.1`, `1e+21`), float32 from its own shortest digits, NaN/infinity refused; binary as
    padded base64 strings; dates `"YYYY-MM-DD"`; timestamps as UTC instants
    `"YYYY-MM-DDTHH:MM:SS[.fff|.ffffff|.fffffffff]Z"` (fewest exact fraction digits); lists as
    arrays, structs as objects (sorted the same way).

    Raises:
        InvalidArgumentError: NaN/infinity, or two columns with one name (names the row).
        InvalidTypeError: not a batch, or a column type outside the list above.
    """

def arrow_rows(
    data: _ArrowData,
    *,
    key: str | _ArrowData | None = None,
    payload: str | None = None,
    exclude: Sequence[str] = ...,
) -> tuple[Payloads, bytes]:
    """Payloads and keys (N*16 bytes) of the rows of `data`, validated as a whole: no Python
    object per row.

    `data` is a record batch or table, or a single binary/string column of payloads. Payloads:
    the column named `payload` as is (its Arrow buffers shared, not copied, when it is one chunk
    of binary, large binary, string or large string), else the canonical JSON of each row
    without the `exclude` columns (one buffer). Keys: explicit keys of the column named `key`
    (or of the Arrow column `key`), else the content keys of the payloads.

    Raises:
        InvalidArgumentError: a missing column, a null, a bad id, mismatched lengths.
        InvalidTypeError: not Arrow data, or a column of an unsupported type.
    """

def route_keys(keys: Buffer, partitions: int) -> bytes:
    """Route of each key among `partitions` logs, as N little-endian int32.

    route = first 8 key bytes as a big-endian unsigned int, modulo `partitions`; a stable
    function of the key that `woodpecker_idem.spark.prepare` computes the same way inside Spark.

    Raises:
        InvalidArgumentError: `partitions` < 1, or `keys` not a multiple of 16 bytes.
    """

def arrow_first_misrouted(
    keys: Buffer, partitions: int, routes: _ArrowData
) -> tuple[int, int | None, int] | None:
    """The first row whose route column disagrees with its key's route, as (row, found, expected)
    (`found` None for a null), or None when every row is routed right.

    Raises:
        InvalidArgumentError: `partitions` < 1, or the lengths differ.
        InvalidTypeError: `routes` is not an integer Arrow column.
    """

# --- records and files -----------------------------------------------------------------------

def encode_entry(
    segment_id: int,
    entry_id: int,
    timestamp_ms: int,
    payload: Buffer,
    properties: dict[str, str] | None = None,
    idempotency_key: Buffer | None = None,
) -> bytes:
    """One LogStore record: `length u32 | crc32c u32 | LogEntry` (see `proto/logstore.proto`).

    The writer encodes each entry exactly once, here, so every resend after a lost ack is
    byte-identical and nodes can compare bytes instead of parsing.

    Raises:
        InvalidTypeError: `payload`/`idempotency_key` not bytes-like, or `properties` not a
            dict of str to str.
    """

def chunk_end(
    payloads: list[bytes] | Payloads, start: int, end: int, limit: int, overhead: int
) -> tuple[int, int]:
    """`(bytes, end)`: the rows from `start` (before `end`) whose bytes, `overhead` more each,
    fit `limit` (at least one row), and what they count: where a run of one AddEntries batch
    ends. A `Payloads` answers by bisection over its offsets, without reading a row.

    Raises:
        InvalidArgumentError: the range is outside `payloads`.
        InvalidTypeError: a payload in the range is not bytes.
    """

def encode_frame(
    segment_id: int,
    first_entry_id: int,
    timestamp_ms: int | Buffer,
    payloads: list[bytes] | Payloads,
    start: int,
    end: int,
    keys: Buffer | None = None,
    status: Buffer | None = None,
    properties: list[dict[str, str] | None] | None = None,
    compression: int = 0,
) -> tuple[bytes, int]:
    """One frame (records as `encode_entry`, end to end, entry ids counting up from
    `first_entry_id`) of the rows `start..end` of `payloads` (the queue's list of `bytes`, or a
    batch call's `Payloads`): every writer's encoding, one call and one `bytes` per run of
    entries, written in place into that `bytes`. Returns `(frame, records)`.

    Args:
        timestamp_ms: One int for every row, or an int64 column (e.g. `array("q")`) with one
            value per row of the whole list (each write's queueing time).
        keys: N*16 bytes for the whole list: each row's idempotency key.
        status: One byte per row of the range, as `DedupWindow.reserve_many` gives: rows whose
            byte is not 0 (duplicates) are skipped.
        properties: One `dict[str, str]` or None per row of the whole list.
        compression: 0 none, 1 lz4, 2 zstd (`append.compression`): the frame is returned as
            compressed units of up to 256 records / about 64 KiB each (a header no record starts
            with, the entry count, a CRC32C of the compressed bytes), compressed in the same call
            without the GIL.

    Raises:
        InvalidArgumentError: the range is outside `payloads`, a column does not match it, or
            `compression` is no codec.
        InvalidTypeError: a payload is not bytes, or properties are not `dict[str, str]`.
    """

def write_results(
    segment_id: int,
    first_entry_id: int,
    count: int,
    duplicate: bool,
    result_type: type[_T],
    id_type: type,
) -> list[_T]:
    """`[result_type(id_type(segment_id, first_entry_id + i), duplicate) for i in range(count)]`,
    built in place: the results of a run of writes settled by one ack, without a Python call per
    write (`WriteResult` and `LogMessageId`). Types without a `__dict__` (a NamedTuple's) leave
    the cycle collector: a tuple of ints and a bool is in no cycle.

    Raises:
        InvalidTypeError: a type is not a tuple subclass.
    """

def concat(parts: list[_B] | tuple[_B, ...]) -> bytes:
    """The parts laid end to end in one new `bytes`, like `b"".join(parts)` but copied with the
    GIL held: `bytes.join` lets go of the GIL for results of 1 MiB or more, and winning it back
    from a busy producer thread costs up to one switch interval (5 ms) per batch frame or block.

    Raises:
        InvalidTypeError: `parts` is not a list or tuple, or `parts[i]` is not bytes-like.
    """

def count_records(frame: Buffer) -> int:
    """Number of entries in a frame (records and compressed units back to back), without parsing
    or decompressing anything: a compressed unit's header gives its count, its CRC is checked.

    Raises:
        InvalidArgumentError: naming `frame`, when a record or unit is truncated, runs past the
            end, fails its CRC or names an unknown codec.
    """

def decompress_frame(frame: _B, where: str) -> _B | bytes:
    """The plain records of a stored frame: `frame` itself when it holds no compressed unit,
    else a new `bytes` with each unit decompressed in its place (without the GIL).

    Raises:
        CorruptEntryError: naming `where`, the byte and why, when a unit fails its CRC, names an
            unknown codec, does not decompress, or does not hold its header's records.
    """

def frame_codec(frame: Buffer) -> int:
    """The codec number of a frame's first unit (0 when it starts with a plain record), as a
    batch or block header records it.

    Raises:
        CorruptEntryError: the unit names an unknown codec.
    """

def put_file(
    temp: str | os.PathLike[str],
    final_path: str | os.PathLike[str],
    data: Buffer,
    *,
    exclusive: bool,
    sync: bool,
) -> int:
    """The local object store's durable put, run without the GIL: write `data` to the fresh file
    `temp` (created exclusively, in `final_path`'s directory), sync its data when `sync`, publish
    it as `final_path` (hard link when `exclusive`, so an existing name is kept; else rename over
    it), then sync the directory when `sync`.

    Returns 0 published, 1 `final_path` exists (exclusive; nothing changed), 2 `temp` is taken
    (pick another name), 3 the directory is missing (create it and retry). The temp file is gone
    after every outcome but 2.

    Raises:
        OSError: the subclass for its errno (e.g. `NotADirectoryError` when a path component is a
            file, `IsADirectoryError` when renaming over a directory), with `filename` set.
        InvalidTypeError: naming `data`, when it is not bytes-like.
    """

# --- local segment files ---------------------------------------------------------------------

def segfile_scan(
    path: str | os.PathLike[str], start: int, limit: int, *, completed: bool
) -> tuple[list[tuple[int, int, int]], int, int, int | None]:
    """Walk the whole batches of a local segment file in `[start, limit)`, without the GIL.

    Returns `(runs, lac, end, corrupt_at)`: runs of consecutive entries in consecutive batches as
    `(first, last, offset of the run's first batch)`, the highest LAC, where the whole batches
    end (a torn tail ends the walk), and the offset of a bad batch header that is not the tail.
    With `completed`, a final batch whose records fail their CRC is kept (the footer vouches for
    it) instead of ending the walk. A missing file is empty.

    Raises:
        OSError: reading the file failed.
    """

def segfile_read(
    path: str | os.PathLike[str], spans: list[tuple[int, int, int, int]]
) -> tuple[list[bytes], int, int, tuple[int, int, str] | None]:
    """Entries of a local segment file, CRC-checked, one buffered sequential pass, without the GIL.

    Each span `(offset, first, lo, hi)` starts at the batch at `offset` (first entry `first`) and
    asks for entries `lo..=hi`. Returns `(entries, resume_offset, resume_first, bad)`: where entry
    `hi + 1` of the last span can be read from, and `bad = (batch offset, entry id, why)` when
    the file is damaged there (then `entries` is empty).

    Raises:
        OSError: reading the file failed.
    """

def decode_entries(
    raw: list[bytes], segment_id: int, first_entry_id: int
) -> tuple[list[StoredEntry], tuple[int, str] | None]:
    """Parse entries read from a LogStore (LogEntry bytes of ids `first_entry_id`, ... of
    `segment_id`). Returns `(entries, bad)`: `bad = (index, why)` for the first entry that does not
    parse or says it is another position, `entries` then holding the ones before it.

    Raises:
        InvalidTypeError: an item of `raw` is not bytes.
    """

def decode_entry_keys(
    raw: list[bytes], segment_id: int, first_entry_id: int
) -> tuple[EntryKeys, tuple[int, str] | None]:
    """`decode_entries` for recovery's replay: the keys (with positions and timestamps) of the
    entries, as one `EntryKeys`, and `bad` as `decode_entries` gives it (the keys are then
    those of the entries before it). No payload is copied, no object made per entry.

    Raises:
        InvalidTypeError: an item of `raw` is not bytes.
        InvalidArgumentError: `segment_id` or `first_entry_id` is outside 0..=2**32-1.
    """

def check_entries(raw: list[bytes], segment_id: int, first_entry_id: int) -> None:
    """Check that every entry of `raw` (LogEntry bytes of ids `first_entry_id`, ... of
    `segment_id`) parses and is the entry at its position, building nothing (a reader checks a
    whole read at once, then decodes it a few entries at a time with `decode_messages`).

    Raises:
        CorruptEntryError: the first entry that does not parse or says it is another position,
            named (`entry {segment_id}:{entry_id}: why`).
        InvalidTypeError: an item of `raw` is not bytes.
    """

def decode_messages(
    raw: list[bytes],
    segment_id: int,
    first_entry_id: int,
    message_type: type[_T],
    id_type: type[tuple[Any, ...]],
) -> list[_T]:
    """Parse entries read from a LogStore straight into a reader's messages, in one call: each is
    `message_type(id_type(segment_id, entry_id), payload, properties, timestamp_ms,
    idempotency_key or None)`, built in place (no `__new__` call), with a new properties dict
    each. The types are `LogMessage` and `LogMessageId` (any tuple subclasses are accepted).

    Raises:
        CorruptEntryError: an entry does not parse or says it is another position; the message
            names it (`entry {segment_id}:{entry_id}: why`).
        InvalidTypeError: an item of `raw` is not bytes, or a type is not a tuple subclass.
    """

@final
class EntryKeys:
    """The keys of a run of entries read back from a LogStore (made by `decode_entry_keys`), for
    `DedupWindow.add_committed_keys`. `len()` is the number of entries read, keyed or not."""

    def __len__(self) -> int: ...
    @property
    def keyed(self) -> int:
        """Entries that carry a key (a plain writer's carry none)."""
    @property
    def last_timestamp_ms(self) -> int | None:
        """The timestamp of the last entry; None for no entries."""

@final
class StoredEntry:
    """One entry read back from a LogStore (made by `decode_entries`)."""

    @property
    def segment_id(self) -> int: ...
    @property
    def entry_id(self) -> int: ...
    @property
    def timestamp_ms(self) -> int: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def idempotency_key(self) -> bytes:
        """The 16-byte key, or b"" for an entry of a plain writer."""
    @property
    def properties(self) -> dict[str, str]:
        """A new dict on each access."""

@final
class SegmentAppender:
    """An append-only local segment file (created if missing, closed when dropped)."""

    def __new__(cls, path: str | os.PathLike[str]) -> Self: ...
    def append(self, header: Buffer, frame: Buffer) -> int:
        """Append `header` and `frame` in one O_APPEND write; returns the batch's offset. A short
        write raises `OSError`."""
    def sync(self, sync: bool, fence: str | os.PathLike[str] | None) -> bool:
        """`fdatasync` when `sync`, THEN whether `fence` exists (the order fencing relies on)."""
    def append_sync(
        self, header: Buffer, frame: Buffer, sync: bool, fence: str | os.PathLike[str] | None
    ) -> tuple[int, bool]:
        """`append` then `sync` as one call: `(offset, fenced)`."""

# --- dedup window ----------------------------------------------------------------------------

@final
class WindowEntry:
    """What the window knows about a key: where its entry lives and whether it is durable yet.

    Immutable, comparable and hashable, so tests can compare lookups with expected values.
    """

    @property
    def segment_id(self) -> int:
        """Segment holding the entry (0..=2**32-1)."""
    @property
    def entry_id(self) -> int:
        """Entry id within the segment (0..=2**32-1)."""
    @property
    def timestamp_ms(self) -> int:
        """Time the entry was added, ms; drives time-based eviction."""
    @property
    def committed(self) -> bool:
        """False while the write is in flight (pending): a retry must join it, not rewrite."""
    def __new__(cls, segment_id: int, entry_id: int, timestamp_ms: int, committed: bool) -> Self:
        """Build an entry by hand (for comparisons in tests; lookups build their own).

        Raises:
            InvalidArgumentError: an id is outside 0..=2**32-1 or `timestamp_ms` outside int64.
            InvalidTypeError: an id or `timestamp_ms` is not an int.
        """
    def __eq__(self, value: object, /) -> bool:
        """Equal when all four fields are."""
    def __hash__(self) -> int:
        """Hash of the four fields (entries can be set members and dict keys)."""

@final
class DedupWindow:
    """The per-log set of recent idempotency keys that makes retries return the original id.

    Pending keys (writes in flight) live in a separate table that is never evicted and does not
    count against `max_keys`. Committed keys live in a ring in commit order, so the oldest commit
    is evicted first, whether by capacity or by age. The ring's address space is reserved for
    `max_keys` up front (32 bytes per key, touched as keys land); its index grows in place with
    the keys (5.3 bytes per key in a full window, up to 10.7 while it grows), so a window far
    from full costs, and copies, what it holds. Pending keys' memory is released once none is in
    flight.

    Thread-safe: an internal lock guards the state; batch methods release the GIL while they hold
    it, and single-key methods wait for a busy lock with the GIL released.

    Keys are 16-byte bytes-like values; ids are stored as u32 and timestamps as int64.
    """

    def __new__(cls, max_keys: int, window_ms: int) -> Self:
        """An empty window, its ring reserved for `max_keys` committed keys.

        Args:
            max_keys: Committed keys kept at most (1..=2**32-1); the oldest commit is evicted
                beyond it.
            window_ms: Age (>= 1 ms) at which a committed key stops deduplicating.

        Raises:
            InvalidArgumentError: `max_keys` or `window_ms` is out of range.
            InvalidTypeError: either is not an int.
            MemoryError: the ring for `max_keys` keys cannot be reserved.
        """
    def get(self, key: Buffer, now_ms: int | None = None) -> WindowEntry | None:
        """Look a key up (counted in `hits` / `misses`; a pending key is a hit).

        Args:
            key: 16-byte key.
            now_ms: If given, a committed entry at least `window_ms` old counts as absent even if
                `evict` has not removed it yet, so staleness never depends on eviction timing.

        Raises:
            InvalidArgumentError: `key` is not 16 bytes, or `now_ms` outside int64.
            InvalidTypeError: `key` is not bytes-like or `now_ms` not an int.
        """
    def add_pending(self, key: Buffer, segment_id: int, entry_id: int, timestamp_ms: int) -> None:
        """Record a write in flight, so a concurrent retry of the same key joins it.

        A committed record of the key that is at least `window_ms` older than `timestamp_ms` is
        replaced (the key is being written again after its window, a new write by design).

        Raises:
            InvalidArgumentError: `key` is already pending, or committed within the window (the
                caller should have looked it up first), `key` is not 16 bytes, or an
                id/timestamp is out of range.
            InvalidTypeError: an argument has the wrong type.
        """
    def commit(self, key: Buffer) -> bool:
        """Mark a pending key durable: it joins the newest end of the commit order.

        Returns:
            False if the key is not pending (already committed, dropped or never added).

        May evict the oldest committed key when the window is full.
        """
    def commit_through(self, segment_id: int, last_entry_id: int) -> int:
        """Commit the pending keys of `segment_id` with entry ids up to `last_entry_id`, in entry
        order: a quorum ack commits a prefix of a segment, so the writer names the position
        instead of handing each key back (one call per acked batch, no key copies).

        Returns:
            How many keys were committed (0 when none of that segment is pending up to there).

        Raises:
            InvalidArgumentError: an id is out of range 0..=4294967295.
            InvalidTypeError: an id is not an int.
        """
    def drop_segment(self, segment_id: int) -> int:
        """Forget every pending key of `segment_id`: the segment was completed without them (the
        second failure outcome), so their retries write them anew.

        Returns:
            How many keys were pending there.
        """

    def drop_pending(self, key: Buffer) -> bool:
        """Forget a pending key whose write failed, so a retry writes it anew.

        Returns:
            False if the key is not pending.
        """
    def add_committed(self, key: Buffer, segment_id: int, entry_id: int, timestamp_ms: int) -> bool:
        """Insert a durable key directly (recovery from snapshots and segment scans, in log order).

        The later log position wins: a committed record of the key at the same or a later
        (segment_id, entry_id) is kept; one at an earlier position (the key was rewritten after
        its window) is replaced and its ring slot freed lazily. A pending entry for the key is
        replaced by the given ids and becomes committed.

        Returns:
            True if the record was inserted, False if the existing one was kept.

        Raises:
            InvalidArgumentError / InvalidTypeError: as for `add_pending` (except presence).
        """
    def evict(self, now_ms: int) -> int:
        """Drop committed keys from the oldest end (commit order) while `now_ms - ts >= window_ms`.

        Stops at the first young entry, so an old entry committed after a young one waits.

        Returns:
            Number of keys evicted (also added to `evictions`).
        """
    def get_many(self, keys: Buffer, now_ms: int | None = None) -> tuple[bytes, bytes, bytes]:
        """Look up N keys in one call, without the GIL.

        Args:
            keys: N*16 bytes of concatenated keys.
            now_ms: As for `get`.

        Returns:
            `(status, segment_ids, entry_ids)`: N status bytes (0 absent, 1 pending,
            2 committed) and two buffers of N little-endian int64 (-1 where absent), ready for
            `array.array("q", ...)` or `numpy.frombuffer(..., "<i8")`.

        Raises:
            InvalidArgumentError: `keys` is not a multiple of 16 bytes.
            InvalidTypeError: `keys` is not bytes-like.
        """
    def reserve_many(
        self, keys: Buffer, timestamps_ms: Buffer, segment_id: int, first_entry_id: int
    ) -> tuple[bytes, bytes, bytes]:
        """Judge a batch of writes in one pass, row by row in order, each as of its own time.

        A key committed within its window (as of its row's timestamp) or pending (including a
        repeat of an earlier row) reports the ids it holds; any other key becomes pending at the
        next entry id of `segment_id`, counting up from `first_entry_id`. The GIL is kept: a
        writer's batch takes microseconds.

        Args:
            keys: N*16 bytes.
            timestamps_ms: N int64 (array('q'), numpy int64, or raw little-endian bytes).
            segment_id: 0..=2**32-1.
            first_entry_id: the entry id of the first new row.

        Returns:
            `(status, segment_ids, entry_ids)` like `get_many`, where status 0 means "new here:
            now pending at the returned ids" (new rows get consecutive entry ids).

        Raises:
            InvalidArgumentError: `timestamps_ms` does not hold N values, `keys` is not a
                multiple of 16 bytes, or the new rows could pass entry id 2**32-1. Nothing is
                reserved in that case.
        """
    def reserve_frame(
        self,
        keys: Buffer,
        start: int,
        end: int,
        timestamp_ms: int | Buffer,
        segment_id: int,
        first_entry_id: int,
        payloads: list[bytes] | Payloads,
        properties: list[dict[str, str] | None] | None = None,
        compression: int = 0,
    ) -> tuple[bytes, bytes, bytes, bytes, int]:
        """A writer's run in one call: rows `start..end` judged as `reserve_many` judges them
        and the new ones encoded as `encode_frame` encodes them (their keys in the records,
        entry ids from `first_entry_id`), compressed per `compression`.

        Every argument is checked before any key is reserved, so the keys of a run are reserved
        only together with its frame.

        Args:
            keys: N*16 bytes, one key per row of the whole `payloads`.
            timestamp_ms: One int for every row, or an int64 column of N (queueing times).
            payloads: The queue's list of `bytes`, or a batch call's `Payloads`.
            properties: One `dict[str, str]` or None per row of the whole list.

        Returns:
            `(status, segment_ids, entry_ids, frame, count)`: `reserve_many`'s answer for the
            run's rows, the frame of its new rows and how many records it holds.

        Raises:
            InvalidArgumentError: the range is outside `payloads`, a column does not match, the
                new rows could pass entry id 2**32-1, or `compression` is no codec.
            InvalidTypeError: a payload is not bytes, or properties are not `dict[str, str]`.
        """
    def add_committed_many(
        self, keys: Buffer, segment_ids: Buffer, entry_ids: Buffer, timestamps_ms: Buffer
    ) -> int:
        """`add_committed` for N keys in order, without the GIL (recovery of large windows).

        Args:
            keys: N*16 bytes.
            segment_ids: N int64 (array('q'), numpy int64, or raw little-endian bytes).
            entry_ids: N int64, like `segment_ids`.
            timestamps_ms: N int64.

        Returns:
            Number of keys inserted.

        Raises:
            InvalidArgumentError: a column does not hold N values, or `segment_ids[i]` /
                `entry_ids[i]` is outside 0..=2**32-1. Nothing is inserted in that case.
            InvalidTypeError: an argument is not a buffer.
        """
    def reserve_committed(self, additional: int) -> None:
        """Room in the index for `additional` more committed keys (`max_keys` in all at most),
        in one resize, without the GIL: a bulk load that comes in several calls (recovery: a
        snapshot, then its gap a read at a time) sizes the index once. Only a speed-up:
        inserts grow the index as they go otherwise (at least doubling)."""
    def add_committed_keys(self, keys: EntryKeys) -> int:
        """`add_committed` for the keys of `keys` (made by `decode_entry_keys`), in order:
        recovery's replay of entries read back from the log, with no object per entry. Returns
        the number of keys inserted.

        Raises:
            InvalidTypeError: `keys` is not an `EntryKeys`.
        """
    def __len__(self) -> int:
        """Committed plus pending keys."""
    @property
    def pending_count(self) -> int:
        """Writes in flight."""
    @property
    def committed_count(self) -> int:
        """Committed keys held (at most `max_keys`)."""
    @property
    def max_keys(self) -> int:
        """Capacity for committed keys."""
    @property
    def window_ms(self) -> int:
        """Age at which committed keys expire."""
    @property
    def hits(self) -> int:
        """Lookups that found the key (pending or committed)."""
    @property
    def misses(self) -> int:
        """Lookups that did not find the key (or found it expired)."""
    @property
    def evictions(self) -> int:
        """Committed keys removed, by capacity or by `evict`."""
    @property
    def early_evictions(self) -> int:
        """Capacity evictions of keys younger than `window_ms`: dedup was weaker than configured,
        a signal to raise `max_keys`."""
    def memory_bytes(self) -> int:
        """Heap bytes owned (ring capacity, the index's cells in use, pending table), for sizing
        and metrics."""
    def stats(self) -> dict[str, int]:
        """All counters and sizes in one consistent read: `hits`, `misses`, `evictions`,
        `early_evictions`, `pending_count`, `committed_count`, `max_keys`, `window_ms`,
        `memory_bytes`."""
    def clone_committed(self) -> DedupWindow:
        """A copy with the same config and committed entries in the same order (no pending,
        counters zero). A memcpy-like copy of what the window holds (not of `max_keys`). Tests
        and tools: a snapshot reads the live window through a `SnapshotStream` instead, without
        a copy."""
    def committed_entries(self) -> list[tuple[bytes, int, int, int]]:
        """`(key, segment_id, entry_id, timestamp_ms)` in commit order, oldest first (tests and
        tools; use `SnapshotStream` or `encode_snapshot` for bulk export)."""

# --- payloads --------------------------------------------------------------------------------

@final
class Payloads:
    """A batch's payloads as one buffer and its offsets (Arrow's binary layout): what the batch
    calls (`write_many`, `write_keyed`, `write_arrow`, the Spark sink) hand the writer instead of
    one `bytes` object per row. Immutable. The bytes of any range of rows, and where a run of
    rows fits a byte limit, come from the offsets alone.

    Made from a sequence of bytes (bytearray and memoryview rows too), copied into one buffer in
    one pass (`Payloads(rows)`), or from an Arrow binary or string column without a copy
    (`Payloads.from_arrow`); given to Arrow without a copy (`pyarrow.array(payloads)`, through
    `__arrow_c_array__`). It compares equal to a `Payloads` or a list of bytes with the same
    rows, and indexes like a list (`p[i]` is a `bytes` copy of row i, `p[a:b]` a `Payloads`
    sharing the buffer).
    """

    def __new__(cls, rows: Sequence[Buffer] | Payloads) -> Self:
        """The rows laid end to end, in one new buffer (a `Payloads` is shared, not copied).

        Raises:
            InvalidTypeError: `rows` is not a sequence (a lone bytes or str is not), or
                `payloads[i]` is not bytes, bytearray or memoryview.
        """
    @staticmethod
    def from_arrow(column: _ArrowData) -> Payloads:
        """The values of a binary or string Arrow column (any object with `__arrow_c_array__`
        or `__arrow_c_stream__`): one chunk of binary, large binary, string or large string
        is shared, not copied; other byte types and several chunks are copied in one pass.

        Raises:
            InvalidArgumentError: a null value (naming its row), or offsets outside the values.
            InvalidTypeError: not Arrow data, or not a binary or string column.
        """
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, key: int, /) -> bytes: ...
    @overload
    def __getitem__(self, key: slice, /) -> Payloads: ...
    def __eq__(self, value: object, /) -> bool: ...
    @property
    def nbytes(self) -> int:
        """Bytes of every row together."""
    @property
    def longest(self) -> int:
        """Length of the longest row (0 for none), known once the batch is made."""
    def range_bytes(self, start: int, end: int, overhead: int = 0) -> int:
        """Bytes of the rows `start..end`, `overhead` more per row, from two offsets.

        Raises:
            InvalidArgumentError: the range is not within the rows.
        """
    def first_longer(self, max_bytes: int) -> int | None:
        """The first row longer than `max_bytes`, or None (then no row is read)."""
    def fit(self, start: int, end: int, limit: int, overhead: int = 0) -> tuple[int, int]:
        """`(bytes, end)`: the rows from `start` (before `end`) whose bytes, `overhead` more
        each, fit `limit` (at least one row), and what they count.

        Raises:
            InvalidArgumentError: the range is not within the rows.
        """
    def take(self, rows: Sequence[int] | Buffer) -> Payloads:
        """The rows numbered in `rows` (ints, or an int64 buffer such as `array("q")`), in that
        order, copied into a new batch.

        Raises:
            InvalidArgumentError: `rows[i]` is not a row.
            InvalidTypeError: `rows` is neither.
        """
    def to_list(self) -> list[bytes]:
        """Every row as `bytes`."""
    def __arrow_c_array__(self, requested_schema: object = None) -> tuple[object, object]:
        """The Arrow PyCapsule interface: the rows as an Arrow binary (or large binary) array
        sharing this batch's buffers."""

# --- key pipe --------------------------------------------------------------------------------

@final
class KeyPipe:
    """Content keys computed a chunk at a time, returned in push order.

    `push` holds a `bytes` payload by reference (no copy: bytes are immutable, so the pipe's thread
    may read them without the GIL) and returns; every 64 inputs or 256 KiB the chunk is hashed,
    all its payloads and ids together: at once by the pusher under 32 KiB of payloads (cheaper
    than waking a thread), else by the pipe's own Rust thread while the producer carries on. The
    references are released when the keys are taken.
    `push_id` validates an id and copies it; its key is hashed with its chunk.
    Not meant to be shared: the idempotent writer calls it under its own lock.
    """

    def __new__(cls) -> Self:
        """An empty pipe (its hashing thread starts with the first large chunk)."""
    def push(self, payload: Buffer) -> None:
        """Queue `payload`: a `bytes` object is held until its key is taken, any other buffer is
        copied (it could change meanwhile). Raises InvalidTypeError for a non-bytes-like."""
    def push_id(self, idempotency_id: str | bytes) -> None:
        """Queue the key of an explicit id: the id is checked and copied at once (a bad id raises,
        as `explicit_key`) and hashed with its chunk."""
    def push_key(self, key: Buffer) -> None:
        """Queue a key computed already (16 bytes); it comes back as it is, in its turn."""
    def ready_count(self) -> int:
        """How many of the oldest queued payloads have their keys computed already (taking
        them neither waits nor hashes)."""
    def take(self, n: int) -> bytes:
        """The keys (N*16 bytes) of the `n` oldest queued payloads, in push order. Keys of a
        chunk not handed over yet are hashed here; an unfinished chunk is waited for without
        the GIL. Raises InvalidArgumentError if fewer than `n` are queued."""
    def clear(self) -> None:
        """Forget every queued payload."""
    def __len__(self) -> int:
        """Payloads queued and not yet taken."""

# --- snapshots -------------------------------------------------------------------------------

@final
class Snapshot:
    """A decoded, fully validated dedup snapshot (see `proto/dedup_snapshot.proto`)."""

    @property
    def format_version(self) -> int:
        """Format version of the data (2; 1 for a snapshot written by an earlier release)."""
    @property
    def log_id(self) -> int:
        """Log the window belongs to; recovery checks it matches."""
    @property
    def epoch(self) -> int:
        """Writer epoch that wrote the snapshot."""
    @property
    def timestamp_ms(self) -> int:
        """When the snapshot was taken."""
    @property
    def window_max_keys(self) -> int:
        """`max_keys` of the window that was snapshotted."""
    @property
    def window_ms(self) -> int:
        """`window_ms` of the window that was snapshotted."""
    @property
    def watermarks(self) -> dict[int, int]:
        """Segment id -> last confirmed entry id: recovery scans only entries above these."""
    def __len__(self) -> int:
        """Number of entries."""
    def shared_position(self) -> tuple[int, int] | None:
        """A (segment id, entry id) two entries claim, if any: a log entry holds one key."""
    def segment_ends(self) -> dict[int, int]:
        """Segment id -> the highest entry id the entries name in it (for checking a snapshot
        against the log's metadata without building every entry as a tuple)."""
    def entries(self) -> list[tuple[bytes, int, int, int]]:
        """`(key, segment_id, entry_id, timestamp_ms)` in commit order, oldest first."""
    def keys(self) -> bytes:
        """All keys concatenated (N*16 bytes), e.g. for `DedupWindow.get_many`."""
    def load_into(self, window: DedupWindow) -> int:
        """`add_committed` every entry in order into an existing window (GIL released).

        Returns:
            Number of keys inserted (keys already committed in `window` are kept as they are).

        Raises:
            InvalidTypeError: `window` is not a `DedupWindow`.
        """
    def take_into(self, window: DedupWindow) -> int:
        """`load_into`, handing the entries over instead of copying them: a new window takes
        them as its ring (recovery: a large snapshot is neither copied nor held twice). The
        snapshot holds no entries afterwards (`len` 0, `entries()` empty); its metadata, and
        what `segment_ends` and `shared_position` say of the entries it had, stay.

        Returns:
            Number of keys inserted.

        Raises:
            InvalidTypeError: `window` is not a `DedupWindow`.
        """
    def to_window(self, max_keys: int | None = None, window_ms: int | None = None) -> DedupWindow:
        """A new window holding the entries, with the snapshot's config unless overridden
        (a smaller `max_keys` keeps the newest entries).

        Raises:
            InvalidArgumentError / InvalidTypeError: as for `DedupWindow(...)`.
        """

def encode_snapshot(
    window: DedupWindow, log_id: int, epoch: int, timestamp_ms: int, watermarks: dict[int, int]
) -> bytes:
    """Serialise the committed entries of `window` (commit order) with snapshot metadata, whole:
    the bytes of a `SnapshotStream` of the window, end to end (tests and tools; the writer
    streams its snapshots instead of holding one whole).

    Pending entries are left out: they are not durable and recovery must not resurrect them.
    Encoding runs without the GIL, with the window's lock held throughout.

    Args:
        window: The window to serialise.
        log_id: Numeric log id (0..=2**64-1).
        epoch: Writer epoch (0..=2**64-1).
        timestamp_ms: Snapshot time (int64).
        watermarks: Segment id (u32) -> last confirmed entry id (int64), taken under the same
            lock as the copy.

    Raises:
        InvalidArgumentError: a number is out of range (the message names it).
        InvalidTypeError: `window` is not a `DedupWindow`, `watermarks` not a dict, or a number
            not an int.
    """

@final
class SnapshotStream:
    """A snapshot of a live window made a chunk at a time as it is iterated: the header and the
    metadata frame, one frame per `chunk_records` committed entries, then the trailer; the parts
    end to end are the snapshot (`decode_snapshot` reads it). The entries are those committed
    when the stream is made: each chunk is read under the window's lock, held for that chunk
    alone, so writers go on between chunks; what they evict meanwhile is left out (as if evicted
    before), what they commit meanwhile too (it lies above `watermarks` copied before)."""

    def __new__(
        cls,
        window: DedupWindow,
        log_id: int,
        epoch: int,
        timestamp_ms: int,
        watermarks: dict[int, int],
        chunk_records: int = 16384,
    ) -> Self:
        """Fix the end of the commit order to snapshot; nothing is read yet.

        Raises:
            InvalidArgumentError: a number is out of range, or `chunk_records` is 0.
            InvalidTypeError: `window` is not a `DedupWindow`, `watermarks` not a dict, or a
                number not an int.
        """
    def __iter__(self) -> SnapshotStream: ...
    def __next__(self) -> bytes:
        """The next part (raises StopIteration after the trailer)."""
    @property
    def count(self) -> int:
        """Entries in the parts produced so far."""
    @property
    def nbytes(self) -> int:
        """Bytes produced so far."""
    @property
    def done(self) -> bool:
        """Whether the trailer was produced: the parts so far are the whole snapshot."""

def decode_snapshot(data: Buffer) -> Snapshot:
    """Decode and validate a snapshot of version 1 or 2: header, CRCs (every frame's, chained,
    in version 2), frame order and counts, and every column against its entry count.

    Never panics or allocates more than the input warrants, whatever the bytes.

    Raises:
        SnapshotCorruptError: bad magic, unsupported version, length or CRC mismatch, a
            truncated, oversized, misplaced or missing frame, counts that do not match, bytes
            after the trailer, or a malformed body (the message says which).
        InvalidTypeError: `data` is not bytes-like.
    """

# --- the LogStore wire (rust/src/net): protobuf bytes only cross it -----------------------------

class RpcError(Exception):
    """A failed gRPC call. `args` is `(code, details, error)`: `code` the status name
    ("UNAVAILABLE", "ABORTED", ...), `details` its message, `error` the project error code the
    node sent (`wp-error` trailing metadata) or None. A `NodeServer` handler raises one to fail
    its call with that status and code; any other exception fails it as UNKNOWN."""

@final
class NodeChannel:
    """One HTTP/2 connection to one node (TLS when `tls`: `ca` verifies the node, None: the
    system's roots; `cert`/`key` the client's certificate), made on the first call, remade after
    it breaks, shared by every thread. The tokio runtime under it is made on first use, once per
    process (a forked child makes its own)."""

    def __new__(
        cls,
        address: str,
        service: str,
        *,
        tls: bool = False,
        ca: bytes | None = None,
        cert: bytes | None = None,
        key: bytes | None = None,
    ) -> Self:
        """Raises ValueError for an address that is no "host:port", or a certificate without
        its key."""
    def call(self, method: str, request: bytes, timeout_s: float) -> bytes:
        """Call `service`/`method` with the request's bytes and wait (GIL released) for the
        response's bytes. Raises `RpcError` (DEADLINE_EXCEEDED once `timeout_s` passes,
        connecting included; UNAVAILABLE for a node that cannot be reached)."""
    def start(
        self,
        method: str,
        request: bytes,
        timeout_s: float,
        completions: Completions,
        token: int,
    ) -> None:
        """The same call, started without waiting: its outcome, as `call` would return or
        raise it, goes to `completions` under `token`."""
    def close(self) -> None:
        """Drop the connection (a later call connects again)."""

@final
class Completions:
    """The outcomes of calls started with `NodeChannel.start`, for one thread to take in the
    order they arrived."""

    def __new__(cls) -> Self: ...
    def next(self) -> tuple[int, bytes | RpcError] | None:
        """The next outcome, `(token, response bytes or the RpcError)`, waiting for one (GIL
        released); None once closed."""
    def close(self) -> None:
        """Wake the thread in `next` with None; outcomes not taken yet, or still to come, are
        dropped."""

@final
class NodeServer:
    """Serves `service` on `address` ("host:port", port 0: a free one) from the moment it is
    made: each call runs `handler(method, request) -> response` (bytes) on a server thread with
    the GIL, at most `workers` at once. TLS when `tls`: `cert`/`key` the server's certificate,
    `ca` (if set) the CA whose client certificates it requires."""

    def __new__(
        cls,
        address: str,
        service: str,
        handler: Callable[[str, bytes], bytes],
        *,
        workers: int = 8,
        tls: bool = False,
        ca: bytes | None = None,
        cert: bytes | None = None,
        key: bytes | None = None,
    ) -> Self:
        """Raises OSError when it cannot listen or the TLS settings are unusable, ValueError for
        a handler that is not callable."""
    @property
    def port(self) -> int:
        """The port listened on."""
    def stop(self, grace_s: float) -> None:
        """Refuse new calls (UNAVAILABLE), stop listening, and wait up to `grace_s` for the
        calls under way to finish (GIL released)."""
