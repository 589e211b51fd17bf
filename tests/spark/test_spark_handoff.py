"""A streaming task whose route's writer is kept by another Python worker of its host hands its
rows to that worker (spark/holder.py, spark/remote.py) instead of taking the log over; when the
holder is gone or was taken over, the task takes the log over as before; when the holder goes
away mid-batch, the task fails and its retry writes exactly what is missing.

Spark's Python workers are stood in for by tests/support/sparkworker.py processes (each runs
sink tasks one at a time and keeps their writers, as a reused worker does), so the test decides
which worker runs which micro-batch, and which one is killed when.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from sparkenv import PACKAGE_PARENT
from test_spark_tasks import P, assert_exactly_once, options

from woodpecker_idem import connect, explicit_key
from woodpecker_idem.errors import HandoffError, WriterFencedError
from woodpecker_idem.spark import handoff, holder
from woodpecker_idem.spark import kept as kept_writers
from woodpecker_idem.spark.options import ensure_log_group

WORKER = str(Path(__file__).resolve().parents[1] / "support" / "sparkworker.py")


class Worker:
    """One stand-in Python worker (a child process, stopped by its PID)."""

    def __init__(self, data_dir: Path, query_id: str):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, WORKER, str(data_dir), query_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.pid = self.proc.pid
        assert self.read() == {"ready": True}

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"worker {self.pid} ended (exit status {self.proc.poll()})"
        return json.loads(line)

    def send(self, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def task(self, batch: int, start: int, n: int, attempt: int = 0) -> dict[str, Any]:
        """Micro-batch `batch`'s task for route 0: order ids start..start+n-1 of that route."""
        self.send({"batch": batch, "route": 0, "start": start, "n": n, "attempt": attempt})
        return self.read()

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def workers(tmp_path: Path):
    client = connect(tmp_path)
    try:
        ensure_log_group(client, "orders", P)
    finally:
        client.close()
    query = uuid.uuid4().hex
    started: list[Worker] = []

    def start() -> Worker:
        started.append(Worker(tmp_path, query))
        return started[-1]

    try:
        yield start
    finally:
        for w in started:
            w.stop()


def route_keys_of(start: int, n: int, route: int = 0) -> set[bytes]:
    from sparkworker import route_batches

    return {
        explicit_key(str(i))
        for b in route_batches(route, start, n)
        for i in b.column("order_id").to_pylist()
    }


def segments(data_dir: Path) -> int:
    client = connect(data_dir)
    try:
        return len(client.open_log("orders-0").segments())
    finally:
        client.close()


def test_a_route_moving_between_workers_stays_in_one_segment(tmp_path, workers):
    a, b = workers(), workers()
    moves = []
    for batch, worker in enumerate((a, b, a, b, b, a)):
        done = worker.task(batch, 200 * batch, 200)
        assert done["ok"], done
        assert done["written"] == len(route_keys_of(200 * batch, 200))
        moves.append(done["handed_off"])
    # a kept the writer from micro-batch 0 on: b handed it its rows, a wrote its own
    assert moves == [[], [0], [], [0], [0], []]
    assert segments(tmp_path) == 1
    assert_exactly_once(tmp_path, route_keys_of(0, 1200))


def test_a_task_replayed_through_the_holder_writes_nothing_again(tmp_path, workers):
    a, b = workers(), workers()
    assert a.task(0, 0, 200)["ok"]
    assert b.task(1, 200, 200)["handed_off"] == [0]
    again = b.task(1, 200, 200, attempt=1)  # committed: skipped without a writer
    assert again["ok"] and again["written"] == 0 and again["skipped"] > 0
    assert segments(tmp_path) == 1
    assert_exactly_once(tmp_path, route_keys_of(0, 400))


def test_when_the_holder_is_gone_the_task_takes_the_log_over(tmp_path, workers):
    a, b = workers(), workers()
    assert a.task(0, 0, 200)["ok"]
    a.kill()
    done = b.task(1, 200, 200)
    assert done["ok"], done
    assert done["handed_off"] == []
    assert segments(tmp_path) == 2
    assert_exactly_once(tmp_path, route_keys_of(0, 400))


def test_when_the_holders_writer_was_taken_over_the_task_takes_the_log_over(tmp_path, workers):
    a, b = workers(), workers()
    assert a.task(0, 0, 200)["ok"]
    client = connect(tmp_path)  # another writer takes the log over (and writes nothing)
    try:
        client.open_log("orders-0").open_writer(idempotent=True).close()
    finally:
        client.close()
    done = b.task(1, 200, 200)
    assert done["ok"], done
    assert done["handed_off"] == []
    # b holds the writer now: a hands its next task to b
    assert a.task(2, 400, 200)["handed_off"] == [0]
    assert_exactly_once(tmp_path, route_keys_of(0, 600))


def test_a_holder_gone_mid_batch_fails_the_task_and_its_retry_writes_the_rest(tmp_path, workers):
    a, b = workers(), workers()
    assert a.task(0, 0, 200)["ok"]
    b.send({"batch": 1, "route": 0, "start": 200, "n": 400, "pause_after": 50})
    assert b.read() == {"paused": True}  # 50 rows written through a's writer
    a.kill()
    b.send({})  # go on
    failed = b.read()
    assert not failed["ok"]
    assert failed["error"] == "HandoffError", failed
    retry = b.task(1, 200, 400, attempt=1)
    assert retry["ok"], retry
    assert retry["handed_off"] == []
    assert retry["replayed"] >= 50  # what a acknowledged is not written again
    assert retry["written"] + retry["replayed"] == len(route_keys_of(200, 400))
    assert_exactly_once(tmp_path, route_keys_of(0, 600))


# --- the pieces ------------------------------------------------------------------------------


def test_rows_cross_as_arrow_ipc_unchanged():
    payloads = [b"", b"\x00" * 3, os.urandom(1000)]
    keys = os.urandom(16 * len(payloads))
    assert handoff.decode_rows(bytearray(handoff.encode_rows(payloads, keys))) == (payloads, keys)


def test_the_registry_names_the_latest_holder_and_forgets_the_dead():
    directory = handoff.registry_dir()
    assert directory is not None
    store = uuid.uuid4().hex
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead_pid = int(gone.stdout)
    handoff.publish(directory, store, 7, handoff.Holder(dead_pid, "/nowhere.sock"))
    assert handoff.lookup(directory, store, 7) == handoff.Holder(dead_pid, "/nowhere.sock")
    assert not handoff.alive(dead_pid)
    leftovers = [directory / f"{dead_pid}.sock", directory / f"{store}.holder.{dead_pid}.tmp"]
    for path in leftovers:
        path.write_text("")
    handoff.sweep(directory)
    assert handoff.lookup(directory, store, 7) is None
    assert not any(path.exists() for path in leftovers)
    me = handoff.Holder(os.getpid(), "/here.sock")
    handoff.publish(directory, store, 7, me)
    handoff.sweep(directory)
    assert handoff.lookup(directory, store, 7) == me
    assert handoff.lookup(directory, store, 8) is None


def test_the_holders_errors_are_raised_as_their_own_class():
    holder = handoff.Holder(12345, "/x.sock")
    with pytest.raises(WriterFencedError, match="worker 12345"):
        handoff.raise_reply(handoff.error_reply(WriterFencedError("taken over")), holder)
    with pytest.raises(HandoffError, match="KeyError"):
        handoff.raise_reply(handoff.error_reply(KeyError("k")), holder)
    assert handoff.raise_reply({"duplicates": 3}, holder) == {"duplicates": 3}


def test_a_kept_writer_is_named_by_its_options():
    def key(**extra: str) -> str:
        return kept_writers.kept_key(options(Path("/d"), **extra), 0)

    assert key() == key()
    assert key() != key(windowMaxKeys="5")
    assert kept_writers.kept_key(options(Path("/d")), 0) != kept_writers.kept_key(
        options(Path("/d")), 1
    )


def _session(request: dict[str, Any], *more: tuple[dict[str, Any], Any]) -> list[dict[str, Any]]:
    """Requests to an in-process holder session; the connection is dropped after them (no
    close request unless given)."""
    mine, theirs = socket.socketpair()
    server = threading.Thread(target=holder.serve, args=(theirs,))
    server.start()
    replies = []
    with mine:
        for header, body in ((request, None), *more):
            handoff.send(mine, header, body)
            msg = handoff.receive(mine)
            assert msg is not None
            replies.append(msg[0])
    server.join()
    return replies


def test_a_session_keeps_the_writer_only_when_the_task_closes_it_so(tmp_path):
    client = connect(tmp_path)
    ensure_log_group(client, "orders", P)
    handle = client.open_log("orders-0")
    opts = options(tmp_path)
    key = kept_writers.kept_key(opts, 0)
    writer_client = opts.connect()
    writer = writer_client.open_log("orders-0").open_writer(idempotent=True)
    kept_writers.keep(key, kept_writers.Kept(writer_client, writer, None, os.getpid()))
    opening = {
        "op": "open",
        "log": "orders-0",
        "log_id": handle.log_id,
        "kept_key": key,
        "batch": ["stream:q", 0],
        "writer": "Spark partition 0",
    }
    try:
        assert _session({**opening, "kept_key": "another"})[0]["ok"] is False
        assert _session({"op": "write"})[0]["error"] == "InvalidArgumentError"
        keys = b"".join(explicit_key(str(i)) for i in range(3))
        rows = handoff.encode_rows([b"a", b"b", b"c"], keys)
        replies = _session(opening, ({"op": "write"}, rows), ({"op": "close", "keep": True}, None))
        assert replies == [{"ok": True}, {"duplicates": 0}, {}]
        again = {**opening, "batch": ["stream:q", 1]}
        replies = _session(again, ({"op": "write"}, rows))  # then the task's worker is gone
        assert replies == [{"ok": True}, {"duplicates": 3}]
        assert kept_writers.take(key) is None  # closed, not kept
        assert writer.stopped
    finally:
        writer.close()
        writer_client.close()
        client.close()
