"""client.close(): every writer opened through the client is closed first (its queued writes
flushed, its segments completed), so no writer thread outlives the stores it uses."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

import woodpecker_idem as wp
from woodpecker_idem import SegmentState, WriterFencedError


def _writer_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("wp-") and t.is_alive()}


@pytest.fixture
def thread_errors(monkeypatch):
    """Exceptions that ended a thread (threading.excepthook), recorded instead of printed."""
    errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    return errors


def test_close_flushes_and_stops_every_writer(tmp_path: Path, thread_errors):
    before = _writer_threads()
    client = wp.connect(tmp_path, {"append.linger_ms": 1000})  # nothing goes out by itself soon
    plain = client.open_log("plain", create=True).open_writer()
    idem = client.open_log("idem", create=True).open_writer(idempotent=True)
    futures = [plain.write_async(b"p%d" % i) for i in range(50)]
    futures += [idem.write_async(b"i%d" % i, idempotency_id=f"i{i}") for i in range(50)]
    assert _writer_threads() - before
    client.close()
    assert all(f.result(0).message_id for f in futures)  # flushed, not failed
    assert _writer_threads() - before == set()
    assert thread_errors == []
    with wp.connect(tmp_path) as again:
        for name in ("plain", "idem"):
            log = again.open_log(name)
            assert len(list(log.open_reader())) == 50
            assert SegmentState.ACTIVE not in {s.state for s in log.segments()}  # closed cleanly


def test_close_with_a_fenced_writer_logs_no_error(tmp_path: Path, thread_errors, caplog):
    """A writer taken over (it has not noticed yet) keeps a snapshot task; closing the client
    stops it before the metadata store closes, with nothing worse than a warning logged."""
    before = _writer_threads()
    client = wp.connect(tmp_path, {"idempotency.snapshot_interval_s": 0.05})
    log = client.open_log("x", create=True)
    a = log.open_writer(idempotent=True)
    a.write_many([b"a%d" % i for i in range(100)])
    b = log.open_writer(idempotent=True)  # takes over: `a` is fenced
    b.write_many([b"b%d" % i for i in range(100)])
    with caplog.at_level(logging.WARNING, logger="woodpecker_idem"):
        client.close()
    assert _writer_threads() - before == set()
    assert thread_errors == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert a.fenced and not b.fenced


def test_fenced_writer_close_stops_its_snapshot_task(tmp_path: Path):
    with wp.connect(tmp_path, {"idempotency.snapshot_interval_s": 3600}) as client:
        log = client.open_log("x", create=True)
        a = log.open_writer(idempotent=True)
        b = log.open_writer(idempotent=True)
        with pytest.raises(WriterFencedError):
            a.write(b"late", idempotency_id="late")  # `a` learns it was taken over
        a.close()
        assert not a.snapshotter.active
        b.close()
