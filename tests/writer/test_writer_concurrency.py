"""Several producer threads into backpressure, on one writer: every call of every kind at once
(`write`, `write_async` bursts, `write_many`, `write_keyed`, `write_arrow`, the batch calls
with lists and with `Payloads`, over an Arrow column's buffers too), overlapping keys,
limits so small that producers wait for room, batches are cut and segments roll all the time.
The history checker judges the log; every accepted write must end at the entry holding its key.

A producer waiting for room releases the writer's lock while others queue: that wait is where
the columns of a queued write (key, payload, timestamp, future) once got out of step, and
writes were acknowledged at entries holding other keys. These tests keep that wait busy.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest

import woodpecker_idem as wp
from woodpecker_idem import Payloads, WoodpeckerError, explicit_key, explicit_keys
from woodpecker_idem.testing import FaultInjectingTransport
from woodpecker_idem.testing.history import History, Stamp

# Limits small enough that backpressure, batch cuts and rolls happen on most calls
TIGHT = {
    "append.max_inflight_entries": 24,
    "append.max_inflight_bytes": 4096,
    "append.max_entry_bytes": 1024,
    "append.max_batch_entries": 4,
    "append.linger_ms": 1,
    "segment.max_entries": 97,
    "storage.fsync": "never",
    "idempotency.snapshot_interval_s": 3600,
    "idempotency.snapshot_threshold": 10**8,
}
# Large batches: a keyed queue is admitted once it holds 128 writes or 7300 bytes (65 writes of
# about 112 counted bytes), and then only the writes whose keys are hashed go, 64 at a time: a
# queue that grows past 65 writes (bursts of up to 200 write_async) while the node takes 2 ms
# per add is admitted in part, the rest staying queued behind (`Accumulator._take_locked`).
# Batch calls' chunks (up to 90 rows) are often larger than a segment's room left: their runs
# are cut at the segment's end.
LARGE = {
    "append.max_batch_entries": 128,
    "append.max_batch_bytes": 7300,
    "append.max_inflight_entries": 160,
    "append.max_inflight_bytes": 20 * 1024,
    "append.linger_ms": 50,
}
LARGE_ADD_DELAY_MS = 2
WINDOW_S = 3600
WINDOW_KEYS = 10**6
# Every call here is acknowledged within a second or so even on a loaded machine; a write that
# is never resolved (columns out of step after a lock released mid-append, a waiter lost) fails
# its seed after this long (a burst's futures share one deadline, and the other producers stop
# at their next call) instead of after minutes
CALL_TIMEOUT_S = 10.0


def payload_of(ident: str) -> bytes:
    """Every attempt of one key sends the same payload (the checker compares them)."""
    return f"payload-of-{ident}".encode() * 3


@dataclass
class Stress:
    """One run: the producers share one key space that keeps growing, so new keys and retries
    of keys other producers wrote (committed, pending or queued) arrive all the time."""

    writer: object
    history: History
    idempotent: bool
    seed: int
    rounds: int
    burst_max: int = 60  # write_async calls per burst, at most
    next_key: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)  # a producer failed

    def ident(self, rng: random.Random) -> str:
        with self.lock:
            if rng.random() < 0.5 or self.next_key < 10:
                self.next_key += 1
                return f"k{self.next_key}"
            return f"k{rng.randrange(max(1, self.next_key - 200), self.next_key + 1)}"

    def key(self, ident: str) -> bytes | None:
        return explicit_key(ident) if self.idempotent else None

    def kw(self, ident: str) -> dict:
        return {"idempotency_id": ident} if self.idempotent else {}

    # --- the calls ---------------------------------------------------------------------------

    def one_write(self, rng: random.Random) -> None:
        ident = self.ident(rng)
        payload = payload_of(ident)
        try:
            self.history.call(
                self.key(ident),
                payload,
                lambda: self.writer.write(payload, timeout=CALL_TIMEOUT_S, **self.kw(ident)),
            )
        except WoodpeckerError:  # recorded; nothing here may fail: the run stops
            self.stop.set()

    def burst(self, rng: random.Random) -> None:
        idents = [self.ident(rng) for _ in range(rng.randint(1, self.burst_max))]
        calls: list[tuple[str, Stamp, Future]] = []
        for ident in idents:
            start = self.history.now()
            calls.append(
                (ident, start, self.writer.write_async(payload_of(ident), **self.kw(ident)))
            )
        deadline = time.monotonic() + CALL_TIMEOUT_S
        for ident, start, future in calls:
            try:
                result = future.result(max(0.0, deadline - time.monotonic()))
            except WoodpeckerError as exc:
                self.history.failed(self.key(ident), payload_of(ident), exc, start)
                self.stop.set()
            else:
                self.history.ok(self.key(ident), payload_of(ident), result, start)

    def batch(self, rng: random.Random, how: str) -> None:
        idents = [self.ident(rng) for _ in range(rng.randint(1, 90))]
        payloads = [payload_of(i) for i in idents]
        start = self.history.now()
        try:
            wait = CALL_TIMEOUT_S
            if how == "many" and self.idempotent:
                result = self.writer.write_many(payloads, idents, timeout=wait)
            elif how == "many":
                result = self.writer.write_many(payloads, timeout=wait)
            elif how == "columnar":  # a Payloads made from the list (one buffer)
                result = self.writer.write_many(Payloads(payloads), timeout=wait)
            elif how == "keyed":
                result = self.writer.write_keyed(payloads, explicit_keys(idents), timeout=wait)
            elif how == "keyed-columnar":  # a Payloads over an Arrow column's buffers, sliced
                column = pa.array([b"not written", *payloads], pa.large_binary()).slice(1)
                result = self.writer.write_keyed(
                    Payloads.from_arrow(column), explicit_keys(idents), timeout=wait
                )
            else:  # arrow: a key column and a payload column
                table = pa.table({"id": idents, "body": payloads})
                result = self.writer.write_arrow(
                    table, key_column="id", payload_column="body", timeout=wait
                )
            acked = bytearray(b"\x01") * len(idents)
            error: WoodpeckerError | None = None
        except WoodpeckerError as exc:
            result, acked, error = exc.batch_result, exc.acknowledged, exc
            self.stop.set()
            assert result is not None and acked is not None, exc
        end = self.history.now()
        for row, ident in enumerate(idents):
            if acked[row]:
                mid = wp.LogMessageId(result.segment_ids[row], result.entry_ids[row])
                res = wp.WriteResult(mid, bool(result.duplicate[row]))
                self.history.ok(self.key(ident), payloads[row], res, start, end)
            else:
                assert error is not None
                self.history.failed(self.key(ident), payloads[row], error, start, end)

    def producer(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        calls: list[Callable[[random.Random], None]] = [self.one_write, self.burst]
        calls.append(lambda r: self.batch(r, "many"))
        if self.idempotent:
            calls += [
                lambda r: self.batch(r, "keyed"),
                lambda r: self.batch(r, "keyed-columnar"),
                lambda r: self.batch(r, "arrow"),
            ]
        else:
            calls.append(lambda r: self.batch(r, "columnar"))
        for _ in range(self.rounds):
            if self.stop.is_set():
                return
            rng.choice(calls)(rng)


def run_stress(
    path: Path,
    *,
    idempotent: bool,
    threads: int,
    rounds: int,
    seed: int,
    resend: bool = False,
    add_delay_ms: float = 0,
    burst_max: int = 60,
    **cfg: object,
) -> None:
    """`resend`: afterwards a new idempotent writer takes the log over (its window rebuilt
    from the newest snapshot and the log after it) and every key is written again.
    `add_delay_ms`: the node answers each add that much later (queues grow meanwhile);
    `burst_max`: the most write_async calls of one burst."""
    client = wp.connect(path, {"quorum.es": 1, **TIGHT, **cfg})
    if add_delay_ms:
        slow = FaultInjectingTransport(client.transport)
        for node in slow.node_ids:
            slow.delay(node, add_delay_ms)
        client.transport = slow
    log = client.open_log("stress", create=True)
    writer = (
        log.open_writer(idempotent=True, window_duration_s=WINDOW_S, window_max_keys=WINDOW_KEYS)
        if idempotent
        else log.open_writer()
    )
    history = History()
    stress = Stress(writer, history, idempotent, seed, rounds, burst_max)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            stress.producer(i)
        except BaseException as exc:  # a producer that dies fails the test
            errors.append(exc)
            stress.stop.set()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors
    metrics = dict(writer.metrics)
    snapshots = writer.snapshotter.writes if idempotent else 0
    writer.close()
    # the faults met the writes: producers waited for room, segments rolled under them
    assert metrics["backpressure_waits"] > 0, metrics
    assert metrics["segments_rolled"] > 0, metrics
    if resend:
        assert snapshots > 1, snapshots  # snapshots were streamed while producers wrote
        again = log.open_writer(
            idempotent=True, window_duration_s=WINDOW_S, window_max_keys=WINDOW_KEYS
        )
        assert again.recovery.snapshot_key_count > 0, again.recovery
        idents = [f"k{n}" for n in range(stress.next_key + 1)]
        start = history.now()
        res = again.write_many([payload_of(i) for i in idents], idents)
        end = history.now()
        for row, ident in enumerate(idents):
            mid = wp.LogMessageId(res.segment_ids[row], res.entry_ids[row])
            history.ok(
                explicit_key(ident),
                payload_of(ident),
                wp.WriteResult(mid, bool(res.duplicate[row])),
                start,
                end,
            )
        again.close()
    log.open_writer().close()  # completes every segment
    # the entries the nodes store, read around the LogReader (and the reader held to them)
    verdict = history.check_log(log, WINDOW_S * 1000, WINDOW_KEYS)
    client.close()
    assert verdict.ok, verdict.summary()
    failed = [a for a in history.attempts if not a.ok]
    assert not failed, failed[:5]  # nothing here fails a write: every one is acknowledged
    assert verdict.entries > 100


@pytest.mark.parametrize("seed", range(3))
def test_idempotent_producers_into_backpressure(tmp_path: Path, seed: int):
    run_stress(tmp_path, idempotent=True, threads=6, rounds=80, seed=seed)


@pytest.mark.parametrize(
    "limits",
    [
        {"append.max_inflight_entries": 1, "append.max_batch_entries": 1},
        {"append.max_inflight_entries": 64, "append.max_inflight_bytes": 1 << 20},
        {"append.max_inflight_entries": 10_000, "append.max_inflight_bytes": 1024},  # bytes bind
    ],
    ids=["one-entry", "entries-64", "bytes-1k"],
)
def test_idempotent_producers_under_other_limits(tmp_path: Path, limits: dict):
    run_stress(tmp_path, idempotent=True, threads=6, rounds=40, seed=7, **limits)


def test_snapshots_streamed_under_producers_rebuild_the_window(tmp_path: Path):
    """Snapshots stream from the live window while producers commit into backpressure; a
    takeover rebuilds from the newest one, and a resend of every key lands nowhere new."""
    run_stress(
        tmp_path,
        idempotent=True,
        threads=6,
        rounds=60,
        seed=11,
        resend=True,
        **{"idempotency.snapshot_interval_s": 0.01, "idempotency.snapshot_threshold": 16},
    )


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
def test_producers_with_batches_larger_than_the_room_left(tmp_path: Path, idempotent: bool):
    """LARGE: batch calls and queue admissions bigger than the in-flight room and the segment's
    room, so batches are admitted in part (see LARGE)."""
    run_stress(
        tmp_path,
        idempotent=idempotent,
        threads=6,
        rounds=40,
        seed=21,
        add_delay_ms=LARGE_ADD_DELAY_MS,
        burst_max=200,
        **LARGE,
    )


@pytest.mark.parametrize("seed", range(2))
def test_plain_producers_into_backpressure(tmp_path: Path, seed: int):
    run_stress(tmp_path, idempotent=False, threads=6, rounds=80, seed=seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(int(os.environ.get("WP_STRESS_SEEDS", "10"))))
def test_idempotent_producers_into_backpressure_long(tmp_path: Path, seed: int):
    run_stress(tmp_path, idempotent=True, threads=8, rounds=150, seed=100 + seed)
