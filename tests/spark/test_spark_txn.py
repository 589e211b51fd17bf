"""Batch identities on a real local Spark: exactly-once beyond the key window.

The window here lasts 1 s (`windowDurationS`) and every re-run comes after it: only the batch
identities (`txnAppId` / `txnVersion`, or a streaming query's micro-batch) stand between a re-run
and a second copy of its rows. Judged by reading every log back (history checker and census).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
from sparkenv import (
    judge_group,
    order_keys,
    orders,
    spark,  # noqa: F401 - the session fixture
)

from woodpecker_idem import connect
from woodpecker_idem.spark import prepare
from woodpecker_idem.spark.batches import BatchId, begin
from woodpecker_idem.spark.options import ensure_log_group

P = 4
ROWS = 2000
WINDOW_S = 1.0


def after_the_window() -> None:
    time.sleep(WINDOW_S * 2.5)


def save(df, data_dir: Path, log: str = "orders", **options) -> None:
    w = (
        df.write.format("woodpecker")
        .option("log", log)
        .option("partitions", P)
        .option("dataDir", str(data_dir))
        .option("idempotencyKey", "order_id")
        .option("windowDurationS", WINDOW_S)
        .option("reportFile", str(data_dir / "reports.jsonl"))
        .mode("append")
    )
    for k, v in options.items():
        w = w.option(k, v)
    w.save()


def last_report(data_dir: Path) -> dict:
    return json.loads((data_dir / "reports.jsonl").read_text().splitlines()[-1])


def entries(data_dir: Path, log: str) -> int:
    client = connect(data_dir)
    try:
        return sum(len(list(client.open_log(f"{log}-{p}").open_reader())) for p in range(P))
    finally:
        client.close()


def judge(data_dir: Path, log: str, keys: set[bytes]) -> None:
    client = connect(data_dir)
    try:
        judge_group(client, log, keys, P)
    finally:
        client.close()


def fail_while(marker: Path, after: dict[int, int]):
    """mapInArrow: every attempt of partition p fails after `after[p]` rows while `marker`
    exists (the job is cut short: Spark gives up after its task retries)."""

    def fn(batches):
        from pyspark import TaskContext

        k = after.get(TaskContext.get().partitionId()) if marker.exists() else None
        seen = 0
        for b in batches:
            if k is not None and seen + b.num_rows > k:
                if k > seen:
                    yield b.slice(0, k - seen)
                time.sleep(2)  # the sink writes what reached it before the task dies
                raise RuntimeError(f"injected failure after {k} rows")
            seen += b.num_rows
            yield b

    return fn


def test_a_committed_txn_version_rerun_after_the_window_writes_nothing(spark, tmp_path):  # noqa: F811
    prepared = prepare(orders(spark, ROWS), "order_id", P)
    save(prepared, tmp_path, txnAppId="nightly", txnVersion="7")
    first = last_report(tmp_path)
    assert (first["written"], first["txn_app_id"], first["txn_version"]) == (ROWS, "nightly", 7)
    after_the_window()
    save(prepared, tmp_path, txnAppId="nightly", txnVersion="7")
    again = last_report(tmp_path)
    assert (again["rows"], again["written"], again["skipped"]) == (ROWS, 0, ROWS)
    save(prepared, tmp_path, txnAppId="nightly", txnVersion="6")  # older: skipped as in Delta
    assert last_report(tmp_path)["written"] == 0
    judge(tmp_path, "orders", order_keys(0, ROWS))
    # the next version writes; another application is another scope
    save(prepare(orders(spark, 500, start=ROWS), "order_id", P), tmp_path, txnAppId="nightly",
         txnVersion="8")  # fmt: skip
    assert last_report(tmp_path)["written"] == 500
    judge(tmp_path, "orders", order_keys(0, ROWS + 500))
    client = connect(tmp_path)
    try:
        txns = [
            t
            for p in range(P)
            for t in client.meta.list_txns(client.open_log(f"orders-{p}").log_id)
        ]
    finally:
        client.close()
    assert {(t.app_id, t.version, t.committed) for t in txns} == {("nightly", 8, True)}


def test_without_a_txn_identity_a_rerun_after_the_window_appends_again(spark, tmp_path):  # noqa: F811
    """What the identity prevents: the window alone forgets the first run."""
    prepared = prepare(orders(spark, 400), "order_id", P)
    save(prepared, tmp_path)
    after_the_window()
    save(prepared, tmp_path)
    assert last_report(tmp_path)["written"] == 400
    assert entries(tmp_path, "orders") == 800


def test_a_cut_short_job_rerun_after_the_window_writes_exactly_the_missing_rows(spark, tmp_path):  # noqa: F811
    marker = tmp_path / "fail-now"
    marker.touch()
    prepared = prepare(orders(spark, ROWS), "order_id", P)
    failing = prepared.mapInArrow(fail_while(marker, {1: 130, 3: 260}), prepared.schema)
    with pytest.raises(Exception, match="injected failure"):
        save(failing, tmp_path, txnAppId="load", txnVersion="1")
    before = entries(tmp_path, "orders")
    # partitions 0 and 2 finished; 1 and 3 wrote a prefix (each retry found it and stopped
    # at the same row)
    per_route = ROWS // P
    assert 2 * per_route * 0.8 < before < ROWS
    marker.unlink()
    after_the_window()
    save(failing, tmp_path, txnAppId="load", txnVersion="1")
    report = last_report(tmp_path)
    assert report["written"] == ROWS - before
    assert report["replayed"] > 0 and report["skipped"] > 0
    assert report["replayed"] + report["skipped"] == before
    judge(tmp_path, "orders", order_keys(0, ROWS))
    after_the_window()
    save(prepared, tmp_path, txnAppId="load", txnVersion="1")
    assert last_report(tmp_path)["written"] == 0
    judge(tmp_path, "orders", order_keys(0, ROWS))


def test_an_older_version_run_while_a_newer_one_was_cut_short_writes_nothing(spark, tmp_path):  # noqa: F811
    """Version 2 begun in every log and cut short before any row (its records not committed,
    made as a task makes them), version 1 run after the window: nothing written, version 2's
    records kept; version 2's re-run then writes every row once."""
    prepared = prepare(orders(spark, ROWS), "order_id", P)
    client = connect(tmp_path)
    try:
        ensure_log_group(client, "orders", P)
        for p in range(P):
            handle = client.open_log(f"orders-{p}")
            with handle.open_writer(idempotent=True) as writer:  # the cut-short attempt's
                begin(client, handle, writer.epoch, BatchId("load", 2), f"Spark partition {p}",
                      handle.end())  # fmt: skip
    finally:
        client.close()
    after_the_window()
    save(prepared, tmp_path, txnAppId="load", txnVersion="1")
    old = last_report(tmp_path)
    assert (old["written"], old["skipped"]) == (0, ROWS)
    assert entries(tmp_path, "orders") == 0
    client = connect(tmp_path)
    try:
        txns = [
            t
            for p in range(P)
            for t in client.meta.list_txns(client.open_log(f"orders-{p}").log_id)
        ]
    finally:
        client.close()
    assert {(t.app_id, t.version, t.committed) for t in txns} == {("load", 2, False)}
    save(prepared, tmp_path, txnAppId="load", txnVersion="2")
    assert last_report(tmp_path)["written"] == ROWS
    judge(tmp_path, "orders", order_keys(0, ROWS))


def test_txn_options_are_checked(spark, tmp_path):  # noqa: F811
    prepared = prepare(orders(spark, 10), "order_id", P)
    with pytest.raises(Exception, match='option "txnVersion" is required'):
        save(prepared, tmp_path, txnAppId="a")
    with pytest.raises(Exception, match=r"option \"txnVersion\" must be an int >= 0, not 'v2'"):
        save(prepared, tmp_path, txnAppId="a", txnVersion="v2")
    with pytest.raises(Exception, match="need the idempotent sink"):
        save(prepared, tmp_path, txnAppId="a", txnVersion="1", idempotent="false")


def test_a_micro_batch_cut_short_and_replayed_after_the_window_is_written_once(spark, tmp_path):  # noqa: F811
    import pyarrow.parquet as pq

    source, marker = tmp_path / "in", tmp_path / "fail-now"
    source.mkdir()
    for n, (start, stop) in enumerate([(0, 600), (600, 1200)]):
        ids = pa.array(range(start, stop), pa.int64())
        note = pa.array(["x" * 100] * len(ids))  # rows big enough to leave the JVM's buffers
        pq.write_table(pa.table({"order_id": ids, "note": note}), source / f"part-{n}.parquet")
    marker.touch()

    def fail_while_marked(batches):
        seen = 0
        for b in batches:
            if marker.exists() and seen >= 200:
                time.sleep(2)  # the sink writes what reached it; every attempt fails
                raise RuntimeError("injected failure mid-batch")
            seen += b.num_rows
            yield b

    def start():
        stream = spark.readStream.schema("order_id bigint, note string")
        stream = stream.option("maxFilesPerTrigger", 1)
        prepared = prepare(stream.parquet(str(source)), "order_id", 2)
        return (
            prepared.mapInArrow(fail_while_marked, prepared.schema)
            .writeStream.format("woodpecker")
            .option("log", "stream")
            .option("partitions", 2)
            .option("idempotencyKey", "order_id")
            .option("windowDurationS", WINDOW_S)
            .option("dataDir", str(tmp_path))
            .option("reportFile", str(tmp_path / "reports.jsonl"))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    query = start()
    with pytest.raises(Exception, match="injected failure"):
        query.awaitTermination(180)
    client = connect(tmp_path)
    before = sum(len(list(client.open_log(f"stream-{p}").open_reader())) for p in range(2))
    client.close()
    assert 0 < before < 600  # a prefix of the first micro-batch
    marker.unlink()
    after_the_window()
    query = start()  # from the checkpoint: micro-batch 0 is replayed, then 1
    query.awaitTermination(180)
    assert query.exception() is None
    lines = (tmp_path / "reports.jsonl").read_text().splitlines()
    batches = {r["batch_id"]: r for r in map(json.loads, lines)}
    assert batches[0]["rows"] == 600 and batches[0]["replayed"] == before
    assert batches[0]["written"] == 600 - before
    assert batches[1]["written"] == 600
    client = connect(tmp_path)
    try:
        judge_group(client, "stream", order_keys(0, 1200), 2)
    finally:
        client.close()


def test_a_batch_write_in_foreach_batch_keeps_the_identity_it_was_given(spark, tmp_path):  # noqa: F811
    """Its tasks run with the micro-batch's properties; the write's own txnAppId still names it
    (Delta's foreachBatch idiom: txnAppId = the query, txnVersion = the batch id)."""
    import pyarrow.parquet as pq

    source = tmp_path / "in"
    source.mkdir()
    for n in range(2):
        ids = pa.array(range(n * 100, (n + 1) * 100), pa.int64())
        pq.write_table(pa.table({"order_id": ids}), source / f"part-{n}.parquet")

    def each(df, batch_id):
        save(prepare(df, "order_id", P), tmp_path, txnAppId="fb", txnVersion=str(batch_id))

    stream = spark.readStream.schema("order_id bigint").option("maxFilesPerTrigger", 1)
    query = (
        stream.parquet(str(source))
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None
    client = connect(tmp_path)
    try:
        records = [t for p in range(P) for t in client.meta.list_txns(
            client.open_log(f"orders-{p}").log_id)]  # fmt: skip
    finally:
        client.close()
    assert {(t.app_id, t.version, t.committed) for t in records} == {("fb", 1, True)}
    judge(tmp_path, "orders", order_keys(0, 200))
