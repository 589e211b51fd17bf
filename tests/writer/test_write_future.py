"""WriteFuture must behave exactly like concurrent.futures.Future, whichever path completes it."""

from __future__ import annotations

import threading
import time
from concurrent.futures import (
    FIRST_COMPLETED,
    Future,
    InvalidStateError,
    as_completed,
    wait,
)

import pytest

import woodpecker_idem as wp
from woodpecker_idem.types import LogMessageId, WriteResult
from woodpecker_idem.writer.results import FutureRun, WriteFuture


def test_is_a_concurrent_future_and_resolves_like_one() -> None:
    f = WriteFuture()
    assert isinstance(f, Future) and not f.done() and not f.running()
    seen: list[object] = []
    f.add_done_callback(lambda x: seen.append(x.result()))
    f.set_result(42)
    assert f.done() and f.result() == 42 and f.exception() is None and seen == [42]
    f.add_done_callback(lambda x: seen.append("late"))  # after completion: runs at once
    assert seen == [42, "late"]
    with pytest.raises(InvalidStateError):
        f.set_result(1)


def test_exception_path() -> None:
    f = WriteFuture()
    f.set_exception(TimeoutError("late"))
    with pytest.raises(TimeoutError, match="late"):
        f.result()
    assert isinstance(f.exception(), TimeoutError)


def test_result_blocks_until_another_thread_sets_it() -> None:
    f = WriteFuture()
    threading.Timer(0.05, f.set_result, args=("x",)).start()
    started = time.monotonic()
    assert f.result(5) == "x"
    assert time.monotonic() - started >= 0.04
    g = WriteFuture()
    with pytest.raises(TimeoutError):
        g.result(0.01)


def test_wait_as_completed_and_cancel() -> None:
    fs = [WriteFuture() for _ in range(3)]
    fs[0].set_result(0)
    done, not_done = wait(fs, timeout=0, return_when=FIRST_COMPLETED)
    assert done == {fs[0]} and len(not_done) == 2
    threading.Timer(0.02, fs[1].set_result, args=(1,)).start()
    threading.Timer(0.04, fs[2].set_exception, args=(ValueError("v"),)).start()
    assert {f for f in as_completed(fs, timeout=5)} == set(fs)


def test_a_queued_write_cannot_be_cancelled(tmp_path) -> None:
    """cancel() is False (Kafka's producer futures say the same): a True would promise that a
    write which still lands did not."""
    c = WriteFuture()
    assert not c.cancel() and not c.cancelled()
    c.set_result(1)
    assert c.result() == 1
    client = wp.connect(str(tmp_path), {"quorum.es": 1})
    try:
        writer = client.create_log("c").open_writer()
        futures = [writer.write_async(b"x%d" % i) for i in range(50)]
        assert not any(f.cancel() for f in futures)
        writer.flush()
        assert [f.result().message_id.entry_id for f in futures] == list(range(50))
        assert len(list(client.open_log("c").open_reader())) == 50
    finally:
        client.close()


def test_settle_all_skips_settled_futures_and_wakes_waiters_and_callbacks() -> None:
    fs = [WriteFuture() for _ in range(4)]
    fs[1].set_exception(TimeoutError("timed out first"))  # settled before the batch's ack
    seen: list[object] = []
    fs[2].add_done_callback(lambda f: seen.append(f.result()))
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(fs[3].result(5)))
    waiter.start()
    while fs[3]._cond is None:  # the waiter blocks on its condition (the full path)
        time.sleep(0.001)
    plain = Future()
    WriteFuture.settle_all([*fs, plain], ["a", "b", "c", "d", "e"])
    waiter.join(5)
    assert fs[0].result() == "a" and isinstance(fs[1].exception(), TimeoutError)
    assert seen == ["c"] and got == ["d"] and plain.result() == "e"


def test_a_future_run_tells_each_write_its_own_id() -> None:
    fs = [WriteFuture() for _ in range(5)]
    run = FutureRun(fs)
    head, tail = run.split(2)
    head.set_result(WriteResult(LogMessageId(3, 10), False))
    tail.set_exception(RuntimeError("segment lost"))
    assert [f.result() for f in fs[:2]] == [
        WriteResult(LogMessageId(3, 10), False),
        WriteResult(LogMessageId(3, 11), False),
    ]
    assert all(isinstance(f.exception(), RuntimeError) for f in fs[2:])


def test_racing_completion_against_waiters_and_callbacks() -> None:
    """Completion on one thread while another adds callbacks or blocks: nothing is missed."""
    for _ in range(300):
        f = WriteFuture()
        calls: list[int] = []
        got: list[object] = []
        barrier = threading.Barrier(3)

        def waiter(fut: WriteFuture = f, out: list = got, b: threading.Barrier = barrier) -> None:
            b.wait()
            out.append(fut.result(5))

        def adder(fut: WriteFuture = f, out: list = calls, b: threading.Barrier = barrier) -> None:
            b.wait()
            fut.add_done_callback(lambda _f: out.append(1))

        threads = [threading.Thread(target=waiter), threading.Thread(target=adder)]
        for t in threads:
            t.start()
        barrier.wait()
        f.set_result("ok")
        for t in threads:
            t.join(5)
        assert got == ["ok"] and calls == [1]


def test_second_completion_raises_without_deadlock() -> None:
    f = WriteFuture()
    f.set_exception(RuntimeError("first"))
    with pytest.raises(InvalidStateError):
        f.set_exception(RuntimeError("second"))  # its message reprs the future
    assert "finished" in repr(f)


def test_a_settled_future_is_one_object_for_the_garbage_collector() -> None:
    """No condition, lists or dict are made unless somebody blocks, waits or adds a callback:
    a write in flight costs the collector one object, not four. Counted on the futures
    themselves (the objects the collector reaches from each), so other threads allocating
    meanwhile do not count (a count of every object in the process did, on a busy machine)."""
    import gc

    def owned(f: WriteFuture) -> list[object]:
        """The objects the collector walks through `f` (not its class)."""
        return [o for o in gc.get_referents(f) if gc.is_tracked(o) and o is not type(f)]

    futures = [WriteFuture() for _ in range(1000)]
    for f in futures:
        f.set_result(None)
        assert f.result() is None and f.done()
    assert all(gc.is_tracked(f) for f in futures)
    extra = [type(o).__name__ for f in futures for o in owned(f)]
    assert extra == [], f"settled futures own {len(extra)} more objects: {sorted(set(extra))}"
    called = []
    futures[0].add_done_callback(called.append)  # done: called at once, still no condition
    assert called == [futures[0]] and futures[0]._cond is None
    waited = WriteFuture()
    waited.set_result(None)
    waited.result(0)
    assert owned(waited) == []


def test_write_results_are_the_namedtuples_built_in_place() -> None:
    import gc

    from woodpecker_idem._core import write_results
    from woodpecker_idem.errors import InvalidTypeError

    got = write_results(7, 2**40, 3, True, WriteResult, LogMessageId)
    assert got == [WriteResult(LogMessageId(7, 2**40 + i), True) for i in range(3)]
    assert all(type(r) is WriteResult and type(r.message_id) is LogMessageId for r in got)
    assert got[0].message_id.entry_id == 2**40 and got[2].duplicate is True
    assert not any(gc.is_tracked(r) or gc.is_tracked(r.message_id) for r in got)  # no cycles
    assert write_results(0, 0, 0, False, WriteResult, LogMessageId) == []
    with pytest.raises(InvalidTypeError, match="result_type must be a tuple subclass"):
        write_results(0, 0, 1, False, dict, LogMessageId)  # type: ignore[type-var]


def test_a_failed_future_owns_nothing_more_than_a_settled_one() -> None:
    """A fence fails every queued write at once: failing must not build the condition and
    lists a blocked caller needs (before, every failed future made them)."""
    future = WriteFuture()
    future.set_exception(ValueError("fenced"))
    assert future._cond is None and future._waiter_list is None and future._callbacks is None
    assert future.done() and isinstance(future.exception(), ValueError)
    with pytest.raises(ValueError, match="fenced"):
        future.result()
    with pytest.raises(InvalidStateError):
        future.set_exception(ValueError("again"))
