"""Service mode under real-process faults, each judged by the history checker (exactly once,
nothing acknowledged lost, every accepted write ends): two of three LogStore node processes
SIGKILLed at aq=2, nodes that apply a write and drop its reply (`logstore serve --fault
drop-replies:RATE`, testing only), and etcd restarted under the nodes and the writer.

Every test writes from threads that retry a failed key with the same idempotency id (as an
application would) and records every attempt; each checks that its fault landed where it was
aimed and met new writes (attempts that began after it), then that writing went on after it.
One short test of each kind runs by default; the long ones are `slow`."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from etcdserver import EtcdServer
from nodeserver import LogStoreNode
from servicestream import (
    Stream,
    attempts_between,
    judge,
    new_acked,
    start_all,
    until,
    until_answers,
)
from slowprofile import size

import woodpecker_idem as wp
from woodpecker_idem.testing import History

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


# --- two of three nodes SIGKILLed at aq=2 -------------------------------------------------------


def _two_killed(tmp_path: Path, threads: int, per_phase: int, cycles: int) -> None:
    """Each cycle SIGKILLs two of the three nodes (another pair each time), waits for a write
    begun after the kill to fail, restarts one, waits for writes to resume, restarts the other."""
    nodes = start_all([LogStoreNode(f"n{i}", tmp_path / "data", args=LONG_TTL) for i in range(3)])
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

                until(failed_after, "a write begun after the kill failed")
                errors_in_outages |= set(stream.errors)
                first.start()
                outages.append((killed_ns, time.monotonic_ns()))
                resumed_from = stream.acked_now()
                stream.until_acked(resumed_from + per_phase, "writes resume with one node back")
                second.start()
                until_answers(client, second.node_id)
            stream.stop()
            writer.close()
            for killed_ns, restarted_ns in outages:
                # aq=2 held: nothing new begun while one node was up was acknowledged
                assert not new_acked(attempts_between(history, killed_ns, restarted_ns))
                # the fault met new writes: begun in the outage, acknowledged once one was back
                met = new_acked([a for a in history.attempts if a.start.ns > killed_ns])
                assert [a for a in met if a.end.ns > restarted_ns], "no write of it resumed"
            assert errors_in_outages <= CLEAR, errors_in_outages
            judge(history, log)
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
    nodes = start_all([LogStoreNode(f"n{i}", tmp_path / "data", args=ttl) for i in range(4)])
    by_id = {n.node_id: n for n in nodes}
    try:
        client = wp.connect(tmp_path / "data", SERVICE)
        try:
            live = client.ensemble.directory.live
            until(lambda: live() == ["n0", "n1", "n2", "n3"], "every node registered")
            log = client.open_log("lapsed", create=True)
            writer = log.open_writer(idempotent=True)
            history = History(client.clock)
            stream = Stream(writer, history, threads=2)
            stream.until_acked(30, "writes before the kill")
            victims = list(log.segments()[-1].nodes[1:])  # two of the open segment's three
            for node in victims:
                by_id[node].kill()
            killed_ns = time.monotonic_ns()
            until(lambda: not set(victims) & set(live()), "the killed nodes lapse")
            failed_from = sum(stream.errors.values())
            until(
                lambda: sum(stream.errors.values()) > failed_from,
                "writes fail while two nodes are gone",
            )
            by_id[victims[0]].start()
            restarted_ns = time.monotonic_ns()
            resumed_from = stream.acked_now()
            stream.until_acked(resumed_from + 30, "writes resume on the three live nodes")
            stream.stop()
            writer.close()
            assert not new_acked(attempts_between(history, killed_ns, restarted_ns))
            after = log.segments()[-1]  # placed once one victim was back
            assert victims[1] not in after.nodes, after
            by_id[victims[1]].start()
            until_answers(client, victims[1])
            judge(history, log)
        finally:
            client.close()
    finally:
        for node in nodes:
            node.stop()


# --- nodes that apply a write and drop its reply -------------------------------------------------

DROPPED = re.compile(r"fault drop-replies: (\d+) replies dropped")


def _dropping(tmp_path: Path, rate: float, threads: int, writes: int) -> None:
    fault = ("--fault", f"drop-replies:{rate}")
    nodes = start_all([LogStoreNode(f"n{i}", tmp_path / "data", args=fault) for i in range(3)])
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
            judge(history, log)
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
        nodes = start_all(
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
                        ended = attempts_between(history, down_ns, time.monotonic_ns())
                        return len(ended) >= 5 and writer.metrics["background_retries"] > retries

                    until(met_the_outage, "writes in the outage end; the writer meets it")
                    etcd.start()  # the same ports and data
                    resumed_from = stream.acked_now()
                    stream.until_acked(resumed_from + per_phase, "writes go on after etcd")
                stream.stop()
                writer.close()
                live = client.ensemble.directory.live
                until(lambda: live() == ["n0", "n1", "n2"], "the nodes stay registered")
                judge(history, log)
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
