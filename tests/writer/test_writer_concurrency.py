"""Several producer threads into backpressure, on one writer: every call of every kind at once
(`write`, `write_async` bursts, `write_many`, `write_keyed`, `write_arrow`), overlapping keys,
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
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest

import woodpecker_idem as wp
from woodpecker_idem import WoodpeckerError, explicit_key, explicit_keys
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
WINDOW_S = 3600
WINDOW_KEYS = 10**6


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
    next_key: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

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
                self.key(ident), payload, lambda: self.writer.write(payload, **self.kw(ident))
            )
        except WoodpeckerError:
            pass  # recorded; the checker judges it

    def burst(self, rng: random.Random) -> None:
        idents = [self.ident(rng) for _ in range(rng.randint(1, 60))]
        calls: list[tuple[str, Stamp, Future]] = []
        for ident in idents:
            start = self.history.now()
            calls.append(
                (ident, start, self.writer.write_async(payload_of(ident), **self.kw(ident)))
            )
        for ident, start, future in calls:
            try:
                result = future.result(60)
            except WoodpeckerError as exc:
                self.history.failed(self.key(ident), payload_of(ident), exc, start)
            else:
                self.history.ok(self.key(ident), payload_of(ident), result, start)

    def batch(self, rng: random.Random, how: str) -> None:
        idents = [self.ident(rng) for _ in range(rng.randint(1, 90))]
        payloads = [payload_of(i) for i in idents]
        start = self.history.now()
        try:
            if how == "many" and self.idempotent:
                result = self.writer.write_many(payloads, idents)
            elif how == "many":
                result = self.writer.write_many(payloads)
            elif how == "keyed":
                result = self.writer.write_keyed(payloads, explicit_keys(idents))
            else:  # arrow: a key column and a payload column
                table = pa.table({"id": idents, "body": payloads})
                result = self.writer.write_arrow(table, key_column="id", payload_column="body")
            acked = bytearray(b"\x01") * len(idents)
            error: WoodpeckerError | None = None
        except WoodpeckerError as exc:
            result, acked, error = exc.batch_result, exc.acknowledged, exc
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
            calls += [lambda r: self.batch(r, "keyed"), lambda r: self.batch(r, "arrow")]
        for _ in range(self.rounds):
            rng.choice(calls)(rng)


def run_stress(
    path: Path,
    *,
    idempotent: bool,
    threads: int,
    rounds: int,
    seed: int,
    resend: bool = False,
    **cfg: object,
) -> None:
    """`resend`: afterwards a new idempotent writer takes the log over (its window rebuilt
    from the newest snapshot and the log after it) and every key is written again."""
    client = wp.connect(path, {"quorum.es": 1, **TIGHT, **cfg})
    log = client.open_log("stress", create=True)
    writer = (
        log.open_writer(idempotent=True, window_duration_s=WINDOW_S, window_max_keys=WINDOW_KEYS)
        if idempotent
        else log.open_writer()
    )
    history = History()
    stress = Stress(writer, history, idempotent, seed, rounds)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            stress.producer(i)
        except BaseException as exc:  # a producer that dies fails the test
            errors.append(exc)

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


@pytest.mark.parametrize("seed", range(2))
def test_plain_producers_into_backpressure(tmp_path: Path, seed: int):
    run_stress(tmp_path, idempotent=False, threads=6, rounds=80, seed=seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(int(os.environ.get("WP_STRESS_SEEDS", "10"))))
def test_idempotent_producers_into_backpressure_long(tmp_path: Path, seed: int):
    run_stress(tmp_path, idempotent=True, threads=8, rounds=150, seed=100 + seed)
