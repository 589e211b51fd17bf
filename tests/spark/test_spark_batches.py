"""Batch identities on the sink's task side, without a JVM: what a task attempt of an identified
batch writes after the key window has forgotten every earlier attempt."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_spark_tasks import P, assert_exactly_once, options, prepared_batches

from woodpecker_idem import connect, explicit_key
from woodpecker_idem.errors import InvalidArgumentError
from woodpecker_idem.spark import batch_records, forget_batches
from woodpecker_idem.spark.options import ensure_log_group
from woodpecker_idem.spark.sink import WoodpeckerCommitMessage, mark_committed, write_batches

WINDOW_S = 0.5


@pytest.fixture
def group(tmp_path: Path) -> Path:
    client = connect(tmp_path)
    try:
        ensure_log_group(client, "orders", P)
    finally:
        client.close()
    return tmp_path


def attempt(data_dir: Path, rows: int, fail_after: int | None = None, partition: int = 0,
            version: str = "1") -> WoodpeckerCommitMessage:  # fmt: skip
    opts = options(data_dir, txnAppId="load", txnVersion=version, windowDurationS=str(WINDOW_S))
    msg = WoodpeckerCommitMessage(partition=partition, attempt=0)

    def batches():
        for i, b in enumerate(prepared_batches(0, rows)):
            if fail_after is not None and i * 100 >= fail_after:
                raise RuntimeError("the task dies")
            yield b

    write_batches(opts, batches(), msg)
    return msg


def segments(data_dir: Path) -> int:
    client = connect(data_dir)
    try:
        return sum(len(client.open_log(f"orders-{p}").segments()) for p in range(P))
    finally:
        client.close()


def test_a_replay_after_the_window_writes_exactly_the_rest_and_a_committed_batch_nothing(group):
    with pytest.raises(RuntimeError, match="the task dies"):
        attempt(group, 1000, fail_after=300)
    assert_exactly_once(group, {explicit_key(str(i)) for i in range(300)})
    time.sleep(WINDOW_S * 3)
    msg = attempt(group, 1000)
    assert (msg.rows, msg.written, msg.replayed, msg.skipped) == (1000, 700, 300, 0)
    assert msg.duplicates == 300  # every row not written is counted
    assert_exactly_once(group, {explicit_key(str(i)) for i in range(1000)})
    # not marked yet (the driver marks once Spark counts the task as succeeded): read back again
    again = attempt(group, 1000)
    assert (again.written, again.replayed) == (0, 1000)
    opts = options(group, txnAppId="load", txnVersion="1")
    assert mark_committed(opts, [again]) == P
    time.sleep(WINDOW_S * 3)
    before = segments(group)
    done = attempt(group, 1000)
    assert (done.written, done.skipped, done.replayed) == (0, 1000, 0)
    assert segments(group) == before  # a committed batch takes no log over
    assert (attempt(group, 1000, version="0").written) == 0  # an older version: skipped
    assert_exactly_once(group, {explicit_key(str(i)) for i in range(1000)})


def test_an_older_version_run_while_a_newer_one_was_cut_short_writes_nothing(group):
    """Version 2 cut short (its record not committed), then version 1 runs after the window: it
    writes nothing and leaves version 2's record as it was, so version 2's replay still writes
    exactly its missing rows. Guards an older version judged by a newer *committed* record
    only: it would replace the record and write its rows again (the window forgot them)."""
    with pytest.raises(RuntimeError, match="the task dies"):
        attempt(group, 1000, fail_after=300, version="2")
    time.sleep(WINDOW_S * 3)
    old = attempt(group, 1000, version="1")
    assert (old.written, old.skipped, old.replayed) == (0, 1000, 0)
    assert_exactly_once(group, {explicit_key(str(i)) for i in range(300)})
    client = connect(group)
    try:
        records = batch_records(client, "orders")
    finally:
        client.close()
    assert {(t.app_id, t.version, t.committed) for _, t in records} == {("load", 2, False)}
    rest = attempt(group, 1000, version="2")
    assert (rest.written, rest.replayed) == (700, 300)
    assert_exactly_once(group, {explicit_key(str(i)) for i in range(1000)})


def test_a_stale_attempt_cannot_mark_its_batch_committed(group):
    first = attempt(group, 500)
    attempt(group, 500)  # another attempt of the batch took the logs over since
    opts = options(group, txnAppId="load", txnVersion="1")
    assert mark_committed(opts, [first]) == 0  # fenced: left open, a replay reads back
    client = connect(group)
    try:
        assert all(not t.committed for _, t in batch_records(client, "orders"))
    finally:
        client.close()


def test_a_route_met_by_two_partitions_of_one_batch_is_refused(group):
    with pytest.raises(RuntimeError):
        attempt(group, 1000, fail_after=300, partition=0)
    with pytest.raises(InvalidArgumentError, match="one route must be written by one Spark"):
        attempt(group, 1000, partition=1)


def test_batch_records_are_listed_and_forgotten_per_application(group):
    attempt(group, 300)
    client = connect(group)
    try:
        records = batch_records(client, "orders")
        assert sorted(name for name, _ in records) == [f"orders-{p}" for p in range(P)]
        assert {(t.app_id, t.version, t.writer) for _, t in records} == {
            ("load", 1, "Spark partition 0")
        }
        assert forget_batches(client, "orders", "other") == 0
        assert forget_batches(client, "orders", "load") == P
        assert batch_records(client, "orders") == []
        assert batch_records(client, "no-such-group") == []
    finally:
        client.close()
    time.sleep(WINDOW_S * 3)
    assert attempt(group, 300).written == 300  # forgotten: a new write, the window long gone
