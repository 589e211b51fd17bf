"""Service mode: es=3/aq=2 over gRPC on loopback, three LogStore node processes (issue 28).

    .venv/bin/python -m pytest benches/bench_service.py -p no:cacheprovider -s \\
        --benchmark-json=bench-results/service.json

For each node `storage.fsync` policy (`batch_ms:5`, then `always`), three `logstore serve`
processes on 127.0.0.1 (SQLite registry and node storage in a temp directory) and one client
(`quorum.nodes: registry`, es=3). Every round runs each case once, in turn (interleaved, so a
slow spell of the shared machine falls on every case alike); each figure is the median over the
rounds:
- `entries/s`: N entries through `write_async` back to back, from the first call to the last
  ack, for the idempotent writer (an explicit id per entry) and the plain one, 100 B and 1 KiB;
- `node CPU us/entry`: the CPU time (user + system) of the three node processes over that run,
  per entry (all three replicas together);
- sync `write()` p50/p99: one caller, each write waited for, 1 KiB, idempotent and plain;
- the floor under it: p50 of the first two answers of one small call (LastAddConfirmed) started
  on the three nodes at once and answered into one queue, as the write path's senders start a
  batch's AddEntries (`_core.NodeChannel.start`): what a sync write costs at least over this
  wire, with these node processes, on this machine.
The figures are printed and kept in `extra_info`, each under its fsync policy, with the load
average before and after.

Targets (issue 28: >= 42,000 entries/s of 1 KiB idempotent with `batch_ms`; sync `write()` p50
<= 0.5 ms with `batch_ms`) are for a quiet machine: three node processes, the client and the
kernel's loopback share its two cores with whatever else runs. They are asserted only with
`WP_BENCH_TARGETS=1`; otherwise reported (`targets_met`). Every run asserts that every write was
acknowledged. `WP_BENCH_SERVICE_ROUNDS` (default 5) and `WP_BENCH_SERVICE_N` (entries per
throughput run, default 20,000) size it.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytest

import woodpecker_idem as wp
from woodpecker_idem._core import Completions, NodeChannel
from woodpecker_idem._proto import logstore_pb2 as pb
from woodpecker_idem.logstore.remote import SERVICE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from nodeserver import LogStoreNode  # noqa: E402

ROUNDS = int(os.environ.get("WP_BENCH_SERVICE_ROUNDS", "5"))
N = int(os.environ.get("WP_BENCH_SERVICE_N", "20000"))
SYNC_WRITES = 300  # per round and writer, each waited for
CHECK_TARGETS = os.environ.get("WP_BENCH_TARGETS") == "1"
TARGET_IDEM_1K_PER_S = 42_000  # with batch_ms (NATS JetStream R=3 with message ids: 35,000/s)
TARGET_SYNC_P50_S = 0.5e-3  # with batch_ms (NATS R=3: 0.48 ms)
SIZES = (100, 1024)
QUIET = {"idempotency.snapshot_interval_s": 3600, "idempotency.snapshot_threshold": 10**8}
CLIENT = {
    "quorum.nodes": "registry",
    "quorum.es": 3,
    "segment.max_entries": 10_000_000,  # no roll inside a run: the steady state
    **QUIET,
}
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of the processes so far (/proc/PID/stat)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total * TICK_S


def _quorum_floor(addresses: list[str]) -> list[float]:
    """Latency to the second answer of a LastAddConfirmed started on every node at once."""
    channels = [NodeChannel(a, SERVICE) for a in addresses]
    answers = Completions()
    request = pb.SegmentRequest(log_id=1, segment_id=0).SerializeToString()
    lat = []
    try:
        for _ in range(SYNC_WRITES):
            t0 = time.perf_counter()
            for token, channel in enumerate(channels):
                channel.start("LastAddConfirmed", request, 10.0, answers, token)
            outcomes = [answers.next(), answers.next()]
            lat.append(time.perf_counter() - t0)
            outcomes.append(answers.next())
            assert all(o is not None and isinstance(o[1], bytes) for o in outcomes), outcomes
    finally:
        answers.close()
        for channel in channels:
            channel.close()
    return lat


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Case:
    """One writer and its payload; `write_async` N entries (ids unique across rounds)."""

    def __init__(self, client: wp.WoodpeckerClient, idempotent: bool, size: int):
        self.name = f"{'idempotent' if idempotent else 'plain'} {size} B"
        kind = "idem" if idempotent else "plain"
        self.writer = client.open_log(f"{kind}-{size}", create=True).open_writer(
            idempotent=idempotent
        )
        self.idempotent = idempotent
        self.payload = os.urandom(size)
        self._next = 0

    def _ids(self, n: int) -> list[str]:
        first, self._next = self._next, self._next + n
        return [f"id-{i}" for i in range(first, first + n)]

    def throughput(self, n: int) -> float:
        """Seconds for n entries, first call to last ack."""
        payload, write = self.payload, self.writer.write_async
        ids = self._ids(n) if self.idempotent else None
        t0 = time.perf_counter()
        if ids is None:
            futures = [write(payload) for _ in range(n)]
        else:
            futures = [write(payload, idempotency_id=i) for i in ids]
        for f in futures:
            f.result(300)
        return time.perf_counter() - t0

    def sync(self, n: int) -> list[float]:
        """Latency of n sync `write()`s, one after the other."""
        payload, write = self.payload, self.writer.write
        ids = self._ids(n) if self.idempotent else [None] * n
        lat = []
        clock = time.perf_counter
        for i in ids:
            t0 = clock()
            if i is None:
                write(payload)
            else:
                write(payload, idempotency_id=i)
            lat.append(clock() - t0)
        return lat


@pytest.mark.parametrize("fsync", ["batch_ms:5", "always"])
def test_service_es3_over_grpc(benchmark, fsync: str):
    base = Path(os.environ.get("WP_BENCH_DIR", "."))
    with tempfile.TemporaryDirectory(dir=base, prefix=".bench-service-") as d:
        data = Path(d) / "data"
        nodes = [LogStoreNode(f"n{i}", data, {"storage.fsync": fsync}) for i in range(3)]
        load_before = _load()
        try:
            for node in nodes:
                node.start()
            pids = [node.pid for node in nodes]
            client = wp.connect(data, CLIENT)
            try:
                cases = [Case(client, idem, size) for idem in (True, False) for size in SIZES]
                for case in cases:
                    case.throughput(2000)  # warm-up: channels, first segment, imports
                rates: dict[str, list[float]] = {c.name: [] for c in cases}
                cpu: dict[str, list[float]] = {c.name: [] for c in cases}
                sync_cases = [c for c in cases if len(c.payload) == 1024]
                p50: dict[str, list[float]] = {c.name: [] for c in sync_cases}
                p99: dict[str, list[float]] = {c.name: [] for c in sync_cases}
                floor: list[float] = []
                for _ in range(ROUNDS):
                    for case in cases:
                        before = _cpu_s(pids)
                        seconds = case.throughput(N)
                        cpu[case.name].append((_cpu_s(pids) - before) / N)
                        rates[case.name].append(N / seconds)
                    for case in sync_cases:
                        lat = case.sync(SYNC_WRITES)
                        p50[case.name].append(_pct(lat, 0.5))
                        p99[case.name].append(_pct(lat, 0.99))
                    floor.append(_pct(_quorum_floor([n.address for n in nodes]), 0.5))
                idem_1k = cases[1]
                benchmark.pedantic(lambda: idem_1k.throughput(1000), rounds=1, iterations=1)
                for case in cases:
                    case.writer.close()
            finally:
                client.close()
        finally:
            for node in nodes:
                node.stop()
    med = {name: statistics.median(v) for name, v in rates.items()}
    sync_p50 = {name: statistics.median(v) for name, v in p50.items()}
    info = {
        "storage.fsync": fsync,
        "rounds": ROUNDS,
        "entries_per_run": N,
        "load_before": load_before,
        "load_after": _load(),
        "entries_per_s": {name: round(v) for name, v in med.items()},
        "node_cpu_us_per_entry": {
            name: round(statistics.median(v) * 1e6, 1) for name, v in cpu.items()
        },
        "sync_write_p50_ms": {name: round(v * 1e3, 3) for name, v in sync_p50.items()},
        "sync_write_p99_ms": {
            name: round(statistics.median(v) * 1e3, 3) for name, v in p99.items()
        },
        "floor_2_of_3_calls_p50_ms": round(statistics.median(floor) * 1e3, 3),
    }
    if fsync.startswith("batch_ms"):
        info["targets_met"] = {
            "idempotent 1 KiB >= 42,000/s": med["idempotent 1024 B"] >= TARGET_IDEM_1K_PER_S,
            "sync p50 <= 0.5 ms": sync_p50["idempotent 1024 B"] <= TARGET_SYNC_P50_S,
        }
    benchmark.extra_info.update(info)
    print(f"\nservice es=3 over gRPC, storage.fsync {fsync}: {info}")  # noqa: T201
    if CHECK_TARGETS and fsync.startswith("batch_ms"):
        assert med["idempotent 1024 B"] >= TARGET_IDEM_1K_PER_S, info
        assert sync_p50["idempotent 1024 B"] <= TARGET_SYNC_P50_S, info
