"""Command line: `woodpecker-idem demo` runs the main job on the embedded default.

The demo is a producer that retries like real ones do: acks lost on the node, application-level
resends, and its writer abandoned mid-stream (a crash) with a new writer taking over and replaying
the uncertain tail. It prints what was attempted, what landed, and the history checker's verdict.
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import DedupWindow, connect, decode_snapshot, encode_snapshot, explicit_key
from .errors import LogNotFoundError, WoodpeckerError
from .history import History
from .logstore.transport import FaultInjectingTransport


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


def demo(data_dir: Path, records: int, seed: int) -> int:
    _core_figures()
    rng = random.Random(seed)
    client = connect(data_dir)
    faults = FaultInjectingTransport(client.transport)
    client.transport = faults
    try:
        client.delete_log("demo")
    except LogNotFoundError:
        pass
    log_handle = client.create_log("demo")
    history = History()
    writer = log_handle.open_writer(idempotent=True)
    crash_at = records // 2
    lost_acks = app_retries = 0

    inflight: list[tuple[bytes, object]] = []

    def attempt(i: int) -> None:
        oid = f"order-{i}"
        payload = f"order {i}: {rng.randint(1, 999)} units".encode()
        key = explicit_key(oid)
        try:
            inflight.append((key, writer.write_async(payload, idempotency_id=oid)))
        except WoodpeckerError as exc:
            history.failed(key, exc)

    def settle() -> None:
        for key, future in inflight:
            try:
                history.ok(key, future.result(30))
            except WoodpeckerError as exc:
                history.failed(key, exc)
        inflight.clear()

    for i in range(records):
        if rng.random() < 0.03:
            faults.drop_acks("node-0")  # the node applies the batch, its ack is lost
            lost_acks += 1
        attempt(i)
        if rng.random() < 0.2:  # the application resends anyway (it lost the ack itself)
            app_retries += 1
            attempt(i)
        if i % 100 == 99:
            settle()
        if i == crash_at:
            # Crash: the writer is abandoned mid-stream with writes in flight; a new one takes
            # over (fencing it), rebuilds its window, and the producer replays its uncertain tail.
            writer = log_handle.open_writer(idempotent=True)
            settle()
            for j in range(max(0, i - 200), i + 1):
                attempt(j)
    settle()
    writer.close()
    report = writer.recovery
    metrics = writer.metrics_snapshot()
    window_ms = writer.window.window_ms
    messages = list(log_handle.open_reader("earliest"))
    verdict = history.check(messages, window_ms, writer.window.max_keys)
    client.close()
    print(
        f"producer: {records:,} records, {len(history.attempts):,} attempts "
        f"({app_retries} application resends, {lost_acks} acks lost on the node, "
        f"1 writer crash with takeover and a 200-record replay)"
    )
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="woodpecker-idem")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser(
        "demo", help="idempotent producer with injected faults, judged by the checker"
    )
    d.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the embedded log lives (default: a fresh temporary directory)",
    )
    d.add_argument("--records", type=int, default=3000)
    d.add_argument("--seed", type=int, default=7)
    d.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.command == "demo":
        tmp = None
        data_dir = args.data_dir
        if data_dir is None:
            tmp = data_dir = Path(tempfile.mkdtemp(prefix="woodpecker-demo-"))
        try:
            return demo(data_dir, args.records, args.seed)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
