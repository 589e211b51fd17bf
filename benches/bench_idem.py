"""Benchmarks of idempotent writes against plain writes (embedded mode: es=1, local directory).

    .venv/bin/python -m pytest benches/bench_idem.py \
        --benchmark-json=bench-results/idem.json -p no:cacheprovider

Comparisons run interleaved (plain, explicit id, content key, then reversed), ROUNDS rounds. The
throughput and p99 targets are judged on the median of the per-round ratios (each idempotent run
against the plain run of the same round, so slow drifts of the shared machine cancel out); the
ratio of the medians is reported next to it.
Figures go to ``benchmark.extra_info`` and are printed (``-s``). Targets (asserted):
- idempotent write_async throughput within 10% of plain, p99 latency within 1.2x (1 KiB payloads,
  with a business id and with the default content key);
- recovery of a 100,000-key snapshot plus a 10,000-entry gap: open_writer(idempotent=True) < 1 s;
- duplicates suppressed through write_many >= 1,000,000/s (100k committed explicit ids per call).
"""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path

import pytest

import woodpecker_idem as wp

ROUNDS = 61  # a round's ratio swings by +-0.1 on this shared machine: the median needs many
N_WRITES = 10_000
PAYLOAD = 1024
SNAPSHOT_KEYS = 100_000
GAP = 10_000
DUP_BATCH = 100_000

THROUGHPUT_RATIO = 0.95  # issue 12: idempotent write_async >= 0.95x plain
P99_RATIO = 1.2
RECOVERY_S = 1.0
DUPS_PER_S = 1_000_000

QUIET = {"idempotency.snapshot_interval_s": 3600, "idempotency.snapshot_threshold": 10**8}


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class WriteRun:
    """One burst of N_WRITES write_async calls of distinct 1 KiB payloads on a fresh log.

    kind: "plain" (no key), "explicit" (idempotent, a business id per write), "content"
    (idempotent, the default key: MD5 of the payload).
    """

    def __init__(self, client, kind: str, tag: str):
        self.log = client.open_log(f"bench-{tag}", create=True)
        self.writer = self.log.open_writer(idempotent=kind != "plain")
        self.payloads = [
            (b"%s-%08d-" % (tag.encode(), i)).ljust(PAYLOAD, b"x") for i in range(N_WRITES)
        ]
        self.ids = [f"{tag}-order-{i}" for i in range(N_WRITES)] if kind == "explicit" else None

    def run(self) -> tuple[float, float]:
        lat: list[float] = []
        clock = time.perf_counter
        futures = []
        write = self.writer.write_async
        gc.collect()
        t0 = clock()
        if self.ids is None:
            for p in self.payloads:
                start = clock()
                f = write(p)
                f.add_done_callback(lambda _f, s=start: lat.append(clock() - s))
                futures.append(f)
        else:
            for p, i in zip(self.payloads, self.ids, strict=True):
                start = clock()
                f = write(p, idempotency_id=i)
                f.add_done_callback(lambda _f, s=start: lat.append(clock() - s))
                futures.append(f)
        for f in futures:
            f.result(60)
        elapsed = clock() - t0
        self.writer.close()
        return N_WRITES / elapsed, _p(lat, 0.99)


KINDS = ("plain", "explicit", "content")


def test_idempotent_vs_plain_write_throughput(benchmark, tmp_path: Path):
    """Both idempotent key kinds against plain writes, interleaved, medians of ROUNDS runs.

    The content key costs one MD5 of the payload (~0.2 us for 1 KiB, 32 hashed at a time: md5x) on
    the key pipe's own thread; a business id costs an MD5 of the id on the producer. Neither may
    cost more than 10% of throughput.
    """
    client = wp.connect(tmp_path / "tp", {"quorum.es": 1})
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
    for kind in KINDS:  # warm-up (imports, first segment files)
        WriteRun(client, kind, f"warm-{kind}").run()
    for r in range(ROUNDS):
        order = KINDS if r % 2 == 0 else KINDS[::-1]
        for kind in order:
            results[kind].append(WriteRun(client, kind, f"{kind}-{r}").run())
    last = WriteRun(client, "explicit", "pedantic")
    benchmark.pedantic(last.run, rounds=1, iterations=1)
    client.close()
    tp = {k: statistics.median(x[0] for x in v) for k, v in results.items()}
    p99 = {k: statistics.median(x[1] for x in v) for k, v in results.items()}
    plain = results["plain"]
    paired = {  # median over rounds of (idempotent run / plain run of the same round)
        k: (
            statistics.median(x[0] / p[0] for x, p in zip(results[k], plain, strict=True)),
            statistics.median(x[1] / p[1] for x, p in zip(results[k], plain, strict=True)),
        )
        for k in ("explicit", "content")
    }
    info = {
        "writes_per_run": N_WRITES,
        "payload_bytes": PAYLOAD,
        **{f"{k}_writes_per_s": round(tp[k]) for k in KINDS},
        **{f"{k}_p99_ms": round(p99[k] * 1000, 2) for k in KINDS},
        "explicit_throughput_ratio": round(paired["explicit"][0], 3),
        "explicit_p99_ratio": round(paired["explicit"][1], 3),
        "content_throughput_ratio": round(paired["content"][0], 3),
        "content_p99_ratio": round(paired["content"][1], 3),
        "ratio_of_medians": {
            k: (round(tp[k] / tp["plain"], 3), round(p99[k] / p99["plain"], 3))
            for k in ("explicit", "content")
        },
        "runs": {k: [(round(a), round(b * 1000, 2)) for a, b in v] for k, v in results.items()},
    }
    benchmark.extra_info.update(info)
    print("\nwrite throughput:", info)
    for kind in ("explicit", "content"):
        assert paired[kind][0] >= THROUGHPUT_RATIO, (kind, info)
        assert paired[kind][1] <= P99_RATIO, (kind, info)


def _fill(writer, start: int, count: int, chunk: int = 10_000) -> None:
    for s in range(start, start + count, chunk):
        n = min(chunk, start + count - s)
        ids = [f"id-{i}" for i in range(s, s + n)]
        writer.write_many([b"v%d" % i for i in range(s, s + n)], ids)


@pytest.fixture(scope="module")
def recovery_log(tmp_path_factory):
    """A log whose newest snapshot holds 100,000 keys, with 10,000 entries written after it."""
    path = tmp_path_factory.mktemp("recovery")
    client = wp.connect(path, {"quorum.es": 1, **QUIET})
    log = client.open_log("rec", create=True)
    w = log.open_writer(idempotent=True, window_duration_s=3600, window_max_keys=200_000)
    _fill(w, 0, SNAPSHOT_KEYS)
    assert w.snapshotter.write_now()
    _fill(w, SNAPSHOT_KEYS, GAP)
    yield client, log  # the writer is abandoned (a crash): every open below is a takeover
    client.close()


def test_recovery_100k_snapshot_10k_gap(benchmark, recovery_log):
    client, log = recovery_log
    times: list[float] = []
    reports = []

    def open_writer():
        gc.collect()
        t0 = time.perf_counter()
        w = log.open_writer(idempotent=True, window_duration_s=3600, window_max_keys=200_000)
        times.append(time.perf_counter() - t0)
        reports.append(w.recovery)
        return w

    for _ in range(ROUNDS - 1):
        open_writer()
    benchmark.pedantic(open_writer, rounds=1, iterations=1)
    rep = reports[-1]
    assert rep.snapshot_key_count == SNAPSHOT_KEYS and rep.entries_replayed == GAP
    assert rep.window_size == SNAPSHOT_KEYS + GAP
    info = {
        "open_writer_median_s": round(statistics.median(times), 4),
        "open_writer_best_s": round(min(times), 4),
        "rebuild_window_median_s": round(statistics.median(r.seconds for r in reports), 4),
        "snapshot_keys": rep.snapshot_key_count,
        "entries_replayed": rep.entries_replayed,
        "all_s": [round(t, 4) for t in times],
    }
    benchmark.extra_info.update(info)
    print("\nrecovery:", info)
    assert statistics.median(times) < RECOVERY_S, info


def test_write_many_duplicates_per_second(benchmark, tmp_path: Path):
    client = wp.connect(tmp_path / "dups", {"quorum.es": 1, **QUIET})
    log = client.open_log("dups", create=True)
    w = log.open_writer(idempotent=True, window_duration_s=3600, window_max_keys=300_000)
    _fill(w, 0, DUP_BATCH)
    ids = [f"id-{i}" for i in range(DUP_BATCH)]
    payloads = [b"v%d" % i for i in range(DUP_BATCH)]
    small = [b"payload-%08d" % i for i in range(DUP_BATCH)]  # content keys, 16 B payloads
    for s in range(0, DUP_BATCH, 10_000):
        w.write_many(small[s : s + 10_000])

    def by_ids():
        res = w.write_many(payloads, ids)
        assert res.duplicate.count(1) == DUP_BATCH
        return res

    def by_payload():
        res = w.write_many(small)
        assert res.duplicate.count(1) == DUP_BATCH
        return res

    t_ids: list[float] = []
    t_payload: list[float] = []
    for _ in range(ROUNDS):
        for fn, out in ((by_ids, t_ids), (by_payload, t_payload)):
            gc.collect()
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    benchmark.pedantic(by_ids, rounds=3, iterations=1)
    m = w.metrics_snapshot()
    client.close()
    rate_ids = DUP_BATCH / statistics.median(t_ids)
    rate_payload = DUP_BATCH / statistics.median(t_payload)
    info = {
        "batch": DUP_BATCH,
        "explicit_id_dups_per_s": round(rate_ids),
        "content_key_dups_per_s": round(rate_payload),
        "duplicates_suppressed_metric": m["duplicates_suppressed"],
    }
    benchmark.extra_info.update(info)
    print("\nwrite_many duplicates:", info)
    assert m["duplicates_suppressed"] >= 2 * ROUNDS * DUP_BATCH
    assert rate_ids >= DUPS_PER_S, info
