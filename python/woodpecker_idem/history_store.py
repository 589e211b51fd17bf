"""The history checker's own read of a log: the entries its LogStore nodes store.

A checker that read the log through `LogReader` would share the reader's bugs: a reader showing
an entry only one node holds, or hiding one, would make the log it judges agree with the writes
it judges. This read goes around the reader and the client's transport (which tests wrap to
inject faults): it builds fresh engines over each node's storage (nothing a live engine cached
is trusted), reads every segment the metadata lists from every node of its ensemble, and decides
which entries are in the log by the rules of the log itself, not by the reader's code:

- a completed (or sealed) segment holds entries 0..lastEntryId of its metadata; each must be
  stored intact on at least one node of its ensemble;
- an active segment holds the longest run of entries from 0 that each lie on at least `aq`
  nodes (an entry on fewer was never acknowledged, and a reader must not show it);
- truncated segments and entries before the log's truncation point are not in the log;
- nodes holding one entry must hold the same bytes.

What breaks these rules is returned as `problems` (kind `replicas`); a replica that is corrupt
where another holds the entry intact is only counted in `corrupt_replicas` (readers skip it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ._core import decode_entries, decode_messages
from .errors import CorruptEntryError, InvalidArgumentError
from .history import REPLICAS
from .logstore.engine import LogStoreEngine
from .logstore.transport import InProcessTransport, LogStoreTransport
from .meta.base import MetadataStore, SegmentMeta
from .types import LogMessage, LogMessageId, SegmentState

READ_CHUNK = 10_000


@dataclass
class StoredLog:
    """What the nodes store of one log: its entries in log order and what breaks the rules."""

    messages: list[LogMessage] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    corrupt_replicas: list[str] = field(default_factory=list)


def read_stored(client: object, log: object) -> StoredLog:
    """The entries `log` (a LogHandle or a log name) has on the LogStore nodes of `client` (a
    WoodpeckerClient whose nodes live in this process, as every embedded client's do)."""
    meta: MetadataStore = client.meta  # type: ignore[attr-defined]
    if isinstance(log, str):
        log_id = meta.get_log(log).log_id
    else:
        log_id = log.log_id  # type: ignore[attr-defined]
    engines = fresh_engines(client.transport)  # type: ignore[attr-defined]
    return stored_messages(meta, engines, log_id)


def fresh_engines(transport: LogStoreTransport) -> dict[str, LogStoreEngine]:
    """New engines over the storage of the in-process nodes behind `transport` (through any
    wrappers with an `inner` transport, as fault injectors are)."""
    seen = transport
    while not isinstance(seen, InProcessTransport):
        inner = getattr(seen, "inner", None)
        if not isinstance(inner, LogStoreTransport):
            raise InvalidArgumentError(
                f"the stored entries are read from in-process LogStore nodes; transport "
                f"{type(transport).__name__} has none behind it"
            )
        seen = inner
    return {node: LogStoreEngine(engine.storage, node) for node, engine in seen.engines.items()}


def stored_messages(
    meta: MetadataStore, engines: Mapping[str, LogStoreEngine], log_id: int
) -> StoredLog:
    """Every entry of log `log_id` by the rules in the module docstring."""
    out = StoredLog()
    floor = meta.get_log_by_id(log_id).truncated_to or LogMessageId(0, 0)
    for seg in meta.list_segments(log_id):
        if seg.state is SegmentState.TRUNCATED:
            continue
        held: dict[str, list[bytes]] = {}
        for node in seg.nodes:
            engine = engines.get(node)
            if engine is None:
                out.problems.append(
                    f"{REPLICAS}: segment {seg.segment_id} names node {node}, which does not exist"
                )
                continue
            held[node] = _node_entries(engine, seg, out.corrupt_replicas)
        raw = combine(seg, held, out.problems)
        start = 0 if seg.segment_id > floor.segment_id else floor.entry_id
        if seg.segment_id < floor.segment_id or start >= len(raw):
            continue
        out.messages.extend(
            decode_messages(raw[start:], seg.segment_id, start, LogMessage, LogMessageId)
        )
    return out


def _node_entries(engine: LogStoreEngine, seg: SegmentMeta, corrupt: list[str]) -> list[bytes]:
    """The entries one node holds of `seg` from entry 0 on, up to the first gap or damage."""
    out: list[bytes] = []
    while True:
        try:
            got = engine.read(seg.log_id, seg.segment_id, len(out), READ_CHUNK)
        except CorruptEntryError as exc:
            corrupt.append(f"{engine.node_id} segment {seg.segment_id}: {exc}")
            return out
        if not got:
            return out
        good, bad = decode_entries(got, seg.segment_id, len(out))
        out.extend(got[: len(good)])
        if bad is not None:
            index, why = bad
            corrupt.append(
                f"{engine.node_id} entry {seg.segment_id}:{len(out)} (read index {index}): {why}"
            )
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
