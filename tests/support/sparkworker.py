"""A stand-in for one of Spark's Python workers, for tests/spark/test_spark_handoff.py: it runs
streaming sink tasks (`write_batches`, as a worker runs them) one at a time, keeps their writers
between tasks and serves them to sibling workers, as a reused Python worker does.

    python tests/support/sparkworker.py DATA_DIR QUERY_ID

Reads one JSON request a line on stdin:

    {"batch": b, "route": r, "start": s, "n": n, "attempt": a, "pause_after": k}

writes the micro-batch `b`'s rows of route r (order ids s..s+n-1 that route to r, in Arrow
batches of 10, as Spark partition r of the log group "orders" of 2 logs), then marks its batch
records committed as the driver does when the task succeeded. With `pause_after`, it prints
`{"paused": true}` once k rows are written and waits for a line on stdin before going on.
Answers one JSON line a request: the task's commit message fields and `"ok": true`, or
`"ok": false` with the error's class and message.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Iterator

import pyarrow as pa

from woodpecker_idem._core import arrow_explicit_keys, route_keys
from woodpecker_idem.retry import Backoff
from woodpecker_idem.spark import ROUTE_COLUMN
from woodpecker_idem.spark.batches import STREAM_APP_PREFIX, BatchId
from woodpecker_idem.spark.options import SinkOptions
from woodpecker_idem.spark.sink import WoodpeckerCommitMessage, mark_committed, write_batches

P = 2


def route_batches(route: int, start: int, n: int) -> list[pa.RecordBatch]:
    """The rows of order ids start..start+n-1 that route to `route`, as prepare() hands them."""
    ids = pa.array(range(start, start + n), pa.int64())
    routes = memoryview(route_keys(arrow_explicit_keys(ids), P)).cast("i")
    ours = [i for i, r in zip(range(start, start + n), routes, strict=True) if r == route]
    mine = pa.array(ours, pa.int64())
    out = []
    for s in range(0, len(mine), 10):
        part = mine.slice(s, 10)
        out.append(
            pa.record_batch(
                {"order_id": part, ROUTE_COLUMN: pa.array([route] * len(part), pa.int32())}
            )
        )
    return out


def run(opts: SinkOptions, request: dict) -> dict:
    route = request["route"]
    opts = dataclasses.replace(opts, batch_id=BatchId(opts.batch_id.app_id, request["batch"]))
    msg = WoodpeckerCommitMessage(partition=route, attempt=request.get("attempt", 0))
    pause_after = request.get("pause_after")

    def batches() -> Iterator[pa.RecordBatch]:
        paused = pause_after is None
        for batch in route_batches(route, request["start"], request["n"]):
            if not paused and msg.rows + batch.num_rows > pause_after:
                paused = True
                # the write thread runs behind the batches handed over: wait for it
                wait = Backoff(0.01, 0.1, budget_s=120)
                while msg.rows < pause_after and wait.wait():
                    pass
                print(json.dumps({"paused": True}), flush=True)
                sys.stdin.readline()
            yield batch

    try:
        write_batches(opts, batches(), msg)
    except Exception as exc:  # reported to the test
        return {"ok": False, "error": type(exc).__name__, "message": str(exc)}
    mark_committed(opts, [msg])
    fields = {k: v for k, v in dataclasses.asdict(msg).items() if k != "txns"}
    return {"ok": True, **fields}


def main() -> None:
    data_dir, query_id = sys.argv[1], sys.argv[2]
    raw = {
        "log": "orders",
        "partitions": str(P),
        "dataDir": data_dir,
        "idempotencyKey": "order_id",
    }
    opts = SinkOptions.parse(raw, need_partitions=True)
    opts = dataclasses.replace(opts, batch_id=BatchId(STREAM_APP_PREFIX + query_id, 0))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run(opts, json.loads(line))), flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    main()
