"""Local ObjectStore throughput: 1 MiB create-if-absent puts (the block-write hot path).

As a bench: `pytest benches/bench_objectstore.py --benchmark-json=...` (figures in extra_info).
As a script: `.venv/bin/python benches/bench_objectstore.py [--dir DIR] [--n N]` (DIR should be on
the disk you care about; the default is a temp dir under the CWD).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from woodpecker_idem.objectstore import LocalObjectStore


def run(directory: str, n: int, size: int, fsync: bool) -> dict[str, float]:
    """Time `n` puts of `size` bytes into fresh keys; returns puts/s and latency percentiles."""
    store = LocalObjectStore(os.path.join(directory, f"bench-{fsync}"), fsync=fsync)
    payload = os.urandom(size)
    store.put("log/1/0/warm.blk", payload, if_none_match=True)
    lat: list[float] = []
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter()
        assert store.put(f"log/1/0/{i}.blk", payload, if_none_match=True)
        lat.append(time.perf_counter() - s)
    total = time.perf_counter() - t0
    lat.sort()
    return {
        "puts_per_s": n / total,
        "mib_per_s": n * size / total / 2**20,
        "p50_ms": statistics.median(lat) * 1e3,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
    }


def test_local_put_1mib(benchmark, tmp_path) -> None:
    """The writer needs ~100 block puts/s at its 2 MiB batch limit; that floor is asserted."""
    figures = {f"fsync_{fsync}": run(str(tmp_path), 100, 1 << 20, fsync) for fsync in (True, False)}
    benchmark.pedantic(lambda: run(str(tmp_path / "p"), 20, 1 << 20, True), rounds=1, iterations=1)
    benchmark.extra_info.update(figures)
    print("\nlocal 1 MiB create-if-absent puts:", figures)
    assert figures["fsync_True"]["puts_per_s"] >= 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--size", type=int, default=1 << 20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir or ".", prefix=".bench-os-") as d:
        for fsync in (True, False):
            r = run(d, args.n, args.size, fsync)
            print(
                f"fsync={fsync!s:5} {args.size} B create-if-absent puts: "
                f"{r['puts_per_s']:.0f} put/s, {r['mib_per_s']:.0f} MiB/s, "
                f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms"
            )


if __name__ == "__main__":
    main()
