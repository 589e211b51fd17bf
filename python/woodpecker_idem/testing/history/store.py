"""The history checker's own read of a log: the entries its LogStore nodes store.

A checker that read the log through `LogReader` would share the reader's bugs: a reader showing
an entry only one node holds, or hiding one, would make the log it judges agree with the writes
it judges. This read goes around the reader: it asks each node for the raw bytes its storage
holds (`LogStoreTransport.raw_read`, the node's stored bytes read fresh, nothing a live engine
cached is trusted; a fault injector passes it through untouched), reads every segment the
metadata lists from every node of its ensemble, and decides which entries are in the log by the
rules of the log itself, not by the reader's code:

- a completed (or sealed) segment holds entries 0..lastEntryId of its metadata; each must be
  stored intact on at least one node of its ensemble;
- an active segment holds the longest run of entries from 0 that each lie on at least `aq`
  nodes (an entry on fewer was never acknowledged, and a reader must not show it);
- truncated segments and entries before the log's truncation point are not in the log;
- nodes holding one entry must hold the same bytes.

What breaks these rules is returned as `problems` (kind `replicas`); a replica that is corrupt
where another holds the entry intact is only counted in `corrupt_replicas` (readers skip it).

Where the bytes come from is a `RawSource`: any object with the transport's `node_ids` and
`raw_read`. A client's transport is one, whether its nodes live in this process
(`InProcessTransport` reads a fresh engine over the node's storage) or, in service mode, in other
processes (the `RawRead` RPC of proto/logstore.proto), so the checker needs no engine of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..._core import decode_entries, decode_messages
from ...errors import CorruptEntryError
from ...meta.base import MetadataStore, SegmentMeta
from ...types import LogMessage, LogMessageId, SegmentState
from .model import REPLICAS

READ_CHUNK = 10_000


@dataclass
class StoredLog:
    """What the nodes store of one log: its entries in log order and what breaks the rules."""

    messages: list[LogMessage] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    corrupt_replicas: list[str] = field(default_factory=list)


class RawSource(Protocol):
    """Where the checker reads what each node stores (a `LogStoreTransport` is one)."""

    @property
    def node_ids(self) -> list[str]: ...

    def raw_read(
        self, node_id: str, log_id: int, segment_id: int, from_entry_id: int, max_entries: int
    ) -> list[bytes]: ...


def read_stored(client: object, log: object, source: RawSource | None = None) -> StoredLog:
    """The entries `log` (a LogHandle or a log name) has on the LogStore nodes of `client` (a
    WoodpeckerClient), read from `source` (default: the client's transport)."""
    meta: MetadataStore = client.meta  # type: ignore[attr-defined]
    if isinstance(log, str):
        log_id = meta.get_log(log).log_id
    else:
        log_id = log.log_id  # type: ignore[attr-defined]
    if source is None:
        source = client.transport  # type: ignore[attr-defined]
    return stored_messages(meta, source, log_id)


def stored_messages(meta: MetadataStore, source: RawSource, log_id: int) -> StoredLog:
    """Every entry of log `log_id` by the rules in the module docstring."""
    out = StoredLog()
    nodes = set(source.node_ids)
    floor = meta.get_log_by_id(log_id).truncated_to or LogMessageId(0, 0)
    for seg in meta.list_segments(log_id):
        if seg.state is SegmentState.TRUNCATED:
            continue
        held: dict[str, list[bytes]] = {}
        for node in seg.nodes:
            if node not in nodes:
                out.problems.append(
                    f"{REPLICAS}: segment {seg.segment_id} names node {node}, which does not exist"
                )
                continue
            held[node] = _node_entries(source, node, seg, out.corrupt_replicas)
        raw = combine(seg, held, out.problems)
        start = 0 if seg.segment_id > floor.segment_id else floor.entry_id
        if seg.segment_id < floor.segment_id or start >= len(raw):
            continue
        out.messages.extend(
            decode_messages(raw[start:], seg.segment_id, start, LogMessage, LogMessageId)
        )
    return out


def _node_entries(
    source: RawSource, node: str, seg: SegmentMeta, corrupt: list[str]
) -> list[bytes]:
    """The entries one node holds of `seg` from entry 0 on, up to the first gap or damage."""
    out: list[bytes] = []
    while True:
        try:
            got = source.raw_read(node, seg.log_id, seg.segment_id, len(out), READ_CHUNK)
        except CorruptEntryError as exc:
            corrupt.append(f"{node} segment {seg.segment_id}: {exc}")
            return out
        if not got:
            return out
        good, bad = decode_entries(got, seg.segment_id, len(out))
        out.extend(got[: len(good)])
        if bad is not None:
            index, why = bad
            corrupt.append(f"{node} entry {seg.segment_id}:{len(out)} (read index {index}): {why}")
            return out


def combine(seg: SegmentMeta, held: Mapping[str, list[bytes]], problems: list[str]) -> list[bytes]:
    """The entries of `seg` in the log, given what each node holds of it (from entry 0)."""
    name = f"log {seg.log_id} segment {seg.segment_id}"
    if seg.state is SegmentState.ACTIVE:
        end = -1
        while sum(len(entries) > end + 1 for entries in held.values()) >= seg.aq:
            end += 1
    else:
        end = seg.last_entry_id
    out: list[bytes] = []
    for entry_id in range(end + 1):
        copies = {entries[entry_id] for entries in held.values() if len(entries) > entry_id}
        if not copies:
            problems.append(
                f"{REPLICAS}: {name} is {seg.state.value} at {end}, but entry {entry_id} is "
                f"stored intact on none of {', '.join(seg.nodes)}"
            )
            return out
        if len(copies) > 1:
            problems.append(
                f"{REPLICAS}: {name} entry {entry_id} is stored with {len(copies)} different "
                f"contents on its nodes"
            )
        out.append(next(es[entry_id] for es in held.values() if len(es) > entry_id))
    return out
