"""The writers users hold: `LogWriter` (plain) and `IdempotentLogWriter`, thin facades over one
write pipeline (pipeline.py). They check arguments (every row of a batch before anything is
queued), then hand the call to the pipeline's accumulator; they hold no state of their own.

Plain and idempotent writers are the same pipeline; the idempotent one is opened with a dedup
stage (`Dedup`, from `woodpecker_idem.idempotency`, chosen by the composition root), the plain one
with `NoDedup`. An idempotent write:

    write(msg, idempotency_id) -> key -> accumulator.lookup_locked (nothing queued ahead):
      committed -> the original id, duplicate=True, no server round trip;
      else      -> queued; admitted with the writes queued with it, each judged by the stage:
                   pending -> joins the entry in flight (same outcome, duplicate=True);
                   absent  -> a new entry (encoded once, key persisted in it), committed at aq.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from .._core import (
    Payloads,
    arrow_rows,
    content_key,
    content_keys,
    explicit_key,
    explicit_keys,
)
from ..args import timeout_arg, wait_for
from ..errors import (
    InvalidArgumentError,
    InvalidTypeError,
    PayloadTooLargeError,
)
from ..types import (
    UNCONDITIONAL,
    ExpectedLast,
    LogMessageId,
    WriteManyResult,
    WriteMessage,
    WriteResult,
    expected_last_arg,
)
from .accumulator import ACK_LATENCY_BOUNDS
from .dedup import NO_DEDUP, Dedup
from .lifecycle import FORKS
from .pipeline import Pipeline, open_pipeline
from .results import Outcomes, WriteFuture, resolve

if TYPE_CHECKING:
    from ..ensemble import LogContext


class _Writer:
    """What both writers share: the pipeline they face, flush, close and their state."""

    def __init__(self, ctx: LogContext, dedup: Dedup):
        self._pipeline = pipeline = open_pipeline(ctx, dedup)
        self._acc = pipeline.accumulator
        self._lock = pipeline.lock
        self._max_entry_bytes = pipeline.max_entry_bytes
        self._generation = pipeline.generation
        self.log_id = ctx.log_id
        self.epoch = pipeline.epoch
        self.owner = pipeline.owner

    # --- flushing and closing ----------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every entry queued before this call is committed or failed."""
        self._pipeline.flush(timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        """Flush, then complete the open segment so readers see it sealed. Idempotent.

        Returns within `timeout` seconds (None: no bound on the flush): writes not acknowledged
        by then fail with `WriterClosedError`, and a segment not completed by then is completed by
        the next writer's takeover.
        """
        self._pipeline.close(timeout)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- state ---------------------------------------------------------------------------------

    @property
    def fenced(self) -> bool:
        """Another writer took the log over: every call fails with `WriterFencedError`."""
        return self._pipeline.fenced

    @property
    def stopped(self) -> bool:
        """Closed (or closing) or fenced: it no longer owns its log."""
        return self._pipeline.stopped

    @property
    def repairing(self) -> bool:
        """A segment lost its ack quorum and is being completed: new writes are refused."""
        return self._pipeline.repairing

    @property
    def metrics(self) -> dict[str, float]:
        """The pipeline's counters (segments rolled and repaired, background retries, waits for
        room)."""
        return self._pipeline.metrics

    @property
    def ack_latency(self) -> tuple[tuple[float, ...], list[int], float]:
        """The histogram of the time from acceptance to ack of this writer's entries: bucket
        upper bounds in seconds (+Inf is the last bucket, implied), the entries in each bucket
        (not cumulative) and the sum of their latencies."""
        with self._lock:
            counts = list(self._pipeline.inflight.latency_buckets)
            total = float(self._pipeline.metrics["ack_latency_seconds"])
        return ACK_LATENCY_BOUNDS, counts, total

    def acknowledged_ends(self) -> dict[int, int]:
        """For each segment this writer has not completed yet, the last entry its quorum
        acknowledged (-1: none yet): where the log ends for `LogHandle.truncate`."""
        with self._lock:
            return self._pipeline.segments.lacs_locked()

    @property
    def queued(self) -> int:
        """Writes accepted and not given ids yet: queued for their run (admitted on an ack, a
        batch's worth, after `append.linger_ms`, or on flush). An inspection point for operations
        and tests; `metrics_snapshot()["pending"]` counts them too on an idempotent writer."""
        with self._lock:
            return len(self._acc)

    def last_message_id(self) -> LogMessageId | None:
        """The log's last entry as this writer's next write would follow it: the last entry
        given an id, acknowledged or still pending (None: the log holds none). What a
        conditional append (`expected_last=`) is judged against when its turn comes."""
        with self._lock:
            return self._pipeline.segments.tail_locked(None)[0]

    def still_owner(self) -> bool:
        """Ask the metadata store now whether this writer still owns the log; if another writer
        took it over, this one is fenced at once (what it had pending fails with
        `WriterFencedError`) instead of at its next metadata call or lease renewal."""
        return self._pipeline.still_owner()


class LogWriter(_Writer):
    """Appends to one log; thread-safe. Open it with `LogHandle.open_writer()`.

    Takes the log over (a new epoch fences every earlier writer), completes what earlier writers
    left, and opens a segment before it accepts a write. Its pipeline's dedup stage is the no-op
    `NoDedup`: no key is computed or stored, no window, no snapshot thread."""

    def __init__(self, ctx: LogContext):
        super().__init__(ctx, NO_DEDUP)

    # --- writing -----------------------------------------------------------------------------

    def write(
        self,
        message: WriteMessage | bytes,
        *,
        properties: dict[str, str] | None = None,
        idempotency_id: str | bytes | None = None,
        timeout: float | None = None,
        expected_last: ExpectedLast = UNCONDITIONAL,
    ) -> WriteResult:
        """Append and wait for the quorum ack (`timeout`: None or seconds > 0, checked before the
        write is queued). A wait that ends first raises `WriteTimeoutError`: still pending.
        `expected_last`: a conditional append (docs/semantics.md): written only if the log's
        last entry is then this id (None: the log holds none), else `ConditionFailedError`."""
        wait = timeout_arg(timeout, allow_zero=False)
        future = self.write_async(
            message,
            properties=properties,
            idempotency_id=idempotency_id,
            expected_last=expected_last,
        )
        return wait_for(future, wait, self._still_pending_text)

    def write_async(
        self,
        message: WriteMessage | bytes,
        *,
        properties: dict[str, str] | None = None,
        idempotency_id: str | bytes | None = None,
        expected_last: ExpectedLast = UNCONDITIONAL,
    ) -> Future[WriteResult]:
        """Queue an append; the future resolves at the quorum ack (or with the failure outcome).
        `expected_last`: as `write`'s, judged when the write's turn comes."""
        if FORKS[0] != self._generation:
            self._pipeline.check_process()
        if idempotency_id is not None:
            raise InvalidArgumentError(
                "idempotency_id given to a non-idempotent writer; open it with "
                "open_writer(idempotent=True)"
            )
        if expected_last is not UNCONDITIONAL:
            expected_last = expected_last_arg(expected_last)
        payload, props = coerce_message(message, properties, self._max_entry_bytes)
        future: Future[WriteResult] = WriteFuture()
        outcomes: Outcomes = []
        try:
            with self._lock:
                self._acc.queue_locked(payload, props, future, outcomes, expected=expected_last)
        finally:  # after the lock, also when the write was refused (see `queue_locked`)
            if outcomes:
                resolve(outcomes)
        return future

    def write_many(
        self,
        payloads: Sequence[bytes] | Payloads,
        *,
        timeout: float | None = None,
        expected_last: ExpectedLast = UNCONDITIONAL,
    ) -> WriteManyResult:
        """Append a batch (a sequence of bytes, or a `Payloads`) in order, in runs of one
        AddEntries batch (one frame and one waiter each, no future per row); columnar results.
        Every row and `timeout` are checked before any row is queued. A failure raises the
        lowest failed row's error, carrying the result and which rows were acknowledged
        (`batch_result`, `acknowledged`); a retry on this plain writer appends the rows again
        (the idempotent writer's `write_many` answers them).
        `expected_last`: a conditional batch: the rows land one after another right after that
        entry, or from the first row that would not on, none of them does
        (`ConditionFailedError`; a resumable bulk load, docs/semantics.md)."""
        self._pipeline.check_process()
        wait = timeout_arg(timeout, allow_zero=False)
        if expected_last is not UNCONDITIONAL:
            expected_last = expected_last_arg(expected_last)
        rows = checked_payloads(payloads, self._max_entry_bytes)
        return self._acc.write_rows(rows, None, wait, self._still_pending_text, expected_last)

    def _still_pending_text(self) -> str:
        """What a timed-out wait means for this writer (the idempotent one says a retry joins)."""
        return (
            f"the entry to log {self.log_id} is still pending and the writer keeps sending it; "
            "it may still land, and a retry on this plain writer appends a second copy"
        )


class IdempotentLogWriter(_Writer):
    """Every retry of one logical write lands at most once within the window, and returns the
    original position. Open it with `LogHandle.open_writer(idempotent=True)`: the pipeline
    rebuilds the window (snapshot + gap) before it accepts a write."""

    def __init__(self, ctx: LogContext, stage: Any):
        super().__init__(ctx, stage)
        self._stage = stage

    def write(
        self,
        message: WriteMessage | bytes,
        *,
        properties: dict[str, str] | None = None,
        idempotency_id: str | bytes | None = None,
        timeout: float | None = None,
        expected_last: ExpectedLast = UNCONDITIONAL,
    ) -> WriteResult:
        """Append and wait for the quorum ack; a key committed in the window returns its original
        id at once (duplicate=True) unless an earlier write is still queued (it is judged first).
        `timeout`: None or seconds > 0; a wait that ends first raises `WriteTimeoutError`.
        `expected_last`: a conditional append (docs/semantics.md); a key found in the window is
        answered as a duplicate first, whatever the log's last entry."""
        wait = None if timeout is None else timeout_arg(timeout, allow_zero=False)
        if FORKS[0] != self._generation:
            self._pipeline.check_process()
        if expected_last is not UNCONDITIONAL:
            expected_last = expected_last_arg(expected_last)
        payload, props = coerce_message(message, properties, self._max_entry_bytes)
        key = content_key(payload) if idempotency_id is None else explicit_key(idempotency_id)
        acc = self._acc
        outcomes: Outcomes = []
        try:
            with self._lock:
                hit = acc.lookup_locked(key)
                if hit is not None:
                    return hit
                future: Future[WriteResult] = WriteFuture()
                acc.queue_locked(payload, props, future, outcomes, key, expected=expected_last)
        finally:  # after the lock, also when the write was refused (see `queue_locked`)
            if outcomes:
                resolve(outcomes)
        return wait_for(future, wait, self._still_pending_text)

    def write_async(
        self,
        message: WriteMessage | bytes,
        *,
        properties: dict[str, str] | None = None,
        idempotency_id: str | bytes | None = None,
        expected_last: ExpectedLast = UNCONDITIONAL,
    ) -> Future[WriteResult]:
        """Queue a write; the future resolves at the quorum ack (or with the failure outcome), at
        once for a key committed in the window when no earlier write is queued. `expected_last`:
        as `write`'s."""
        if FORKS[0] != self._generation:
            self._pipeline.check_process()
        if expected_last is not UNCONDITIONAL:
            expected_last = expected_last_arg(expected_last)
        payload, props = coerce_message(message, properties, self._max_entry_bytes)
        future: Future[WriteResult] = WriteFuture()
        acc = self._acc
        outcomes: Outcomes = []
        try:
            if acc.futures:  # writes queued ahead: judged after them (keys hashed with their chunk)
                with self._lock:
                    acc.queue_locked(
                        payload, props, future, outcomes, None, idempotency_id, expected_last
                    )
            else:  # a hint, re-checked under the lock (lookup_locked)
                key = (
                    content_key(payload) if idempotency_id is None else explicit_key(idempotency_id)
                )
                with self._lock:
                    hit = acc.lookup_locked(key)
                    if hit is None:
                        acc.queue_locked(
                            payload, props, future, outcomes, key, expected=expected_last
                        )
                    else:
                        outcomes.append((future, hit))
        finally:  # after the lock, also when the write was refused (see `queue_locked`)
            if outcomes:
                resolve(outcomes)
        return future

    def _still_pending_text(self) -> str:
        return (
            f"the entry to log {self.log_id} is still pending and the writer keeps sending it; "
            "a retry with the same key joins it and returns its id"
        )

    def write_many(
        self,
        payloads: Sequence[bytes] | Payloads,
        ids: Sequence[str | bytes] | None = None,
        timeout: float | None = None,
        *,
        expected_last: ExpectedLast = UNCONDITIONAL,
    ) -> WriteManyResult:
        """Write a batch; one window pass, columnar results. Raises the first failure.

        Every row (payload type and size, id) and `timeout` are checked before any row is
        queued: a bad row refuses the whole batch and nothing is written. `expected_last`: a
        conditional batch (as the plain writer's `write_many`); rows found in the window are
        answered first, and the next new row must follow the last of them."""
        wait = timeout_arg(timeout, allow_zero=False)
        if expected_last is not UNCONDITIONAL:
            expected_last = expected_last_arg(expected_last)
        if ids is not None and not (hasattr(ids, "__len__") and hasattr(ids, "__getitem__")):
            raise InvalidTypeError(
                f"ids must be a sequence (a list or tuple), not {type(ids).__name__}"
            )
        checked = checked_payloads(payloads, self._max_entry_bytes)
        keys = content_keys(checked) if ids is None else explicit_keys(ids)  # checks types
        if ids is not None and len(ids) != len(checked):
            raise InvalidArgumentError(f"ids has {len(ids)} items but payloads has {len(checked)}")
        self._pipeline.check_process()
        return self._acc.write_rows(checked, keys, wait, self._still_pending_text, expected_last)

    def write_arrow(
        self,
        data: object,
        *,
        key_column: str | object | None = None,
        payload_column: str | None = None,
        exclude_columns: Sequence[str] = (),
        timeout: float | None = None,
        expected_last: ExpectedLast = UNCONDITIONAL,
    ) -> WriteManyResult:
        """Write every row of Arrow data (a pyarrow/polars RecordBatch or Table, or a binary
        column of payloads): keys are computed in Rust from the Arrow buffers, the whole batch is
        validated before anything is queued, and the call completes once, with columnar results.

        Payload: the `payload_column` (binary or string) as is, else the canonical JSON of the row
        (without `exclude_columns`). Key: the explicit id in `key_column` (a column name, or an
        Arrow column beside a payload column: string, binary or integer), else the payload's
        content key. `expected_last`: a conditional batch, as `write_many`'s.
        """
        wait = timeout_arg(timeout, allow_zero=False)
        if expected_last is not UNCONDITIONAL:
            expected_last = expected_last_arg(expected_last)
        payloads, keys = arrow_rows(
            data, key=key_column, payload=payload_column, exclude=list(exclude_columns)
        )
        return self._write_keyed(payloads, keys, wait, expected_last)

    def write_keyed(
        self,
        payloads: Payloads | list[bytes],
        keys: bytes,
        timeout: float | None = None,
        *,
        expected_last: ExpectedLast = UNCONDITIONAL,
    ) -> WriteManyResult:
        """Write payloads (a `Payloads`, as `arrow_rows` gives them, or a list of bytes) whose
        16-byte keys were computed already (N*16 bytes, by the `_core` key functions, e.g.
        `arrow_rows`); checked whole before anything is queued.
        `expected_last`: a conditional batch, as `write_many`'s."""
        if expected_last is not UNCONDITIONAL:
            expected_last = expected_last_arg(expected_last)
        return self._write_keyed(
            payloads, keys, timeout_arg(timeout, allow_zero=False), expected_last
        )

    def _write_keyed(
        self,
        payloads: Payloads | list[bytes],
        keys: bytes,
        wait: float | None,
        expected: ExpectedLast,
    ) -> WriteManyResult:
        """`write_keyed` with its timeout and `expected` checked already (`write_arrow` checks
        them before it reads the Arrow data)."""
        self._pipeline.check_process()
        rows = keyed_rows(payloads, keys, self._max_entry_bytes)
        return self._acc.write_rows(rows, keys, wait, self._still_pending_text, expected)

    # --- the window ----------------------------------------------------------------------------

    @property
    def window(self) -> Any:
        """The dedup window (`_core.DedupWindow`)."""
        return self._stage.window

    @property
    def recovery(self) -> Any:
        """The last window rebuild's report (seconds, snapshot age, entries replayed, ...)."""
        return self._stage.report

    @property
    def snapshotter(self) -> Any:
        """The window's snapshot writer (`idempotency.snapshot.Snapshotter`): `write_now()`
        writes a snapshot at once (True when written, False when this writer no longer owns the
        log or the put failed), `last_key` is the object key of the newest, `writes` how many
        it wrote. An inspection point for operations and tests; it runs on its own otherwise."""
        return self._stage.snapshotter

    def metrics_snapshot(self) -> dict[str, float | int | None]:
        """Duplicates suppressed, window size/memory, evictions, snapshots, last recovery."""
        with self._lock:
            queued = len(self._acc)
            duplicates = self._acc.duplicates
        figures = self._stage.metrics()
        figures["pending"] = (figures.get("pending") or 0) + queued
        return {"duplicates_suppressed": duplicates, **figures}


# --- argument checks (both writers) --------------------------------------------------------------


def coerce_message(
    message: WriteMessage | bytes | bytearray | memoryview,
    properties: dict[str, str] | None,
    max_bytes: int,
) -> tuple[bytes, dict | None]:
    """Validate a payload and its properties; bad input fails here, before anything is queued."""
    if type(message) is bytes and properties is None and len(message) <= max_bytes:
        return message, None  # the common case, valid by construction
    payload: bytes | bytearray | memoryview
    if isinstance(message, WriteMessage):
        payload, props = message.payload, message.properties or None
    else:
        payload, props = message, None
    if properties is not None and not isinstance(properties, dict):
        raise InvalidTypeError(
            f"properties must be a dict[str, str], not {type(properties).__name__}"
        )
    if properties:
        if props is not None and not isinstance(props, dict):
            raise InvalidTypeError(
                f"WriteMessage.properties must be a dict[str, str], not {type(props).__name__}"
            )
        props = {**(props or {}), **properties}
    if isinstance(payload, (bytearray, memoryview)):
        payload = bytes(payload)
    elif not isinstance(payload, bytes):
        raise InvalidTypeError(
            f"payload must be bytes, bytearray or memoryview, not {type(payload).__name__}"
            + (" (encode str first)" if isinstance(payload, str) else "")
        )
    if len(payload) > max_bytes:
        raise PayloadTooLargeError(
            f"payload is {len(payload)} bytes; append.max_entry_bytes allows {max_bytes}"
        )
    if props is not None:
        if not isinstance(props, dict):
            raise InvalidTypeError(
                f"properties must be a dict[str, str], not {type(props).__name__}"
            )
        for k, v in props.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidTypeError(f"properties must map str to str; got {k!r}: {v!r}")
    return payload, props


def checked_payloads(payloads: Sequence[bytes] | Payloads, max_bytes: int) -> Payloads:
    """A batch's payloads as one `Payloads` (a sequence of bytes is copied into one in one
    pass), every row checked (type, size) before any is queued: a bad row refuses the whole
    batch, naming it."""
    rows = payloads if type(payloads) is Payloads else Payloads(payloads)  # names a bad row
    over = rows.first_longer(max_bytes)  # from the longest row: no pass when none is over
    if over is not None:
        raise PayloadTooLargeError(
            f"payloads[{over}]: payload is {rows.range_bytes(over, over + 1)} bytes; "
            f"append.max_entry_bytes allows {max_bytes}"
        )
    return rows


def keyed_rows(payloads: Payloads | list[bytes], keys: bytes, max_bytes: int) -> Payloads:
    """`write_keyed`'s rows, checked whole before any is queued (N*16 key bytes, payloads within
    append.max_entry_bytes): a bad row refuses the batch, naming it. No Python work per row (the
    Spark sink's path): a `Payloads` is checked from its offsets."""
    try:
        rows = payloads if type(payloads) is Payloads else Payloads(payloads)
    except InvalidTypeError as exc:
        raise InvalidTypeError(f"{exc}; nothing of the batch was written") from None
    n = len(rows)
    if len(keys) != 16 * n:
        raise InvalidArgumentError(f"keys has {len(keys)} bytes; {n} payloads need {16 * n}")
    too_large = rows.first_longer(max_bytes)
    if too_large is not None:
        raise PayloadTooLargeError(
            f"row {too_large}: payload is {rows.range_bytes(too_large, too_large + 1)} bytes; "
            f"append.max_entry_bytes allows {max_bytes}; nothing of the batch was written"
        )
    return rows


__all__ = ["IdempotentLogWriter", "LogWriter", "Pipeline"]
