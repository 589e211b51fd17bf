"""Processor: exactly-once read-process-write from one log to another, without transactions.

Kafka's consume-transform-produce loop (Kafka Streams with `processing.guarantee=exactly_once`,
Flink's flatMap into an exactly-once sink) needs transactions there, because the consumer's
offset commit and the produced records must land together. Here idempotency is enough:

    with wp.Processor(orders, invoices, "billing", fn) as p:
        p.run()                      # until p.stop(); run(until_idle=True) returns when caught up

1. A named reader of the source log (`open_reader(name=...)`) resumes after its last commit.
2. Each result of `fn(entry)` is written to the target log by an idempotent writer with an
   idempotency id derived from the entry's position (`source_id`): a replay of the entry after a
   crash writes the same ids, which the window answers as duplicates.
3. The reader's position is committed only past entries whose every result was acknowledged
   (`InFlight`): a crash anywhere loses nothing (what was not committed is read again) and
   duplicates nothing within the target's dedup window.

Beyond the window (a processor down longer than `window_duration_s`, keys evicted by
`window_max_keys`) the window forgets the ids; the **target check** (`check_target`, on by
default) makes it hold anyway. Every result carries its source position (`SOURCE_PROPERTY`) and
the highest source position the processor had submitted when it wrote it (`HIGH_PROPERTY`). At
start, after taking the target's writer (no one else appends from then on), the processor reads
the target back from its end to the last entry whose high mark is below the committed position
(everything before it came from earlier source entries, already committed) and skips every
(position, index) it finds at or after the committed position. Those are exactly the results
written after the last commit, holes included (a write that failed while later ones landed).
The Spark sink's batch identities do the same for micro-batches (spark/batches.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from .errors import EntryTruncatedError, InvalidArgumentError, InvalidTypeError, WoodpeckerError
from .types import LogMessage, LogMessageId, SegmentState, WriteMessage, WriteResult

if TYPE_CHECKING:
    from .client.log import LogHandle
    from .client.reader import LogReader
    from .writer.api import IdempotentLogWriter

log = logging.getLogger(__name__)

# Properties every result written carries (names under "wp.", refused in fn's own properties).
SOURCE_PROPERTY = "wp.source"  # its idempotency id: processor, source log, position, index
HIGH_PROPERTY = "wp.high"  # the highest source position submitted when it was written

Result = bytes | bytearray | memoryview | WriteMessage
Output = Result | Iterable[Result] | None

# How long `run`, ending with an error, waits for the results in flight to be acknowledged
# before it commits: what lands after is read again by the next run (and found in the target).
EXIT_WAIT_S = 10.0
# How long one wait (for an ack, for new entries) lasts before `stop` is looked at.
POLL_S = 0.05
# Entries processed between two looks at the acks (and the commit cadence), at most: each look
# asks every result of the oldest entry in flight whether it is done.
ADVANCE_EVERY = 32


def source_id(name: str, source_log_id: int, message_id: LogMessageId, index: int = 0) -> str:
    """The idempotency id of result `index` of source entry `message_id`:
    `"{name}@{source_log_id}:{segment}:{entry}"`, with `#{index}` for index >= 1 (a fn with one
    result per entry gets the plain id). The processor's name keeps two processors of one source
    apart in one target; the source's log id (not its name) keeps a log deleted and created
    again under the same name, whose positions start over, from matching the old one's ids."""
    base = f"{name}@{source_log_id}:{message_id.segment_id}:{message_id.entry_id}"
    return base if index == 0 else f"{base}#{index}"


def parse_source_id(text: str, name: str, source_log_id: int) -> tuple[LogMessageId, int] | None:
    """(position, index) of an id `source_id(name, source_log_id, ...)` made; None for any other
    text (another processor's, another source's, not an id at all)."""
    prefix = f"{name}@{source_log_id}:"
    if not text.startswith(prefix):
        return None
    position, suffix, index_text = text[len(prefix) :].partition("#")
    seg, sep, entry = position.partition(":")
    if not (sep and _number(seg) and _number(entry)):
        return None
    if suffix and not (_number(index_text) and index_text != "0"):
        return None  # index 0 has no suffix: "#0" is nobody's id
    return LogMessageId(int(seg), int(entry)), int(index_text) if suffix else 0


def _number(text: str) -> bool:
    """A number as `str(int)` writes it (no sign, no leading zero, ASCII digits)."""
    return text.isascii() and text.isdigit() and text == str(int(text))


@dataclass(slots=True)
class Written:
    """One result in flight: what to write again if its write fails."""

    index: int
    key: str
    payload: bytes
    properties: dict[str, str]
    future: Future[WriteResult]
    failed_at: float | None = None  # monotonic time of the first failure
    attempts: int = 1
    next_try: float = 0.0


@dataclass(slots=True)
class Pending:
    """A source entry whose results are not all acknowledged yet."""

    position: LogMessageId
    results: list[Written]


def _acknowledged(fut: Future[WriteResult]) -> bool:
    # result(), not exception(): on a settled write's future it reads the outcome directly,
    # where exception() first builds the future's condition (one per result)
    if not fut.done():
        return False
    try:
        fut.result()
    except BaseException:  # noqa: BLE001 - a failed write is not acknowledged
        return False
    return True


def _failed(fut: Future[WriteResult]) -> bool:
    return fut.done() and not _acknowledged(fut)


class InFlight:
    """The source entries processed and not yet committable, oldest first.

    The commit-after-ack rule lives here: `settled()` pops the oldest entries whose every result
    is acknowledged and returns the last one's position, the only position that may be
    committed. An entry with no results is settled once the entries before it are."""

    def __init__(self) -> None:
        self._queue: deque[Pending] = deque()
        self.results = 0  # results not acknowledged yet (or failed, waiting for a retry)

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, position: LogMessageId, results: list[Written]) -> None:
        self._queue.append(Pending(position, results))
        self.results += len(results)

    def settled(self, stats: ProcessorStats | None = None) -> LogMessageId | None:
        last = None
        queue = self._queue
        while queue:
            head = queue[0]
            for w in head.results:
                if not _acknowledged(w.future):
                    return last
            queue.popleft()
            self.results -= len(head.results)
            last = head.position
            if stats is not None:
                for w in head.results:
                    if w.future.result().duplicate:
                        stats.duplicates += 1
                    else:
                        stats.written += 1
        return last

    def head(self) -> Pending | None:
        return self._queue[0] if self._queue else None

    def head_failed(self) -> bool:
        """Whether a result of the oldest entry failed (what holds the commit back)."""
        head = self._queue[0] if self._queue else None
        return head is not None and any(_failed(w.future) for w in head.results)

    def failed(self) -> list[Written]:
        """Results whose write failed, of every entry in flight (oldest first): a pass over
        everything in flight, made when the oldest entry has a failed result (a failure
        rarely comes alone: a segment closed fails the rest of its writes too)."""
        return [w for p in self._queue for w in p.results if _failed(w.future)]


@dataclass
class ProcessorStats:
    """What a processor did since it opened."""

    read: int = 0  # source entries read
    results: int = 0  # results fn returned
    written: int = 0  # results that created their entry in the target
    duplicates: int = 0  # results the target's window answered (written by an earlier run)
    skipped: int = 0  # results the target check found written already, not written again
    retries: int = 0  # writes sent again after a retriable failure
    commits: int = 0
    scanned: int = 0  # target entries read by the target check at the start


class Processor:
    """Read `source` with the named reader `name`, write `fn(entry)`'s results to `target`
    exactly once (see the module docstring and docs/consumers.md).

    `fn(entry: LogMessage)` returns None or an empty iterable (no result: the position is still
    committed), a payload (`bytes` or a `WriteMessage` with properties) or an iterable of
    payloads; it must return the same results for the same entry on every run (the ids are by
    position and index). An exception from `fn` stops `run` (after committing what was
    acknowledged) and is raised from it.

    `commit_every`: commit after this many source entries settle (and whenever the processor
    has caught up, and at least every `commit_interval_s`); commits are in the background
    (`commit_async`) while running, synchronous when `run` returns. `max_in_flight`: source
    entries processed and not settled before the processor waits for acks. `check_target`:
    the target check at the start (beyond the window; see the module docstring);
    `window_duration_s`, `window_max_keys`: the target writer's window (None: the config's).
    `retry_budget_s`: how long a result's write is retried on retriable errors before `run`
    raises the error.

    The processor takes the target's writer over (one processor per target log: a second one
    fences the first, as writers do) and the reader name (the first one's next commit fails).
    """

    def __init__(
        self,
        source: LogHandle,
        target: LogHandle,
        name: str,
        fn: Callable[[LogMessage], Output],
        *,
        start: str | LogMessageId = "earliest",
        commit_every: int = 1000,
        commit_interval_s: float = 1.0,
        max_in_flight: int = 10_000,
        check_target: bool = True,
        window_duration_s: float | None = None,
        window_max_keys: int | None = None,
        retry_budget_s: float = 120.0,
    ):
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"processor name must be a non-empty str, not {name!r}")
        if not callable(fn):
            raise InvalidTypeError(f"fn must be callable, not {type(fn).__name__}")
        for arg, value in (("commit_every", commit_every), ("max_in_flight", max_in_flight)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{arg} must be an int >= 1, not {value!r}")
        for arg, seconds in (
            ("commit_interval_s", commit_interval_s),
            ("retry_budget_s", retry_budget_s),
        ):
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
                raise InvalidArgumentError(
                    f"{arg} must be a number of seconds > 0, not {seconds!r}"
                )
        if source.log_id == target.log_id:
            raise InvalidArgumentError(
                f"source and target are the same log ({source.name!r}): a processor writing "
                "what it reads would read its own results"
            )
        self.source = source
        self.target = target
        self.name = name
        self.fn = fn
        self.commit_every = commit_every
        self.commit_interval_s = float(commit_interval_s)
        self.max_in_flight = max_in_flight
        self.check_target = bool(check_target)
        self.retry_budget_s = float(retry_budget_s)
        self.stats = ProcessorStats()
        self._stop = threading.Event()
        self._in_flight = InFlight()
        self._skip: set[tuple[LogMessageId, int]] = set()
        self._skip_until: LogMessageId | None = None  # the highest position in _skip
        self._high: LogMessageId | None = None
        self._prefix = source_id(name, source.log_id, LogMessageId(0, 0))[: -len("0:0")]
        self._settled: LogMessageId | None = None  # the last source entry settled
        self._since_commit = 0
        self._last_commit = time.monotonic()
        # The target's writer first: from its takeover on, nothing else appends to the target,
        # so the check below reads everything an earlier processor wrote. Then the name, whose
        # take-over fences the earlier holder's commits, so the committed position is final.
        # public for its metrics (`writer.metrics_snapshot()`); writing through it yourself
        # breaks the target check's order
        self.writer: IdempotentLogWriter = target.open_writer(
            idempotent=True, window_duration_s=window_duration_s, window_max_keys=window_max_keys
        )
        try:
            self._reader: LogReader = source.open_reader(start, name=name)
            self.committed: LogMessageId = self._reader.position
            if self.check_target:
                self._check_target(self.committed)
        except BaseException:
            self.writer.close()
            raise

    # --- the target check ------------------------------------------------------------------------

    def _check_target(self, committed: LogMessageId) -> None:
        """Read the target back from its end, segment by segment, to the last result whose high
        mark is below `committed`: every result before it comes from a source entry before
        `committed`. Results at or after `committed` go into the skip set."""
        high: LogMessageId | None = None
        segments = [s for s in self.target.segments() if s.state is not SegmentState.TRUNCATED]
        for seg in reversed(segments):
            found = self._read_segment(seg.segment_id)
            stop = False
            for pos, index, mark in reversed(found):
                if mark is not None:
                    high = mark if high is None else max(high, mark)
                    if mark < committed:
                        stop = True  # everything before it is older than the commit
                        break
                high = pos if high is None else max(high, pos)
                if pos >= committed:
                    self._skip.add((pos, index))
            if stop:
                break
        self._high = high
        if self._skip:
            self._skip_until = max(pos for pos, _ in self._skip)
        log.info(
            "processor %r: from %s of %s; the target check read %d entries of %s and found %d "
            "results written after it",
            self.name,
            committed,
            self.source.name,
            self.stats.scanned,
            self.target.name,
            len(self._skip),
        )

    def _read_segment(self, segment_id: int) -> list[tuple[LogMessageId, int, LogMessageId | None]]:
        """(source position, index, high mark) of this processor's results in one segment of
        the target, in log order (a result without a high mark was written unchecked)."""
        try:
            reader = self.target.open_reader(LogMessageId(segment_id, 0))
        except EntryTruncatedError as exc:
            kept = exc.first_kept
            if not isinstance(kept, LogMessageId) or kept.segment_id != segment_id:
                return []  # the whole segment was truncated
            reader = self.target.open_reader(kept)
        out = []
        with reader:
            for msg in reader:
                if msg.message_id.segment_id != segment_id:
                    break
                self.stats.scanned += 1
                props = msg.properties
                text = props.get(SOURCE_PROPERTY) if props else None
                parsed = parse_source_id(text, self.name, self.source.log_id) if text else None
                if parsed is None:
                    continue  # not this processor's
                mark_text = props.get(HIGH_PROPERTY)
                try:
                    mark = LogMessageId.parse(mark_text) if mark_text else None
                except InvalidArgumentError:
                    mark = None
                out.append((parsed[0], parsed[1], mark))
        return out

    # --- running ---------------------------------------------------------------------------------

    def run(self, *, until_idle: bool = False) -> ProcessorStats:
        """Process entries until `stop()` (or, with `until_idle`, until the end of the source as
        it is when reached); returns the stats. Commits what is settled on the way out, also
        when it raises (fn's error, a fenced writer or reader, a write failing past
        `retry_budget_s`)."""
        self._stop.clear()
        reader = self._reader
        stop = self._stop
        every = min(ADVANCE_EVERY, self.commit_every)
        try:
            while not stop.is_set():
                for n, msg in enumerate(reader, 1):  # what the source holds now
                    self._process(msg)
                    full = len(self._in_flight) >= self.max_in_flight
                    if n % every == 0 or full:
                        self._advance(block=full)
                        self._commit_if_due()
                    if stop.is_set():
                        break
                if stop.is_set():
                    break
                self._drain()  # caught up: commit everything written so far
                self._commit(block=False)
                if until_idle:
                    break
                more = reader.read_next(POLL_S)  # wait for more
                if more is not None:
                    self._process(more)
        except BaseException:
            try:  # what was acknowledged before the error is done: commit it
                self._settle_for(EXIT_WAIT_S)
                self._commit(block=True)
            except Exception as exc:  # noqa: BLE001 - the first error is the one raised
                log.warning("processor %r: no commit after the error: %s", self.name, exc)
            raise
        self._advance(block=False, retry=False)
        self._commit(block=True)
        return self.stats

    def _commit_if_due(self) -> None:
        if self._since_commit >= self.commit_every or (
            time.monotonic() - self._last_commit >= self.commit_interval_s
        ):
            self._commit(block=False)

    def stop(self) -> None:
        """Make `run` return (from another thread or a signal handler): it commits what is
        settled; results still in flight stay in flight (a later run settles them)."""
        self._stop.set()

    def _process(self, msg: LogMessage) -> None:
        stats = self.stats
        stats.read += 1
        self._since_commit += 1
        pos = msg.message_id
        out = self.fn(msg)
        results: list[Result] = [out] if type(out) is bytes else self._results(msg, out)
        stats.results += len(results)
        at = f"{pos.segment_id}:{pos.entry_id}"
        high = self._high
        if high is None or pos >= high:  # the usual case: this entry is the highest yet
            self._high, high_text = pos, at
        else:  # still below what the target check found
            high_text = str(high)
        skip = self._skip_until is not None and pos <= self._skip_until
        written = []
        write = self.writer.write_async
        for index, result in enumerate(results):
            if skip and (pos, index) in self._skip:
                stats.skipped += 1
                continue
            key = f"{self._prefix}{at}" if index == 0 else f"{self._prefix}{at}#{index}"
            # only a run that read the target knows every earlier position: without the
            # check, no high mark (a later check then reads on past these results)
            if self.check_target:
                tags = {SOURCE_PROPERTY: key, HIGH_PROPERTY: high_text}
            else:
                tags = {SOURCE_PROPERTY: key}
            if type(result) is bytes:
                payload = result
            else:
                payload, props = self._unpack(result, index)
                tags = {**props, **tags}
            fut = write(payload, properties=tags, idempotency_id=key)
            written.append(Written(index, key, payload, tags, fut))
        if self._skip_until is not None and pos >= self._skip_until:
            self._skip.clear()  # past everything found: nothing more to look up
            self._skip_until = None
        self._in_flight.add(pos, written)

    def _results(self, msg: LogMessage, out: Output) -> list[Result]:
        if out is None:
            return []
        if isinstance(out, (bytes, bytearray, memoryview, WriteMessage)):
            return [out]
        if isinstance(out, str) or not isinstance(out, Iterable):
            raise InvalidTypeError(
                f"fn returned {type(out).__name__} for entry {msg.message_id}: it must return "
                "None, bytes, a WriteMessage or an iterable of them"
            )
        return list(out)

    def _unpack(self, result: Result, index: int) -> tuple[bytes, dict[str, str]]:
        if isinstance(result, WriteMessage):
            payload, props = result.payload, dict(result.properties or {})
            taken = [k for k in (SOURCE_PROPERTY, HIGH_PROPERTY) if k in props]
            if taken:
                raise InvalidArgumentError(
                    f"result {index} of fn carries the property {taken[0]!r}: the processor "
                    "writes it (the result's source position)"
                )
        elif isinstance(result, (bytes, bytearray, memoryview)):
            payload, props = bytes(result), {}
        else:
            raise InvalidTypeError(
                f"result {index} of fn is {type(result).__name__}: a result is bytes or a "
                "WriteMessage"
            )
        return payload, props

    def _advance(self, block: bool, retry: bool = True) -> None:
        """Settle what is acknowledged and write failed results again; with `block`, wait until
        at least the oldest entry in flight settles (or `stop`)."""
        while True:
            done = self._in_flight.settled(self.stats)
            if done is not None:
                self._settled = done
                block = False
            if retry and self._in_flight.head_failed():
                self._retry_failed()
            head = self._in_flight.head()
            if not block or head is None or self._stop.is_set():
                return
            waiting = [w.future for w in head.results if not w.future.done()]
            if waiting:
                wait(waiting, timeout=POLL_S, return_when=FIRST_COMPLETED)
            else:  # failed, waiting for its retry's turn
                self._stop.wait(POLL_S / 5)

    def _settle_for(self, seconds: float) -> None:
        """On the way out after an error: settle what lands within `seconds` (no retries: a
        failed result stops it), so a restart reads again as little as it can."""
        deadline = time.monotonic() + seconds
        while len(self._in_flight) and time.monotonic() < deadline:
            self._advance(block=False, retry=False)
            head = self._in_flight.head()
            if head is None:
                return
            waiting = [w.future for w in head.results if not w.future.done()]
            if not waiting:
                return  # a failed result: nothing after it can be committed
            wait(waiting, timeout=POLL_S, return_when=FIRST_COMPLETED)

    def _drain(self) -> None:
        """Wait until everything in flight is settled (or `stop`)."""
        while len(self._in_flight) and not self._stop.is_set():
            self._advance(block=True)

    def _retry_failed(self) -> None:
        """Write every failed result again, with its own id: a retry joins the entry if it is
        still pending and is answered as a duplicate if it landed, never a second copy. A
        retriable error is retried with backoff for `retry_budget_s`, any other is raised."""
        now = time.monotonic()
        for w in self._in_flight.failed():
            exc = w.future.exception()
            assert exc is not None
            if not (isinstance(exc, WoodpeckerError) and exc.retriable):
                raise exc
            if w.failed_at is None:
                w.failed_at = now
            elif now - w.failed_at > self.retry_budget_s:
                raise exc
            if now < w.next_try:
                continue
            self.stats.retries += 1
            w.next_try = now + min(1.0, 0.05 * 2 ** min(w.attempts, 5))
            w.attempts += 1
            if self.check_target and self._high is not None:
                # the mark of now: results submitted since its first write may land before
                # this one, and the mark must cover every result before it in the target
                w.properties = {**w.properties, HIGH_PROPERTY: str(self._high)}
            w.future = self.writer.write_async(
                w.payload, properties=w.properties, idempotency_id=w.key
            )

    def _commit(self, block: bool) -> None:
        done = self._settled
        if done is None:
            return
        at = LogMessageId(done.segment_id, done.entry_id + 1)
        self._since_commit = 0
        self._last_commit = time.monotonic()
        if block:
            self.committed = self._reader.commit(done)
        elif at != self.committed:
            self._reader.commit_async(done)
            self.committed = at
        else:
            return
        self.stats.commits += 1

    # --- closing ---------------------------------------------------------------------------------

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop, store the commits asked for, close the target's writer (results still in
        flight get `timeout` to land; the next processor settles the rest)."""
        self._stop.set()
        try:
            self._reader.close()
        finally:
            self.writer.close(timeout)

    def __enter__(self) -> Processor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
