"""A log deleted under a live writer fences it (issue: `delete_log` / `drop-group --force` while a
writer in another client holds the log): nothing is acknowledged once the delete is committed,
and the writer's next write fails with a clear, non-retriable `WriterFencedError`."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from woodpecker_idem.errors import WriterFencedError

WAIT_S = 60


@pytest.mark.parametrize("meta_config", ["sqlite", "etcd"], indirect=True)
@pytest.mark.parametrize("idempotent", [False, True])
def test_a_log_deleted_under_a_writer_of_another_client_fences_it(
    tmp_path: Path, wp_connect, meta_config, idempotent: bool
):
    writing = wp_connect(tmp_path, meta_config)
    deleting = wp_connect(tmp_path, meta_config)  # another client: its own nodes, same storage
    log = writing.open_log("doomed", create=True)
    w = log.open_writer(idempotent=idempotent)
    deleted = threading.Event()
    after: list[object] = []  # outcomes of the writes started once the delete had returned
    acked_before = 0
    errors: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        nonlocal acked_before
        i = 0
        while not stop.is_set():
            started_after = deleted.is_set()
            key = {"idempotency_id": f"k{i}"} if idempotent else {}
            try:
                w.write(b"entry-%d" % i, timeout=WAIT_S, **key)  # type: ignore[call-overload]
                outcome: object = "acked"
            except WriterFencedError as exc:
                outcome = exc
            except BaseException as exc:  # noqa: BLE001 - any other outcome fails the test
                errors.append(exc)
                return
            if started_after:
                after.append(outcome)
                if len(after) >= 5:
                    return
            elif outcome == "acked":
                acked_before += 1
            i += 1

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        while acked_before < 20 and producer.is_alive():
            threading.Event().wait(0.01)
        deleting.delete_log("doomed")
        deleted.set()
        producer.join(WAIT_S)
    finally:
        stop.set()
        producer.join(WAIT_S)
    assert not errors, errors
    assert acked_before >= 20
    assert len(after) == 5, after  # the writer went on being called after the delete
    assert all(isinstance(o, WriterFencedError) for o in after), after  # none acknowledged
    assert not after[0].retriable  # type: ignore[attr-defined]
    assert w.fenced
    assert "doomed" not in deleting.list_logs()
    w.close()
    again = deleting.open_log("doomed", create=True)  # a new log of that name starts empty
    assert list(again.open_reader("earliest")) == []
