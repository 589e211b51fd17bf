"""The ensemble layer's parts on their own: the client's scheduler (timers, ordered tasks, close),
the node senders (lanes in order, lanes taking turns, deadlines, stuck workers replaced),
placement with exclusion and the node directory."""

from __future__ import annotations

import threading
import time

import pytest

from woodpecker_idem.ensemble.members import NodeDirectory
from woodpecker_idem.ensemble.placement import new_ensemble
from woodpecker_idem.ensemble.scheduler import Scheduler
from woodpecker_idem.ensemble.senders import CALLS_PER_NODE, Job, NodeSender
from woodpecker_idem.errors import ClientClosedError, NodeUnavailableError, QuorumUnavailableError
from woodpecker_idem.logstore.transport import InProcessTransport
from woodpecker_idem.meta import NodeInfo
from woodpecker_idem.meta.sqlite import SqliteMetadataStore

WAIT_S = 30  # how long a test waits for what must happen (never reached when it passes)


@pytest.fixture
def scheduler():
    s = Scheduler("test")
    yield s
    s.close()


# --- the scheduler ----------------------------------------------------------------------------


def test_a_timer_runs_when_poked_and_again_after_the_delay_it_returns(scheduler):
    runs: list[float] = []
    done = threading.Event()

    def tick() -> float | None:
        runs.append(time.monotonic())
        if len(runs) == 3:
            done.set()
            return None  # stops: no fourth run
        return 0.01

    timer = scheduler.timer(tick, "t")
    assert runs == []  # not scheduled until poked or given a time
    timer.poke()
    assert done.wait(WAIT_S)
    time.sleep(0.05)
    assert len(runs) == 3


def test_pokes_while_a_run_is_due_are_one_run(scheduler):
    gate = threading.Event()
    runs = []
    blocker = scheduler.timer(lambda: gate.wait(WAIT_S) and None, "blocker")
    counted = scheduler.timer(lambda: runs.append(1), "counted")
    blocker.poke()  # holds the timer thread
    for _ in range(50):
        counted.poke()
    gate.set()
    flush = threading.Event()
    scheduler.timer(lambda: flush.set(), "flush").at(time.monotonic() + 0.01)
    assert flush.wait(WAIT_S)
    assert runs == [1]


def test_tasks_of_one_key_run_in_order_one_at_a_time_and_keys_take_turns(scheduler):
    order: list[tuple[str, int]] = []
    lock = threading.Lock()
    running = {"a": 0, "b": 0}
    overlap = []

    def task(key: str, i: int) -> None:
        with lock:
            running[key] += 1
            overlap.append(running[key])
        time.sleep(0.001)
        with lock:
            order.append((key, i))
            running[key] -= 1

    gate = threading.Event()
    scheduler.submit("a", gate.wait, WAIT_S)  # holds key a until every task is submitted
    for i in range(20):
        scheduler.submit("a", task, "a", i)
    for i in range(20):
        scheduler.submit("b", task, "b", i)
    gate.set()
    assert scheduler.drain("a", WAIT_S) and scheduler.drain("b", WAIT_S)
    assert [i for k, i in order if k == "a"] == list(range(20))
    assert [i for k, i in order if k == "b"] == list(range(20))
    assert max(overlap) == 1  # never two tasks of one key at once
    # b did not wait for all of a: the keys took turns on the workers
    assert order.index(("b", 0)) < order.index(("a", 19))


def test_close_cancels_timers_drops_queued_tasks_and_joins_every_thread():
    s = Scheduler("closing", workers=1)
    gate = threading.Event()
    started = threading.Event()
    ran = []
    timer_runs = []

    def first() -> None:
        started.set()
        gate.wait(WAIT_S)

    s.submit("k", first)
    s.submit("k", ran.append, "queued")  # not started before close: dropped
    s.timer(lambda: timer_runs.append(1), "late").at(time.monotonic() + 3600)  # pending
    assert started.wait(WAIT_S)
    threads = s.threads
    assert len(threads) == 2  # the timer thread (a timer is pending) and the worker
    threading.Timer(0.05, gate.set).start()  # the running task ends a little after close begins
    s.close(WAIT_S)
    assert not any(t.is_alive() for t in threads)  # the timer thread too: its timer cancelled
    assert ran == [] and timer_runs == []
    assert s.submit("k", ran.append, "after") is False
    assert ran == []


def test_a_task_that_meets_a_closed_client_ends_quietly(scheduler, caplog):
    def closed() -> None:
        raise ClientClosedError("client is closed")

    def bug() -> None:
        raise RuntimeError("a bug")

    scheduler.submit("k", closed)
    scheduler.submit("k", bug)
    assert scheduler.drain("k", WAIT_S)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "bug" in errors[0]  # the bug is logged, the close is not


# --- node senders ------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done: list[tuple[str, int, object]] = []
        self.all_done = threading.Event()
        self.expect = 0

    def job(self, lane: str, i: int, call=lambda: None, retry=None) -> Job:
        def done(result, error):
            if retry is not None:
                again = retry(error)
                if again is not None:
                    return again
            with self.lock:
                self.done.append((lane, i, error if error is not None else result))
                if len(self.done) == self.expect:
                    self.all_done.set()
            return None

        return Job(call, done)


def test_a_lane_sends_in_submit_order_and_a_retry_holds_back_only_its_own_lane(scheduler):
    sender = NodeSender("n0", scheduler, deadline_s=WAIT_S)
    rec = Recorder()
    rec.expect = 30 + 30
    b_done = threading.Event()
    retries = []

    def flaky() -> None:  # fails, and is retried, until every call of lane b has been made
        if not b_done.is_set():
            retries.append(1)
            raise NodeUnavailableError("transient (test)")

    def retry(error):
        return 0.01 if error is not None else None  # a retry waits on the timer

    def last_b() -> None:
        b_done.set()

    sender.submit("a", rec.job("a", 0, flaky, retry))
    for i in range(1, 30):
        sender.submit("a", rec.job("a", i))
    for i in range(30):
        sender.submit("b", rec.job("b", i, last_b if i == 29 else lambda: None))
    # lane b's calls go on while lane a waits out its retries: were b held behind a, a would
    # retry forever and this wait would fail
    assert rec.all_done.wait(WAIT_S)
    assert retries  # a did wait on retries
    assert [i for lane, i, _ in rec.done if lane == "a"] == list(range(30))
    assert [i for lane, i, _ in rec.done if lane == "b"] == list(range(30))
    sender.close(WAIT_S)


def test_a_call_that_returned_lets_its_lane_go_on_while_its_done_runs(scheduler):
    """The next call of a lane (a writer's next durable add) runs beside the `done` of the one
    before (the writer's commit of it); the lane's `done`s are still told one at a time, in call
    order, and while one is slow the node's workers serve other lanes."""
    sender = NodeSender("n0", scheduler, deadline_s=WAIT_S)
    next_call_ran, other_lane_told, all_told = (
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )
    told: list[object] = []

    def slow_done(result, error):  # e.g. waiting for the writer's lock
        ran = next_call_ran.wait(WAIT_S) and other_lane_told.wait(WAIT_S)
        told.append(("first", ran))

    def tell(name: str, last: bool = False):
        def done(result, error):
            told.append(name)
            if last:
                all_told.set()

        return done

    sender.submit("a", Job(lambda: None, slow_done))
    for i in range(5):
        call = next_call_ran.set if i == 0 else (lambda: None)
        sender.submit("a", Job(call, tell(f"a{i}", last=i == 4)))
    sender.submit("b", Job(lambda: None, lambda r, e: other_lane_told.set()))
    assert all_told.wait(WAIT_S)
    assert told == [("first", True), "a0", "a1", "a2", "a3", "a4"]
    sender.close(WAIT_S)


def test_a_failed_call_holds_its_lane_until_its_done_answers(scheduler):
    """A call that failed is not over until its job says so: the lane's next call waits for the
    answer (here a retry, which then succeeds), and the outcomes are told in order."""
    sender = NodeSender("n0", scheduler, deadline_s=WAIT_S)
    attempts: list[str] = []
    told: list[object] = []
    all_told = threading.Event()

    def flaky():
        attempts.append("first")
        if attempts.count("first") == 1:
            raise NodeUnavailableError("transient (test)")

    def first_done(result, error):
        told.append(("first", error is None))
        return 0.01 if error is not None else None

    def second_done(result, error):
        told.append("second")
        all_told.set()

    sender.submit("a", Job(flaky, first_done))
    sender.submit("a", Job(lambda: attempts.append("second"), second_done))
    assert all_told.wait(WAIT_S)
    assert attempts == ["first", "first", "second"]
    assert told == [("first", False), ("first", True), "second"]
    sender.close(WAIT_S)


def test_a_busy_lane_does_not_starve_another(scheduler):
    """Head of line: busy lanes keep every worker of the node busy with many calls queued; a
    call of another lane submitted after them waits for about one call of each busy lane, not
    for all of them."""
    sender = NodeSender("n0", scheduler, deadline_s=WAIT_S)
    rec = Recorder()
    busy = [f"big{k}" for k in range(CALLS_PER_NODE)]
    rec.expect = 100 * len(busy) + 1
    gate = threading.Event()  # the busy lanes' first calls hold every worker until all is queued
    for i in range(100):
        for lane in busy:
            call = (lambda: gate.wait(WAIT_S)) if i == 0 else (lambda: time.sleep(0.002))
            sender.submit(lane, rec.job(lane, i, call))
    sender.submit("small", rec.job("small", 0))
    gate.set()
    assert rec.all_done.wait(WAIT_S)
    position = [x[:2] for x in rec.done].index(("small", 0))
    assert position <= 2 * CALLS_PER_NODE + 1, position
    sender.close(WAIT_S)


def test_a_call_past_its_deadline_fails_retriably_and_the_node_goes_on(scheduler):
    """A node call that never returns: its caller gets a retriable NodeUnavailableError after
    the deadline, a fresh worker takes the stuck one's place, and other lanes are served."""
    sender = NodeSender("n0", scheduler, deadline_s=WAIT_S)  # the live calls: never reached
    hang = threading.Event()
    rec = Recorder()
    rec.expect = 1 + CALLS_PER_NODE + 5
    for i in range(1 + CALLS_PER_NODE):  # more hung calls than the node has workers
        job = rec.job(f"hung{i}", 0, lambda: hang.wait(WAIT_S) and 1)
        job.deadline_s = 0.2
        sender.submit(f"hung{i}", job)
    for i in range(5):
        sender.submit("live", rec.job("live", i, lambda: "ok"))
    try:
        assert rec.all_done.wait(WAIT_S)
        hung = [r for lane, _, r in rec.done if lane.startswith("hung")]
        assert len(hung) == 1 + CALLS_PER_NODE
        assert all(isinstance(r, NodeUnavailableError) and r.retriable for r in hung), hung
        assert "did not answer within 0.2 s" in str(hung[0])
        assert [r for lane, _, r in rec.done if lane == "live"] == ["ok"] * 5
        assert len(sender.threads) <= CALLS_PER_NODE  # stuck workers are not counted as live
        assert sender.call(lambda: "sync") == "sync"  # a synchronous call still goes through
    finally:
        hang.set()  # the stuck calls return now: their results are ignored
    time.sleep(0.1)
    assert len(rec.done) == rec.expect  # nothing answered twice
    sender.close(WAIT_S)


def test_started_jobs_keep_their_lanes_in_order_and_wake_no_worker(scheduler):
    """Jobs a transport starts without blocking (`Job.start`, answered later from its own
    thread): a lane's next job starts only once the one before it was answered (in submit
    order, a retry first), lanes run side by side, no worker thread is made, and a job whose
    start declines runs on a worker as ever."""
    sender = NodeSender("n0", scheduler, deadline_s=WAIT_S)
    lock = threading.Lock()
    started: list[tuple[str, int]] = []
    in_flight: dict[str, int] = {}
    overlaps: list[str] = []
    done: list[tuple[str, int, object]] = []
    all_done = threading.Event()
    expect = 2 * 20 + 1
    failed_once: set[int] = set()

    def job(lane: str, i: int, declines: bool = False) -> Job:
        def start(answer) -> bool:
            if declines:
                return False
            with lock:
                started.append((lane, i))
                in_flight[lane] = in_flight.get(lane, 0) + 1
                if in_flight[lane] > 1:
                    overlaps.append(lane)

            def later() -> None:
                time.sleep(0.002)
                with lock:
                    in_flight[lane] -= 1
                flaky = lane == "a" and i == 3 and i not in failed_once
                if flaky:
                    failed_once.add(i)
                    answer(None, NodeUnavailableError("transient (test)"))
                else:
                    answer((lane, i), None)

            threading.Thread(target=later, daemon=True).start()  # the "transport's" thread
            return True

        def finish(result, error):
            if error is not None:
                return 0.01  # retried on the timer
            with lock:
                done.append((lane, i, threading.current_thread().name))
                if len(done) == expect:
                    all_done.set()
            return None

        return Job(lambda: (lane, i), finish, start=start)

    for i in range(20):
        sender.submit("a", job("a", i))
        sender.submit("b", job("b", i))
    sender.submit("c", job("c", 0, declines=True))
    assert all_done.wait(WAIT_S)
    assert overlaps == []  # one call of a lane at a time
    assert [i for lane, i, _ in done if lane == "a"] == list(range(20))
    assert [i for lane, i, _ in done if lane == "b"] == list(range(20))
    assert started.count(("a", 3)) == 2  # the failed attempt, then its retry, before ("a", 4)
    assert started.index(("a", 4)) > len(started) - 1 - started[::-1].index(("a", 3))
    workers = {name for lane, _, name in done if lane != "c"}
    assert not any(name.startswith("wp-node-") for name in workers), workers
    assert [name for lane, _, name in done if lane == "c"][0].startswith("wp-node-n0")
    sender.close(WAIT_S)


def test_a_synchronous_call_raises_at_its_deadline(scheduler):
    sender = NodeSender("n0", scheduler, deadline_s=0.1)
    hang = threading.Event()
    try:
        with pytest.raises(NodeUnavailableError, match="did not answer"):
            sender.call(lambda: hang.wait(WAIT_S))
        with pytest.raises(NodeUnavailableError, match="within 0.3 s"):  # a call's own deadline
            sender.call(lambda: hang.wait(WAIT_S), deadline_s=0.3)
        with pytest.raises(ValueError, match="raised"):
            sender.call(lambda: (_ for _ in ()).throw(ValueError("raised")))
    finally:
        hang.set()
        sender.close(WAIT_S)


def test_a_closed_sender_refuses_calls(scheduler):
    sender = NodeSender("n0", scheduler, deadline_s=1)
    sender.close(WAIT_S)
    assert sender.submit("a", Job(lambda: None, lambda r, e: None)) is False
    with pytest.raises(NodeUnavailableError, match="closed"):
        sender.call(lambda: None)


# --- placement and the directory ------------------------------------------------------------------


def test_placement_rotates_by_segment_and_avoids_excluded_nodes():
    live = ["a", "b", "c", "d"]
    assert new_ensemble(live, 3, 0) == ("a", "b", "c")
    assert new_ensemble(live, 3, 1) == ("b", "c", "d")
    assert new_ensemble(live, 3, 5) == ("b", "c", "d")
    assert new_ensemble(live, 3, 0, exclude={"b"}) == ("a", "c", "d")
    # too few others: the excluded node is taken last rather than no segment at all
    assert new_ensemble(live, 3, 0, exclude={"a", "b"}) == ("c", "d", "a")
    with pytest.raises(QuorumUnavailableError, match="2 LogStore node"):
        new_ensemble(["a", "b"], 3, 0)


def test_the_directory_is_the_registry_filtered_by_what_the_transport_reaches(tmp_path):
    transport = InProcessTransport({n: object() for n in ("n0", "n1", "n2")})  # type: ignore[misc]
    meta = SqliteMetadataStore(str(tmp_path / "meta.sqlite"))
    try:
        assert NodeDirectory(transport).live() == ["n0", "n1", "n2"]  # in-process: the engines
        registry = NodeDirectory(transport, meta, refresh_s=0)
        assert registry.live() == []  # none registered yet
        for n in ("n0", "n2", "elsewhere"):
            meta.register_node(NodeInfo(n, f"inproc://{n}"))
        assert registry.live() == ["n0", "n2"]  # "elsewhere" has no route from this client
        meta.unregister_node("n0")
        assert registry.live() == ["n2"]
        cached = NodeDirectory(transport, meta, refresh_s=3600)
        assert cached.live() == ["n2"]
        meta.register_node(NodeInfo("n1", "inproc://n1"))
        assert cached.live() == ["n2"]  # read again only after refresh_s
    finally:
        meta.close()
