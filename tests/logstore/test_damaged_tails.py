"""Damaged tails of an ACTIVE local segment file (issue 20 item 5). An acknowledged batch was
fdatasynced before its ack, so a crash cannot tear it: garbage after the last batch, a damaged
header in the final batch, or a bit flip in its frame is corruption. The next writer (es=1) fails
with a non-retriable `SegmentDamagedError` naming the file and offset and how to repair it,
with a warning and a counter, instead of a retriable `QuorumUnavailableError` for ever or
silently dropping the acknowledged entries. A real tear (zeros to the end) is still the tail."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from segfile_util import batches, flip, locate

import woodpecker_idem as wp
from woodpecker_idem.errors import QuorumUnavailableError, SegmentDamagedError
from woodpecker_idem.logstore.segment_files import BATCH_HEADER_SIZE
from woodpecker_idem.testing.history import History

WINDOW_S = 600
MAX_KEYS = 10_000
CONFIG = {"append.timeout_ms": 3000}


def _writer(log: Any) -> Any:
    return log.open_writer(idempotent=True, window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)


def _active_segment(tmp_path: Path, wp_connect: Any) -> tuple[Any, Path, History]:
    """50 acknowledged keys in an ACTIVE segment whose writer is still open (as if killed)."""
    client = wp_connect(tmp_path, CONFIG)
    log = client.open_log("orders", create=True)
    writer = _writer(log)
    history = History()
    for i in range(50):
        payload = f"payload-{i}".encode()
        history.call(
            wp.explicit_key(f"k{i}"),
            payload,
            lambda p=payload, k=f"k{i}": writer.write(p, idempotency_id=k, timeout=30),
        )
    seg_dir = Path(client.objects.root) / str(log.log_id) / "0"
    assert len(batches(seg_dir / "data")) > 1
    return client, seg_dir, history


def _garbage(data: Path) -> int:
    size = data.stat().st_size
    with open(data, "ab") as f:
        f.write(bytes(range(1, 41)))  # 40 non-zero bytes after the last batch
    return size


def _bad_header(data: Path) -> int:
    offset = batches(data)[-1][0]
    flip(data, offset + 8)
    return offset


def _bad_record(data: Path) -> int:
    offset = batches(data)[-1][0]
    _, _, pos, length = locate(data.parent, 49)
    flip(data, pos + 8 + length // 2)  # inside the final entry's bytes
    return offset


@pytest.mark.parametrize("damage", [_garbage, _bad_header, _bad_record])
def test_damage_at_the_end_of_an_active_segment_is_reported(
    tmp_path: Path, wp_connect: Any, damage: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _, seg_dir, history = _active_segment(tmp_path, wp_connect)
    data = seg_dir / "data"
    offset = damage(data)

    other = wp_connect(tmp_path, CONFIG)  # the next writer, as after a crash
    log = other.open_log("orders")
    with caplog.at_level(logging.WARNING), pytest.raises(SegmentDamagedError) as info:
        _writer(log)
    err = info.value
    assert not isinstance(err, QuorumUnavailableError) and not err.retriable
    assert err.code == "SEGMENT_DAMAGED"
    text = str(err)
    assert f"data@{offset}" in text and f"truncate -s {offset} {data}" in text
    assert f"{data} is damaged at offset {offset}" in caplog.text
    assert other.transport.engines["node-0"].storage.damaged == 1
    with pytest.raises(SegmentDamagedError):  # and again: nothing was sealed meanwhile
        _writer(log)
    assert log.segments()[0].state is wp.SegmentState.ACTIVE

    # the repair the message names: the entries from the offset on are given up, the rest kept
    with open(data, "r+b") as f:
        f.truncate(offset)
    with _writer(log) as writer:
        kept = writer.recovery.window_size
    assert 0 < kept < 50 or damage is _garbage
    messages = list(log.open_reader("earliest"))
    assert [m.payload for m in messages] == [f"payload-{i}".encode() for i in range(len(messages))]
    if damage is _garbage:  # nothing acknowledged was in the garbage: the history holds
        verdict = history.check(messages, WINDOW_S * 1000, MAX_KEYS)
        assert verdict.ok, verdict.summary()


def test_zeros_to_the_end_of_the_final_batch_are_a_torn_write(
    tmp_path: Path, wp_connect: Any
) -> None:
    """Pages a crash before the fdatasync never wrote: the tail, cut off without an error."""
    _, seg_dir, _ = _active_segment(tmp_path, wp_connect)
    data = seg_dir / "data"
    offset, first, _ = batches(data)[-1]
    whole = data.read_bytes()
    cut = offset + BATCH_HEADER_SIZE + 5
    data.write_bytes(whole[:cut] + bytes(len(whole) - cut))
    other = wp_connect(tmp_path, CONFIG)
    log = other.open_log("orders")
    with _writer(log):
        pass
    assert log.segments()[0].last_entry_id == first - 1
    assert other.transport.engines["node-0"].storage.damaged == 0
