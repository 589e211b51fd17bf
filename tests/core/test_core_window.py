"""DedupWindow (Rust core) against a plain-Python reference model of docs/core-api.md.

The model is written from the contract alone: a pending map that is never evicted nor counted in
the capacity, committed keys in commit order, capacity eviction of the oldest committed key (an
*early* eviction when ``new_ts - evicted_ts < window_ms``), time eviction from the oldest end,
expired entries treated as absent by ``get(key, now)``, and hit/miss/eviction counters. A hypothesis
state machine drives the model and the real window with the same operations and compares the full
state after every step.
"""

from __future__ import annotations

import random
import struct
import subprocess
import sys
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from woodpecker_idem import _core
from woodpecker_idem.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    WoodpeckerError,
)

U32_MAX = 2**32 - 1
I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

Value = tuple[int, int, int]  # (segment_id, entry_id, timestamp_ms)
Entry = tuple[bytes, int, int, int]


class RefWindow:
    """Reference model of DedupWindow, straight from the contract.

    Committed records sit in a ring of `max_keys` slots in commit order; a key written again
    (after its window, or at a later log position during recovery) leaves a dead slot behind,
    which is dropped at the oldest end without counting as an eviction.
    """

    def __init__(self, max_keys: int, window_ms: int) -> None:
        self.max_keys = max_keys
        self.window_ms = window_ms
        self.pending: dict[bytes, Value] = {}
        self.pending_seq: dict[bytes, int] = {}  # insertion order, for ties in commit_through
        self.seq = 0
        self.ring: list[list[Any]] = []  # [key, value, live], oldest first
        self.live: dict[bytes, list[Any]] = {}
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.early_evictions = 0

    @property
    def committed(self) -> dict[bytes, Value]:
        return {k: slot[1] for k, slot in self.live.items()}

    # -- helpers ------------------------------------------------------------------------------
    def _pop_oldest(self) -> list[Any]:
        slot = self.ring.pop(0)
        if slot[2]:
            del self.live[slot[0]]
            self.evictions += 1
        return slot

    def _append_committed(self, key: bytes, value: Value) -> None:
        if len(self.ring) >= self.max_keys:
            old = self._pop_oldest()
            if old[2] and value[2] - old[1][2] < self.window_ms:
                self.early_evictions += 1
        slot = [key, value, True]
        self.ring.append(slot)
        self.live[key] = slot

    def _kill(self, key: bytes) -> None:
        self.live.pop(key)[2] = False

    def _expired(self, value: Value, now_ms: int | None) -> bool:
        return now_ms is not None and now_ms - value[2] >= self.window_ms

    def lookup(self, key: bytes, now_ms: int | None) -> tuple[int, Value | None]:
        """(status, value) with status 0 absent, 1 pending, 2 committed; counts hit/miss."""
        if key in self.live:
            value = self.live[key][1]
            if self._expired(value, now_ms):
                self.misses += 1
                return 0, None
            self.hits += 1
            return 2, value
        if key in self.pending:
            self.hits += 1
            return 1, self.pending[key]
        self.misses += 1
        return 0, None

    # -- operations ---------------------------------------------------------------------------
    def can_add_pending(self, key: bytes, ts: int) -> bool:
        if key in self.pending:
            return False
        return key not in self.live or ts - self.live[key][1][2] >= self.window_ms

    def add_pending(self, key: bytes, value: Value) -> None:
        assert self.can_add_pending(key, value[2])
        if key in self.live:
            self._kill(key)  # its committed record expired: the new write replaces it
        self.pending[key] = value
        self.seq += 1
        self.pending_seq[key] = self.seq

    def _in_segment(self, segment_id: int, last: int | None) -> list[bytes]:
        """Pending keys of a segment up to `last`, in entry order (ties: insertion order)."""
        rows = [
            (v[1], self.pending_seq[k], k)
            for k, v in self.pending.items()
            if v[0] == segment_id and (last is None or v[1] <= last)
        ]
        return [k for _e, _s, k in sorted(rows)]

    def commit_through(self, segment_id: int, last_entry_id: int) -> int:
        keys = self._in_segment(segment_id, last_entry_id)
        for k in keys:
            self.commit(k)
        return len(keys)

    def drop_segment(self, segment_id: int) -> int:
        keys = self._in_segment(segment_id, None)
        for k in keys:
            self.drop_pending(k)
        return len(keys)

    def commit(self, key: bytes) -> bool:
        value = self.pending.pop(key, None)
        if value is None:
            return False
        self._append_committed(key, value)
        return True

    def drop_pending(self, key: bytes) -> bool:
        return self.pending.pop(key, None) is not None

    def add_committed(self, key: bytes, value: Value) -> bool:
        if key in self.live:
            old = self.live[key][1]
            if (value[0], value[1]) <= (old[0], old[1]):
                return False
            self._kill(key)
        self.pending.pop(key, None)
        self._append_committed(key, value)
        return True

    def evict(self, now_ms: int) -> int:
        n = 0
        while self.ring:
            key, value, live = self.ring[0]
            if live and now_ms - value[2] < self.window_ms:
                break
            self._pop_oldest()
            n += live
        return n

    def entries(self) -> list[Entry]:
        return [(k, v[0], v[1], v[2]) for k, v, live in self.ring if live]


def q_buf(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}q", *values)


def unpack_q(buf: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(buf) // 8}q", buf))


KEY_POOL = [bytes([i]) * 8 + i.to_bytes(8, "little") for i in range(1, 11)]
keys = st.sampled_from(KEY_POOL)
ids = st.one_of(st.integers(0, 20), st.sampled_from([0, 1, U32_MAX - 1, U32_MAX]))


class WindowMachine(RuleBasedStateMachine):
    """Drives the real window and the model with the same operations."""

    def __init__(self) -> None:
        super().__init__()
        self.real: Any = None
        self.model: RefWindow | None = None
        self.now = 0

    @initialize(
        max_keys=st.integers(1, 8),
        window_ms=st.integers(1, 50),
        start=st.integers(-1000, 10**12),
    )
    def setup(self, max_keys: int, window_ms: int, start: int) -> None:
        self.real = _core.DedupWindow(max_keys, window_ms)
        self.model = RefWindow(max_keys, window_ms)
        self.now = start
        assert self.real.max_keys == max_keys
        assert self.real.window_ms == window_ms

    # timestamps: around the clock, sometimes already expired, sometimes in the future
    def _ts(self, frac: float) -> int:
        assert self.model is not None
        w = self.model.window_ms
        return self.now + int(frac * 3 * w) - 2 * w

    @rule(key=keys, seg=ids, ent=ids, frac=st.floats(0, 1))
    def add_pending(self, key: bytes, seg: int, ent: int, frac: float) -> None:
        assert self.model is not None
        ts = self._ts(frac)
        if self.model.can_add_pending(key, ts):
            self.model.add_pending(key, (seg, ent, ts))
            assert self.real.add_pending(key, seg, ent, ts) is None
        else:
            with pytest.raises(InvalidArgumentError, match="key"):
                self.real.add_pending(key, seg, ent, ts)

    @rule(key=keys)
    def commit(self, key: bytes) -> None:
        assert self.model is not None
        assert self.real.commit(key) is self.model.commit(key)

    @rule(key=keys)
    def drop_pending(self, key: bytes) -> None:
        assert self.model is not None
        assert self.real.drop_pending(key) is self.model.drop_pending(key)

    @rule(seg=ids, last=ids)
    def commit_through(self, seg: int, last: int) -> None:
        assert self.model is not None
        assert self.real.commit_through(seg, last) == self.model.commit_through(seg, last)

    @rule(seg=ids)
    def drop_segment(self, seg: int) -> None:
        assert self.model is not None
        assert self.real.drop_segment(seg) == self.model.drop_segment(seg)

    @rule(key=keys, seg=ids, ent=ids, frac=st.floats(0, 1))
    def add_committed(self, key: bytes, seg: int, ent: int, frac: float) -> None:
        assert self.model is not None
        ts = self._ts(frac)
        expected = self.model.add_committed(key, (seg, ent, ts))
        assert self.real.add_committed(key, seg, ent, ts) is expected

    @rule(
        rows=st.lists(st.tuples(keys, ids, ids, st.floats(0, 1)), max_size=12),
        as_bytearray=st.booleans(),
    )
    def add_committed_many(
        self, rows: list[tuple[bytes, int, int, float]], as_bytearray: bool
    ) -> None:
        assert self.model is not None
        tss = [self._ts(f) for _k, _s, _e, f in rows]
        expected = sum(
            self.model.add_committed(k, (s, e, t))
            for (k, s, e, _f), t in zip(rows, tss, strict=True)
        )
        kbuf: bytes | bytearray = b"".join(r[0] for r in rows)
        if as_bytearray:
            kbuf = bytearray(kbuf)
        got = self.real.add_committed_many(
            kbuf, q_buf([r[1] for r in rows]), q_buf([r[2] for r in rows]), q_buf(tss)
        )
        assert got == expected

    @rule(key=keys, use_now=st.booleans())
    def get(self, key: bytes, use_now: bool) -> None:
        assert self.model is not None
        now = self.now if use_now else None
        status, value = self.model.lookup(key, now)
        got = self.real.get(key, now) if use_now else self.real.get(key)
        if status == 0:
            assert got is None
        else:
            assert got is not None
            assert value is not None
            assert (got.segment_id, got.entry_id, got.timestamp_ms) == value
            assert got.committed is (status == 2)
            assert got == self.real.get(key, now)  # __eq__ on equal entries
            self._resync_get(key, now)
            assert isinstance(repr(got), str)

    def _resync_get(self, key: bytes, now: int | None) -> None:
        # the extra get above counted once more in the real window: mirror it in the model
        assert self.model is not None
        self.model.lookup(key, now)

    @rule(sel=st.lists(keys, max_size=12), use_now=st.booleans())
    def get_many(self, sel: list[bytes], use_now: bool) -> None:
        assert self.model is not None
        now = self.now if use_now else None
        expected = [self.model.lookup(k, now) for k in sel]
        buf = b"".join(sel)
        status, segs, ents = self.real.get_many(buf, now) if use_now else self.real.get_many(buf)
        assert len(status) == len(sel)
        assert list(status) == [s for s, _v in expected]
        assert unpack_q(segs) == [v[0] if v else -1 for _s, v in expected]
        assert unpack_q(ents) == [v[1] if v else -1 for _s, v in expected]

    @rule(advance=st.floats(0, 2))
    def evict(self, advance: float) -> None:
        assert self.model is not None
        self.now += int(advance * self.model.window_ms)
        assert self.real.evict(self.now) == self.model.evict(self.now)

    @rule(advance=st.floats(0, 2))
    def tick(self, advance: float) -> None:
        assert self.model is not None
        self.now += int(advance * self.model.window_ms)

    @rule()
    def clone(self) -> None:
        assert self.model is not None
        c = self.real.clone_committed()
        assert c.committed_entries() == self.model.entries()
        assert c.pending_count == 0
        assert len(c) == len(self.model.committed)
        assert (c.max_keys, c.window_ms) == (self.model.max_keys, self.model.window_ms)
        assert (c.hits, c.misses, c.evictions, c.early_evictions) == (0, 0, 0, 0)

    @invariant()
    def same_state(self) -> None:
        m = self.model
        if m is None:
            return
        r = self.real
        assert r.committed_entries() == m.entries()
        assert r.pending_count == len(m.pending)
        assert r.committed_count == len(m.committed)
        assert len(r) == len(m.pending) + len(m.committed)
        counters = {
            "hits": m.hits,
            "misses": m.misses,
            "evictions": m.evictions,
            "early_evictions": m.early_evictions,
        }
        assert {name: getattr(r, name) for name in counters} == counters
        stats = r.stats()
        assert {name: stats[name] for name in counters} == counters


WindowMachine.TestCase.settings = settings(
    max_examples=250,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestWindowMachine = WindowMachine.TestCase


# --- targeted behaviour -----------------------------------------------------------------------


def k(i: int) -> bytes:
    return i.to_bytes(16, "big")


def test_capacity_eviction_is_commit_order_and_counts_early() -> None:
    w = _core.DedupWindow(2, 100)
    w.add_pending(k(1), 1, 1, 1000)  # pending first, committed last
    assert w.add_committed(k(2), 1, 2, 1001)
    assert w.add_committed(k(3), 1, 3, 1002)
    assert w.commit(k(1))  # commit order: 2, 3, 1 -> 2 evicted (early: 1000 - 1001 < 100)
    assert [e[0] for e in w.committed_entries()] == [k(3), k(1)]
    assert (w.evictions, w.early_evictions) == (1, 1)
    assert w.add_committed(k(4), 1, 4, 1002 + 100)  # evicts 3: 1102 - 1002 = 100 -> not early
    assert (w.evictions, w.early_evictions) == (2, 1)
    assert w.get(k(3)) is None


def test_pending_not_counted_in_capacity_and_never_evicted() -> None:
    w = _core.DedupWindow(1, 10)
    for i in range(50):
        w.add_pending(k(i), 0, i, 0)
    assert w.add_committed(k(100), 0, 100, 0)
    assert w.evict(10**9) == 1
    assert w.pending_count == 50
    assert len(w) == 50
    e = w.get(k(7), 10**9)
    assert e is not None and not e.committed and e.entry_id == 7


def test_evict_stops_at_first_unexpired_in_commit_order() -> None:
    w = _core.DedupWindow(10, 100)
    w.add_committed(k(1), 0, 1, 0)
    w.add_committed(k(2), 0, 2, 500)  # newer in time, older in commit order than 3
    w.add_committed(k(3), 0, 3, 50)
    assert w.evict(199) == 1  # 1 (199 - 0 >= 100) then stops at 2 (199 - 500 < 100)
    assert [e[0] for e in w.committed_entries()] == [k(2), k(3)]
    assert w.get(k(3), 150) is None  # expired for get, though still stored
    assert w.committed_count == 2
    assert w.evict(600) == 2


def test_add_committed_pending_becomes_committed_with_given_ids() -> None:
    w = _core.DedupWindow(4, 100)
    w.add_pending(k(1), 1, 1, 10)
    assert w.add_committed(k(1), 2, 9, 20)
    assert w.pending_count == 0
    assert w.committed_entries() == [(k(1), 2, 9, 20)]
    assert not w.add_committed(k(1), 2, 5, 30)  # an earlier log position: existing entry kept
    assert w.committed_entries() == [(k(1), 2, 9, 20)]
    with pytest.raises(InvalidArgumentError, match="key"):
        w.add_pending(k(1), 0, 0, 0)


def test_buffer_protocol_keys_accepted() -> None:
    w = _core.DedupWindow(4, 100)
    w.add_committed(bytearray(k(1)), 1, 2, 3)
    e = w.get(memoryview(k(1)))
    assert e is not None and (e.segment_id, e.entry_id, e.timestamp_ms) == (1, 2, 3)
    assert w.get_many(memoryview(k(1) + k(2)))[0] == b"\x02\x00"


def test_memory_bytes_covers_preallocated_ring() -> None:
    w = _core.DedupWindow(10_000, 1000)
    assert w.memory_bytes() >= 32 * 10_000
    assert w.memory_bytes() <= 64 * 10_000 + 65_536


def test_u32_and_i64_edges_round_trip() -> None:
    w = _core.DedupWindow(4, 1)
    w.add_committed(k(1), U32_MAX, U32_MAX, I64_MAX)
    w.add_committed(k(2), 0, 0, I64_MIN)
    assert w.committed_entries() == [(k(1), U32_MAX, U32_MAX, I64_MAX), (k(2), 0, 0, I64_MIN)]
    status, segs, ents = w.get_many(k(1) + k(2) + k(3))
    assert status == b"\x02\x02\x00"
    assert unpack_q(segs) == [U32_MAX, 0, -1]
    assert unpack_q(ents) == [U32_MAX, 0, -1]


# --- argument errors --------------------------------------------------------------------------


def assert_arg_error(exc: BaseException, base: type[Exception], name: str) -> None:
    assert isinstance(exc, WoodpeckerError), type(exc)
    assert isinstance(exc, base), type(exc)
    assert name in str(exc), f"{name!r} not named in {exc!r}"


@pytest.mark.parametrize(
    ("args", "base", "name"),
    [
        ((0, 10), ValueError, "max_keys"),
        ((-1, 10), ValueError, "max_keys"),
        ((10, 0), ValueError, "window_ms"),
        ((10, -5), ValueError, "window_ms"),
        (("10", 10), TypeError, "max_keys"),
        ((10, 1.5), TypeError, "window_ms"),
    ],
)
def test_constructor_errors(args: tuple[Any, Any], base: type[Exception], name: str) -> None:
    with pytest.raises(base) as info:
        _core.DedupWindow(*args)
    assert_arg_error(info.value, base, name)


BAD_KEYS: list[tuple[Any, type[Exception]]] = [
    (b"", ValueError),
    (b"x" * 15, ValueError),
    (b"x" * 17, ValueError),
    ("0123456789abcdef", TypeError),
    (12345, TypeError),
    (None, TypeError),
]


@pytest.mark.parametrize(("key", "base"), BAD_KEYS)
@pytest.mark.parametrize(
    "call",
    [
        lambda w, key: w.get(key),
        lambda w, key: w.get(key, 5),
        lambda w, key: w.add_pending(key, 1, 1, 1),
        lambda w, key: w.commit(key),
        lambda w, key: w.drop_pending(key),
        lambda w, key: w.add_committed(key, 1, 1, 1),
    ],
    ids=["get", "get_now", "add_pending", "commit", "drop_pending", "add_committed"],
)
def test_bad_key(call: Any, key: Any, base: type[Exception]) -> None:
    w = _core.DedupWindow(4, 10)
    with pytest.raises(base) as info:
        call(w, key)
    assert_arg_error(info.value, base, "key")
    assert len(w) == 0


@pytest.mark.parametrize("method", ["add_pending", "add_committed"])
@pytest.mark.parametrize(
    ("pos", "value", "base", "name"),
    [
        (0, -1, ValueError, "segment_id"),
        (0, 2**32, ValueError, "segment_id"),
        (0, 2**70, ValueError, "segment_id"),
        (1, -1, ValueError, "entry_id"),
        (1, 2**32, ValueError, "entry_id"),
        (2, 2**63, ValueError, "timestamp_ms"),
        (0, "1", TypeError, "segment_id"),
        (1, 1.0, TypeError, "entry_id"),
        (2, None, TypeError, "timestamp_ms"),
    ],
)
def test_bad_ids(method: str, pos: int, value: Any, base: type[Exception], name: str) -> None:
    w = _core.DedupWindow(4, 10)
    args: list[Any] = [1, 2, 3]
    args[pos] = value
    with pytest.raises(base) as info:
        getattr(w, method)(k(1), *args)
    assert_arg_error(info.value, base, name)
    assert len(w) == 0


def test_batch_argument_errors() -> None:
    w = _core.DedupWindow(4, 10)
    for bad in (b"x" * 15, b"x" * 33):
        with pytest.raises(ValueError) as info:
            w.get_many(bad)
        assert_arg_error(info.value, ValueError, "keys")
    with pytest.raises(TypeError) as tinfo:
        w.get_many([k(1)])
    assert_arg_error(tinfo.value, TypeError, "keys")

    two = k(1) + k(2)
    good = q_buf([1, 2])
    with pytest.raises(ValueError) as info:
        w.add_committed_many(two[:-1], good, good, good)
    assert_arg_error(info.value, ValueError, "keys")
    for pos, name in enumerate(["segment_ids", "entry_ids", "timestamps_ms"]):
        bufs = [good, good, good]
        bufs[pos] = q_buf([1])  # one value for two keys
        with pytest.raises(ValueError) as info:
            w.add_committed_many(two, *bufs)
        assert_arg_error(info.value, ValueError, name)
        bufs[pos] = good[:-3]  # not a multiple of 8 bytes
        with pytest.raises(ValueError) as info:
            w.add_committed_many(two, *bufs)
        assert_arg_error(info.value, ValueError, name)
    for pos, name in enumerate(["segment_ids", "entry_ids"]):
        for value in (-1, 2**32):
            bufs = [good, good, good]
            bufs[pos] = q_buf([1, value])
            with pytest.raises(ValueError) as info:
                w.add_committed_many(two, *bufs)
            assert_arg_error(info.value, ValueError, name)
    with pytest.raises(TypeError) as tinfo:
        w.add_committed_many(two, [1, 2], good, good)
    assert_arg_error(tinfo.value, TypeError, "segment_ids")


# --- large batches (the multi-threaded paths) against the model ---------------------------------


def _load_both(
    rng: random.Random, max_keys: int, window_ms: int, rows: list[tuple[bytes, int, int, int]]
) -> tuple[Any, RefWindow, int]:
    w = _core.DedupWindow(max_keys, window_ms)
    m = RefWindow(max_keys, window_ms)
    expected = sum(m.add_committed(k_, (s, e, t)) for k_, s, e, t in rows)
    got = w.add_committed_many(
        b"".join(r[0] for r in rows),
        q_buf([r[1] for r in rows]),
        q_buf([r[2] for r in rows]),
        q_buf([r[3] for r in rows]),
    )
    return w, m, got - expected


def test_add_committed_many_large_batch_matches_model() -> None:
    rng = random.Random(11)
    pool = [rng.randbytes(16) for _ in range(70_000)]
    rows = [
        (rng.choice(pool), rng.randrange(5), rng.randrange(U32_MAX), rng.randrange(10**6))
        for _ in range(100_000)
    ]
    w, m, diff = _load_both(rng, 30_000, 50_000, rows)
    assert diff == 0
    assert w.committed_entries() == m.entries()
    assert (w.evictions, w.early_evictions) == (m.evictions, m.early_evictions)
    assert m.early_evictions > 0 and m.evictions > m.early_evictions


def test_get_many_large_batch_matches_model() -> None:
    rng = random.Random(12)
    keys = [rng.randbytes(16) for _ in range(60_000)]
    rows = [(keys[i], i % 7, i, rng.randrange(2_000)) for i in range(50_000)]
    w, m, diff = _load_both(rng, 40_000, 1_000, rows)  # the first 10,000 are capacity-evicted
    assert diff == 0
    for i in range(50_000, 55_000):  # pending; 55,000.. never seen
        w.add_pending(keys[i], 9, i, 0)
        m.add_pending(keys[i], (9, i, 0))
    sel = [rng.choice(keys) for _ in range(200_000)]
    for now in (None, 1_500):  # with now: about half of the committed keys are expired
        expected = [m.lookup(key, now) for key in sel]
        status, segs, ents = w.get_many(b"".join(sel), now)
        assert list(status) == [s for s, _v in expected]
        assert unpack_q(segs) == [v[0] if v else -1 for _s, v in expected]
        assert unpack_q(ents) == [v[1] if v else -1 for _s, v in expected]
        assert {s for s, _v in expected} == {0, 1, 2}
    assert (w.hits, w.misses) == (m.hits, m.misses)


def test_clone_committed_of_wrapped_ring_is_independent() -> None:
    rng = random.Random(13)
    rows = [(rng.randbytes(16), 1, i, i) for i in range(25_000)]
    w, m, _ = _load_both(rng, 10_000, 10**9, rows)  # the ring has wrapped
    w.add_pending(rng.randbytes(16), 0, 0, 0)
    c = w.clone_committed()
    assert c.committed_entries() == m.entries()
    status = c.get_many(b"".join(e[0] for e in m.entries()))[0]
    assert status == b"\x02" * 10_000  # the copied index finds every key
    assert c.add_committed(rows[0][0], 5, 5, 5)  # long evicted: inserted, evicts the oldest
    assert c.committed_entries()[-1] == (rows[0][0], 5, 5, 5)
    assert w.committed_entries() == m.entries()  # the original is untouched
    assert w.get(rows[0][0]) is None
    assert c.pending_count == 0 and w.pending_count == 1


def test_extreme_timestamps_do_not_overflow() -> None:
    w = _core.DedupWindow(1, 10)
    w.add_committed(k(1), 0, 0, I64_MIN)
    w.add_committed(k(2), 0, 0, I64_MAX)  # I64_MAX - I64_MIN >= 10: not early (no wrap to -1)
    assert (w.evictions, w.early_evictions) == (1, 0)
    w.add_committed(k(3), 0, 0, I64_MIN)  # negative age: early
    assert (w.evictions, w.early_evictions) == (2, 1)
    w = _core.DedupWindow(4, I64_MAX)
    w.add_committed(k(1), 0, 0, I64_MIN)
    assert w.get(k(1), I64_MIN) is not None
    assert w.get(k(1), I64_MAX) is None  # age 2**64 - 1 >= window
    status, _segs, _ents = w.get_many(k(1), I64_MAX)
    assert status == b"\x00"
    assert w.evict(I64_MAX - 1) == 1


def test_huge_window_is_a_memory_error_not_a_crash() -> None:
    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
        "from woodpecker_idem import _core\n"
        "try:\n"
        "    _core.DedupWindow(2**32 - 1, 1)\n"
        "except MemoryError:\n"
        "    print('MemoryError')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "MemoryError"


def test_commit_through_equals_commits_in_entry_order() -> None:
    keys = [bytes([i]) * 16 for i in range(8)]
    one, pos = _core.DedupWindow(4, 1_000), _core.DedupWindow(4, 1_000)
    for w in (one, pos):
        for i, k in enumerate(keys[:5]):
            w.add_pending(k, 1, i, 100 + i)
        w.add_pending(keys[5], 2, 0, 200)  # another segment: untouched
    for k in keys[:3]:
        one.commit(k)
    assert pos.commit_through(1, 2) == 3
    assert pos.committed_entries() == one.committed_entries()
    assert pos.pending_count == one.pending_count == 3
    # capacity 4: committing the rest evicts the oldest, exactly as commit() does
    for k in keys[3:5]:
        one.commit(k)
    assert pos.commit_through(1, 99) == 2 and pos.commit_through(1, 99) == 0
    assert pos.committed_entries() == one.committed_entries()
    assert pos.early_evictions == one.early_evictions == 1
    assert pos.drop_segment(2) == 1 and pos.get(keys[5]) is None and pos.pending_count == 0
    with pytest.raises(InvalidArgumentError, match="last_entry_id"):
        pos.commit_through(1, -1)
    with pytest.raises(InvalidTypeError, match="segment_id"):
        pos.drop_segment("1")


def test_index_grows_with_the_keys_so_copies_cost_what_the_window_holds() -> None:
    # The ring's address space is reserved for max_keys (32 B/key); the index is not pre-sized,
    # so a window far from full stays small, and its snapshot copy (taken under the writer's
    # lock) holds only its keys (a copy of an index pre-sized for 2M keys took ~12 ms).
    max_keys = 1_000_000
    w = _core.DedupWindow(max_keys, 10_000)
    ring = 32 * max_keys
    assert ring <= w.memory_bytes() < ring + 65_536
    for i in range(1000):
        w.add_committed(k(i), 1, i, 5)
    copy = w.clone_committed()
    assert copy.memory_bytes() < 32 * 1000 + 65_536  # the keys held, not max_keys
    assert copy.committed_entries() == w.committed_entries()
    assert copy.get(k(999)) is not None and copy.get(k(1000)) is None
    for i in range(1000, 5000):  # the copy grows as a window does
        copy.add_committed(k(i), 2, i, 6)
    assert copy.committed_count == 5000 and copy.get(k(4999)) is not None


def _load(w: _core.DedupWindow, first: int, n: int, seg: int = 1) -> int:
    return w.add_committed_many(
        b"".join(k(i) for i in range(first, first + n)),
        q_buf([seg] * n),
        q_buf(list(range(first, first + n))),
        q_buf([7] * n),
    )


def test_a_replay_in_small_calls_after_a_bulk_load_grows_the_index_once() -> None:
    # Recovery loads a snapshot in one call, then its gap 2,000 entries a call. The index was
    # grown to exactly what each call needed, so every call past the snapshot rehashed all of it
    # (issue 32: 86 ms a call at 1M keys); growth at least doubles now.
    w = _core.DedupWindow(400_000, 3_600_000)
    assert _load(w, 0, 100_000) == 100_000
    sizes = [w.memory_bytes()]
    for call in range(50):
        assert _load(w, 100_000 + call * 2_000, 2_000) == 2_000
        if w.memory_bytes() != sizes[-1]:
            sizes.append(w.memory_bytes())
    assert len(sizes) == 2, sizes
    assert w.committed_count == 200_000
    assert all(w.get(k(i)) is not None for i in range(0, 200_000, 997))
    # and a window filled up stays what a full one costs: the doubling stops at max_keys' need
    assert _load(w, 200_000, 200_000) == 200_000
    assert w.memory_bytes() / 400_000 <= 37.5


def test_reserve_committed_sizes_the_index_once_for_a_load_in_many_calls() -> None:
    w = _core.DedupWindow(300_000, 3_600_000)
    empty = w.memory_bytes()
    w.reserve_committed(110_000)
    reserved = w.memory_bytes()
    assert reserved > empty
    assert _load(w, 0, 100_000) == 100_000
    for call in range(5):
        assert _load(w, 100_000 + call * 2_000, 2_000) == 2_000
    assert w.memory_bytes() == reserved  # no growth within the reservation
    w.reserve_committed(10**12)  # capped at max_keys
    assert w.memory_bytes() / 300_000 <= 37.5
    assert w.committed_count == 110_000


def _raw(seg: int, first: int, keys: list[bytes]) -> list[bytes]:
    """LogEntry bytes of entries first.. of `seg`, keyed where the key is not b"" (at 1,000 + i)."""
    return [
        _core.encode_entry(seg, first + i, 1_000 + i, b"p%d" % i, None, key or None)[8:]
        for i, key in enumerate(keys)
    ]


def _keys(seg: int, first: int, keys: list[bytes]) -> _core.EntryKeys:
    got, bad = _core.decode_entry_keys(_raw(seg, first, keys), seg, first)
    assert bad is None
    return got


def test_add_committed_keys_equals_add_committed_many_of_the_keyed_ones() -> None:
    rng = random.Random(32)
    pool = [rng.randbytes(16) for _ in range(3_000)]
    # keyed and plain entries, keys repeated at later positions (the later one is kept)
    keys = [rng.choice(pool) if rng.random() < 0.8 else b"" for _ in range(5_000)]
    native = _core.DedupWindow(10_000, 3_600_000)
    columns = _core.DedupWindow(10_000, 3_600_000)
    runs = [_keys(4, f, keys[f : f + 1_000]) for f in (0, 1_000)] + [_keys(5, 0, keys[2_000:])]
    assert [len(r) for r in runs] == [1_000, 1_000, 3_000]  # entries read, keyed or not
    assert sum(r.keyed for r in runs) == sum(1 for key in keys if key)
    assert [r.last_timestamp_ms for r in runs] == [1_999, 1_999, 3_999]
    got = sum(native.add_committed_keys(r) for r in runs)
    rows = [(4, i, key) for i, key in enumerate(keys[:2_000]) if key]
    rows += [(5, i, key) for i, key in enumerate(keys[2_000:]) if key]
    want = columns.add_committed_many(
        b"".join(r[2] for r in rows),
        q_buf([r[0] for r in rows]),
        q_buf([r[1] for r in rows]),
        q_buf([1_000 + (r[1] if r[0] == 5 else r[1] % 1_000) for r in rows]),
    )
    assert got == want > 0
    assert native.committed_entries() == columns.committed_entries()
    assert native.committed_count < len(rows)  # repeats replaced their older occurrence


def test_decode_entry_keys_stops_where_decode_entries_does() -> None:
    keys = [k(i) if i % 3 else b"" for i in range(10)]
    raw = _raw(7, 20, keys)
    for bad_at, damage in ((4, b"\xff\xff"), (6, None)):
        broken = list(raw)
        # unparseable bytes, or a well-formed entry of another position
        broken[bad_at] = damage if damage is not None else _raw(7, 99, [k(99)])[0]
        got, bad = _core.decode_entry_keys(broken, 7, 20)
        entries, want = _core.decode_entries(broken, 7, 20)
        assert bad == want and bad is not None and bad[0] == bad_at
        assert len(got) == len(entries) == bad_at
        assert got.keyed == sum(1 for e in entries if e.idempotency_key)
    with pytest.raises(InvalidArgumentError, match=r"position -1:0 is out of range"):
        _core.decode_entry_keys(raw, -1, 0)
    with pytest.raises(InvalidTypeError, match=r"raw\[1\] must be bytes, not str"):
        _core.decode_entry_keys([raw[0], "x"], 7, 20)  # type: ignore[list-item]


def test_add_committed_keys_refuses_what_is_not_entry_keys() -> None:
    w = _core.DedupWindow(100, 1_000)
    with pytest.raises(InvalidTypeError, match=r"keys must be an EntryKeys, not list"):
        w.add_committed_keys([k(1)])  # type: ignore[arg-type]
    assert w.committed_count == 0
    assert w.add_committed_keys(_keys(1, 0, [k(1), k(2)])) == 2
