"""Prometheus metrics (issue 22 item 2): the collector exposes what the writers count, named
`woodpecker_..._total` for counters with a `log` label, on a registry and over HTTP."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import woodpecker_idem as wp
from woodpecker_idem.clock import ManualClock
from woodpecker_idem.metrics import SERIES, register_opentelemetry, register_prometheus, serve
from woodpecker_idem.types import SegmentState


def samples(text: str) -> dict[tuple[str, str], float]:
    """{(sample name, log label): value} of an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, s.labels.get("log", ""))] = s.value
    return out


def test_scrape_after_writes_and_duplicates(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    assert register_prometheus(registry) is register_prometheus(registry)  # once per registry
    with wp.connect(tmp_path, {"segment.max_entries": 10}) as client:
        orders = client.open_log("m-orders", create=True).open_writer(idempotent=True)
        for i in range(25):
            orders.write(f"o{i}".encode(), idempotency_id=f"k{i}")
        for i in range(3):  # retries: answered from the window
            assert orders.write(b"again", idempotency_id=f"k{i}").duplicate
        plain = client.open_log("m-audit", create=True).open_writer()
        plain.write(b"x")
        got = samples(generate_latest(registry).decode())
        assert got[("woodpecker_duplicates_suppressed_total", "m-orders")] == 3
        assert got[("woodpecker_window_keys", "m-orders")] == 25
        assert got[("woodpecker_window_memory_bytes", "m-orders")] > 0
        assert got[("woodpecker_segments_rolled_total", "m-orders")] == 2
        assert got[("woodpecker_pending_writes", "m-orders")] == 0
        assert got[("woodpecker_writers_open", "m-orders")] == 1
        assert got[("woodpecker_writers_fenced", "m-orders")] == 0
        assert ("woodpecker_recovery_seconds", "m-orders") in got
        assert got[("woodpecker_entries_acked_total", "m-orders")] == 25  # not the duplicates
        # the ack latency histogram: every acked entry in a bucket, the buckets cumulative
        assert got[("woodpecker_ack_latency_seconds_count", "m-orders")] == 25
        assert got[("woodpecker_ack_latency_seconds_sum", "m-orders")] > 0
        assert got[("woodpecker_ack_latency_seconds_count", "m-audit")] == 1
        text = generate_latest(registry).decode()
        (latency,) = [
            f
            for f in text_string_to_metric_families(text)
            if f.name == "woodpecker_ack_latency_seconds"
        ]
        assert latency.type == "histogram"
        buckets = [
            (s.labels["le"], s.value)
            for s in latency.samples
            if s.name.endswith("_bucket") and s.labels["log"] == "m-orders"
        ]
        assert buckets[-1] == ("+Inf", 25.0) and len(buckets) > 10
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)
        assert got[("woodpecker_entries_acked_total", "m-audit")] == 1
        assert ("woodpecker_backpressure_waits_total", "m-orders") in got
        assert got[("woodpecker_writers_open", "m-audit")] == 1  # a plain writer: its core figures
        assert ("woodpecker_duplicates_suppressed_total", "m-audit") not in got
        # a second writer takes "m-orders" over: the first is fenced, the new one rebuilt its window
        second = client.open_log("m-orders").open_writer(idempotent=True)
        with pytest.raises(wp.WriterFencedError):  # the first learns it at its next write
            orders.write(b"late", idempotency_id="late")
        got = samples(generate_latest(registry).decode())
        assert got[("woodpecker_writers_fenced", "m-orders")] == 1
        assert got[("woodpecker_writers_open", "m-orders")] == 1
        assert got[("woodpecker_recovery_entries_replayed", "m-orders")] >= 0
        second.close()
        plain.close()
        got = samples(generate_latest(registry).decode())
        assert got.get(("woodpecker_writers_open", "m-audit"), 0) == 0  # closed: gone


def test_served_over_http(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    server, thread = serve(0, "127.0.0.1", registry)
    try:
        with wp.connect(tmp_path) as client:
            writer = client.open_log("served", create=True).open_writer(idempotent=True)
            writer.write(b"a", idempotency_id="a")
            writer.write(b"a", idempotency_id="a")
            url = f"http://127.0.0.1:{server.server_port}/metrics"
            with urllib.request.urlopen(url, timeout=30) as response:
                body = response.read().decode()
            writer.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(30)
    got = samples(body)
    assert got[("woodpecker_duplicates_suppressed_total", "served")] == 1
    assert "# TYPE woodpecker_duplicates_suppressed_total counter" in body or (
        "# TYPE woodpecker_duplicates_suppressed counter" in body
    )


def wait_completed(log: wp.LogHandle, n: int) -> None:
    """Until the first n segments are completed (in the background, at the manual clock's time)."""
    deadline = time.monotonic() + 60
    done = (SegmentState.COMPLETED, SegmentState.SEALED)
    while sum(s.state in done for s in log.segments()) < n:
        assert time.monotonic() < deadline, "segments never completed"
        time.sleep(0.005)


def test_retention_and_reader_series(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    register_prometheus(registry)
    clock = ManualClock()
    config = {
        "quorum.es": 3,
        "segment.max_entries": 10,
        "idempotency.window_duration_s": 5,
        "retention.max_age_s": 10,
        "retention.check_interval_s": 0.02,
    }
    with wp.connect(tmp_path, config, clock=clock) as client:
        log = client.open_log("m-ret", create=True)
        writer = log.open_writer(idempotent=True)
        for i in range(25):
            writer.write(f"v{i}".encode(), idempotency_id=f"k{i}")
        wait_completed(log, 2)
        clock.advance(11_000)
        runner = client.retention
        assert runner is not None
        deadline = time.monotonic() + 60
        while runner.segments_dropped < 2:
            assert time.monotonic() < deadline, "retention never ran"
            time.sleep(0.01)
        got = samples(generate_latest(registry).decode())
        assert got[("woodpecker_retention_segments_dropped_total", "m-ret")] == 2
        assert got[("woodpecker_retention_bytes_dropped_total", "m-ret")] > 20 * len("v0")
        writer.close()
        # a replica damaged under a reader: it reads from another and counts it
        other = client.open_log("m-read", create=True)
        plain = other.open_writer()
        for i in range(5):
            plain.write(f"r{i}".encode())
        plain.close()
        first = other.segments()[0].nodes[0]  # the replica read first
        nodes = tmp_path / "objects" / "woodpecker" / client.store_id() / "nodes"
        path = nodes / first / str(other.log_id) / "0" / "data"
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))
        reader = other.open_reader()
        assert len(list(reader)) == 5 and reader.corrupt_replica_reads == 1
        got = samples(generate_latest(registry).decode())
        assert got[("woodpecker_reader_corrupt_replica_reads_total", "m-read")] == 1


def test_opentelemetry_instruments(tmp_path: Path) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instruments = register_opentelemetry(provider)
    assert len(instruments) == len(SERIES)
    with wp.connect(tmp_path) as client:
        writer = client.open_log("m-otel", create=True).open_writer(idempotent=True)
        for _ in range(3):
            writer.write(b"a", idempotency_id="a")
        data = reader.get_metrics_data()
        writer.close()
    points = {
        (metric.name, dict(point.attributes or {}).get("log")): point.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        for point in metric.data.data_points
    }
    assert points[("woodpecker.duplicates_suppressed", "m-otel")] == 2
    assert points[("woodpecker.window_keys", "m-otel")] == 1
    assert points[("woodpecker.writers_open", "m-otel")] == 1
    assert points[("woodpecker.ack_latency_seconds_sum", "m-otel")] > 0
    provider.shutdown()
