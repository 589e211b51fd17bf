"""IdempotentLogWriter.write_arrow: Arrow batches in, keys from Arrow buffers, one completion."""

from __future__ import annotations

import pyarrow as pa
import pytest

from woodpecker_idem import (
    InvalidArgumentError,
    InvalidTypeError,
    PayloadTooLargeError,
    content_key,
    explicit_key,
)
from woodpecker_idem._core import arrow_canonical_json
from woodpecker_idem.client import LogHandle

_LOG_OF: dict[int, LogHandle] = {}  # a writer's log (by id(writer)), for read_all


@pytest.fixture
def writer(wp_connect, tmp_path):
    client = wp_connect(tmp_path / "data")
    log = client.open_log("orders", create=True)
    w = log.open_writer(idempotent=True)
    _LOG_OF[id(w)] = log
    yield w
    w.close()
    del _LOG_OF[id(w)]


def read_all(writer, log=None):
    reader = (log or _LOG_OF[id(writer)]).open_reader("earliest")
    try:
        return list(reader)
    finally:
        reader.close()


def orders(n: int, start: int = 0) -> pa.RecordBatch:
    ids = list(range(start, start + n))
    return pa.record_batch(
        {
            "order_id": pa.array(ids, pa.int64()),
            "amount": pa.array([i * 0.5 for i in ids]),
            "body": pa.array([b"order %d" % i for i in ids], pa.binary()),
        }
    )


def test_a_batch_is_written_once_and_rewritten_as_duplicates(writer):
    batch = orders(1000)
    first = writer.write_arrow(batch, key_column="order_id", payload_column="body")
    assert len(first) == 1000 and not any(first.duplicate)
    again = writer.write_arrow(batch, key_column="order_id", payload_column="body")
    assert all(again.duplicate)
    assert list(again.entry_ids) == list(first.entry_ids)
    assert list(again.segment_ids) == list(first.segment_ids)
    msgs = read_all(writer)
    assert [m.payload for m in msgs] == [b"order %d" % i for i in range(1000)]
    assert [m.idempotency_key for m in msgs] == [explicit_key(str(i)) for i in range(1000)]
    assert writer.metrics_snapshot()["duplicates_suppressed"] == 1000


def test_rows_as_canonical_json_keyed_by_content(writer):
    batch = orders(5).drop_columns(["body"])
    res = writer.write_arrow(batch)
    msgs = read_all(writer)
    payloads = arrow_canonical_json(batch)
    assert [m.payload for m in msgs] == payloads
    assert [m.idempotency_key for m in msgs] == [content_key(p) for p in payloads]
    assert res.message_id(4) == msgs[4].message_id


def test_duplicates_inside_a_batch_join_the_first(writer):
    batch = pa.record_batch({"k": ["a", "b", "a"], "p": [b"1", b"2", b"3"]})
    res = writer.write_arrow(batch, key_column="k", payload_column="p")
    assert list(res.duplicate) == [0, 0, 1]
    assert res.message_id(2) == res.message_id(0)
    assert [m.payload for m in read_all(writer)] == [b"1", b"2"]


def test_columns_and_tables(writer):
    payloads = pa.array([b"x", b"y"])
    res = writer.write_arrow(payloads, key_column=pa.array([10, 11]))
    assert not any(res.duplicate)
    table = pa.Table.from_batches([orders(3), orders(3, 3)])
    res = writer.write_arrow(table, key_column="order_id", payload_column="body")
    assert len(res) == 6
    keys = [m.idempotency_key for m in read_all(writer)]
    assert keys[:2] == [explicit_key("10"), explicit_key("11")]


@pytest.mark.parametrize(
    ("batch", "kwargs", "error", "match"),
    [
        (
            pa.record_batch({"k": ["a", None, "c"], "p": [b"1", b"2", b"3"]}),
            {"key_column": "k", "payload_column": "p"},
            InvalidArgumentError,
            "key column 'k' is null at row 1",
        ),
        (
            pa.record_batch({"k": ["a", "", "c"], "p": [b"1", b"2", b"3"]}),
            {"key_column": "k", "payload_column": "p"},
            InvalidArgumentError,
            "row 1",
        ),
        (
            pa.record_batch({"k": ["a", "b"], "p": [b"1", None]}),
            {"key_column": "k", "payload_column": "p"},
            InvalidArgumentError,
            "payload column 'p' is null at row 1",
        ),
        (
            pa.record_batch({"k": [1.5], "p": [b"1"]}),
            {"key_column": "k", "payload_column": "p"},
            InvalidTypeError,
            "string, binary or integer",
        ),
        (
            pa.record_batch({"k": ["a", "b"], "p": [b"1", b"x" * ((16 << 20) + 1)]}),
            {"key_column": "k", "payload_column": "p"},
            PayloadTooLargeError,
            "row 1",
        ),
        (
            pa.record_batch({"k": ["a", "b"]}),
            {"key_column": "missing"},
            InvalidArgumentError,
            "no column 'missing'",
        ),
    ],
)
def test_a_bad_row_fails_the_call_and_writes_nothing(writer, batch, kwargs, error, match):
    writer.write_arrow(
        pa.record_batch({"k": ["before"], "p": [b"0"]}), key_column="k", payload_column="p"
    )
    with pytest.raises(error, match=match):
        writer.write_arrow(batch, **kwargs)
    writer.flush()
    assert [m.payload for m in read_all(writer)] == [b"0"]
    assert writer.window.pending_count == 0


def test_write_many_checks_every_payload_before_queueing(wp_connect, tmp_path):
    """An oversized payload in the middle used to fail after the rows before it were queued."""
    client = wp_connect(tmp_path / "d", {"append": {"max_entry_bytes": 1024}})
    small = client.open_log("small", create=True)
    w = small.open_writer(idempotent=True)
    with pytest.raises(PayloadTooLargeError):
        w.write_many([b"a", b"b", b"x" * 2000, b"d"])
    w.flush()
    assert read_all(w, small) == []
    w.close()


def test_a_batch_larger_than_the_inflight_limit(wp_connect, tmp_path):
    client = wp_connect(
        tmp_path / "d", {"append": {"max_inflight_entries": 100, "max_batch_entries": 50}}
    )
    w = client.open_log("big", create=True).open_writer(idempotent=True)
    res = w.write_arrow(orders(1000), key_column="order_id", payload_column="body")
    assert not any(res.duplicate)
    assert len({(s, e) for s, e in zip(res.segment_ids, res.entry_ids, strict=True)}) == 1000
    w.close()
