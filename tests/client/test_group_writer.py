"""Many producers, one log group (`client.open_group_writer`, client/group.py): members split the
routes without fencing each other, refuse keys of routes they do not own, hand routes over on a
join and take a dead member's routes once its lease runs out; every key lands once, in the log
of its route."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from woodpecker_idem import RouteNotOwnedError
from woodpecker_idem._core import explicit_key
from woodpecker_idem.client import reader as reader_module
from woodpecker_idem.client.group import log_name, route_of
from woodpecker_idem.ensemble.scheduler import TASK_WORKERS
from woodpecker_idem.ensemble.senders import CALLS_PER_NODE
from woodpecker_idem.errors import (
    InvalidArgumentError,
    LogGroupSizeMismatchError,
    LogNotFoundError,
)

P = 8
FAST = {"writer.lease_ms": 1000, "append.linger_ms": 1}


def wait_until(predicate, what: str, deadline_s: float = 120.0) -> None:
    end = time.monotonic() + deadline_s  # ends a hung test only
    while not predicate():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.01)


def group_entries(client, group: str, partitions: int) -> dict[bytes, list[int]]:
    """payload -> the routes of the logs holding it (once per copy)."""
    seen: dict[bytes, list[int]] = {}
    for route in range(partitions):
        for m in client.open_log(log_name(group, route)).open_reader("earliest"):
            seen.setdefault(m.payload, []).append(route)
    return seen


def write_owned(member, keys: range) -> set[int]:
    """Write every key whose route `member` owns; the others must be refused."""
    written = set()
    for k in keys:
        try:
            member.write(b"v%d" % k, idempotency_id=f"k{k}")
        except RouteNotOwnedError as exc:
            assert exc.route == route_of(explicit_key(f"k{k}"), P) and exc.retriable
            assert exc.route not in member.routes()
            continue
        written.add(k)
    return written


def test_two_members_split_the_routes_and_hand_them_over_on_a_join(tmp_path, wp_connect):
    c1, c2 = wp_connect(tmp_path, FAST), wp_connect(tmp_path, FAST)
    m1 = c1.open_group_writer("g", P)
    assert m1.routes() == frozenset(range(P))  # alone: every route
    first = write_owned(m1, range(100))
    assert first == set(range(100))
    m2 = c2.open_group_writer("g", P)
    # m2's share is still m1's (live leases): nothing is taken from under m1
    assert m2.routes() == frozenset() and m1.routes() == frozenset(range(P))
    m1.rebalance()  # gives m2's share up
    m2.rebalance()  # takes it up
    assert m1.routes() | m2.routes() == frozenset(range(P))
    assert not m1.routes() & m2.routes() and m2.routes()
    by1, by2 = write_owned(m1, range(200)), write_owned(m2, range(200))
    assert by1 | by2 == set(range(200)) and not by1 & by2
    # the first 100 again through their new owners: answered, not written again
    for member in (m1, m2):
        for k in range(100):
            if route_of(explicit_key(f"k{k}"), P) in member.routes():
                assert member.write(b"v%d" % k, idempotency_id=f"k{k}").duplicate
    m1.close()
    m2.close()
    seen = group_entries(c1, "g", P)
    assert sorted(seen) == sorted(b"v%d" % k for k in range(200))
    for k in range(200):
        assert seen[b"v%d" % k] == [route_of(explicit_key(f"k{k}"), P)]


def test_a_closed_member_leaves_its_routes_to_the_others(tmp_path, wp_connect):
    c1, c2 = wp_connect(tmp_path, FAST), wp_connect(tmp_path, FAST)
    m1 = c1.open_group_writer("g", P)
    m2 = c2.open_group_writer("g", P)
    m1.rebalance()
    m2.rebalance()
    assert m2.routes() and m2.routes() != frozenset(range(P))
    m1.close()  # leaves the group, releases its leases
    assert m2.rebalance() == frozenset(range(P))
    assert write_owned(m2, range(50)) == set(range(50))


def test_routes_do_not_grow_threads(tmp_path, wp_connect):
    one = wp_connect(tmp_path / "a", FAST)
    many = wp_connect(tmp_path / "b", FAST)
    g1 = one.open_group_writer("g", 1)
    g16 = many.open_group_writer("g", 16)
    assert len(g16.routes()) == 16
    write_owned(g1, range(64))
    for k in range(64):
        g16.write(b"v%d" % k, idempotency_id=f"k{k}")
    # the client's own threads, bounded by its nodes, whatever the routes: a timer, the task
    # workers and each node's sender lanes
    bound = 1 + TASK_WORKERS + CALLS_PER_NODE * len(many.transport.node_ids)
    assert len(one.threads()) <= bound and len(many.threads()) <= bound


def test_bad_groups_are_refused(tmp_path, wp_connect):
    client = wp_connect(tmp_path, FAST)
    client.open_group_writer("g", 4).close()
    with pytest.raises(LogGroupSizeMismatchError, match="keeps its P"):
        client.open_group_writer("g", 5)
    for bad in (0, 5000):
        with pytest.raises(InvalidArgumentError, match="partitions"):
            client.open_group_writer("h", bad)
    plain = client.open_group_writer("p", 2, idempotent=False)
    with pytest.raises(InvalidArgumentError, match="idempotent=True"):
        plain.write(b"x", idempotency_id="k")
    assert plain.write(b"x").message_id.entry_id == 0


MEMBER = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
from woodpecker_idem import RouteNotOwnedError, connect
data, group, stop = sys.argv[1], sys.argv[2], sys.argv[5]
parts, keys = int(sys.argv[3]), int(sys.argv[4])
# a lease long enough that a loaded machine does not let a live member's run out
client = connect(data, {"writer.lease_ms": 10000, "append.linger_ms": 1})
member = client.open_group_writer(group, parts)
def say(line):  # one write a line: a SIGKILL never leaves half of one
    sys.stdout.write(line + "\\n")
    sys.stdout.flush()
say("member " + member.member)
done = set()
while not os.path.exists(stop):
    member.rebalance()
    say("routes " + " ".join(map(str, sorted(member.routes()))))
    # the second half of the keys once the test says so (after its kill): new writes
    phase2 = os.path.exists(stop + ".phase2")
    for k in range(keys if phase2 else keys // 2):
        if k in done:
            continue
        try:
            result = member.write(b"v%d" % k, idempotency_id=f"k{k}")
        except RouteNotOwnedError:
            continue
        done.add(k)
        say(f"acked {k} {int(result.duplicate)}")
member.close()
client.close()
say("closed")
"""


class Member:
    """A group writer in a process of its own (MEMBER), its stdout read as it comes."""

    def __init__(self, data: Path, stop: Path, keys: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", MEMBER, str(data), "g", str(P), str(keys), str(stop)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.err = ""
        self._out = threading.Thread(target=self._read, daemon=True)
        self._out.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.append(line.strip())

    def acked(self) -> set[int]:
        return {int(x.split()[1]) for x in list(self.lines) if x.startswith("acked")}

    def routes(self) -> set[int]:
        last = [x for x in list(self.lines) if x.startswith("routes")]
        return {int(r) for r in last[-1].split()[1:]} if last else set()

    def finish(self, timeout: float) -> int:
        _, self.err = self.proc.communicate(timeout=timeout)
        self._out.join(timeout)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(60)
        self._out.join(60)


@pytest.mark.parametrize("members", [2, 4])
def test_members_in_processes_one_killed_every_key_once(tmp_path, wp_connect, members):
    """Processes write one group through group writers, each the keys of its routes; one is
    SIGKILLed mid-stream; the others take its routes once its lease and membership run out and
    write its keys (answered from the rebuilt window where they landed): every key exactly once,
    in its log, and no live member fenced another (a fenced write ends a member with a
    traceback)."""
    keys = 600  # the first half before the kill, the second after it
    stop = tmp_path / "stop"
    wp_connect(tmp_path, FAST).open_group_writer("g", P).close()  # the group, made once
    procs = [Member(tmp_path, stop, keys) for _ in range(members)]
    victim, others = procs[0], procs[1:]
    try:
        # mid-stream: the victim owns routes and acknowledged writes
        wait_until(
            lambda: len(victim.acked()) >= 5 and victim.routes(),
            "the victim acknowledged writes of its routes",
        )
        victim_routes = victim.routes()
        victim.kill()
        before = [p.acked() for p in others]
        Path(f"{stop}.phase2").touch()  # the second half of the keys: written after the kill
        wait_until(
            lambda: set().union(*(p.routes() for p in others)) == set(range(P)),
            "the survivors took every route",
        )
        wait_until(
            # by the survivors: the victim's keys again too (answered where they landed)
            lambda: set().union(*(p.acked() for p in others)) >= set(range(keys)),
            "every key acknowledged by the survivors",
        )
        stop.touch()
        for p in others:
            assert p.finish(300) == 0, p.err
            assert "Traceback" not in p.err, p.err
    finally:
        for p in procs:
            p.kill()
    assert victim.acked() and victim_routes, "the kill met no acknowledged write"
    # the kill met new writes: the second half, written after it, holds keys of the routes
    # the victim owned, written by the survivors that took them up
    taken = [
        k
        for p, old in zip(others, before, strict=True)
        for k in p.acked() - old
        if k >= keys // 2 and route_of(explicit_key(f"k{k}"), P) in victim_routes
    ]
    assert taken, "no survivor wrote a key of the victim's routes after the kill"
    assert set().union(*(p.routes() for p in others)) >= victim_routes
    seen = group_entries(wp_connect(tmp_path, FAST), "g", P)
    assert sorted(seen) == sorted(b"v%d" % k for k in range(keys))
    for k in range(keys):
        assert seen[b"v%d" % k] == [route_of(explicit_key(f"k{k}"), P)], k


# --- reading a group -----------------------------------------------------------------------------


def test_a_group_reader_reads_every_log_once_each_in_its_order(tmp_path, wp_connect):
    client = wp_connect(tmp_path, FAST)
    member = client.open_group_writer("g", P)
    acked = {k: member.write(b"v%d" % k, idempotency_id=f"k{k}").message_id for k in range(200)}
    member.close()
    with client.open_group_reader("g") as reader:
        got = list(reader)
    assert sorted(e.message.payload for e in got) == sorted(b"v%d" % k for k in range(200))
    for e in got:
        k = int(e.message.payload[1:])
        assert e.route == route_of(explicit_key(f"k{k}"), P) and e.message.message_id == acked[k]
    for route in range(P):  # each log's entries in their order
        ids = [e.message.message_id for e in got if e.route == route]
        assert ids == sorted(ids)
    with pytest.raises(LogNotFoundError):
        client.open_group_reader("nope")


def test_a_named_group_reader_resumes_after_its_commit(tmp_path, wp_connect):
    client = wp_connect(tmp_path, FAST)
    member = client.open_group_writer("g", P)
    for k in range(100):
        member.write(b"v%d" % k, idempotency_id=f"k{k}")
    first = client.open_group_reader("g", name="billing")
    seen = [first.read_next() for _ in range(40)]
    first.commit()
    first.read_next()  # read, not committed: read again after the reopen
    first.close()
    for k in range(100, 120):  # more after the commit
        member.write(b"v%d" % k, idempotency_id=f"k{k}")
    member.close()
    with client.open_group_reader("g", name="billing") as again:
        rest = list(again)
    payloads = [e.message.payload for e in seen + rest]
    assert sorted(payloads) == sorted(b"v%d" % k for k in range(120))  # none twice, none skipped


def test_a_waiting_group_reader_is_woken_by_a_writer_of_its_client(
    tmp_path, wp_connect, monkeypatch
):
    monkeypatch.setattr(reader_module, "POLL_MIN_S", 3600.0)  # only a wakeup ends a wait
    monkeypatch.setattr(reader_module, "POLL_MAX_S", 3600.0)
    client = wp_connect(tmp_path, FAST)
    member = client.open_group_writer("g", P)
    reader = client.open_group_reader("g")
    got: list = []
    thread = threading.Thread(target=lambda: got.append(reader.read_next(timeout=None)))
    thread.start()
    wait_until(lambda: client.ensemble.tails.waiting, "the reader waits")
    member.write(b"x", idempotency_id="k")
    thread.join(60)
    assert not thread.is_alive() and got[0].message.payload == b"x"
    member.close()
