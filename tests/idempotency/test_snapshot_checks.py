"""Crafted or foreign snapshots (issue 20 item 3): a snapshot with a valid CRC and the right log id
is still checked against the log's metadata before recovery trusts it (its epoch not above the
log's, every watermark and position inside a completed segment, at or below its last entry). One
that fails is ignored and counted like a corrupt one; the history checker judges the log."""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import pytest

import woodpecker_idem as wp
from woodpecker_idem._core import DedupWindow, encode_snapshot
from woodpecker_idem.idempotency.snapshot import snapshot_key
from woodpecker_idem.testing.history import History

WINDOW_S = 600
MAX_KEYS = 10_000
N = 40  # segments 0 (entries 0-24) and 1 (0-14)


def _writer(log: Any) -> Any:
    return log.open_writer(idempotent=True, window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)


def _write(writer: Any, history: History, keys: list[str]) -> dict[str, Any]:
    ids = {}
    for key in keys:
        payload = f"payload of {key}".encode()
        result = history.call(
            wp.explicit_key(key),
            payload,
            lambda p=payload, k=key: writer.write(p, idempotency_id=k, timeout=30),
        )
        ids[key] = result.message_id
    return ids


def _plant(
    client: Any,
    log: Any,
    epoch: int,
    watermarks: dict[int, int],
    entries: dict[str, tuple[int, int]],
) -> None:
    """Put a well-formed snapshot that sorts after every real one (newest)."""
    window = DedupWindow(MAX_KEYS, WINDOW_S * 1000)
    now = client.clock.now_ms()
    for key, (seg, entry) in entries.items():
        window.add_committed_many(
            wp.explicit_key(key), array("q", [seg]), array("q", [entry]), array("q", [now])
        )
    data = encode_snapshot(window, log.log_id, epoch, now + 60_000, watermarks)
    client.objects.put(snapshot_key(log.log_id, epoch, now + 60_000), data)


@pytest.fixture
def written(tmp_path: Path, wp_connect: Any) -> tuple[Any, Any, History, dict[str, Any]]:
    client = wp_connect(tmp_path, {"segment.max_entries": 25})
    log = client.open_log("orders", create=True)
    history = History()
    with _writer(log) as writer:
        ids = _write(writer, history, [f"k{i}" for i in range(N)])
    assert [s.last_entry_id for s in log.segments()] == [24, N - 26]
    return client, log, history, ids


def _judge(log: Any, history: History) -> None:
    verdict = history.check(list(log.open_reader("earliest")), WINDOW_S * 1000, MAX_KEYS)
    assert verdict.ok, verdict.summary()


def test_future_epoch_and_watermark_past_the_end_are_ignored(written: Any) -> None:
    client, log, history, ids = written
    first = {k: (m.segment_id, m.entry_id) for k, m in ids.items() if m.segment_id == 0}
    _plant(client, log, 99, {0: 24, 1: 10**6}, first)  # would skip segment 1
    with _writer(log) as writer:
        assert writer.recovery.corrupt_snapshots == 1
        again = _write(writer, history, [f"k{i}" for i in range(N)])
    assert again == ids  # every key answered as the duplicate it is
    _judge(log, history)


@pytest.mark.parametrize(
    "marks",
    [
        {0: 24, 1: 14},  # the positions are the problem
        {0: 24, 1: 14, 7: 0},  # and a watermark in a segment the log does not have
    ],
)
@pytest.mark.parametrize(
    ("ghost", "where"),
    [((7, 0), "a segment the log does not have"), ((1, 30), "past the segment's end")],
)
def test_a_position_outside_the_log_is_ignored(
    written: Any, marks: dict[int, int], ghost: tuple[int, int], where: str
) -> None:
    client, log, history, ids = written
    entries = {k: (m.segment_id, m.entry_id) for k, m in ids.items()}
    _plant(client, log, 1, marks, {**entries, "ghost": ghost})  # a key never written
    with _writer(log) as writer:
        assert writer.recovery.corrupt_snapshots == 1, where
        new = _write(writer, history, ["ghost"])
        assert new["ghost"] != wp.LogMessageId(*ghost)
        assert _write(writer, history, [f"k{i}" for i in range(N)]) == ids
    _judge(log, history)


def test_two_keys_at_one_entry_are_ignored(written: Any) -> None:
    """An aliased position: the snapshot puts a never-written key at k3's entry as well."""
    client, log, history, ids = written
    entries = {k: (m.segment_id, m.entry_id) for k, m in ids.items()}
    _plant(client, log, 1, {0: 24, 1: 14}, {**entries, "ghost": entries["k3"]})
    with _writer(log) as writer:
        assert writer.recovery.corrupt_snapshots == 1
        assert _write(writer, history, ["ghost"])["ghost"] != ids["k3"]
        assert _write(writer, history, [f"k{i}" for i in range(N)]) == ids
    _judge(log, history)
