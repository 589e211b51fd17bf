"""Clock skew between writer hosts (issue 20 item 9): the window is measured on the writers'
clocks, so a taking-over writer whose clock is behind the log's newest timestamp is warned about
(and the report says by how much); one in step is not."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from woodpecker_idem import ManualClock

T0 = 1_700_000_000_000
SKEW_MS = 601_000


def _writer(client: Any) -> Any:
    log = client.open_log("orders", create=True)
    return log.open_writer(idempotent=True, window_duration_s=3600, window_max_keys=10_000)


@pytest.mark.parametrize("snapshots", [True, False])
def test_a_writer_behind_the_logs_newest_timestamp_is_warned(
    tmp_path: Path, wp_connect: Any, caplog: pytest.LogCaptureFixture, snapshots: bool
) -> None:
    ahead = wp_connect(tmp_path, clock=ManualClock(T0 + SKEW_MS))  # a host 601 s ahead
    with _writer(ahead) as writer:
        for i in range(20):
            writer.write(f"p{i}".encode(), idempotency_id=f"k{i}", timeout=30)
    if not snapshots:  # the newest time then comes from the entries read back
        ahead.objects.delete_prefix("dedup_snapshot/")
    ahead.close()

    behind = wp_connect(tmp_path, clock=ManualClock(T0))
    with caplog.at_level(logging.WARNING):
        writer = _writer(behind)
    assert writer.recovery.clock_behind_ms == SKEW_MS
    assert "601.000 s behind the newest timestamp in the log" in caplog.text
    assert "synchronized" in caplog.text
    writer.close()


def test_a_writer_in_step_is_not_warned(
    tmp_path: Path, wp_connect: Any, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(T0)
    client = wp_connect(tmp_path, clock=clock)
    with _writer(client) as writer:
        for i in range(20):
            writer.write(f"p{i}".encode(), idempotency_id=f"k{i}", timeout=30)
    clock.advance(5)
    with caplog.at_level(logging.WARNING), _writer(client) as writer:
        assert writer.recovery.clock_behind_ms == 0
    assert "behind the newest timestamp" not in caplog.text


def test_the_entries_of_a_crashed_writer_alone_tell_the_newest_time(
    tmp_path: Path, wp_connect: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """No snapshot and no completion of the ahead writer's: the taking-over writer completes its
    segment on its own clock, so only the timestamps of the entries the rebuild reads say how
    far behind it is."""
    ahead = wp_connect(tmp_path, clock=ManualClock(T0 + SKEW_MS))
    crashed = _writer(ahead)  # never closed: taken over below, as after a crash
    for i in range(20):
        crashed.write(f"p{i}".encode(), idempotency_id=f"k{i}", timeout=30)
    ahead.objects.delete_prefix("dedup_snapshot/")

    behind = wp_connect(tmp_path, clock=ManualClock(T0))
    with caplog.at_level(logging.WARNING):
        writer = _writer(behind)
    assert writer.recovery.entries_replayed == 20 and writer.recovery.snapshot_age_ms is None
    assert writer.recovery.clock_behind_ms == SKEW_MS
    assert "601.000 s behind the newest timestamp in the log" in caplog.text
    writer.close()
    ahead.close()
