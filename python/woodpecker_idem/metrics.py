"""Prometheus metrics (the `metrics` extra: `pip install 'woodpecker-idem[metrics]'`).

`register_prometheus(registry=None)` adds a collector to `registry` (prometheus_client's default
registry when None) that reads, at each scrape, the figures every writer of this process already
counts (`writer.metrics_snapshot()`, `writer.metrics`), summed per log and labelled `log`.
Nothing is counted twice and nothing is added to the write path: a scrape walks the open writers
(held weakly, see `woodpecker_idem.registry`). `serve(port)` also serves them over HTTP.

Series are named `woodpecker_<figure>` (counters `woodpecker_<figure>_total`), each with the
label `log`; `_SERIES` below lists them with their help text, and docs/operations.md says which to
alert on.
"""

from __future__ import annotations

import threading
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
)


def _figures(writer: object) -> dict[str, Any]:
    """What a writer counts: the idempotent layer's snapshot and the core's counters."""
    out: dict[str, Any] = dict(getattr(writer, "metrics", {}) or {})
    snapshot = getattr(writer, "metrics_snapshot", None)
    if callable(snapshot):
        out.update(snapshot())
    return out


class WoodpeckerCollector:
    """A prometheus_client collector over every writer of this process (see the module doc)."""

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        per_log: dict[str, list[object]] = {}
        for writer, handle in writer_registry.writers():
            # a closed writer's figures end with it; a fenced one is counted until it is closed
            # or dropped (it is what an alert on fences looks for)
            if writer_registry.is_live(writer) or getattr(writer, "fenced", False):
                per_log.setdefault(handle.name, []).append(writer)
        families: list[Any] = []
        for name, kind, doc, key, scale in _SERIES:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = cls(f"woodpecker_{name}", doc, labels=["log"])
            for log_name, writers in sorted(per_log.items()):
                values = [_figures(w).get(key) for w in writers]
                present = [v for v in values if v is not None]
                if present:
                    family.add_metric([log_name], sum(present) * scale)
            families.append(family)
        open_ = GaugeMetricFamily(
            "woodpecker_writers_open", "Writers open on the log in this process", labels=["log"]
        )
        fenced = GaugeMetricFamily(
            "woodpecker_writers_fenced",
            "Writers of this process fenced by a newer writer of the log",
            labels=["log"],
        )
        for log_name, writers in sorted(per_log.items()):
            open_.add_metric([log_name], sum(writer_registry.is_live(w) for w in writers))
            fenced.add_metric([log_name], sum(bool(getattr(w, "fenced", False)) for w in writers))
        yield from families
        yield open_
        yield fenced
        yield from _reader_and_retention_families()


def _reader_and_retention_families() -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily

    corrupt = CounterMetricFamily(
        "woodpecker_reader_corrupt_replica_reads",
        "Reads that met a corrupt replica and went to another one",
        labels=["log"],
    )
    per_log: dict[str, int] = {}
    for reader, handle in writer_registry.readers():
        n = int(getattr(reader, "corrupt_replica_reads", 0))
        per_log[handle.name] = per_log.get(handle.name, 0) + n
    for log_name, n in sorted(per_log.items()):
        corrupt.add_metric([log_name], n)
    yield corrupt
    segments = CounterMetricFamily(
        "woodpecker_retention_segments_dropped",
        "Completed segments retention dropped",
        labels=["log"],
    )
    nbytes = CounterMetricFamily(
        "woodpecker_retention_bytes_dropped",
        "Bytes of the segments retention dropped",
        labels=["log"],
    )
    failures = CounterMetricFamily(
        "woodpecker_retention_failures",
        "Retention passes that failed (retried)",
        labels=["log"],
    )
    dropped: dict[str, list[int]] = {}
    failed: dict[str, int] = {}
    for runner in writer_registry.runners():
        for log_name, (n, b) in dict(getattr(runner, "dropped", {})).items():
            acc = dropped.setdefault(log_name, [0, 0])
            acc[0] += n
            acc[1] += b
        for log_name, n in dict(getattr(runner, "failed", {})).items():
            failed[log_name] = failed.get(log_name, 0) + n
    for log_name, (n, b) in sorted(dropped.items()):
        segments.add_metric([log_name], n)
        nbytes.add_metric([log_name], b)
    for log_name, n in sorted(failed.items()):
        failures.add_metric([log_name], n)
    yield segments
    yield nbytes
    yield failures


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
            "Prometheus metrics need prometheus_client: pip install 'woodpecker-idem[metrics]'"
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


__all__ = ["WoodpeckerCollector", "register_prometheus", "serve"]
