"""Reading a segment's entries from whichever replica holds them intact (docs/architecture.md).

The LogReader and window recovery both read through `_read` (recovery keeps only the keys:
`read_entry_keys`), so they skip the same
replicas: one that is down, one that lags (holds fewer entries: it answers a short list or none)
and one that is corrupt (a checksum, a block or an entry that does not parse, or an entry stored
at the wrong position). A corrupt replica is logged with its node and position and handed to the
caller's `on_corrupt`, so readers and recovery can count and report it. A read fails only when no
replica can serve the position, with an error naming the position and each node's problem.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sized
from dataclasses import dataclass
from typing import TypeVar

from .._core import EntryKeys, StoredEntry, check_entries, decode_entries, decode_entry_keys
from ..errors import CorruptEntryError, NodeUnavailableError
from ..logstore.transport import LogStoreTransport
from ..meta.base import SegmentMeta

T = TypeVar("T", bound=Sized)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReplicaFault:
    """A replica that held corrupt bytes somewhere in entries `first_entry_id..last_entry_id`
    (the node's message, `error`, names the exact entry or block)."""

    node: str
    log_id: int
    segment_id: int
    first_entry_id: int
    last_entry_id: int
    error: str


def read_entries(
    transport: LogStoreTransport,
    seg: SegmentMeta,
    entry_id: int,
    want: int,
    on_corrupt: Callable[[ReplicaFault], None] | None = None,
) -> list[StoredEntry]:
    """Between 1 and `want` consecutive entries of `seg` from `entry_id`, decoded and checked
    (see `_read`)."""
    return _read(transport, seg, entry_id, want, on_corrupt, _decode)


def read_entry_keys(
    transport: LogStoreTransport,
    seg: SegmentMeta,
    entry_id: int,
    want: int,
    on_corrupt: Callable[[ReplicaFault], None] | None = None,
) -> EntryKeys:
    """`read_entries` as the window rebuild needs it: only the keys, positions and timestamps,
    checked the same way, as one native object (no object per entry)."""
    return _read(transport, seg, entry_id, want, on_corrupt, _decode_keys)


def read_checked(
    transport: LogStoreTransport,
    seg: SegmentMeta,
    entry_id: int,
    want: int,
    on_corrupt: Callable[[ReplicaFault], None] | None = None,
) -> list[bytes]:
    """`read_entries` left as LogEntry bytes, each checked to parse and to be the entry at its
    position (one native call): the reader builds its messages from them a few at a time."""
    return _read(transport, seg, entry_id, want, on_corrupt, _check)


def _read(
    transport: LogStoreTransport,
    seg: SegmentMeta,
    entry_id: int,
    want: int,
    on_corrupt: Callable[[ReplicaFault], None] | None,
    decode: Callable[[str, SegmentMeta, int, list[bytes]], T],
) -> T:
    """Between 1 and `want` consecutive entries of `seg` from `entry_id`, decoded and checked.

    Replicas are tried in ensemble order. When every replica fails and one of them was corrupt,
    the read is retried over fewer entries (halving): a replica corrupt further on can still
    serve the entries before its damage. Raises `CorruptEntryError` when no replica is down and
    none holds `entry_id` intact, else `NodeUnavailableError` (a node that is back may serve it).
    """
    seen: set[tuple[str, str]] = set()  # each corruption is reported once, however often hit
    while True:
        problems: dict[str, str] = {}
        corrupt = unavailable = False
        for node in seg.nodes:
            try:
                raw = transport.read(node, seg.log_id, seg.segment_id, entry_id, want)
                entries = decode(node, seg, entry_id, raw)
            except NodeUnavailableError as exc:
                problems[node] = f"unavailable: {exc}"
                unavailable = True
                continue
            except CorruptEntryError as exc:
                problems[node] = f"corrupt: {exc}"
                corrupt = True
                if (node, str(exc)) not in seen:
                    seen.add((node, str(exc)))
                    _report(node, seg, entry_id, want, exc, on_corrupt)
                continue
            if entries:
                return entries
            problems[node] = "does not hold it"
        if corrupt and want > 1:
            want //= 2
            continue
        detail = "; ".join(f"{node}: {text}" for node, text in problems.items())
        where = f"log {seg.log_id} entry {seg.segment_id}:{entry_id}"
        if corrupt and not unavailable:
            raise CorruptEntryError(f"{where}: no replica holds it intact ({detail})")
        raise NodeUnavailableError(f"{where}: no replica could serve it ({detail})")


def _report(
    node: str,
    seg: SegmentMeta,
    entry_id: int,
    want: int,
    exc: CorruptEntryError,
    on_corrupt: Callable[[ReplicaFault], None] | None,
) -> None:
    fault = ReplicaFault(node, seg.log_id, seg.segment_id, entry_id, entry_id + want - 1, str(exc))
    log.warning(
        "log %s segment %s: replica on %s is corrupt within entries %s..%s (%s); "
        "trying another replica",
        seg.log_id,
        seg.segment_id,
        node,
        fault.first_entry_id,
        fault.last_entry_id,
        exc,
    )
    if on_corrupt is not None:
        on_corrupt(fault)


def _decode(node: str, seg: SegmentMeta, first: int, raw: list[bytes]) -> list[StoredEntry]:
    """Parse a replica's answer (in Rust); an entry that does not parse or sits at the wrong
    position makes the whole answer corrupt."""
    entries, bad = decode_entries(raw, seg.segment_id, first)
    if bad is not None:
        index, why = bad
        raise CorruptEntryError(
            f"{node}: log {seg.log_id} entry {seg.segment_id}:{first + index}: {why}"
        )
    return entries


def _decode_keys(node: str, seg: SegmentMeta, first: int, raw: list[bytes]) -> EntryKeys:
    """`_decode`, keeping the keys alone."""
    keys, bad = decode_entry_keys(raw, seg.segment_id, first)
    if bad is not None:
        index, why = bad
        raise CorruptEntryError(
            f"{node}: log {seg.log_id} entry {seg.segment_id}:{first + index}: {why}"
        )
    return keys


def _check(node: str, seg: SegmentMeta, first: int, raw: list[bytes]) -> list[bytes]:
    """`_decode`, keeping the bytes."""
    try:
        check_entries(raw, seg.segment_id, first)
    except CorruptEntryError as exc:
        raise CorruptEntryError(f"{node}: log {seg.log_id} {exc}") from None
    return raw
