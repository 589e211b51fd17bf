"""Metadata backends side by side: writer takeover time and metadata operations per second, SQLite
(the embedded default, fsync on every commit) vs etcd (one local member started for the bench,
reached over its JSON gateway; etcd fsyncs its WAL on every write too).

Rounds are interleaved (SQLite, etcd, SQLite, etcd, ...) and each side is judged on its median;
the ratio etcd/SQLite of the medians is reported. Only what is sound on a shared machine is
asserted: loose absolute floors that a working etcd on localhost meets with a wide margin. The
ratio is reported, not asserted: it depends on the disk's fsync latency more than on our code.

As a bench: `pytest benches/bench_meta.py --benchmark-json=...` (figures in extra_info).
As a script: `.venv/bin/python benches/bench_meta.py [--rounds N]`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from etcdserver import EtcdServer  # noqa: E402

import woodpecker_idem as wp  # noqa: E402
from woodpecker_idem.meta import MetadataStore, SegmentMeta  # noqa: E402
from woodpecker_idem.types import SegmentState  # noqa: E402

ROUNDS = 7
TAKEOVERS = 10  # per round and side
OPS = 40  # segment lifecycles per round and side (4 metadata calls each)
NOW = 1_700_000_000_000


def _config(backend: str, server: EtcdServer | None) -> dict[str, object]:
    if backend == "sqlite":
        return {}
    assert server is not None
    return {
        "meta.type": "etcd",
        "meta.endpoints": [server.endpoint],
        "meta.prefix": f"/bench-{uuid.uuid4().hex[:8]}",
    }


def takeover_ms(client: wp.WoodpeckerClient, n: int) -> list[float]:
    """`open_writer()` on a log whose previous writer was abandoned (a crash): bump the epoch,
    complete the segment it left, open a new one. One sample per takeover."""
    log = client.open_log(f"t-{uuid.uuid4().hex[:6]}", create=True)
    previous = log.open_writer()
    previous.write(b"x")
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        w = log.open_writer()
        samples.append((time.perf_counter() - start) * 1e3)
        w.write(b"x")
        previous.close(timeout=1)  # fenced: it stops its threads, writes nothing
        previous = w
    previous.close()
    return samples


def _lifecycle(meta: MetadataStore, log_id: int, epoch: int, segment_id: int) -> None:
    """What a writer does per segment: create, read back, epoch check, complete (CAS)."""
    seg = meta.create_segment(
        epoch,
        SegmentMeta(log_id, segment_id, SegmentState.ACTIVE, ("node-0",), 1, 1, 1, NOW),
    )
    got = meta.get_segment(log_id, segment_id)
    assert got == seg
    meta.check_epoch(log_id, epoch)
    done = SegmentMeta(
        log_id,
        segment_id,
        SegmentState.COMPLETED,
        ("node-0",),
        1,
        1,
        1,
        NOW,
        99,
        NOW,
        1024,
        seg.revision,
    )
    meta.update_segment(epoch, done)


def ops_per_s(meta: MetadataStore, n: int) -> float:
    """Metadata calls per second over `n` segment lifecycles (4 calls each), one thread."""
    m = meta.create_log(f"o-{uuid.uuid4().hex[:6]}", NOW)
    epoch = meta.take_over(m.log_id, "bench", NOW, 30_000)
    start = time.perf_counter()
    for sid in range(n):
        _lifecycle(meta, m.log_id, epoch, sid)
    return 4 * n / (time.perf_counter() - start)


@contextmanager
def _sides(workdir: Path) -> Iterator[dict[str, wp.WoodpeckerClient]]:
    with EtcdServer() as server:
        clients = {b: wp.connect(workdir / b, _config(b, server)) for b in ("sqlite", "etcd")}
        try:
            yield clients
        finally:
            for c in clients.values():
                c.close()


def run(workdir: Path, rounds: int = ROUNDS) -> dict[str, dict[str, float]]:
    """Interleaved rounds; returns per-side medians and the etcd/sqlite ratios."""
    take: dict[str, list[float]] = {"sqlite": [], "etcd": []}
    ops: dict[str, list[float]] = {"sqlite": [], "etcd": []}
    with _sides(workdir) as clients:
        for side in clients:  # warm up both (connections, first lease, page cache)
            takeover_ms(clients[side], 2)
            ops_per_s(clients[side].meta, 5)
        for _ in range(rounds):
            for side, client in clients.items():
                take[side].append(statistics.median(takeover_ms(client, TAKEOVERS)))
                ops[side].append(ops_per_s(client.meta, OPS))
    out: dict[str, dict[str, float]] = {}
    for side in ("sqlite", "etcd"):
        out[side] = {
            "takeover_median_ms": statistics.median(take[side]),
            "takeover_max_round_ms": max(take[side]),
            "meta_ops_per_s_median": statistics.median(ops[side]),
        }
    out["ratio_etcd_over_sqlite"] = {
        "takeover_ms": out["etcd"]["takeover_median_ms"] / out["sqlite"]["takeover_median_ms"],
        "meta_ops_per_s": out["etcd"]["meta_ops_per_s_median"]
        / out["sqlite"]["meta_ops_per_s_median"],
    }
    return out


def _check(figures: dict[str, dict[str, float]]) -> None:
    """Loose floors: a takeover on local etcd well under a second, and a writer's metadata calls
    far faster than any roll rate it needs (one roll per segment: a handful of calls)."""
    assert figures["etcd"]["takeover_median_ms"] < 500, figures
    assert figures["etcd"]["meta_ops_per_s_median"] >= 50, figures
    assert figures["sqlite"]["meta_ops_per_s_median"] >= 50, figures


def test_meta_backends(benchmark, tmp_path) -> None:
    figures = run(tmp_path)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    benchmark.extra_info.update(figures)
    print("\nmetadata backends (medians of interleaved rounds):")
    for side, values in figures.items():
        print(f"  {side}: " + ", ".join(f"{k}={v:.3g}" for k, v in values.items()))
    _check(figures)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-meta-") as d:
        figures = run(Path(d), args.rounds)
    for side, values in figures.items():
        print(f"{side}: " + ", ".join(f"{k}={v:.3g}" for k, v in values.items()))
    _check(figures)


if __name__ == "__main__":
    main()
