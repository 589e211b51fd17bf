"""Prometheus metrics (the `metrics` extra: prometheus_client), and the same
series for OpenTelemetry (`register_opentelemetry`, the `otel` extra).

`register_prometheus(registry=None)` adds a collector to `registry` (prometheus_client's default
registry when None) that reads, at each scrape, the figures every writer of this process already
counts (`writer.metrics_snapshot()`, `writer.metrics`), summed per log and labelled `log`.
Nothing is counted twice and nothing is added to the write path: a scrape walks the open writers
(held weakly, see `woodpecker_idem.registry`). `serve(port)` also serves them over HTTP.

Series are named `woodpecker_<figure>` (counters `woodpecker_<figure>_total`), each with the
label `log`; `_SERIES` below lists them with their help text, and docs/operations.md says which to
alert on. The one histogram, `woodpecker_ack_latency_seconds` (`_bucket`, `_sum`, `_count`), has
the buckets of `writer.ack_latency`; OpenTelemetry, whose asynchronous instruments have no
histogram, gets its sum as the counter `woodpecker.ack_latency_seconds_sum` (its count is
`woodpecker.entries_acked`).
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from . import registry as writer_registry

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

# (series, kind, documentation, key in metrics_snapshot() / metrics, scale)
_SERIES: tuple[tuple[str, str, str, str, float], ...] = (
    (
        "duplicates_suppressed",
        "counter",
        "Idempotent writes answered with the original id",
        "duplicates_suppressed",
        1,
    ),
    ("window_evictions", "counter", "Keys aged or pushed out of the dedup window", "evictions", 1),
    (
        "window_early_evictions",
        "counter",
        "Keys pushed out of the dedup window before its duration (window too small)",
        "early_evictions",
        1,
    ),
    ("window_keys", "gauge", "Committed keys in the dedup window", "window_keys", 1),
    ("window_memory_bytes", "gauge", "Memory the dedup window uses", "window_memory_bytes", 1),
    ("pending_writes", "gauge", "Writes accepted and not yet acknowledged", "pending", 1),
    ("snapshot_writes", "counter", "Dedup snapshots written", "snapshot_writes", 1),
    (
        "snapshot_failures",
        "counter",
        "Dedup snapshot writes that failed (retried)",
        "snapshot_failures",
        1,
    ),
    ("snapshot_bytes", "counter", "Bytes of dedup snapshots written", "snapshot_bytes", 1),
    ("recovery_seconds", "gauge", "Duration of the last window rebuild", "recovery_seconds", 1),
    (
        "recovery_snapshot_age_seconds",
        "gauge",
        "Age of the snapshot the last window rebuild started from",
        "recovery_snapshot_age_ms",
        0.001,
    ),
    (
        "recovery_entries_replayed",
        "gauge",
        "Entries the last window rebuild read past its snapshot",
        "recovery_entries_replayed",
        1,
    ),
    (
        "recovery_corrupt_replicas",
        "gauge",
        "Corrupt replicas the last window rebuild met",
        "recovery_corrupt_replicas",
        1,
    ),
    ("segments_rolled", "counter", "Segments the writer rolled", "segments_rolled", 1),
    (
        "segments_repaired",
        "counter",
        "Segments completed after a node failed",
        "segments_repaired",
        1,
    ),
    (
        "background_retries",
        "counter",
        "Retried background operations (storage trouble)",
        "background_retries",
        1,
    ),
    ("entries_acked", "counter", "Entries that reached their ack quorum", "entries_acked", 1),
    (
        "ack_latency_seconds",
        "histogram",
        "Time from acceptance to ack of acked entries",
        "ack_latency_seconds",  # the sum; the buckets come from `writer.ack_latency`
        1,
    ),
    (
        "backpressure_waits",
        "counter",
        "Calls that waited for room (append.max_inflight_entries / max_inflight_bytes)",
        "backpressure_waits",
        1,
    ),
)


# Series that are not writer figures: (name, kind, help)
_OTHER: tuple[tuple[str, str, str], ...] = (
    ("writers_open", "gauge", "Writers open on the log in this process"),
    ("writers_fenced", "gauge", "Writers of this process fenced by a newer writer of the log"),
    (
        "reader_corrupt_replica_reads",
        "counter",
        "Reads that met a corrupt replica and went to another one",
    ),
    ("retention_segments_dropped", "counter", "Completed segments retention dropped"),
    ("retention_bytes_dropped", "counter", "Bytes of the segments retention dropped"),
    ("retention_failures", "counter", "Retention passes that failed (retried)"),
    (
        "segment_upload_conflicts",
        "gauge",
        "Completed segments not uploaded (staged storage): object storage holds a conflicting copy",
    ),
)
#: Every series: (name without the `woodpecker_` prefix and `_total` suffix, kind, help).
SERIES: tuple[tuple[str, str, str], ...] = (
    *((name, kind, doc) for name, kind, doc, _, _ in _SERIES),
    *_OTHER,
)


def _figures(writer: object) -> dict[str, Any]:
    """What a writer counts: the idempotent layer's snapshot and the core's counters."""
    out: dict[str, Any] = dict(getattr(writer, "metrics", {}) or {})
    snapshot = getattr(writer, "metrics_snapshot", None)
    if callable(snapshot):
        out.update(snapshot())
    return out


def _reported_writers() -> Iterator[tuple[Any, Any, bool, bool]]:
    """(writer, its log handle, live, fenced) of every writer whose figures are reported: open
    or fenced (a closed writer's figures end with it)."""
    for writer, handle in writer_registry.writers():
        live = writer_registry.is_live(writer)
        fenced = bool(getattr(writer, "fenced", False))
        if live or fenced:
            yield writer, handle, live, fenced


def collect_histograms() -> dict[str, dict[str, tuple[tuple[float, ...], list[int], float]]]:
    """Every histogram now: name -> {log name: (bucket upper bounds, entries per bucket, not
    cumulative, with +Inf last; the sum)}, summed over this process's writers as `collect`."""
    out: dict[str, dict[str, tuple[tuple[float, ...], list[int], float]]] = {
        "ack_latency_seconds": {}
    }
    latency = out["ack_latency_seconds"]
    for writer, handle, _, _ in _reported_writers():
        figures = getattr(writer, "ack_latency", None)
        if figures is None:
            continue
        bounds, counts, total = figures
        seen = latency.get(handle.name)
        if seen is not None:
            counts = [a + b for a, b in zip(seen[1], counts, strict=True)]
            total += seen[2]
        latency[handle.name] = (bounds, counts, total)
    return out


def collect() -> dict[str, dict[str, float]]:
    """Every series now: name -> {log name: value}, summed over this process's writers (open or
    fenced: a closed writer's figures end with it), readers, retention runners and the upload
    queues of staged storage."""
    out: dict[str, dict[str, float]] = {name: {} for name, _, _ in SERIES}
    for writer, handle, live, fenced in _reported_writers():
        figures = _figures(writer)
        for name, _, _, key, scale in _SERIES:
            value = figures.get(key)
            if value is not None:
                values = out[name]
                values[handle.name] = values.get(handle.name, 0) + value * scale
        for name, value in (("writers_open", live), ("writers_fenced", fenced)):
            values = out[name]
            values[handle.name] = values.get(handle.name, 0) + int(value)
    corrupt = out["reader_corrupt_replica_reads"]
    for reader, handle in writer_registry.readers():
        n = int(getattr(reader, "corrupt_replica_reads", 0))
        corrupt[handle.name] = corrupt.get(handle.name, 0) + n
    for runner in writer_registry.runners():
        for log_name, (n, nbytes) in dict(getattr(runner, "dropped", {})).items():
            for name, value in (
                ("retention_segments_dropped", n),
                ("retention_bytes_dropped", nbytes),
            ):
                out[name][log_name] = out[name].get(log_name, 0) + value
        for log_name, n in dict(getattr(runner, "failed", {})).items():
            failures = out["retention_failures"]
            failures[log_name] = failures.get(log_name, 0) + n
    conflicts = out["segment_upload_conflicts"]
    for uploads in writer_registry.uploads():
        for log_name, n in uploads.conflicts_by_log().items():  # type: ignore[attr-defined]
            conflicts[log_name] = conflicts.get(log_name, 0) + n
    return out


class WoodpeckerCollector:
    """A prometheus_client collector over every writer of this process (see the module doc)."""

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        now = collect()
        histograms = collect_histograms()
        for name, kind, doc in SERIES:
            if kind == "histogram":
                hist = HistogramMetricFamily(f"woodpecker_{name}", doc, labels=["log"])
                for log_name, (bounds, counts, total) in sorted(histograms[name].items()):
                    cumulative, buckets = 0, []
                    for bound, count in zip((*map(str, bounds), "+Inf"), counts, strict=True):
                        cumulative += count
                        buckets.append((bound, cumulative))
                    hist.add_metric([log_name], buckets, total)
                yield hist
                continue
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = cls(f"woodpecker_{name}", doc, labels=["log"])
            for log_name, value in sorted(now[name].items()):
                family.add_metric([log_name], value)
            yield family


_registered: weakref.WeakKeyDictionary[object, WoodpeckerCollector] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def register_prometheus(registry: CollectorRegistry | None = None) -> WoodpeckerCollector:
    """Register the collector on `registry` (prometheus_client's default when None); once per
    registry (a second call returns the first collector)."""
    try:
        from prometheus_client import REGISTRY
    except ImportError as exc:
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(
            "Prometheus metrics need prometheus_client: install the metrics extra "
            "(pip install '<the woodpecker_idem wheel>[metrics]', or pip install prometheus_client)"
        ) from exc
    target = REGISTRY if registry is None else registry
    with _lock:
        collector = _registered.get(target)
        if collector is None:
            collector = _registered[target] = WoodpeckerCollector()
            target.register(collector)
    return collector


def serve(
    port: int, addr: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> tuple[Any, threading.Thread]:
    """Register the collector and serve `registry` on http://addr:port/metrics in a daemon
    thread; returns prometheus_client's (server, thread): `server.shutdown()` stops it, and
    `server.server_port` is the port when `port` was 0."""
    register_prometheus(registry)
    from prometheus_client import REGISTRY, start_http_server

    server, thread = start_http_server(port, addr, registry=registry or REGISTRY)
    return server, thread


class _Snapshot:
    """`collect()` once per collection: OpenTelemetry calls each instrument's callback in turn,
    and walking every writer once per instrument would cost the series count over."""

    def __init__(self, max_age_s: float = 0.5):
        self._max_age_s = max_age_s
        self._at = -math.inf
        self._values: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> dict[str, float]:
        with self._lock:
            now = time.monotonic()
            if now - self._at > self._max_age_s:
                self._values, self._at = collect(), now
            return self._values.get(name, {})


def register_opentelemetry(meter_provider: Any = None) -> list[Any]:
    """The same series as OpenTelemetry observable instruments on `meter_provider` (the global
    one when None), named `woodpecker.<name>` with the attribute `log` (counters without
    `_total`: an exporter to Prometheus adds it). Needs `opentelemetry-api`. Returns the
    instruments."""
    try:
        from opentelemetry import metrics as otel
    except ImportError as exc:
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(
            "OpenTelemetry metrics need opentelemetry-api: install the otel extra "
            "(pip install '<the woodpecker_idem wheel>[otel]', or pip install opentelemetry-api)"
        ) from exc
    provider = meter_provider if meter_provider is not None else otel.get_meter_provider()
    meter = provider.get_meter("woodpecker_idem")
    snapshot = _Snapshot()
    instruments = []
    for name, kind, doc in SERIES:

        def observe(options: Any, name: str = name) -> list[Any]:
            return [otel.Observation(v, {"log": log}) for log, v in snapshot.get(name).items()]

        if kind == "histogram":  # its sum as a counter (its count is entries_acked)
            instruments.append(
                meter.create_observable_counter(
                    f"woodpecker.{name}_sum", callbacks=[observe], description=f"{doc} (sum)"
                )
            )
            continue
        create = (
            meter.create_observable_counter
            if kind == "counter"
            else (meter.create_observable_gauge)
        )
        instruments.append(create(f"woodpecker.{name}", callbacks=[observe], description=doc))
    return instruments


__all__ = [
    "SERIES",
    "WoodpeckerCollector",
    "collect",
    "collect_histograms",
    "register_opentelemetry",
    "register_prometheus",
    "serve",
]
