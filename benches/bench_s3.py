"""Idempotent write throughput on S3: a moto S3 server (a local process), 1 KiB payloads.

Run: `PYTHONPATH=python .venv/bin/python -m pytest benches/bench_s3.py
--benchmark-json=bench-results/s3.json -p no:cacheprovider -s`.

The writer is `open_writer(idempotent=True)` with an explicit id per entry, es=1 (the shared
deployment: an in-process LogStore in the client, blocks straight to the bucket); every entry goes
through `write_async`, and an ack means the block is in the bucket. Figures in `extra_info`:
- `entries_per_s`, `mib_per_s`: N entries back to back, first call to last ack (median of rounds);
- `load_p50_ms`, `load_p99_ms`: per-entry latency under that load;
- `idle_p50_ms`: one entry in flight at a time (one PutObject round trip plus batching linger);
- `puts`: PutObject requests per round (blocks + snapshots), so the batching is visible.
Metadata: SQLite, and etcd (a local member started for the run: the shared deployment of one log
seen from many hosts). moto is a single-threaded Python server, far slower than S3: the figure
bounds the client's overhead from below, no more.
Target (asserted loosely): >= 5,000 entries/s.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from etcdserver import EtcdServer  # noqa: E402
from s3server import MotoS3Server  # noqa: E402

from woodpecker_idem.connect import connect  # noqa: E402

TARGET = 5_000
N = 5_000
ROUNDS = 3
N_IDLE = 100
SIZE = 1024


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3Server]:
    server = MotoS3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    server = EtcdServer().start()
    try:
        yield server
    finally:
        server.stop()


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def _round(writer: Any, payload: bytes, first: int, n: int) -> tuple[float, list[float]]:
    lat = [0.0] * n
    done_at = [0.0] * n
    futures = []
    t0 = time.perf_counter()
    for i in range(n):
        start = time.perf_counter()
        f = writer.write_async(payload, idempotency_id=f"order-{first + i}")

        def cb(_f: Any, i: int = i, start: float = start) -> None:
            done_at[i] = time.perf_counter()
            lat[i] = done_at[i] - start

        f.add_done_callback(cb)
        futures.append(f)
    for f in futures:
        assert f.result(300).duplicate is False
    return max(done_at) - t0, lat


@pytest.mark.parametrize("meta", ["sqlite", "etcd"])
def test_idempotent_write_on_s3(
    benchmark: Any, s3: MotoS3Server, meta: str, request: pytest.FixtureRequest
) -> None:
    etcd_config: dict[str, object] = {}
    if meta == "etcd":
        server = request.getfixturevalue("etcd")
        etcd_config = {"meta.endpoints": [server.endpoint], "meta.prefix": f"/b{uuid.uuid4().hex}"}
    config = {
        **etcd_config,
        "objectstore.type": "s3",
        "objectstore.endpoint_url": s3.endpoint_url,
        "objectstore.bucket": f"bench-{uuid.uuid4().hex[:12]}",
        "objectstore.access_key_id": "testing",
        "objectstore.secret_access_key": "testing",
        "objectstore.region": "us-east-1",
        "objectstore.create_bucket": True,
        "meta.type": meta,
        "quorum.es": 1,
        "append.linger_ms": 2,
        "segment.max_entries": 10_000_000,
    }
    puts = [0]
    base = Path(os.environ.get("WP_BENCH_DIR", "."))
    with tempfile.TemporaryDirectory(dir=base, prefix=".bench-s3-") as d:
        client = connect(d, config)
        try:
            client.objects.client.meta.events.register(
                "before-send.s3.PutObject", lambda **_: puts.__setitem__(0, puts[0] + 1)
            )
            writer = client.create_log("bench").open_writer(
                idempotent=True, window_duration_s=600, window_max_keys=100_000
            )
            payload = os.urandom(SIZE)
            _round(writer, payload, 10_000_000, 500)  # warm-up
            runs: list[tuple[float, list[float]]] = []
            put_counts: list[int] = []

            def run() -> None:
                before = puts[0]
                runs.append(_round(writer, payload, len(runs) * N, N))
                put_counts.append(puts[0] - before)

            benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
            idle = []
            for i in range(N_IDLE):
                t = time.perf_counter()
                writer.write_async(payload, idempotency_id=f"idle-{i}").result(30)
                idle.append(time.perf_counter() - t)
            writer.close()
        finally:
            client.close()

    totals = [t for t, _ in runs]
    med = statistics.median(totals)
    lat = runs[totals.index(med)][1]
    info = {
        "meta": meta,
        "payload_bytes": SIZE,
        "entries": N,
        "entries_per_s": round(N / med),
        "entries_per_s_best": round(N / min(totals)),
        "mib_per_s": round(N * SIZE / med / 2**20, 2),
        "load_p50_ms": round(_pct(lat, 0.50) * 1e3, 2),
        "load_p99_ms": round(_pct(lat, 0.99) * 1e3, 2),
        "idle_p50_ms": round(_pct(idle, 0.50) * 1e3, 2),
        "puts": int(statistics.median(put_counts)),
        "target_entries_per_s": TARGET,
    }
    benchmark.extra_info.update(info)
    print(f"\nidempotent writer on S3 (moto), {meta} metadata, 1 KiB: {info}")
    assert info["entries_per_s"] >= TARGET, info
