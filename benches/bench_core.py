"""Benchmarks of the Rust core (`woodpecker_idem._core`) with their targets asserted.

Run (see benches/README.md):

    mkdir -p bench-results
    .venv/bin/python -m pytest benches/bench_core.py --benchmark-json=bench-results/core.json \
        -p no:cacheprovider

The machine is shared and noisy, so every comparison runs the two sides interleaved (A, B, A, B,
...) for several rounds and compares the medians as a ratio; the absolute throughputs without a
counterpart (`get_many`, `add_committed_many`) are judged on the fastest run. Every figure is in
``benchmark.extra_info`` (in the JSON) and printed (``-s`` shows it).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from woodpecker_idem import _core

HERE = Path(__file__).resolve().parent

# targets (docs/core-api.md, docs/architecture.md "The window")
BATCH_LOOKUPS_PER_S = 10_000_000
BYTES_PER_KEY = 40.0  # a bulk load (window rebuild): memory_bytes and RSS
# RSS of a window filled the way a writer fills it (reserve, then commit as acks arrive), no
# malloc tuning (issue 19: 53 B/key at 1M and 45 at 100k with the hashbrown index)
WRITER_BYTES_PER_KEY = {100_000: 44.0, 1_000_000: 40.0}
# the whole writing process (a real idempotent writer bulk-loading new keys while snapshots run):
# peak RSS growth over the window's own bytes (issue 19 item 7; `mem_probe.py process` measured
# 3.3-3.5x at 1M keys while a snapshot copied the window and held its whole encoding)
PROCESS_OVER_WINDOW = 1.3
HASH_SPEEDUP_100B = 2.0
HASH_SPEEDUP_1K = 2.5  # several payloads per vector pass (md5x); one by one it is ~1.1x
HASH_RATIO_8K = 0.9
SNAPSHOT_BYTES_PER_ENTRY = 19.0
SNAPSHOT_SPEEDUP = 20.0
# loose limits for the single-call paths (no target; they catch an order-of-magnitude regression)
SINGLE_GET_NS = 2_000
SINGLE_ADD_NS = 3_000
# a bulk load sizes the growing index once (`reserve_committed`): ~8M keys/s; one that rehashes at
# every doubling measured 3.4M
BATCH_INSERTS_PER_S = 4_000_000
# A batch's lookups and reservations in a window holding 1M keys, per key, against one holding
# 10k (whose index is cached): the index cells of the keys ahead are prefetched, so the big
# window's cache misses overlap (1.49x before, ~1.09x with it)
BIG_WINDOW_RATIO = 1.25
# A quorum ack's commit of 10,000 keys, per key, with 500k keys pending against 10k: the pending
# and committed index cells of the keys ahead are prefetched (2.07x before, 1.32-1.36x with it)
MANY_PENDING_RATIO = 1.6


def int64s(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}q", *values)


def interleaved(
    fns: dict[str, Callable[[], Any]], rounds: int, reps: dict[str, int] | None = None
) -> dict[str, float]:
    """Median seconds per call of each function, run alternately for `rounds` rounds.

    `reps` runs a (fast) function several times per round, each run one sample, so a short call is
    not judged on a handful of samples taken while a neighbour hogs the shared cores.
    """

    def timed(fn: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:
            gc.collect()
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0

        return run

    return interleaved_samples({name: timed(fn) for name, fn in fns.items()}, rounds, reps)


def interleaved_samples(
    fns: dict[str, Callable[[], float]], rounds: int, reps: dict[str, int] | None = None
) -> dict[str, float]:
    """As `interleaved`, for functions that time their own measured part (set-up and clean-up
    left out) and return it: the median of each one's returns."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _rep in range((reps or {}).get(name, 1)):
                samples[name].append(fn())
    return {name: statistics.median(v) for name, v in samples.items()}


def best_and_median(fn: Callable[[], Any], rounds: int) -> tuple[float, float]:
    """(fastest, median) seconds of `rounds` calls: absolute targets are judged on the fastest,
    the run least disturbed by other work on the shared machine; the median is reported too."""
    ts = []
    for _ in range(rounds):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), statistics.median(ts)


def record(benchmark: Any, **figures: Any) -> None:
    benchmark.extra_info.update(figures)
    print(f"\n[{benchmark.name}] " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def per_key_ratio(
    benchmark: Any,
    passes: dict[int, Callable[[], float]],
    rounds: int,
    names: dict[int, str],
    ratio_name: str,
) -> float:
    """Interleaved medians of two passes that each return seconds per key (keyed by their size,
    small and big), one more run of the big one for pytest-benchmark's table, both medians
    recorded in ns per key as `ns_per_key_<name>` and their ratio as `ratio_name`. Returns big
    over small."""
    small, big = sorted(passes)
    med = interleaved_samples(passes, rounds)
    benchmark.pedantic(passes[big], rounds=1, iterations=1)
    ratio = med[big] / med[small]
    record(
        benchmark,
        **{f"ns_per_key_{names[n]}": round(med[n] * 1e9, 1) for n in (small, big)},
        **{ratio_name: round(ratio, 3)},
    )
    return ratio


def random_keys(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(16 * n)


def loaded_window(keys: bytes, max_keys: int | None = None) -> Any:
    n = len(keys) // 16
    w = _core.DedupWindow(max_keys or n, 3_600_000)
    ids = int64s(list(range(n)))
    assert w.add_committed_many(keys, int64s([1] * n), ids, int64s([1_000] * n)) == n
    return w


class NaiveWindow:
    """What a plain-Python window costs: a dict plus a deque in commit order."""

    def __init__(self, max_keys: int, window_ms: int) -> None:
        self.max_keys = max_keys
        self.window_ms = window_ms
        self.index: dict[bytes, tuple[int, int, int]] = {}
        self.order: deque[bytes] = deque()
        self.hits = self.misses = 0

    def get(self, key: bytes, now_ms: int | None = None) -> tuple[int, int, int] | None:
        value = self.index.get(key)
        if value is None or (now_ms is not None and now_ms - value[2] >= self.window_ms):
            self.misses += 1
            return None
        self.hits += 1
        return value

    def add_committed(self, key: bytes, segment_id: int, entry_id: int, ts: int) -> bool:
        if key in self.index:
            return False
        if len(self.order) >= self.max_keys:
            del self.index[self.order.popleft()]
        self.index[key] = (segment_id, entry_id, ts)
        self.order.append(key)
        return True


# --- window: single calls and batches ---------------------------------------------------------

N_SINGLE = 20_000


def test_window_get_single(benchmark: Any) -> None:
    keys = random_keys(100_000, 1)
    w = loaded_window(keys)
    naive = NaiveWindow(100_000, 3_600_000)
    for i, key in enumerate(w.committed_entries()):
        naive.add_committed(key[0], 1, i, 1_000)
    probe = [keys[16 * i : 16 * i + 16] for i in range(0, 100_000, 5)]  # N_SINGLE present keys

    def core_gets() -> None:
        get = w.get
        for key in probe:
            get(key, 2_000)

    def naive_gets() -> None:
        get = naive.get
        for key in probe:
            get(key, 2_000)

    med = interleaved({"core": core_gets, "naive": naive_gets}, rounds=7)
    benchmark.pedantic(core_gets, rounds=5, iterations=1, warmup_rounds=1)
    core_ns = med["core"] / N_SINGLE * 1e9
    record(
        benchmark,
        get_ns_per_op=round(core_ns, 1),
        naive_python_get_ns_per_op=round(med["naive"] / N_SINGLE * 1e9, 1),
        ratio_naive_over_core=round(med["naive"] / med["core"], 2),
    )
    assert core_ns <= SINGLE_GET_NS


def test_window_add_committed_single(benchmark: Any) -> None:
    keys = random_keys(N_SINGLE, 2)
    probe = [keys[16 * i : 16 * i + 16] for i in range(N_SINGLE)]

    def core_adds() -> None:
        w = _core.DedupWindow(N_SINGLE, 3_600_000)
        add = w.add_committed
        for i, key in enumerate(probe):
            add(key, 1, i, 1_000 + i)

    def naive_adds() -> None:
        w = NaiveWindow(N_SINGLE, 3_600_000)
        add = w.add_committed
        for i, key in enumerate(probe):
            add(key, 1, i, 1_000 + i)

    med = interleaved({"core": core_adds, "naive": naive_adds}, rounds=7)
    benchmark.pedantic(core_adds, rounds=5, iterations=1, warmup_rounds=1)
    core_ns = med["core"] / N_SINGLE * 1e9
    record(
        benchmark,
        add_committed_ns_per_op=round(core_ns, 1),
        naive_python_add_ns_per_op=round(med["naive"] / N_SINGLE * 1e9, 1),
        ratio_naive_over_core=round(med["naive"] / med["core"], 2),
    )
    assert core_ns <= SINGLE_ADD_NS


@pytest.mark.parametrize("window_keys", [100_000, 1_000_000])
def test_window_get_many(benchmark: Any, window_keys: int) -> None:
    n_lookups = 1_000_000
    keys = random_keys(window_keys, 3)
    w = loaded_window(keys)
    rng = random.Random(4)
    # half present (random order), half absent
    present = [rng.randrange(window_keys) for _ in range(n_lookups // 2)]
    absent = rng.randbytes(16 * (n_lookups // 2))
    parts = [keys[16 * i : 16 * i + 16] for i in present]
    parts += [absent[16 * i : 16 * i + 16] for i in range(n_lookups // 2)]
    rng.shuffle(parts)
    batch = b"".join(parts)
    del parts
    status = w.get_many(batch, 2_000)[0]
    assert status.count(2) == n_lookups // 2 and status.count(0) == n_lookups // 2

    best, med = best_and_median(lambda: w.get_many(batch, 2_000), rounds=9)
    benchmark.pedantic(w.get_many, args=(batch, 2_000), rounds=5, iterations=1)
    per_s = n_lookups / best
    record(
        benchmark,
        window_keys=window_keys,
        lookups=n_lookups,
        get_many_keys_per_s_best=round(per_s),
        get_many_keys_per_s_median=round(n_lookups / med),
        get_many_ns_per_key_best=round(best / n_lookups * 1e9, 2),
    )
    assert per_s >= BATCH_LOOKUPS_PER_S


def test_window_add_committed_many(benchmark: Any) -> None:
    n = 1_000_000
    keys = random_keys(n, 5)
    segs, ents, tss = int64s([1] * n), int64s(list(range(n))), int64s(list(range(n)))

    def load() -> None:
        w = _core.DedupWindow(n, 3_600_000)
        assert w.add_committed_many(keys, segs, ents, tss) == n

    best, med = best_and_median(load, rounds=5)
    benchmark.pedantic(load, rounds=3, iterations=1)
    per_s = n / best
    record(
        benchmark,
        keys=n,
        add_committed_many_keys_per_s_best=round(per_s),
        add_committed_many_keys_per_s_median=round(n / med),
        add_committed_many_ns_per_key_best=round(best / n * 1e9, 2),
    )
    assert per_s >= BATCH_INSERTS_PER_S


def test_window_batch_costs_about_the_same_per_key_in_a_big_window(benchmark: Any) -> None:
    """`get_many` then `reserve_many` of new keys in 10,000-key batches (the batch lane's calls),
    in a window holding 1M keys against one holding 10k, interleaved; per key, medians."""
    new_keys, batch = 100_000, 10_000
    new = random_keys(new_keys, 9)
    stamps = int64s([2_000] * batch)
    windows = {
        held: loaded_window(random_keys(held, 5), held + new_keys) for held in (10_000, 1_000_000)
    }

    def one_pass(w: Any) -> float:
        gc.collect()
        t0 = time.perf_counter()
        for start in range(0, new_keys, batch):
            keys = new[16 * start : 16 * (start + batch)]
            w.get_many(keys, 2_000)
            w.reserve_many(keys, stamps, 7, start)
        spent = time.perf_counter() - t0
        assert w.drop_segment(7) == new_keys  # back as it was, for the next round
        return spent / new_keys

    passes = {held: functools.partial(one_pass, w) for held, w in windows.items()}
    names = {10_000: "10k_held", 1_000_000: "1m_held"}
    ratio = per_key_ratio(benchmark, passes, 15, names, "big_over_small")
    assert ratio <= BIG_WINDOW_RATIO


def test_window_commit_costs_about_the_same_per_key_with_many_pending(benchmark: Any) -> None:
    """`commit_through` in 10,000-key steps (a quorum ack's call) of 500k pending keys against
    10k, each on a fresh window filled by `reserve_many`, interleaved; per key, medians."""
    step = 10_000
    stamps = int64s([2_000] * step)

    def one_pass(pending: int) -> float:
        keys = random_keys(pending, pending)
        w = _core.DedupWindow(1_000_000, 3_600_000)
        for start in range(0, pending, step):
            w.reserve_many(keys[16 * start : 16 * (start + step)], stamps, 7, start)
        gc.collect()
        t0 = time.perf_counter()
        for start in range(0, pending, step):
            w.commit_through(7, start + step - 1)
        spent = time.perf_counter() - t0
        assert w.committed_count == pending
        return spent / pending

    passes = {n: functools.partial(one_pass, n) for n in (10_000, 500_000)}
    names = {10_000: "10k_pending", 500_000: "500k_pending"}
    ratio = per_key_ratio(benchmark, passes, 9, names, "many_over_few")
    assert ratio <= MANY_PENDING_RATIO


# --- memory per committed key -----------------------------------------------------------------


def probe_memory(impl: str, n: int) -> dict[str, Any]:
    env = dict(os.environ)
    if impl in ("core", "python"):  # large input buffers: mmapped, so their release shows
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    out = subprocess.run(
        [sys.executable, str(HERE / "mem_probe.py"), impl, str(n)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("n", [100_000, 1_000_000])
def test_memory_per_key(benchmark: Any, n: int) -> None:
    results: dict[str, dict[str, Any]] = {}

    def run() -> None:
        results["writer"] = probe_memory("writer", n)

    benchmark.pedantic(run, rounds=1, iterations=1)
    writer = results["writer"]
    core = probe_memory("core", n)
    naive = probe_memory("python", n)
    record(
        benchmark,
        keys=n,
        writer_rss_bytes_per_key=round(writer["rss_per_key"], 2),
        writer_memory_bytes_per_key=round(writer["memory_bytes_per_key"], 2),
        core_rss_bytes_per_key=round(core["rss_per_key"], 2),
        core_memory_bytes_per_key=round(core["memory_bytes_per_key"], 2),
        naive_python_rss_bytes_per_key=round(naive["rss_per_key"], 2),
        naive_over_core=round(naive["rss_per_key"] / max(core["rss_per_key"], 1e-9), 1),
    )
    assert writer["rss_per_key"] <= WRITER_BYTES_PER_KEY[n]
    assert core["memory_bytes_per_key"] <= BYTES_PER_KEY
    assert core["rss_per_key"] <= BYTES_PER_KEY


@pytest.mark.parametrize("n", [100_000, 1_000_000])
def test_memory_of_the_writing_process(benchmark: Any, n: int) -> None:
    """Peak growth of a process whose idempotent writer bulk-loads n new keys (write_keyed, with
    snapshots during and after the load) against its window's `memory_bytes`. At 100k keys the
    fixed costs (batch buffers, a snapshot chunk) weigh more than the window: reported only."""
    results: dict[str, dict[str, Any]] = {}

    def run() -> None:
        results["process"] = probe_memory("process", n)

    benchmark.pedantic(run, rounds=1, iterations=1)
    out = results["process"]
    record(
        benchmark,
        keys=n,
        peak_growth_bytes=out["rss_delta"],
        window_bytes=out["memory_bytes"],
        peak_over_window=round(out["peak_over_window"], 3),
        snapshots=out["snapshots"],
        snapshots_during_load=out["snapshots_during_load"],
    )
    assert out["snapshots_during_load"] >= 1 and out["snapshots"] > out["snapshots_during_load"]
    if n >= 1_000_000:
        assert out["peak_over_window"] <= PROCESS_OVER_WINDOW, out


# --- key hashing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "count", "target"),
    [
        (100, 100_000, HASH_SPEEDUP_100B),
        (1024, 1_000, HASH_SPEEDUP_1K),  # under the thread-split limits: one core, like the pipe
        (8192, 4_000, HASH_RATIO_8K),
    ],
    ids=["100B", "1KiB", "8KiB"],
)
def test_content_keys_vs_hashlib(benchmark: Any, size: int, count: int, target: float) -> None:
    rng = random.Random(size)
    payloads = [rng.randbytes(size) for _ in range(count)]
    md5 = hashlib.md5

    def ours() -> bytes:
        return _core.content_keys(payloads)

    def theirs() -> bytes:
        return b"".join([md5(p).digest() for p in payloads])

    assert ours() == theirs()
    med = interleaved({"content_keys": ours, "hashlib": theirs}, rounds=9)
    benchmark.pedantic(ours, rounds=5, iterations=1)
    ratio = med["hashlib"] / med["content_keys"]
    mb = size * count / 1e6
    record(
        benchmark,
        payload_bytes=size,
        payloads=count,
        content_keys_ms=round(med["content_keys"] * 1e3, 2),
        hashlib_loop_ms=round(med["hashlib"] * 1e3, 2),
        content_keys_mb_per_s=round(mb / med["content_keys"], 1),
        hashlib_mb_per_s=round(mb / med["hashlib"], 1),
        speedup=round(ratio, 2),
        target=target,
    )
    assert ratio >= target


# --- snapshot codec vs a naive protobuf-Python format -----------------------------------------


def naive_snapshot_class() -> Any:
    """NaiveSnapshot built with the protobuf dynamic API (no protoc step)."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name="wp_bench_naive_snapshot.proto", package="wp_bench", syntax="proto3"
    )
    f = descriptor_pb2.FieldDescriptorProto
    entry = fdp.message_type.add(name="NaiveEntry")
    for name, num, typ in [
        ("key_hex", 1, f.TYPE_STRING),
        ("segment_id", 2, f.TYPE_UINT64),
        ("entry_id", 3, f.TYPE_UINT64),
        ("timestamp_ms", 4, f.TYPE_INT64),
    ]:
        entry.field.add(name=name, number=num, type=typ, label=f.LABEL_OPTIONAL)
    mark = fdp.message_type.add(name="NaiveWatermark")
    mark.field.add(name="segment_id", number=1, type=f.TYPE_UINT64, label=f.LABEL_OPTIONAL)
    mark.field.add(name="last_entry_id", number=2, type=f.TYPE_UINT64, label=f.LABEL_OPTIONAL)
    snap = fdp.message_type.add(name="NaiveSnapshot")
    snap.field.add(
        name="entries",
        number=1,
        type=f.TYPE_MESSAGE,
        type_name=".wp_bench.NaiveEntry",
        label=f.LABEL_REPEATED,
    )
    for name, num, typ in [
        ("log_id", 2, f.TYPE_UINT64),
        ("epoch", 3, f.TYPE_UINT64),
        ("timestamp_ms", 4, f.TYPE_INT64),
        ("window_max_keys", 5, f.TYPE_UINT64),
        ("window_ms", 6, f.TYPE_UINT64),
    ]:
        snap.field.add(name=name, number=num, type=typ, label=f.LABEL_OPTIONAL)
    snap.field.add(
        name="watermarks",
        number=7,
        type=f.TYPE_MESSAGE,
        type_name=".wp_bench.NaiveWatermark",
        label=f.LABEL_REPEATED,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("wp_bench.NaiveSnapshot"))


def naive_encode(cls: Any, d: Any) -> bytes:
    w = d.window
    msg = cls(
        log_id=d.log_id,
        epoch=d.epoch,
        timestamp_ms=d.timestamp_ms,
        window_max_keys=w.max_keys,
        window_ms=w.window_ms,
    )
    for seg, last in d.watermarks.items():
        msg.watermarks.add(segment_id=seg, last_entry_id=last)
    add = msg.entries.add
    for key, seg, ent, ts in w.committed_entries():
        add(key_hex=key.hex(), segment_id=seg, entry_id=ent, timestamp_ms=ts)
    return msg.SerializeToString()


def naive_decode(cls: Any, data: bytes) -> dict[bytes, tuple[int, int, int]]:
    msg = cls.FromString(data)
    fromhex = bytes.fromhex
    return {fromhex(e.key_hex): (e.segment_id, e.entry_id, e.timestamp_ms) for e in msg.entries}


def our_encode(d: Any) -> bytes:
    return _core.encode_snapshot(d.window, d.log_id, d.epoch, d.timestamp_ms, d.watermarks)


def test_snapshot_encode(benchmark: Any, snapshot_data: Any) -> None:
    cls = naive_snapshot_class()
    d = snapshot_data
    data = our_encode(d)
    naive = naive_encode(cls, d)
    assert _core.decode_snapshot(data).entries() == d.window.committed_entries()
    med = interleaved(
        {"ours": lambda: our_encode(d), "naive": lambda: naive_encode(cls, d)},
        rounds=7,
        reps={"ours": 5},
    )
    benchmark.pedantic(our_encode, args=(d,), rounds=10, iterations=1)
    speedup = med["naive"] / med["ours"]
    record(
        benchmark,
        entries=d.n,
        snapshot_bytes=len(data),
        snapshot_bytes_per_entry=round(len(data) / d.n, 3),
        naive_bytes_per_entry=round(len(naive) / d.n, 3),
        encode_ms=round(med["ours"] * 1e3, 3),
        naive_encode_ms=round(med["naive"] * 1e3, 3),
        encode_speedup=round(speedup, 1),
    )
    assert len(data) / d.n <= SNAPSHOT_BYTES_PER_ENTRY
    assert speedup >= SNAPSHOT_SPEEDUP


CAPTURE_KEYS = 10_000
CAPTURE_RATIO = 2.0  # the copy of a 2M-key window holding 10k keys, against one of 100k capacity


def test_snapshot_capture_costs_the_keys_held(benchmark: Any) -> None:
    """`clone_committed` is the copy a snapshot takes under the writer's lock: it must cost what
    the window holds, not its capacity (the index used to be sized for `max_keys`, and a capture
    of 10k keys in a 2M-key window took 12-13 ms against 0.3 ms)."""
    keys = random_keys(CAPTURE_KEYS, 3)
    small = loaded_window(keys, 100_000)
    large = loaded_window(keys, 2_000_000)
    med = interleaved(
        {"small": small.clone_committed, "large": large.clone_committed},
        rounds=7,
        reps={"small": 5, "large": 5},
    )
    benchmark.pedantic(large.clone_committed, rounds=10, iterations=1)
    ratio = med["large"] / med["small"]
    record(
        benchmark,
        keys=CAPTURE_KEYS,
        capture_ms_max_keys_100k=round(med["small"] * 1e3, 3),
        capture_ms_max_keys_2m=round(med["large"] * 1e3, 3),
        ratio_2m_over_100k=round(ratio, 2),
    )
    assert large.clone_committed().committed_entries() == small.committed_entries()
    assert ratio <= CAPTURE_RATIO


def test_snapshot_decode(benchmark: Any, snapshot_data: Any) -> None:
    cls = naive_snapshot_class()
    d = snapshot_data
    data = our_encode(d)
    naive = naive_encode(cls, d)
    assert len(naive_decode(cls, naive)) == d.n

    def ours() -> Any:  # parse and rebuild the index: the window itself
        return _core.decode_snapshot(data).to_window()

    assert ours().committed_entries() == d.window.committed_entries()
    med = interleaved(
        {
            "ours": ours,
            "ours_parse_only": lambda: _core.decode_snapshot(data),
            "naive": lambda: naive_decode(cls, naive),
        },
        rounds=9,
        reps={"ours": 5, "ours_parse_only": 5},
    )
    benchmark.pedantic(ours, rounds=10, iterations=1)
    speedup = med["naive"] / med["ours"]
    record(
        benchmark,
        entries=d.n,
        decode_to_window_ms=round(med["ours"] * 1e3, 3),
        decode_parse_only_ms=round(med["ours_parse_only"] * 1e3, 3),
        naive_decode_to_dict_ms=round(med["naive"] * 1e3, 3),
        decode_speedup=round(speedup, 1),
        parse_only_speedup=round(med["naive"] / med["ours_parse_only"], 1),
    )
    assert speedup >= SNAPSHOT_SPEEDUP


# --- concat and the GIL (moved from core/test_core_entry.py: a timing claim) -----------------


def _other_thread_ran_during(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list]:
    """How far a spinning thread got during each call, the calls interleaved for `rounds`
    rounds (it also gets the GIL at the interpreter's forced switches around a call, so never
    quite 0)."""
    import threading

    counter = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counter[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    ran: dict[str, list] = {name: [] for name in calls}
    try:
        for _ in range(rounds):
            for name, call in calls.items():
                before = counter[0]
                call()
                ran[name].append(counter[0] - before)
    finally:
        stop.set()
        t.join()
    return ran


CONCAT_PARTS = [bytes(1 << 20)] * 48  # 48 MiB: a copy of several milliseconds


def test_concat_keeps_the_gil_where_bytes_join_lets_go(benchmark: Any) -> None:
    """bytes.join releases the GIL for results of 1 MiB or more; winning it back from a busy
    thread costs up to 5 ms per frame or block. concat copies with the GIL held: a thread
    spinning next to it gets at most half as far during concat as during join (medians of 9
    interleaved rounds; the spinner runs only at forced switches around concat, but all through
    join's copy)."""
    ran = _other_thread_ran_during(
        {
            "concat": lambda: _core.concat(CONCAT_PARTS),
            "join": lambda: b"".join(CONCAT_PARTS),
        },
        9,
    )
    benchmark.pedantic(_core.concat, args=(CONCAT_PARTS,), rounds=3, iterations=1)
    held, released = statistics.median(ran["concat"]), statistics.median(ran["join"])
    record(benchmark, spinner_during_concat=held, spinner_during_join=released)
    assert 2 * held < released, ran
