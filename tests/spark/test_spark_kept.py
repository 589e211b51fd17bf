"""A streaming query's writers stay open in the Python workers between micro-batches, and a task
that Spark runs in another worker than the one keeping its route's writer hands its rows to that
worker: no new segment per log per micro-batch, whichever worker runs a route's task.

A fresh local Spark with two task slots (`local[2]`: two Python workers, and which one runs a
route's task is Spark's choice) runs 16 micro-batches into 2 logs (tests/support/streamproc.py):
each log keeps the one segment its first writer opened, and every key is in the log once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sparkenv import PACKAGE_PARENT, judge_group, order_keys

from woodpecker_idem import connect

BATCHES = 16
ROWS = 200
SCRIPT = str(Path(__file__).resolve().parents[1] / "support" / "streamproc.py")


def test_micro_batches_in_two_workers_write_through_one_writer_per_log(tmp_path: Path):
    env = dict(os.environ)
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH")) if p),
    )
    data_dir = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, SCRIPT, str(data_dir), "--master", "local[2]"]
        + ["--batches", str(BATCHES), "--rows", str(ROWS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    reports = [json.loads(x) for x in (data_dir / "reports.jsonl").read_text().splitlines()]
    assert [r["written"] for r in reports] == [ROWS] * BATCHES
    assert out["segments_per_log"] == [1, 1]  # not one per micro-batch, nor one per move
    # Spark moved routes between the workers (each move, unserved, was a take-over). Where
    # both routes' tasks of a micro-batch land is Spark's pick: all 15 landing as the first
    # did has odds ~2^-15.
    assert out["handed_off"] > 0
    client = connect(data_dir)
    try:
        judge_group(client, "kept", order_keys(0, BATCHES * ROWS), 2)
    finally:
        client.close()
