"""A reader of the client that writes the log is woken by the writer's commits (ensemble/tails.py)
and reads up to the LAC the writer published, without waiting for the nodes to learn it; other
readers keep polling the nodes."""

from __future__ import annotations

import threading
import time

import pytest

from woodpecker_idem.client import reader as reader_module

ES3 = {"quorum.es": 3, "append.linger_ms": 1}
FOREVER_S = 3600.0  # a poll this long never ends within a test: only a wakeup can


@pytest.fixture
def no_polling(monkeypatch):
    """Readers poll the nodes once an hour: an entry reaches them only through the writer's
    wakeup (and its published LAC)."""
    monkeypatch.setattr(reader_module, "POLL_MIN_S", FOREVER_S)
    monkeypatch.setattr(reader_module, "POLL_MAX_S", FOREVER_S)


def wait_until(predicate, what: str) -> None:
    end = time.monotonic() + 60  # ends a hung test only
    while not predicate():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.001)


def tail_in_thread(reader, count: int) -> tuple[threading.Thread, list]:
    got: list = []

    def run() -> None:
        while len(got) < count:
            got.append(reader.read_next(timeout=None))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


@pytest.mark.parametrize("config", [{"append.linger_ms": 1}, ES3], ids=["es1", "es3-aq2"])
def test_a_waiting_reader_is_woken_by_each_commit(tmp_path, wp_connect, no_polling, config):
    client = wp_connect(tmp_path, config)
    handle = client.create_log("w")
    writer = handle.open_writer()
    reader = handle.open_reader("earliest")
    thread, got = tail_in_thread(reader, 3)
    tails = client.ensemble.tails
    acked = []
    for i in range(3):
        wait_until(lambda: tails.waiting, "the reader waits")  # each entry meets a waiting reader
        acked.append(writer.write(b"e%d" % i).message_id)
    thread.join(60)  # an hour-long poll would still be sleeping
    assert not thread.is_alive(), f"the reader saw {len(got)} of 3 entries"
    assert [m.message_id for m in got] == acked and [m.payload for m in got] == [
        b"e0",
        b"e1",
        b"e2",
    ]
    writer.close()


def test_a_reader_follows_the_writer_into_the_next_segment(tmp_path, wp_connect, no_polling):
    client = wp_connect(tmp_path, {"segment.max_entries": 2, "append.linger_ms": 1})
    handle = client.create_log("w")
    writer = handle.open_writer()
    reader = handle.open_reader("earliest")
    thread, got = tail_in_thread(reader, 5)
    acked = []
    for i in range(5):
        wait_until(lambda: client.ensemble.tails.waiting, "the reader waits")
        acked.append(writer.write(b"e%d" % i).message_id)
    thread.join(60)
    assert not thread.is_alive(), f"the reader saw {len(got)} of 5 entries"
    assert [m.message_id for m in got] == acked
    assert len({mid.segment_id for mid in acked}) == 3
    writer.close()


def test_a_reader_of_another_client_still_polls_the_nodes(tmp_path, wp_connect, monkeypatch):
    """No writer of its own client: its wait ends by the poll, which finds the entry."""
    monkeypatch.setattr(reader_module, "POLL_MAX_S", 0.01)
    handle = wp_connect(tmp_path).create_log("w")
    other = wp_connect(tmp_path).open_log("w")
    reader = other.open_reader("earliest")
    thread, got = tail_in_thread(reader, 1)
    writer = handle.open_writer()
    mid = writer.write(b"x").message_id
    thread.join(60)
    assert not thread.is_alive() and got[0].message_id == mid
    writer.close()
