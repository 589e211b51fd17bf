"""The idempotent writer's intake: writes accepted but not yet given ids.

A producer thread queues a write (payload, properties, future) with its queueing time, and pushes
it into a `KeyPipe`: keys are computed 64 at a time, payloads' and explicit ids' alike (by the
pipe's Rust thread, without the GIL, when a chunk's payloads are large). Queued writes are
admitted (given ids, in one window pass and one encoding call per batch) at once when nothing is
in flight, else by the ack of the batch in flight (group commit), by the producer itself once a
batch's keys are ready, or by the flusher once the oldest has waited `append.linger_ms`.
That hashes payloads many at a time and turns per-write window and encoding calls into one per
batch.
Every method is called with the writer's lock held.
"""

from __future__ import annotations

import time
from array import array
from concurrent.futures import Future
from typing import NamedTuple

from .._core import KeyPipe
from ..client.queued import TIMESTAMP_TYPECODE
from ..client.rows import ROW_OVERHEAD as OVERHEAD

# A producer admits queued writes itself once this many wait ...
ADMIT_AT = 128
# ... and at least this many of the oldest have their keys ready
ADMIT_MIN = 64


class IntakeBatch(NamedTuple):
    payloads: list[bytes]
    properties: list[dict | None]
    futures: list[Future]
    timestamps: array  # each write's queueing time, the time it is judged at
    nbytes: int  # what the writes count against append.max_inflight_bytes
    keys: bytes  # N*16 bytes, one key per write
    since: float  # time.monotonic() when the oldest write was queued


class Intake:
    """A FIFO of queued writes, one column per field; write i's key is the pipe's i-th."""

    __slots__ = ("payloads", "properties", "futures", "timestamps", "nbytes", "since", "pipe")

    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self.properties: list[dict | None] = []
        self.futures: list[Future] = []
        self.timestamps = array(TIMESTAMP_TYPECODE)
        self.nbytes = 0
        self.since = 0.0
        self.pipe = KeyPipe()

    def __len__(self) -> int:
        return len(self.futures)

    def take(self, count: int | None = None) -> IntakeBatch:
        """The oldest `count` writes (all by default) with their keys; waits for the pipe only
        for keys not computed yet."""
        if count is None or count == len(self.futures):
            batch = IntakeBatch(
                self.payloads,
                self.properties,
                self.futures,
                self.timestamps,
                self.nbytes,
                self.pipe.take(len(self.futures)),
                self.since,
            )
            self.payloads, self.properties, self.futures = [], [], []
            self.timestamps = array(TIMESTAMP_TYPECODE)
            self.nbytes = 0
            return batch
        n = count
        payloads = self.payloads[:n]
        nbytes = sum([len(p) for p in payloads]) + OVERHEAD * n
        batch = IntakeBatch(
            payloads,
            self.properties[:n],
            self.futures[:n],
            self.timestamps[:n],
            nbytes,
            self.pipe.take(n),
            self.since,
        )
        del self.payloads[:n], self.properties[:n], self.futures[:n], self.timestamps[:n]
        self.nbytes -= nbytes
        self.since = time.monotonic()
        return batch

    def trim(self) -> None:
        """Drop the columns' rows past the pipe's keys: a row whose key never went in (its
        queue_locked was cut short, e.g. by KeyboardInterrupt) is not queued."""
        n = len(self.pipe)
        del self.payloads[n:], self.properties[n:], self.futures[n:], self.timestamps[n:]

    def drop(self) -> list[Future]:
        """Forget every queued write (the writer failed); returns their futures."""
        futures = self.futures
        self.payloads, self.properties, self.futures = [], [], []
        self.timestamps = array(TIMESTAMP_TYPECODE)
        self.nbytes = 0
        self.since = 0.0
        self.pipe.clear()
        return futures
