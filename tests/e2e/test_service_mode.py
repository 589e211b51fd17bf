"""Service mode: three LogStore node processes (`woodpecker-idem logstore serve`) registered in the
metadata store, a client with `quorum.nodes: registry` and es=3 placing its segments on them over
gRPC; one node SIGKILLed mid-stream and restarted. Judged by the history checker, which reads the
nodes' storage through their RawRead (no engine of the client's), and by the readers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from nodeserver import LogStoreNode

import woodpecker_idem as wp
from woodpecker_idem.errors import NodeUnavailableError
from woodpecker_idem.testing import History, check_history, read_stored

WAIT_S = 60
WINDOW_MS, MAX_KEYS = 600_000, 100_000

SERVICE = {
    "quorum.nodes": "registry",
    "quorum.es": 3,
    "quorum.call_timeout_ms": 5_000,
    "append.timeout_ms": 30_000,
    "segment.max_entries": 90,  # rolls: segments placed again while a node is down
    "storage.fsync": "never",
}


def _until_answers(client, node: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            client.transport.last_add_confirmed(node, 0, 0)
            return
        except NodeUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture
def nodes(tmp_path: Path):
    started = [LogStoreNode(f"n{i}", tmp_path / "data").start() for i in range(3)]
    try:
        yield started
    finally:
        for node in started:
            node.stop()


def test_es3_over_three_node_processes_survives_a_node_killed_mid_stream(tmp_path, nodes):
    client = wp.connect(tmp_path / "data", SERVICE)
    try:
        assert client.ensemble.directory.live() == ["n0", "n1", "n2"]
        log = client.open_log("orders", create=True)
        w = log.open_writer(idempotent=True)
        history = History(client.clock)
        killed = threading.Event()

        def write(i: int) -> None:
            key = f"order-{i % 400}"  # every key twice: the second time a duplicate
            history.call(
                wp.explicit_key(key),
                key.encode(),
                lambda: w.write(key.encode(), idempotency_id=key, timeout=WAIT_S),
            )

        for i in range(250):
            write(i)
        nodes[1].kill()  # mid-stream: an entry may be on it alone, unacknowledged
        killed.set()
        for i in range(250, 550):
            write(i)
        nodes[1].start()  # back over its storage, at the same address
        for i in range(550, 800):
            write(i)
        assert len(log.segments()) > 3  # rolled while n1 was down and after
        w.close()
        _until_answers(client, "n1")  # the restarted node, for the checker's read of it
        msgs = list(log.open_reader("earliest"))
        assert len(msgs) == 400
        verdict = check_history(history.attempts, msgs, WINDOW_MS, MAX_KEYS)
        assert verdict.ok, verdict
        stored = read_stored(client, log)  # the nodes' own storage, through RawRead
        assert stored.problems == [], stored.problems
        assert [m.message_id for m in stored.messages] == [m.message_id for m in msgs]
        duplicates = [a for a in history.attempts if a.duplicate]
        assert len(duplicates) == 400
    finally:
        client.close()
    assert killed.is_set()
    for node in nodes:
        assert "serving on" in node.output()
