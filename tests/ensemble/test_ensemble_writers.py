"""The ensemble layer under real writers: threads bounded per client however many writers it
has, a node that never answers, placement that avoids the node a segment lost, background work
that ends with its client."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import woodpecker_idem as wp
from woodpecker_idem.logstore.engine import LogStoreEngine
from woodpecker_idem.logstore.segment_files import segment_storage
from woodpecker_idem.logstore.transport import InProcessTransport
from woodpecker_idem.objectstore import open_object_store
from woodpecker_idem.testing import FaultInjectingTransport, History, check_history

WAIT_S = 60


def _threads_of_this_process() -> set[threading.Thread]:
    return set(threading.enumerate())


def test_sixty_four_idempotent_writers_at_es3_share_a_few_threads(tmp_path: Path, wp_connect):
    """Kafka runs one Sender per producer for all partitions: here one sender per node and one
    scheduler per client, whatever the number of writers (each of which had a sender thread per
    node, a ticker, a maintenance and a snapshot thread: 384 threads for these 64)."""
    before = _threads_of_this_process()
    client = wp_connect(
        tmp_path,
        {
            "quorum.es": 3,
            "storage.fsync": "never",
            "idempotency.snapshot_interval_s": 0.2,  # snapshots are due all the time
            "idempotency.snapshot_threshold": 5,
            "segment.max_entries": 40,  # rolls: completions on the scheduler too
        },
    )
    writers = [
        client.open_log(f"log-{i}", create=True).open_writer(idempotent=True) for i in range(64)
    ]
    histories = [History(client.clock) for _ in writers]
    futures = []
    for round_ in range(20):
        for i, w in enumerate(writers):
            key = f"k{round_ % 10}-{i}"  # every key written twice
            start = histories[i].now()
            futures.append((i, key, start, w.write_async(key.encode(), idempotency_id=key)))
    for i, key, start, f in futures:
        histories[i].ok(wp.explicit_key(key), key.encode(), f.result(WAIT_S), start)
    started = _threads_of_this_process() - before
    own = client.threads()
    assert set(own) <= started
    assert len(own) <= 10, sorted(t.name for t in own)
    # nothing else was started on the writers' behalf (retention is off by default)
    assert {t.name for t in started - set(own)} <= {"etcd-lease"}, sorted(t.name for t in started)
    for w in writers:
        w.close()
    for i in range(64):
        msgs = list(client.open_log(f"log-{i}").open_reader("earliest"))
        assert len(msgs) == 10
        verdict = check_history(histories[i].attempts, msgs, 600_000, 100_000)
        assert verdict.ok, verdict
    client.close()
    assert not any(t.is_alive() for t in own)


@contextlib.contextmanager
def _logged(logger: str, text: str) -> Iterator[threading.Event]:
    """An event set once `logger` logs a record containing `text`."""
    seen = threading.Event()

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if text in record.getMessage():
                seen.set()

    handler = Handler()
    target = logging.getLogger(logger)
    target.addHandler(handler)
    try:
        yield seen
    finally:
        target.removeHandler(handler)


class HangingTransport(FaultInjectingTransport):
    """`hang(node)`: every later add on `node` blocks until `release()` (a node that never
    answers, and never fails)."""

    def __init__(self, inner):
        super().__init__(inner)
        self._hung: set[str] = set()
        self._released = threading.Event()
        self.blocked = threading.Semaphore(0)

    def hang(self, node: str) -> None:
        self._hung.add(node)

    def release(self) -> None:
        self._released.set()

    def add_entries(
        self, node_id, log_id, segment_id, first_entry_id, frame, lac=-1, recovery=False
    ):
        if node_id in self._hung:
            self.blocked.release()
            self._released.wait(WAIT_S)
        return super().add_entries(
            node_id, log_id, segment_id, first_entry_id, frame, lac, recovery
        )


def _four_nodes(tmp_path: Path) -> InProcessTransport:
    objects = open_object_store("local", path=str(tmp_path / "nodes"))
    return InProcessTransport(
        {
            f"node-{i}": LogStoreEngine(
                segment_storage(objects.child(f"node-{i}"), fsync=False), f"node-{i}"
            )
            for i in range(4)
        }
    )


def test_a_node_that_never_answers_fails_at_the_deadline_and_the_next_segment_avoids_it(
    tmp_path: Path, wp_connect
):
    """es=3 on four nodes: node-1 hangs forever. Its calls fail at the deadline
    (quorum.call_timeout_ms) as a retriable error, the node is given up for the segment, writes
    go on with aq=2, and the next segment is placed on the three others. Nothing acknowledged is
    lost."""
    hanging = HangingTransport(_four_nodes(tmp_path))
    client = wp_connect(
        tmp_path / "data",
        {
            "quorum.es": 3,
            "quorum.call_timeout_ms": 2_000,  # the live nodes answer within it, however loaded
            "append.max_retries": 1,
            "segment.max_entries": 30,
        },
        transport=hanging,
    )
    log = client.open_log("hung", create=True)
    w = log.open_writer(idempotent=True)
    try:
        segments = log.segments()
        first = segments[-1]
        assert "node-1" in first.nodes  # segment 0 rotates from node-0: node-0, 1, 2
        acked = {"before": w.write(b"before", idempotency_id="before")}
        hanging.hang("node-1")
        with _logged("woodpecker_idem.writer.completion", "node node-1 dropped") as dropped:
            acked["hung"] = w.write(b"hung", idempotency_id="hung", timeout=WAIT_S)  # aq=2
            assert hanging.blocked.acquire(timeout=WAIT_S)  # node-1 was called, and hung
            assert dropped.wait(WAIT_S)  # its deadline passed, twice (one retry): given up
        for i in range(60):  # past the roll at 30 entries
            key = f"k{i}"
            acked[key] = w.write(key.encode(), idempotency_id=key, timeout=WAIT_S)
        later = [s for s in log.segments() if s.segment_id > first.segment_id]
        assert later, "the writer rolled"
        assert "node-1" not in later[0].nodes, later[0]
        assert len(client.threads()) <= 2 * 4 + 4  # the stuck workers are not the client's
    finally:
        hanging.release()
    w.close()
    msgs = list(log.open_reader("earliest"))
    by_payload = {m.payload: m.message_id for m in msgs}
    assert len(msgs) == 62
    for key, result in acked.items():
        assert by_payload[key.encode()] == result.message_id


def test_closing_the_client_ends_its_background_work(tmp_path: Path, wp_connect):
    """One scheduler per client: closing the client cancels its writers' ticks, lease renewals
    and snapshot checks and joins the threads; nothing of it runs against the closed stores."""
    client = wp_connect(tmp_path, {"idempotency.snapshot_interval_s": 0.05})
    writers = [client.open_log(f"l{i}", create=True).open_writer(idempotent=True) for i in range(4)]
    for w in writers:
        w.write(b"x", idempotency_id="x")
    threads = client.threads()
    assert threads
    client.close()
    assert not any(t.is_alive() for t in threads)
    assert client.ensemble.scheduler.closed
    for w in writers:
        assert w.stopped


def test_a_deleted_log_is_removed_from_every_node_through_the_ensemble(tmp_path, wp_connect):
    client = wp_connect(tmp_path, {"quorum.es": 3})
    log = client.open_log("gone", create=True)
    with log.open_writer() as w:
        w.write(b"x")
    calls = FaultInjectingTransport(client.transport)
    client.transport = calls
    client.delete_log("gone")
    assert calls.calls["delete_log"] == 3
    again = client.open_log("gone", create=True)
    assert list(again.open_reader("earliest")) == []
