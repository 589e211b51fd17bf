"""WriteFuture must behave exactly like concurrent.futures.Future, whichever path completes it."""

from __future__ import annotations

import threading
import time
from concurrent.futures import (
    FIRST_COMPLETED,
    CancelledError,
    Future,
    InvalidStateError,
    as_completed,
    wait,
)

import pytest

from woodpecker_idem.client.futures import WriteFuture


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
    c = WriteFuture()
    assert c.cancel() and c.cancelled()
    with pytest.raises(CancelledError):
        c.result()
    with pytest.raises(InvalidStateError):
        c.set_result(1)


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
    a write in flight costs the collector one object, not four (measured on its full walks)."""
    import gc

    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        futures = [WriteFuture() for _ in range(1000)]
        for f in futures:
            f.set_result(None)
            assert f.result() is None and f.done()
        grown = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert 1000 <= grown <= 1010, grown
    called = []
    futures[0].add_done_callback(called.append)  # done: called at once, still no condition
    assert called == [futures[0]] and futures[0]._cond is None
