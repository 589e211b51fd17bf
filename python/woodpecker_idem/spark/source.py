"""Reading a log group: positions per log, ranges between them, and the streaming source.

An offset is, for every log of the group, the position of the next entry to read
(`{"0": {"segment": s, "entry": e}, ...}`, keyed by the log's number in the group). Spark keeps
the offsets of each micro-batch in the query's checkpoint, so a replayed micro-batch reads the
same entries again: a log is immutable, which is what makes a source -> sink pipeline exactly
once end to end (the sink's micro-batch identity does the rest).

The readable end of a log is where a reader stops: the last entry of completed segments, and in
a segment still being written the tail its replicas confirm. An offset never passes a segment
that is still being written, so every entry up to it can be read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..client.group import log_name
from ..client.reader import visible_last
from ..errors import (
    EntryTruncatedError,
    InvalidArgumentError,
    LogNotFoundError,
    StorageUnavailableError,
)
from ..types import LogMessageId, SegmentState
from .options import SinkOptions

if TYPE_CHECKING:
    import pyarrow as pa

    from ..client.client import WoodpeckerClient

log = logging.getLogger(__name__)

READ_BATCH_ROWS = 8192
READ_WAIT_S = 60.0  # a range planned readable that stays unreadable this long fails the task


@dataclass(frozen=True)
class Span:
    """Entries `first..last` of one segment (last < first: none)."""

    segment: int
    first: int
    last: int


def log_spans(client: WoodpeckerClient, name: str) -> tuple[LogMessageId, list[Span]]:
    """(the truncation floor, the readable entries of each segment in order). The spans end at
    the first segment still being written (nothing after it is readable yet)."""
    meta = client.meta
    log_meta = meta.get_log(name)
    floor = log_meta.truncated_to or LogMessageId(0, 0)
    spans = []
    for seg in meta.list_segments(log_meta.log_id):
        if seg.state is SegmentState.TRUNCATED or seg.segment_id < floor.segment_id:
            continue
        first = floor.entry_id if seg.segment_id == floor.segment_id else 0
        spans.append(Span(seg.segment_id, first, visible_last(client.ensemble.calls, seg)))
        if seg.state is SegmentState.ACTIVE:
            break
    return floor, spans


def end_of(floor: LogMessageId, spans: list[Span]) -> LogMessageId:
    if not spans:
        return floor
    last = spans[-1]
    return LogMessageId(last.segment, max(last.first, last.last + 1))


def count_between(spans: list[Span], start: LogMessageId, end: LogMessageId) -> int:
    n = 0
    for s in spans:
        lo = max(s.first, start.entry_id) if s.segment == start.segment_id else s.first
        hi = end.entry_id - 1 if s.segment == end.segment_id else s.last
        if start.segment_id <= s.segment <= end.segment_id and hi >= lo:
            n += hi - lo + 1
    return n


def advance(spans: list[Span], start: LogMessageId, end: LogMessageId, k: int) -> LogMessageId:
    """The position `k` readable entries after `start` (at most `end`)."""
    for s in spans:
        if s.segment < start.segment_id or s.segment > end.segment_id:
            continue
        lo = max(s.first, start.entry_id) if s.segment == start.segment_id else s.first
        hi = end.entry_id - 1 if s.segment == end.segment_id else s.last
        avail = max(0, hi - lo + 1)
        if k < avail:
            return LogMessageId(s.segment, lo + k)
        k -= avail
    return end


# --- offsets ------------------------------------------------------------------------------------


def encode_offset(positions: dict[int, LogMessageId]) -> dict[str, Any]:
    return {
        str(p): {"segment": pos.segment_id, "entry": pos.entry_id}
        for p, pos in sorted(positions.items())
    }


def decode_offset(offset: dict[str, Any]) -> dict[int, LogMessageId]:
    return {int(p): LogMessageId(int(v["segment"]), int(v["entry"])) for p, v in offset.items()}


def parse_positions(
    option: str, text: str | None, default: str, partitions: int, allowed: tuple[str, ...]
) -> dict[int, str | LogMessageId]:
    """`earliest` / `latest` for every log, or JSON naming some logs (`{"0": {"segment": 3,
    "entry": 10}, "2": "latest"}`; the others take `default`)."""
    value = (text or default).strip()
    if value in allowed:
        return dict.fromkeys(range(partitions), value)
    try:
        given = json.loads(value)
    except ValueError:
        given = None
    if not isinstance(given, dict):
        raise InvalidArgumentError(
            f'option "{option}" must be {" or ".join(allowed)}, or a JSON object of positions '
            f'per log number (e.g. {{"0": {{"segment": 3, "entry": 10}}, "1": "{allowed[0]}"}}), '
            f"not {text!r}"
        )
    out: dict[int, str | LogMessageId] = dict.fromkeys(range(partitions), default)
    for raw, pos in given.items():
        if not str(raw).isdigit() or not 0 <= int(raw) < partitions:
            raise InvalidArgumentError(
                f'option "{option}": {raw!r} is not a log number of the group (0..{partitions - 1})'
            )
        if isinstance(pos, str) and pos in allowed:
            out[int(raw)] = pos
        elif (
            isinstance(pos, dict)
            and set(pos) == {"segment", "entry"}
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pos.values())
        ):
            out[int(raw)] = LogMessageId(pos["segment"], pos["entry"])
        else:
            raise InvalidArgumentError(
                f'option "{option}": log {raw} must be {" or ".join(allowed)} or '
                f'{{"segment": int >= 0, "entry": int >= 0}}, not {json.dumps(pos)}'
            )
    return out


def resolve(
    client: WoodpeckerClient, group: str, partitions: int, wanted: dict[int, str | LogMessageId]
) -> dict[int, LogMessageId]:
    out = {}
    for p in range(partitions):
        floor, spans = log_spans(client, log_name(group, p))
        want = wanted[p]
        if want == "earliest":
            out[p] = floor
        elif want == "latest":
            out[p] = end_of(floor, spans)
        else:
            assert isinstance(want, LogMessageId)
            out[p] = want
    return out


def group_size(client: WoodpeckerClient, group: str) -> int:
    found = client.meta.get_log_group(group)
    if found is None:
        raise LogNotFoundError(f"no log group {group!r}: nothing was written to it")
    return found.partitions


# --- reading a range ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LogRange:
    """`count` entries of log `log` of the group from `start` (an InputPartition's value)."""

    log: int
    start: LogMessageId
    count: int


def plan_ranges(
    client: WoodpeckerClient,
    group: str,
    start: dict[int, LogMessageId],
    end: dict[int, LogMessageId],
) -> list[LogRange]:
    out = []
    for p in sorted(end):
        floor, spans = log_spans(client, log_name(group, p))
        begin = start.get(p, floor)
        if begin < floor:
            raise EntryTruncatedError(
                f"log {log_name(group, p)} is truncated to {floor}; position {begin} is gone"
            )
        n = count_between(spans, begin, end[p])
        if n:
            out.append(LogRange(p, begin, n))
    return out


def arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("payload", pa.binary()),
            ("key", pa.binary()),
            ("segment", pa.int64()),
            ("entry", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("log", pa.int32()),
        ]
    )


def read_range(opts: SinkOptions, r: LogRange | None) -> Iterator[pa.RecordBatch]:
    """The range's entries as Arrow batches; fails (rather than returning fewer) if the entries
    planned readable do not all come within READ_WAIT_S. None: nothing (Spark plans one empty
    partition when a batch read has no range)."""
    import pyarrow as pa

    if r is None:
        return

    schema = arrow_schema()
    client = opts.connect()
    try:
        reader = client.open_log(log_name(opts.log, r.log)).open_reader(r.start)
        try:
            cols: list[list] = [[], [], [], [], [], []]
            left = r.count
            while left:
                m = reader.read_next(timeout=READ_WAIT_S)
                if m is None:
                    raise StorageUnavailableError(
                        f"log {log_name(opts.log, r.log)}: {left} of the {r.count} entries from "
                        f"{r.start} planned readable could not be read within {READ_WAIT_S:.0f} s"
                    )
                cols[0].append(m.payload)
                cols[1].append(m.idempotency_key)
                cols[2].append(m.message_id.segment_id)
                cols[3].append(m.message_id.entry_id)
                cols[4].append(m.timestamp_ms * 1000)
                cols[5].append(r.log)
                left -= 1
                if len(cols[0]) >= READ_BATCH_ROWS:
                    yield pa.RecordBatch.from_arrays(cols, schema=schema)
                    cols = [[], [], [], [], [], []]
            if cols[0]:
                yield pa.RecordBatch.from_arrays(cols, schema=schema)
        finally:
            reader.close()
    finally:
        client.close()


# --- the streaming source -----------------------------------------------------------------------


def stream_reader_class() -> type:
    """The class is built on first use: its bases come from pyspark."""
    from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    class WoodpeckerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        """`spark.readStream.format("woodpecker")`: one Spark partition per log with new
        entries; offsets per log (see the module doc)."""

        def __init__(self, opts: SinkOptions, starting: str | None, max_entries: int | None):
            self.opts = opts
            self._starting = starting
            self._max_entries = max_entries
            self._target: dict[int, LogMessageId] | None = None  # Trigger.AvailableNow's end
            client = opts.connect()
            try:
                self._partitions = group_size(client, opts.log)
            finally:
                client.close()
            # checked now: a bad option fails the query's start, not its first batch
            self._wanted = parse_positions(
                "startingOffsets", starting, "earliest", self._partitions, ("earliest", "latest")
            )

        def initialOffset(self) -> dict:  # noqa: N802
            client = self.opts.connect()
            try:
                return encode_offset(resolve(client, self.opts.log, self._partitions, self._wanted))
            finally:
                client.close()

        def getDefaultReadLimit(self) -> Any:  # noqa: N802
            if self._max_entries is None:
                return ReadAllAvailable()
            return ReadMaxRows(self._max_entries)

        def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
            client = self.opts.connect()
            try:
                self._target = resolve(
                    client,
                    self.opts.log,
                    self._partitions,
                    dict.fromkeys(range(self._partitions), "latest"),
                )
            finally:
                client.close()

        def latestOffset(self, start: dict, limit: Any) -> dict:  # noqa: N802
            begin = decode_offset(start)
            client = self.opts.connect()
            try:
                spans = {}
                ends = {}
                for p in range(self._partitions):
                    floor, s = log_spans(client, log_name(self.opts.log, p))
                    spans[p] = s
                    end = end_of(floor, s)
                    if self._target is not None:
                        end = min(end, self._target[p])
                    ends[p] = max(end, begin.get(p, floor))
            finally:
                client.close()
            if isinstance(limit, ReadMaxRows):
                ends = _capped(spans, begin, ends, limit.max_rows)
            return encode_offset(ends)

        def partitions(self, start: dict, end: dict) -> list:
            client = self.opts.connect()
            try:
                ranges = plan_ranges(
                    client, self.opts.log, decode_offset(start), decode_offset(end)
                )
            finally:
                client.close()
            return [InputPartition(r) for r in ranges]

        def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
            return read_range(self.opts, partition.value)

        def commit(self, end: dict) -> None:
            """Nothing to release: entries stay until the log is truncated."""

    return WoodpeckerStreamReader


def _capped(
    spans: dict[int, list[Span]],
    begin: dict[int, LogMessageId],
    ends: dict[int, LogMessageId],
    budget: int,
) -> dict[int, LogMessageId]:
    """At most `budget` entries in all, shared evenly by the logs that have new ones (a log
    needing less leaves its share to the others)."""
    want = {p: count_between(spans[p], begin.get(p, LogMessageId(0, 0)), ends[p]) for p in ends}
    take = dict.fromkeys(ends, 0)
    left = budget
    while left > 0:
        open_logs = [p for p in ends if take[p] < want[p]]
        if not open_logs:
            break
        share = max(1, left // len(open_logs))
        for p in open_logs:
            n = min(share, want[p] - take[p], left)
            take[p] += n
            left -= n
            if not left:
                break
    return {p: advance(spans[p], begin.get(p, LogMessageId(0, 0)), ends[p], take[p]) for p in ends}
