"""Service mode under real-process faults, each judged by the history checker (exactly once,
nothing acknowledged lost, every accepted write ends): two of three LogStore node processes
SIGKILLed at aq=2, nodes that apply a write and drop its reply (`logstore serve --fault
drop-replies:RATE`, testing only), and etcd restarted under the nodes and the writer.

Every test writes from threads that retry a failed key with the same idempotency id (as an
application would) and records every attempt; each checks that its fault landed where it was
aimed and met new writes (attempts that began after it), then that writing went on after it.
One short test of each kind runs by default; the long ones are `slow`."""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from etcdserver import EtcdServer
from nodeserver import LogStoreNode
from slowprofile import size

import woodpecker_idem as wp
from woodpecker_idem.errors import NodeUnavailableError
from woodpecker_idem.testing import History

WAIT_S = 120
WINDOW_MS, MAX_KEYS = 600_000, 100_000
WRITE_TIMEOUT_S = 5.0  # an outage shows as clear errors, not one write that waits for minutes

SERVICE = {
    "quorum.nodes": "registry",
    "quorum.es": 3,
    "quorum.call_timeout_ms": 2_000,
    "append.timeout_ms": 10_000,
    "segment.max_entries": 60,  # rolls: segments placed (and metadata written) under the fault
    "storage.fsync": "never",
}
# what a write meets while its quorum is gone: it waited its timeout, or was refused while the
# writer completes the segment that lost its quorum (both retriable, both naming the cause)
CLEAR = {"WriteTimeoutError", "QuorumUnavailableError", "SegmentClosedError"}
LONG_TTL = ("--registry-ttl", "600")  # a killed node stays placeable (es=3 over three nodes)


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.05)


def _until_answers(client: wp.WoodpeckerClient, node: str) -> None:
    """The node serves this client again (the checker reads every replica through it)."""

    def answers() -> bool:
        try:
            client.transport.last_add_confirmed(node, 0, 0)
        except NodeUnavailableError:
            return False
        return True

    _until(answers, f"node {node} answers")


class Stream:
    """`threads` threads writing keyed entries through one writer, one write at a time each: a
    new key per write, every fifth write again a key acknowledged before (a duplicate). A failed
    write (retriable) is tried again with the same key until acknowledged; every attempt is in
    `history`. A non-retriable error ends the stream and is raised by `stop()`."""

    def __init__(self, writer: object, history: History, threads: int, name: str = "k"):
        self._writer = writer
        self.history = history
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.acked = 0
        self.errors: Counter[str] = Counter()
        self.fatal: list[BaseException] = []
        self.last_start_ns = 0  # when the latest attempt began (time.monotonic_ns)
        self._name = name
        self._threads = [
            threading.Thread(target=self._run, name=f"stream-{i}", daemon=True)
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    def _write(self, key: str) -> None:
        while not self._stop.is_set():
            with self._lock:
                self.last_start_ns = time.monotonic_ns()
            try:
                self.history.call(
                    wp.explicit_key(key),
                    key.encode(),
                    lambda: self._writer.write(  # type: ignore[attr-defined]
                        key.encode(), idempotency_id=key, timeout=WRITE_TIMEOUT_S
                    ),
                )
            except wp.WoodpeckerError as exc:
                with self._lock:
                    self.errors[type(exc).__name__] += 1
                if not exc.retriable:
                    raise
                time.sleep(0.05)
                continue
            with self._lock:
                self.acked += 1
            return

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                i = next(self._ids)
                self._write(f"{self._name}{i}")
                if i % 5 == 4:
                    self._write(f"{self._name}{i - 3}")  # acknowledged before: a duplicate
        except BaseException as exc:  # noqa: BLE001 - raised again by stop()
            self.fatal.append(exc)

    def acked_now(self) -> int:
        with self._lock:
            return self.acked

    def until_acked(self, n: int, what: str) -> None:
        _until(lambda: self.acked_now() >= n or bool(self.fatal), what)
        assert not self.fatal, self.fatal

    def stop(self) -> None:
        """Stop and wait for every thread: each write under way ends (acknowledged or failed)."""
        self._stop.set()
        for t in self._threads:
            t.join(WAIT_S)
        assert not any(t.is_alive() for t in self._threads), "a write never ended"
        assert not self.fatal, self.fatal


def _attempts_between(history: History, after_ns: int, before_ns: int) -> list:
    """Attempts that began after `after_ns` and ended before `before_ns`."""
    return [a for a in history.attempts if a.start.ns > after_ns and a.end.ns < before_ns]


def _new_acked(attempts: list) -> list:
    """The attempts that stored a new entry (a duplicate is answered from the writer's window,
    without any node: one may be acknowledged in an outage)."""
    return [a for a in attempts if a.ok and not a.duplicate]


def _judge(history: History, log: object) -> None:
    verdict = history.check_log(log, WINDOW_MS, MAX_KEYS)
    assert verdict.ok, verdict.summary()


def _start(nodes: list[LogStoreNode]) -> list[LogStoreNode]:
    started: list[LogStoreNode] = []
    try:
        for node in nodes:
            started.append(node.start())
    except BaseException:
        for node in started:
            node.stop()
        raise
    return nodes


# --- two of three nodes SIGKILLed at aq=2 -------------------------------------------------------


def _two_killed(tmp_path: Path, threads: int, per_phase: int, cycles: int) -> None:
    """Each cycle SIGKILLs two of the three nodes (another pair each time), waits for a write
    begun after the kill to fail, restarts one, waits for writes to resume, restarts the other."""
    nodes = _start([LogStoreNode(f"n{i}", tmp_path / "data", args=LONG_TTL) for i in range(3)])
    pairs = [(1, 2), (0, 2), (0, 1)]
    try:
        client = wp.connect(tmp_path / "data", SERVICE)
        try:
            log = client.open_log("two-killed", create=True)
            writer = log.open_writer(idempotent=True)
            history = History(client.clock)
            stream = Stream(writer, history, threads)
            stream.until_acked(per_phase, "writes before the kill")
            outages: list[tuple[int, int]] = []
            errors_in_outages: set[str] = set()
            for cycle in range(cycles):
                first, second = (nodes[i] for i in pairs[cycle % len(pairs)])
                first.kill()
                second.kill()
                killed_ns = time.monotonic_ns()

                def failed_after(killed_ns: int = killed_ns) -> bool:
                    # the outage meets new writes: one begun after the kill fails clearly
                    return any(not a.ok and a.start.ns > killed_ns for a in list(history.attempts))

                _until(failed_after, "a write begun after the kill failed")
                errors_in_outages |= set(stream.errors)
                first.start()
                outages.append((killed_ns, time.monotonic_ns()))
                resumed_from = stream.acked_now()
                stream.until_acked(resumed_from + per_phase, "writes resume with one node back")
                second.start()
                _until_answers(client, second.node_id)
            stream.stop()
            writer.close()
            for killed_ns, restarted_ns in outages:
                # aq=2 held: nothing new begun while one node was up was acknowledged
                assert not _new_acked(_attempts_between(history, killed_ns, restarted_ns))
                # the fault met new writes: begun in the outage, acknowledged once one was back
                met = _new_acked([a for a in history.attempts if a.start.ns > killed_ns])
                assert [a for a in met if a.end.ns > restarted_ns], "no write of it resumed"
            assert errors_in_outages <= CLEAR, errors_in_outages
            _judge(history, log)
        finally:
            client.close()
    finally:
        for node in nodes:
            node.stop()


def test_two_of_three_nodes_killed_at_aq2_writes_fail_clearly_and_resume_when_one_returns(
    tmp_path,
):
    _two_killed(tmp_path, threads=2, per_phase=30, cycles=1)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_two_of_three_nodes_killed_at_aq2_repeatedly_under_four_threads(tmp_path):
    _two_killed(tmp_path, threads=4, per_phase=size(400, 60), cycles=size(3, 2))


def test_with_a_short_ttl_writes_resume_once_enough_nodes_are_registered_again(tmp_path):
    """Four nodes with a short registry TTL, es=3: two nodes of the open segment SIGKILLed
    lapse out of the registry, so no segment can be placed (two live of es=3) and writes fail
    clearly; one restarted registers again, the next segment goes on the three live nodes and
    writes resume without the other."""
    ttl = ("--registry-ttl", "5")  # renewed every 1.7 s: a busy machine keeps it
    nodes = _start([LogStoreNode(f"n{i}", tmp_path / "data", args=ttl) for i in range(4)])
    by_id = {n.node_id: n for n in nodes}
    try:
        client = wp.connect(tmp_path / "data", SERVICE)
        try:
            live = client.ensemble.directory.live
            _until(lambda: live() == ["n0", "n1", "n2", "n3"], "every node registered")
            log = client.open_log("lapsed", create=True)
            writer = log.open_writer(idempotent=True)
            history = History(client.clock)
            stream = Stream(writer, history, threads=2)
            stream.until_acked(30, "writes before the kill")
            victims = list(log.segments()[-1].nodes[1:])  # two of the open segment's three
            for node in victims:
                by_id[node].kill()
            killed_ns = time.monotonic_ns()
            _until(lambda: not set(victims) & set(live()), "the killed nodes lapse")
            failed_from = sum(stream.errors.values())
            _until(
                lambda: sum(stream.errors.values()) > failed_from,
                "writes fail while two nodes are gone",
            )
            by_id[victims[0]].start()
            restarted_ns = time.monotonic_ns()
            resumed_from = stream.acked_now()
            stream.until_acked(resumed_from + 30, "writes resume on the three live nodes")
            stream.stop()
            writer.close()
            assert not _new_acked(_attempts_between(history, killed_ns, restarted_ns))
            after = log.segments()[-1]  # placed once one victim was back
            assert victims[1] not in after.nodes, after
            by_id[victims[1]].start()
            _until_answers(client, victims[1])
            _judge(history, log)
        finally:
            client.close()
    finally:
        for node in nodes:
            node.stop()


# --- nodes that apply a write and drop its reply -------------------------------------------------

DROPPED = re.compile(r"fault drop-replies: (\d+) replies dropped")


def _dropping(tmp_path: Path, rate: float, threads: int, writes: int) -> None:
    fault = ("--fault", f"drop-replies:{rate}")
    nodes = _start([LogStoreNode(f"n{i}", tmp_path / "data", args=fault) for i in range(3)])
    stopped = False
    try:
        client = wp.connect(tmp_path / "data", SERVICE)
        try:
            log = client.open_log("dropped", create=True)
            writer = log.open_writer(idempotent=True)
            history = History(client.clock)
            stream = Stream(writer, history, threads)
            stream.until_acked(writes, "writes through nodes that drop replies")
            stream.stop()
            writer.close()
            _judge(history, log)
            assert sum(a.duplicate for a in history.attempts if a.ok) > 0  # re-writes were seen
        finally:
            client.close()
        for node in nodes:
            node.stop()  # SIGTERM: the node reports its count as it exits
        stopped = True
        dropped = {n.node_id: [int(c) for c in DROPPED.findall(n.output())] for n in nodes}
        # the fault landed on every node, on the adds of this stream's writes
        assert all(counts and counts[0] > 0 for counts in dropped.values()), dropped
    finally:
        if not stopped:
            for node in nodes:
                node.stop()


def test_nodes_that_apply_a_write_and_drop_its_reply_keep_every_write_exactly_once(tmp_path):
    _dropping(tmp_path, rate=0.2, threads=2, writes=200)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_nodes_dropping_many_replies_under_four_threads(tmp_path):
    _dropping(tmp_path, rate=0.4, threads=4, writes=size(3000, 400))


# --- etcd restarted under the nodes and the writer ------------------------------------------------


def _etcd_restarted(tmp_path: Path, threads: int, per_phase: int, restarts: int) -> None:
    etcd = EtcdServer().start()
    try:
        meta = {
            "meta.type": "etcd",
            "meta.endpoints": [etcd.endpoint],
            "meta.prefix": "/wp-etcd-restart",
            "meta.timeout_ms": 2_000,
        }
        node_cfg = {"storage.fsync": "never", **meta}
        nodes = _start(
            [LogStoreNode(f"n{i}", tmp_path / "data", node_cfg, LONG_TTL) for i in range(3)]
        )
        try:
            client = wp.connect(tmp_path / "data", {**SERVICE, **meta})
            try:
                log = client.open_log("etcd-restart", create=True)
                writer = log.open_writer(idempotent=True)
                history = History(client.clock)
                stream = Stream(writer, history, threads)
                stream.until_acked(per_phase, "writes before etcd goes down")
                for _ in range(restarts):
                    etcd.terminate()  # down: no metadata (segment rolls, lease renewals)
                    down_ns, down_ms = time.monotonic_ns(), client.clock.now_ms()

                    retries = writer.metrics["background_retries"]

                    def met_the_outage(down_ns: int = down_ns, retries: float = retries) -> bool:
                        # writes begun in the outage ended, and the writer met it on its
                        # metadata path (a roll refused, retried later)
                        ended = _attempts_between(history, down_ns, time.monotonic_ns())
                        return len(ended) >= 5 and writer.metrics["background_retries"] > retries

                    _until(met_the_outage, "writes in the outage end; the writer meets it")
                    etcd.start()  # the same ports and data
                    resumed_from = stream.acked_now()
                    stream.until_acked(resumed_from + per_phase, "writes go on after etcd")
                stream.stop()
                writer.close()
                live = client.ensemble.directory.live
                _until(lambda: live() == ["n0", "n1", "n2"], "the nodes stay registered")
                _judge(history, log)
                # a segment was placed (its metadata written) after the last outage
                assert any(seg.created_ms >= down_ms for seg in log.segments())
            finally:
                client.close()
        finally:
            for node in nodes:
                node.stop()
    finally:
        etcd.stop()


def test_etcd_restarted_mid_stream_writes_go_on_or_fail_clearly_and_resume(tmp_path):
    _etcd_restarted(tmp_path, threads=2, per_phase=80, restarts=1)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_etcd_restarted_again_and_again_under_four_threads(tmp_path):
    _etcd_restarted(tmp_path, threads=4, per_phase=size(300, 60), restarts=size(4, 2))


def test_the_node_fault_flag_is_drop_replies_with_a_rate_and_nothing_else():
    from woodpecker_idem.logstore.remote import DropReplies

    assert DropReplies.parse("drop-replies:0.25", seed="n0").rate == 0.25
    for bad in ("drop-replies:1.5", "drop-replies:x", "drop-replies", "freeze:0.1"):
        with pytest.raises(wp.InvalidArgumentError, match="drop-replies"):
            DropReplies.parse(bad)
    never, always = DropReplies(0.0, "a"), DropReplies(1.0, "a")
    assert not any(never.drop() for _ in range(100)) and never.dropped == 0
    assert all(always.drop() for _ in range(100)) and always.dropped == 100
