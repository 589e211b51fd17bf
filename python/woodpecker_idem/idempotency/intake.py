"""The idempotent writer's intake: writes accepted but not yet given ids.

A producer thread queues a write (payload, properties, future) with its queueing time, and pushes
its payload (or explicit id) into a `KeyPipe`, whose Rust thread computes the key in parallel
without the GIL. Queued writes are admitted (given ids, in one window pass per batch) by the
producer itself once a batch's keys are ready, or by the flusher when the oldest has waited
`append.linger_ms`. That keeps the per-write MD5 off the producer thread and turns per-write window
lookups and inserts into one call per batch. Every method is called with the writer's lock held.
"""

from __future__ import annotations

import time
from array import array
from concurrent.futures import Future
from typing import NamedTuple

from .._core import KeyPipe

# Bytes a queued write counts against append.max_inflight_bytes until its record exists
OVERHEAD = 64
# A producer admits queued writes itself once this many wait ...
ADMIT_AT = 128
# ... and at least this many of the oldest have their keys ready
ADMIT_MIN = 64

Item = tuple[bytes, "dict | None", Future]


class IntakeBatch(NamedTuple):
    items: list[Item]
    timestamps: array  # array('q'): each write's queueing time, the time it is judged at
    nbytes: int  # what the writes count against append.max_inflight_bytes
    keys: bytes  # N*16 bytes, one key per item
    since: float  # time.monotonic() when the oldest write was queued


class Intake:
    """A FIFO of queued writes; item i's key is the pipe's i-th."""

    __slots__ = ("items", "timestamps", "nbytes", "since", "pipe")

    def __init__(self) -> None:
        self.items: list[Item] = []
        self.timestamps = array("q")
        self.nbytes = 0
        self.since = 0.0
        self.pipe = KeyPipe()

    def __len__(self) -> int:
        return len(self.items)

    def take(self, count: int | None = None) -> IntakeBatch:
        """The oldest `count` writes (all by default) with their keys; waits for the pipe only
        for keys not computed yet."""
        n = len(self.items) if count is None else count
        items = self.items[:n]
        stamps = self.timestamps[:n]
        if n == len(self.items):
            nbytes = self.nbytes
        else:
            nbytes = sum([len(it[0]) for it in items]) + OVERHEAD * n
        since = self.since
        del self.items[:n]
        del self.timestamps[:n]
        self.nbytes -= nbytes
        self.since = time.monotonic()
        return IntakeBatch(items, stamps, nbytes, self.pipe.take(n), since)

    def drop(self) -> list[Item]:
        """Forget every queued write (the writer failed); returns them."""
        items = self.items
        self.items = []
        self.timestamps = array("q")
        self.nbytes = 0
        self.pipe.clear()
        return items
