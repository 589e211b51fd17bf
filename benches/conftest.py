"""Shared data for benches/bench_core.py (built once per session)."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from typing import Any

import pytest

from woodpecker_idem import _core

SNAPSHOT_ENTRIES = 100_000
SNAPSHOT_SEGMENTS = 3


@dataclass(frozen=True)
class SnapshotData:
    """A window of committed entries shaped like a real log, and the snapshot's metadata."""

    window: Any
    n: int
    log_id: int
    epoch: int
    timestamp_ms: int
    watermarks: dict[int, int]


def int64s(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}q", *values)


@pytest.fixture(scope="session")
def snapshot_data() -> SnapshotData:
    """100,000 random keys over 3 segments, consecutive entry ids, timestamps +0..12 ms."""
    rng = random.Random(20240601)
    n = SNAPSHOT_ENTRIES
    per_segment = -(-n // SNAPSHOT_SEGMENTS)
    segs: list[int] = []
    ents: list[int] = []
    tss: list[int] = []
    ts = 1_717_200_000_000
    watermarks: dict[int, int] = {}
    for i in range(n):
        seg = 40 + i // per_segment
        ent = i % per_segment
        ts += rng.randint(0, 12)
        segs.append(seg)
        ents.append(ent)
        tss.append(ts)
        watermarks[seg] = ent
    window = _core.DedupWindow(n, 3_600_000)
    inserted = window.add_committed_many(
        rng.randbytes(16 * n), int64s(segs), int64s(ents), int64s(tss)
    )
    assert inserted == n
    return SnapshotData(window, n, 7, 3, ts, watermarks)
