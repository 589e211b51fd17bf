"""The sink's task side without a JVM: what one Spark task attempt does with its Arrow batches.

A duplicate attempt (Spark would launch it speculatively on another host) is simulated by running
one partition's write twice at once from two processes: the later one takes the log over, the
earlier is fenced, and the log keeps every key exactly once.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from sparkenv import run_attempt

from woodpecker_idem import connect, explicit_key
from woodpecker_idem._core import arrow_explicit_keys, route_keys
from woodpecker_idem.errors import (
    EarlyEvictionError,
    InvalidArgumentError,
    LogGroupSizeMismatchError,
    RowsNotPreparedError,
    WriterFencedError,
    WriterForkedError,
)
from woodpecker_idem.retry import Backoff
from woodpecker_idem.spark import ROUTE_COLUMN
from woodpecker_idem.spark.options import SinkOptions, ensure_log_group
from woodpecker_idem.spark.sink import (
    WoodpeckerCommitMessage,
    _WriteThread,
    write_batches,
)
from woodpecker_idem.testing.history import History

P = 2


def prepared_batches(start: int, n: int, per_batch: int = 100) -> list[pa.RecordBatch]:
    """Order rows with their route column, as prepare() hands them to the sink."""
    out = []
    for s in range(start, start + n, per_batch):
        ids = pa.array(range(s, min(start + n, s + per_batch)), pa.int64())
        routes = pa.Array.from_buffers(
            pa.int32(), len(ids), [None, pa.py_buffer(route_keys(arrow_explicit_keys(ids), P))]
        )
        out.append(
            pa.record_batch(
                {"order_id": ids, "note": pa.array(["x"] * len(ids)), ROUTE_COLUMN: routes}
            )
        )
    return out


def options(data_dir: Path, **extra: str) -> SinkOptions:
    raw = {
        "log": "orders",
        "partitions": str(P),
        "dataDir": str(data_dir),
        "idempotencyKey": "order_id",
        **extra,
    }
    return SinkOptions.parse(raw, need_partitions=True)


@pytest.fixture
def group(tmp_path: Path) -> Path:
    client = connect(tmp_path)
    try:
        ensure_log_group(client, "orders", P)
    finally:
        client.close()
    return tmp_path


def read_group(data_dir: Path) -> list:
    client = connect(data_dir)
    try:
        out = []
        for p in range(P):
            reader = client.open_log(f"orders-{p}").open_reader()
            out.extend(reader)
            reader.close()
        return out
    finally:
        client.close()


def assert_exactly_once(data_dir: Path, keys: set[bytes]) -> None:
    messages = read_group(data_dir)
    # The tasks' writes, outcome unknown to the test (each may have landed); payloads as
    # stored: these tests judge keys (duplicates, inventions, the census below).
    stored = {m.idempotency_key: m.payload for m in messages}
    history = History()
    for k in keys:
        history.failed(k, stored.get(k, b""), "written by a task")
    verdict = history.check(messages, 600_000, 100_000)
    assert verdict.ok, verdict.summary()
    assert sorted(m.idempotency_key for m in messages) == sorted(keys)  # nothing lost


def _attempt(data_dir: str, first: bool, started, taken, results) -> None:
    """One task attempt in its own process. The first writes 5 batches, lets the duplicate
    attempt start and waits until it has written a batch (so took both logs over), then goes on."""
    opts = options(Path(data_dir))
    msg = WoodpeckerCommitMessage(partition=0, attempt=0 if first else 1)

    def batches():
        for i, b in enumerate(prepared_batches(0, 3000)):
            if first and i == 5:
                started.set()
                taken.wait(60)
            if not first and i == 1:
                # the task's write thread runs behind: signal once batch 0 is written
                wait = Backoff(0.01, 0.1, budget_s=60)
                while msg.rows < 100 and wait.wait():
                    pass
                taken.set()
            yield b

    run_attempt(opts, batches(), msg, results)


def test_a_duplicate_attempt_fences_the_first_and_the_log_stays_exactly_once(group):
    ctx = multiprocessing.get_context("spawn")
    started, taken = ctx.Event(), ctx.Event()
    results = ctx.Queue()
    first = ctx.Process(target=_attempt, args=(str(group), True, started, taken, results))
    first.start()
    assert started.wait(60), "the first attempt did not start writing"
    second = ctx.Process(target=_attempt, args=(str(group), False, started, taken, results))
    second.start()
    outcomes = sorted(results.get(timeout=120) for _ in range(2))
    for proc in (first, second):
        proc.join(30)
        assert proc.exitcode == 0
    kinds = [o[0] for o in outcomes]
    assert kinds == ["fenced", "ok"], outcomes
    ok = outcomes[1]
    assert ok[1] == 3000 and ok[2] + ok[3] == 3000
    assert ok[3] > 0  # it found rows the fenced attempt had committed
    assert_exactly_once(group, {explicit_key(str(i)) for i in range(3000)})


def test_rows_without_a_route_or_with_a_wrong_one_write_nothing(group):
    good = prepared_batches(0, 100)[0]
    msg = WoodpeckerCommitMessage(partition=0, attempt=0)
    with pytest.raises(RowsNotPreparedError, match="prepare"):
        write_batches(options(group), iter([good.drop_columns([ROUTE_COLUMN])]), msg)
    routes = good.column(ROUTE_COLUMN).to_pylist()
    routes[37] = 1 - routes[37]
    bad = good.set_column(
        good.schema.get_field_index(ROUTE_COLUMN), ROUTE_COLUMN, pa.array(routes, pa.int32())
    )
    with pytest.raises(RowsNotPreparedError, match=r"row 37 .* routes to"):
        write_batches(options(group), iter([bad]), msg)
    assert read_group(group) == []


def test_early_evictions_fail_the_task_naming_window_max_keys(group):
    msg = WoodpeckerCommitMessage(partition=0, attempt=0)
    with pytest.raises(EarlyEvictionError, match="windowMaxKeys"):
        write_batches(options(group, windowMaxKeys="50"), iter(prepared_batches(0, 400)), msg)


def test_a_failed_write_drops_the_batches_handed_over_after_it():
    """Writes run on the task's write thread, a few batches behind Spark: once one fails, the
    batches queued behind it are dropped (the task fails with that error), not written."""
    release = threading.Event()
    written: list[int] = []

    class Task:  # stands in for TaskWriters: the first write fails once two more are queued
        def write(self, route: int, payloads: list[bytes], keys: bytes) -> int:
            written.append(route)
            release.wait(30)
            raise WriterFencedError("taken over")

    writes = _WriteThread(Task(), WoodpeckerCommitMessage(partition=0, attempt=0))  # type: ignore[arg-type]
    for route in range(3):
        writes.put(route, [b"x"], bytes(16))
    release.set()
    with pytest.raises(WriterFencedError, match="taken over"):
        writes.close()
    assert written == [0]


def test_rows_handed_over_before_an_upstream_failure_are_written(group):
    """The task's iterator fails after 3 batches (an injected failure upstream): the 3 batches
    handed over are written before the error reaches Spark, so the retry finds them."""
    msg = WoodpeckerCommitMessage(partition=0, attempt=0)

    def failing():
        yield from prepared_batches(0, 300)
        raise RuntimeError("upstream failed")

    with pytest.raises(RuntimeError, match="upstream failed"):
        write_batches(options(group), failing(), msg)
    assert msg.written == 300
    assert_exactly_once(group, {explicit_key(str(i)) for i in range(300)})


def test_a_group_keeps_its_partition_count(tmp_path):
    client = connect(tmp_path)
    try:
        ensure_log_group(client, "g", 4)
        ensure_log_group(client, "g", 4)
        with pytest.raises(LogGroupSizeMismatchError, match=r'option\("partitions", 4\)'):
            ensure_log_group(client, "g", 3)
        assert sorted(client.list_logs()) == [f"g-{p}" for p in range(4)]
    finally:
        client.close()


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"partitions": "2", "dataDir": "/x"}, '"log" is required'),
        ({"log": "a", "partitions": "2"}, '"dataDir"'),
        ({"log": "a", "dataDir": "/x"}, '"partitions" is required'),
        ({"log": "a", "dataDir": "/x", "partitions": "0"}, '"partitions" must be an int 1..4096'),
        ({"log": "a", "dataDir": "/x", "partitions": "2", "windowMaxKeys": "many"}, "windowMax"),
    ],
)
def test_bad_options_are_refused_on_the_driver(raw, match):
    with pytest.raises(InvalidArgumentError, match=match):
        SinkOptions.parse(raw, need_partitions=True)


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
def test_a_writer_used_in_a_forked_child_fails_clearly(tmp_path, idempotent):
    client = connect(tmp_path)
    writer = client.open_log("l", create=True).open_writer(idempotent=idempotent)
    writer.write(b"before")
    pid = os.fork()
    if pid == 0:  # the child: no writer threads exist here
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # (not pytest-timeout's handler)
        signal.alarm(20)  # without the check the write would wait forever: killed instead
        code = 0
        for call in (lambda: writer.write(b"in child"), writer.flush, writer.close):
            try:
                call()
                code = 1
            except WriterForkedError:
                pass
            except BaseException:  # noqa: BLE001
                code = 2
        os._exit(code)  # (a normal exit would run the atexit hook: it leaves the writer alone)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    writer.write(b"after")  # the parent's writer is unaffected, its segment still open
    writer.close()
    assert [m.payload for m in client.open_log("l").open_reader()] == [b"before", b"after"]
    client.close()


def test_write_partition_takes_rows_or_batches(tmp_path):
    from woodpecker_idem.spark import write_partition

    batches = prepared_batches(0, 300)
    rows = [r for b in batches for r in b.to_pylist()]  # dicts, as Spark Rows' asDict() gives
    kwargs = {"log": "orders", "partitions": P, "key": "order_id", "data_dir": str(tmp_path)}
    first = write_partition(rows[:200], **kwargs, chunk_rows=64)
    assert (first.rows, first.written, first.duplicates) == (200, 200, 0)
    again = write_partition(iter(batches), **kwargs)
    assert (again.rows, again.written, again.duplicates) == (300, 100, 200)
    assert_exactly_once(tmp_path, {explicit_key(str(i)) for i in range(300)})


def test_the_spark_route_expression_uses_the_explicit_key_domain():
    import hashlib

    from woodpecker_idem.spark.routing import EXPLICIT_DOMAIN

    assert hashlib.md5(EXPLICIT_DOMAIN + b"order-7").digest() == explicit_key("order-7")
