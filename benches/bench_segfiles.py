"""Local segment files: files and bytes left by sync writes, read-back speed, and the cost of one
durable add next to the append+fdatasync floor and a durable object put.

Run: `.venv/bin/python -m pytest benches/bench_segfiles.py -s
--benchmark-json=bench-results/segfiles.json -p no:cacheprovider`.

- `test_sync_writes_files_and_read_back`: N (default 100,000; `WP_BENCH_SEGFILES_N`) sync
  `write()`s of 1 KiB, durable, one at a time through the client (embedded default, linger 0).
  Asserted: at most 4 files per segment (data, footer; fence files only after a takeover). Then a
  fresh client (no cache, like another process) reads the completed segments back with the
  storage's one-call sequential read (`LogStoreEngine.read_completed`), interleaved with the full
  reader (`open_reader()` iterated to the end, which decodes every entry into a `LogMessage`),
  7 rounds. Both are judged on their fastest round (the least disturbed on a shared machine):
  >= 300,000 entries/s each (issue 12's read-back target is the reader's; the storage's is its
  floor). Medians are reported too.
- `test_add_vs_floor`: interleaved rounds of one durable 1 KiB add through the engine (append,
  fdatasync, fence check: one native call), the floor (os.write + os.fdatasync on an open file)
  and one durable object put (create, fsync, link, directory fsync); medians and the ratio.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import pytest

from woodpecker_idem._core import encode_entry
from woodpecker_idem.connect import connect
from woodpecker_idem.logstore.engine import LogStoreEngine
from woodpecker_idem.logstore.segment_files import FileSegmentStorage
from woodpecker_idem.objectstore.local import LocalObjectStore

N = int(os.environ.get("WP_BENCH_SEGFILES_N", "100000"))
MAX_FILES_PER_SEGMENT = 4
TARGET_READ_PER_S = 300_000
PAYLOAD = b"x" * 1024


@pytest.mark.timeout(1800)  # 100,000 durable writes: minutes on a loaded shared machine
def test_sync_writes_files_and_read_back(benchmark):
    with tempfile.TemporaryDirectory(dir=os.environ.get("WP_BENCH_DIR")) as tmp:
        client = connect(tmp, {"append.linger_ms": 0})
        handle = client.create_log("bench")
        writer = handle.open_writer()
        t0 = time.perf_counter()
        for _ in range(N):
            writer.write(PAYLOAD)
        write_s = time.perf_counter() - t0
        writer.close()
        root = Path(client.objects.root) / str(handle.log_id)
        client.close()
        files = {d.name: sorted(p.name for p in d.iterdir()) for d in root.iterdir()}
        total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        worst = max(len(v) for v in files.values())

        fresh = connect(tmp)
        log = fresh.open_log("bench")
        engine = fresh.transport.engines["node-0"]
        segments = [s.segment_id for s in log.segments()]
        storage_rates, reader_rates = [], []

        def read_storage() -> None:
            t = time.perf_counter()
            n = sum(len(c) for s in segments for c in engine.read_completed(log.log_id, s))
            assert n == N
            storage_rates.append(n / (time.perf_counter() - t))

        def read_reader() -> None:
            t = time.perf_counter()
            n = sum(1 for _ in log.open_reader())
            assert n == N
            reader_rates.append(n / (time.perf_counter() - t))

        def run() -> None:
            read_storage()
            read_reader()

        benchmark.pedantic(run, rounds=7, iterations=1)
        fresh.close()
    info = {
        "writes": N,
        "sync_writes_per_s": round(N / write_s),
        "segments": len(files),
        "files_per_segment_max": worst,
        "files": files if len(files) <= 4 else f"{len(files)} segments",
        "bytes": total,
        "bytes_per_entry": round(total / N, 1),
        "read_completed_per_s_best": round(max(storage_rates)),
        "read_completed_per_s_median": round(statistics.median(storage_rates)),
        "reader_per_s_best": round(max(reader_rates)),
        "reader_per_s_median": round(statistics.median(reader_rates)),
    }
    benchmark.extra_info.update(info)
    print("\nsegment files:", info)
    assert worst <= MAX_FILES_PER_SEGMENT, files
    assert max(storage_rates) >= TARGET_READ_PER_S, info
    assert max(reader_rates) >= TARGET_READ_PER_S, info


def test_add_vs_floor(benchmark):
    rounds, per_round = 7, 200
    with tempfile.TemporaryDirectory(dir=os.environ.get("WP_BENCH_DIR")) as tmp:
        engine = LogStoreEngine(FileSegmentStorage(Path(tmp) / "segs"), "node-0")
        objects = LocalObjectStore(Path(tmp) / "objects")
        fd = os.open(Path(tmp) / "floor", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        records = [encode_entry(0, i, 1, PAYLOAD, None, None) for i in range(rounds * per_round)]
        add, floor, put = [], [], []
        state = {"entry": 0, "round": 0}

        def one_round() -> None:
            r = state["round"]
            state["round"] += 1
            for i in range(per_round):  # interleaved: add, floor, put, add, ...
                e = state["entry"]
                state["entry"] += 1
                t = time.perf_counter()
                engine.add_entries(1, 0, e, records[e], lac=e - 1)
                add.append(time.perf_counter() - t)
                t = time.perf_counter()
                os.write(fd, records[e])
                os.fdatasync(fd)
                floor.append(time.perf_counter() - t)
                t = time.perf_counter()
                objects.put(f"1/{r}/{i}.blk", records[e], if_none_match=True)
                put.append(time.perf_counter() - t)

        benchmark.pedantic(one_round, rounds=rounds, iterations=1)
        os.close(fd)
    ms = {k: statistics.median(v) * 1000 for k, v in (("add", add), ("floor", floor), ("put", put))}
    info = {
        "add_p50_ms": round(ms["add"], 3),
        "floor_p50_ms": round(ms["floor"], 3),
        "put_p50_ms": round(ms["put"], 3),
        "add_over_floor": round(ms["add"] / ms["floor"], 2),
        "put_over_floor": round(ms["put"] / ms["floor"], 2),
    }
    benchmark.extra_info.update(info)
    print("\nadd vs floor:", info)
    assert ms["add"] < ms["put"], info  # one append+fdatasync beats creating a file per batch
