"""Ctrl-C during the writer's multi-step bookkeeping is held back until the writer is whole
(writer/lifecycle.py), then delivered: the caller still gets its KeyboardInterrupt."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from woodpecker_idem.writer.lifecycle import HOLD_INTERRUPTS


@pytest.fixture(autouse=True)
def python_sigint_handler():
    """Python's own SIGINT handler for each test (a local Spark started earlier in the same
    process installs its own), put back as it was afterwards."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_self() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.02)  # Python runs its handler at the next bytecode: well inside this window


def test_an_interrupt_inside_a_hold_is_delivered_when_it_ends() -> None:
    steps = []
    with pytest.raises(KeyboardInterrupt), HOLD_INTERRUPTS:
        _interrupt_self()
        steps.append("inside, after the signal")
        with HOLD_INTERRUPTS:  # nested: delivered once, by the outermost
            steps.append("nested")
        steps.append("still inside")
    assert steps == ["inside, after the signal", "nested", "still inside"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with HOLD_INTERRUPTS:  # nothing held: a hold leaves nothing behind
        pass
    with pytest.raises(KeyboardInterrupt):
        _interrupt_self()  # and the handler is Python's again


def test_a_hold_calls_the_users_own_handler_after_it() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with HOLD_INTERRUPTS:
            _interrupt_self()
            assert seen == []
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_other_threads_pass_through() -> None:
    done = []

    def work() -> None:
        with HOLD_INTERRUPTS:  # no signal handler can be set here: must not try
            done.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=work)
    t.start()
    t.join(5)
    assert done == [signal.default_int_handler]


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_ctrl_c_while_queued_writes_become_entries_loses_none(
    tmp_path, wp_connect, monkeypatch, idempotent
):
    """SIGINT lands while the caller's thread turns queued writes into entries (here: inside
    the frame encoding of its 3rd admission): the call raises KeyboardInterrupt once the writes
    are entries, and every write accepted lands, in order, without a gap."""
    from woodpecker_idem.idempotency.stage import WindowStage
    from woodpecker_idem.writer import accumulator

    client = wp_connect(tmp_path, {"append.max_batch_entries": 5})
    log = client.create_log("a")
    writer = log.open_writer(idempotent=True) if idempotent else log.open_writer()
    # the idempotent writer encodes a run's frame in the stage's one call that reserves its keys
    module, name = (WindowStage, "reserve_locked") if idempotent else (accumulator, "encode_frame")
    real, calls = getattr(module, name), [0]

    def encode_frame(*args, **kwargs):
        if threading.current_thread() is threading.main_thread():  # Ctrl-C lands there only
            calls[0] += 1
            if calls[0] == 3:
                _interrupt_self()
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, encode_frame)
    futures, interrupted = {}, []
    for i in range(200):
        try:
            futures[b"p%d" % i] = writer.write_async(b"p%d" % i)
        except KeyboardInterrupt:  # raised after its write was queued: it lands too
            interrupted.append(b"p%d" % i)
    assert len(interrupted) == 1 and calls[0] > 3  # the fault landed, and writing went on
    writer.flush(timeout=10)
    acked = {p: f.result(timeout=10).message_id for p, f in futures.items()}
    writer.close()
    msgs = list(client.open_log("a").open_reader())
    assert [m.payload for m in msgs] == [b"p%d" % i for i in range(200)]
    assert {m.payload: m.message_id for m in msgs if m.payload in acked} == acked


def test_an_error_while_queued_writes_become_entries_ends_them(tmp_path, wp_connect, monkeypatch):
    """Any error before a run is queued (here: the encoding fails once) ends the writes it held
    with that error instead of leaving their futures pending; later writes go on."""
    from woodpecker_idem.writer import accumulator as queued

    client = wp_connect(tmp_path, {"append.max_batch_entries": 5})
    writer = client.create_log("e").open_writer()
    real, calls = queued.encode_frame, [0]

    def encode_frame(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 1:
            raise MemoryError("no room for the frame")
        return real(*args, **kwargs)

    monkeypatch.setattr(queued, "encode_frame", encode_frame)
    lost = writer.write_async(b"lost")
    with pytest.raises(MemoryError, match="no room"):
        lost.result(timeout=5)
    assert writer.write(b"next", timeout=5).message_id.entry_id == 0
    writer.close()
    assert [m.payload for m in client.open_log("e").open_reader()] == [b"next"]
