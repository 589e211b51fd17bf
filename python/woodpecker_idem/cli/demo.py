"""`woodpecker-idem pipeline` runs the main job (a Spark job writing an order stream exactly once,
`woodpecker_idem.spark.orders_job`); `woodpecker-idem demo` the idempotent producer.

The demo is a producer that retries like real ones do: acks lost on the node, resends by the
application, and a producer process SIGKILLed mid-stream whose restart replays everything since
its last checkpoint. It prints what was attempted, what landed, and the history checker's verdict
(exit status 1 if the checker finds a duplicate in the window or a lost acknowledged write).

The demo never touches existing logs: it writes a new log with a unique name (`demo-<time>-<hex>`),
so `--data-dir` may point at a directory that holds real data.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from .. import (
    LogMessageId,
    WriteResult,
    connect,
    explicit_key,
)
from .._core import DedupWindow, decode_snapshot, encode_snapshot
from ..clock import SYSTEM_CLOCK
from ..errors import InvalidArgumentError, WoodpeckerError
from ..testing.faults import FaultInjectingTransport
from ..testing.history import History, Stamp
from .common import int_in, run_job


def _core_figures() -> None:
    n = 100_000
    window = DedupWindow(n, 600_000)
    keys = random.Random(1).randbytes(16 * n)
    ts = 1_700_000_000_000
    from array import array

    window.add_committed_many(
        keys,
        array("q", [i // 40_000 for i in range(n)]),
        array("q", [i % 40_000 for i in range(n)]),
        array("q", [ts + i * 6 for i in range(n)]),
    )
    started = time.perf_counter()
    data = encode_snapshot(window, 1, 1, ts + n * 6, {0: 39_999, 1: 39_999, 2: 19_999})
    encode_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    restored = decode_snapshot(data).to_window()
    decode_ms = (time.perf_counter() - started) * 1000
    assert restored.committed_entries() == window.committed_entries()
    print(
        f"core: window of {n:,} keys uses {window.memory_bytes() / n:.1f} B/key; snapshot "
        f"{len(data) / n:.2f} B/entry, encoded in {encode_ms:.1f} ms, restored in "
        f"{decode_ms:.1f} ms"
    )


def _payload(i: int) -> bytes:
    return f"order {i}: {i * 7919 % 997 + 1} units".encode()


class _Producer:
    """Writes orders through an idempotent writer, recording every attempt in the history."""

    def __init__(self, writer, history: History):
        self.writer = writer
        self.history = history
        self.inflight: list[tuple[int, bytes, bytes, Stamp, Future[WriteResult]]] = []
        self.failed: set[int] = set()

    def attempt(self, i: int) -> None:
        oid = f"order-{i}"
        key, payload, start = explicit_key(oid), _payload(i), self.history.now()
        try:
            future = self.writer.write_async(payload, idempotency_id=oid)
        except WoodpeckerError as exc:
            self.history.failed(key, payload, exc, start)
            self.failed.add(i)
            return
        self.inflight.append((i, key, payload, start, future))

    def settle(self) -> None:
        """Wait for every write in flight; like an application, resend the failed ones (a retry
        of an idempotent write is safe) until each is acknowledged."""
        for _ in range(20):
            for i, key, payload, start, future in self.inflight:
                try:
                    self.history.ok(key, payload, future.result(30), start)
                    self.failed.discard(i)
                except WoodpeckerError as exc:
                    self.history.failed(key, payload, exc, start)
                    self.failed.add(i)
            self.inflight.clear()
            if not self.failed:
                return
            time.sleep(0.05)
            for i in sorted(self.failed):
                self.attempt(i)


def _killed_producer(
    data_dir: Path, log_name: str, start: int, stop: int, history: History
) -> tuple[int, int]:
    """Run a producer in a child process and SIGKILL it once it has acknowledged a third of its
    new writes, while more are in flight. Every line it printed before dying is read (a line cut
    by the kill is dropped). Returns (acks, writes in flight at the kill)."""
    cmd = [sys.executable, "-m", "woodpecker_idem.cli", "_produce", str(data_dir), log_name]
    child = subprocess.Popen([*cmd, str(start), str(stop)], stdout=subprocess.PIPE)
    assert child.stdout is not None
    sent: dict[int, Stamp] = {}
    acked: set[int] = set()
    kill_at: Stamp | None = None
    buf = b""
    try:
        while chunk := os.read(child.stdout.fileno(), 1 << 16):  # until EOF: after the kill too
            buf += chunk
            *lines, buf = buf.split(b"\n")  # what is left in buf is a line cut by the kill
            for line in lines:
                fields = line.decode().split()
                if fields[0] == "B":  # a burst of writes about to go out
                    lo, hi, ms, ns = (int(x) for x in fields[1:])
                    sent.update((i, Stamp(ms, ns)) for i in range(lo, hi))
                    continue
                i, seg, entry, dup, ms, ns = (int(x) for x in fields)
                result = WriteResult(LogMessageId(seg, entry), bool(dup))
                history.ok(explicit_key(f"order-{i}"), _payload(i), result, sent[i], Stamp(ms, ns))
                acked.add(i)
            if kill_at is None and len(acked) >= (stop - start) // 3:
                child.kill()  # SIGKILL, by PID: no close, no flush, no final snapshot
                kill_at = history.now()
    finally:
        if kill_at is None:
            child.kill()
            kill_at = history.now()
        child.wait()
        child.stdout.close()
    in_flight = set(sent) - acked
    for i in in_flight:  # sent, never answered: it may or may not have landed
        history.failed(explicit_key(f"order-{i}"), _payload(i), "SIGKILL", sent[i], kill_at)
    return len(acked), len(in_flight)


def _produce(data_dir: Path, log_name: str, start: int, stop: int) -> int:
    """The child side of the demo: writes orders in bursts of 50. Prints `B lo hi ms ns` before a
    burst goes out and `i segment entry dup ms ns` per ack (times: the wall clock in ms, then
    time.monotonic_ns()), each line flushed whole."""
    if not data_dir.is_dir():  # the demo made it: never create one here
        raise InvalidArgumentError(f"data_dir {str(data_dir)!r} is not an existing directory")
    client = connect(data_dir)
    writer = client.open_log(log_name).open_writer(idempotent=True)
    for lo in range(start, stop, 50):
        hi = min(lo + 50, stop)
        print("B", lo, hi, SYSTEM_CLOCK.now_ms(), time.monotonic_ns(), flush=True)
        futures = [
            (i, writer.write_async(_payload(i), idempotency_id=f"order-{i}")) for i in range(lo, hi)
        ]
        for i, future in futures:
            r = future.result(30)
            mid = r.message_id
            now = f"{SYSTEM_CLOCK.now_ms()} {time.monotonic_ns()}"
            print(i, mid.segment_id, mid.entry_id, int(r.duplicate), now, flush=True)
    writer.close()
    return 0


def _demo_log_name() -> str:
    """A name no earlier run used: the demo must never write into (or delete) existing logs."""
    return f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


def demo(data_dir: Path, records: int, seed: int) -> int:
    _core_figures()
    rng = random.Random(seed)
    history = History()
    half = records // 2
    lost_acks = app_retries = 0

    # 1. In this process: acks lost on the node, and resends by the application itself.
    client = connect(data_dir)
    faults = FaultInjectingTransport(client.transport)
    client.transport = faults
    log_name = _demo_log_name()
    log_handle = client.create_log(log_name)  # LogExistsError rather than reuse a log
    producer = _Producer(log_handle.open_writer(idempotent=True), history)
    for i in range(half):
        if rng.random() < 0.03:
            # the node applies the next batch, its ack is lost (settled first: with group commit
            # a batch is sent at once, and lost acks piled up on one batch would exhaust its
            # append.max_retries and drop the only node; one at a time, each costs one resend)
            producer.settle()
            faults.drop_acks("node-0")
            lost_acks += 1
        producer.attempt(i)
        if rng.random() < 0.2:  # the application resends anyway (it lost the ack itself)
            app_retries += 1
            producer.attempt(i)
        if i % 100 == 99:
            producer.settle()
    producer.settle()
    producer.writer.close()

    # 2. A producer process killed with SIGKILL mid-stream, writes in flight.
    child_acks, child_in_flight = _killed_producer(data_dir, log_name, half, records, history)

    # 3. The restarted producer takes over (completing the dead writer's segment, rebuilding
    #    the window) and, not knowing what landed, replays everything since the last checkpoint.
    writer = log_handle.open_writer(idempotent=True)
    producer = _Producer(writer, history)
    replay_from = max(0, half - 200)
    for i in range(replay_from, records):
        producer.attempt(i)
        if i % 100 == 99:
            producer.settle()
    producer.settle()
    writer.close()
    report = writer.recovery
    metrics = writer.metrics_snapshot()
    messages = list(log_handle.open_reader("earliest"))
    verdict = history.check(messages, writer.window.window_ms, writer.window.max_keys)
    client.close()
    print(
        f"producer: {records:,} records, {len(history.attempts):,} attempts "
        f"({app_retries} application resends, {lost_acks} acks lost on the node, a producer "
        f"process SIGKILLed after {child_acks} acks with {child_in_flight} writes in flight, "
        f"then a restart replaying "
        f"{records - replay_from:,} records)"
    )
    print(f"demo log: {log_name!r} in {data_dir}")
    print(
        f"log: {len(messages):,} entries appended; {verdict.duplicates_returned:,} duplicates "
        f"suppressed (returned the original id)"
    )
    if report is not None:
        print(
            f"takeover: window rebuilt in {report.seconds * 1000:.1f} ms from "
            f"{report.snapshot_key_count} snapshot keys + {report.entries_replayed} replayed "
            f"entries; snapshots written {metrics['snapshot_writes']}"
        )
    print(f"checker: {verdict.summary()}")
    return 0 if verdict.ok and len(messages) == records else 1


MIN_RECORDS = 100
MAX_RECORDS = 10_000_000


def add_parsers(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    """The `pipeline` and `demo` commands, and the demo's hidden child `_produce`."""
    sp = add_parser(
        "pipeline",
        help="Spark job: an order stream with task failures and duplicate deliveries, written "
        "exactly once and judged by the checker (needs the spark extra and Java 17)",
    )
    sp.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the embedded log lives (default: a fresh temporary directory); the job "
        "writes a new log group with a unique name",
    )
    sp.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="write to the deployment this config names instead (every executor connects with "
        "it): e.g. the woodpecker.yaml of `woodpecker-idem cluster up` (service mode)",
    )
    sp.add_argument(
        "--orders",
        type=int_in(MIN_RECORDS, MAX_RECORDS),
        default=200_000,
        help=f"orders to generate ({MIN_RECORDS:,}..{MAX_RECORDS:,}; default 200,000)",
    )
    sp.add_argument("--partitions", type=int_in(1, 64), default=4, help="P (default 4)")
    sp.add_argument(
        "--duplicates",
        type=int_in(0, MAX_RECORDS),
        default=2000,
        help="orders the upstream delivers twice in each run (default 2,000)",
    )
    sp.add_argument(
        "--failures",
        type=int_in(0, 64),
        default=2,
        help="tasks whose first attempt fails after k rows, in each run (default 2)",
    )
    sp.add_argument("--seed", type=int, default=7, help="seed of the injected failures")
    sp.add_argument("-v", "--verbose", action="store_true")
    d = add_parser("demo", help="idempotent producer with injected faults, judged by the checker")
    d.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the embedded log lives (default: a fresh temporary directory); existing "
        "logs there are left alone: the demo writes a new log with a unique name",
    )
    d.add_argument(
        "--records",
        type=int_in(MIN_RECORDS, MAX_RECORDS),
        default=3000,
        help=f"orders to write ({MIN_RECORDS:,}..{MAX_RECORDS:,}; default 3000)",
    )
    d.add_argument("--seed", type=int, default=7, help="seed of the injected faults")
    d.add_argument("-v", "--verbose", action="store_true")
    # The demo's child producer (killed on purpose): internal, so not listed in --help.
    p = add_parser("_produce")  # no help=: argparse then leaves it out of the list
    p.add_argument("data_dir", type=Path)
    p.add_argument("log_name")
    p.add_argument("start", type=int_in(0, MAX_RECORDS))
    p.add_argument("stop", type=int_in(0, MAX_RECORDS))
    p.set_defaults(verbose=False)


def run(args: argparse.Namespace) -> int:
    if args.command == "pipeline":
        return _with_data_dir(args.data_dir, lambda d: _pipeline(d, args))
    if args.command == "_produce":
        return run_job(
            "_produce", lambda: _produce(args.data_dir, args.log_name, args.start, args.stop)
        )
    return _with_data_dir(
        args.data_dir, lambda d: run_job("demo", lambda: demo(d, args.records, args.seed))
    )


def _with_data_dir(data_dir: Path | None, job: Callable[[Path], int]) -> int:
    """Run in the given data directory, or in a temporary one removed afterwards."""
    if data_dir is not None:
        return job(data_dir)
    tmp = Path(tempfile.mkdtemp(prefix="woodpecker-demo-"))
    try:
        return job(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pipeline(data_dir: Path, args: argparse.Namespace) -> int:
    """The Spark pipeline; a missing pyspark or Java, or a failed job, is one line on stderr."""
    try:
        from ..spark.orders_job import PipelineSpec, run_pipeline, summary_lines
    except ImportError as exc:
        print(
            f"woodpecker-idem pipeline: needs the spark extra ({exc}): pip install "
            "'<the woodpecker_idem wheel>[spark]' (and a Java 17 runtime), or run ./scripts/demo",
            file=sys.stderr,
        )
        return 2
    spec = PipelineSpec(args.orders, args.partitions, args.duplicates, args.failures, args.seed)
    try:
        result = run_pipeline(data_dir, spec, args.config)
    except (WoodpeckerError, OSError) as exc:
        print(f"woodpecker-idem pipeline: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # Spark's errors (no Java, a job that failed) carry pages of trace
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(
            f"woodpecker-idem pipeline: Spark failed: {type(exc).__name__}: {first}",
            file=sys.stderr,
        )
        return 2
    if args.config is not None:
        where = f"the deployment of {args.config}"
    else:
        where = str(data_dir) if args.data_dir else "a temporary directory, now removed"
    for line in summary_lines(result, where):
        print(line)
    return 0 if result.passed else 1
