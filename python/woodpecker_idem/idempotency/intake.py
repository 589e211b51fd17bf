"""The idempotent writer's intake: writes accepted but not yet given ids.

A producer thread queues a write (payload, properties, explicit key or None, future) with its
queueing time, and pushes a keyless payload into a `KeyPipe`, whose Rust thread computes its
content key in parallel without the GIL. Queued writes are admitted (given ids, in one window
pass per batch) by the producer itself once a batch's keys are ready, or by the flusher when the
oldest has waited `append.linger_ms`. That keeps the per-write MD5 off the producer thread and
turns per-write window lookups and inserts into one call per batch.
Every method is called with the writer's lock held.
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

Item = tuple[bytes, "dict | None", "bytes | None", Future]


class IntakeBatch(NamedTuple):
    items: list[Item]
    timestamps: array  # array('q'): each write's queueing time, the time it is judged at
    nbytes: int  # what the writes count against append.max_inflight_bytes
    keys: bytes  # N*16 bytes, one key per item
    since: float  # time.monotonic() when the oldest write was queued


class Intake:
    """A FIFO of queued writes."""

    __slots__ = ("items", "timestamps", "nbytes", "keyless", "since", "pipe")

    def __init__(self) -> None:
        self.items: list[Item] = []
        self.timestamps = array("q")
        self.nbytes = 0
        self.keyless = 0  # items whose key comes from the pipe
        self.since = 0.0
        self.pipe = KeyPipe()

    def __len__(self) -> int:
        return len(self.items)

    def ready(self) -> int:
        """How many of the oldest writes can be admitted without waiting for the pipe."""
        n = len(self.items)
        if not self.keyless:
            return n
        hashed = self.pipe.ready_count()
        if self.keyless == n:
            return hashed
        for i, item in enumerate(self.items):  # mixed keys: find the first unhashed one
            if item[2] is None:
                if not hashed:
                    return i
                hashed -= 1
        return n

    def take(self, count: int | None = None) -> IntakeBatch:
        """The oldest `count` writes (all by default) with their keys; waits for the pipe only
        for keys not ready yet."""
        n = len(self.items) if count is None else count
        items = self.items[:n]
        stamps = self.timestamps[:n]
        keyless = n if self.keyless == len(self.items) else sum(it[2] is None for it in items)
        nbytes = sum([len(it[0]) for it in items]) + OVERHEAD * n if count else self.nbytes
        since = self.since
        del self.items[:n]
        del self.timestamps[:n]
        self.nbytes -= nbytes
        self.keyless -= keyless
        self.since = time.monotonic()
        if not keyless:
            keys = b"".join([it[2] for it in items])  # type: ignore[misc]
        elif keyless == n:
            keys = self.pipe.take(n)
        else:
            hashed = self.pipe.take(keyless)
            out = []
            j = 0
            for it in items:
                if it[2] is None:
                    out.append(hashed[j : j + 16])
                    j += 16
                else:
                    out.append(it[2])
            keys = b"".join(out)
        return IntakeBatch(items, stamps, nbytes, keys, since)

    def drop(self) -> list[Item]:
        """Forget every queued write (the writer failed); returns them."""
        items = self.items
        self.items = []
        self.timestamps = array("q")
        self.nbytes = 0
        self.keyless = 0
        self.pipe.clear()
        return items
