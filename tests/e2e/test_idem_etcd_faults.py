"""Faults of the metadata store under an idempotent writer with `meta.type: etcd`, each judged by
the history checker: etcd restarted mid-stream, and etcd frozen with SIGSTOP.

Writes inside a segment never touch metadata; a roll (create the next segment, complete the last)
does. So segments are short here, and the producer resends a failed write like an application
would. The checker then proves every key is in the log once and nothing acknowledged was lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcdserver import EtcdServer

import woodpecker_idem as wp
from woodpecker_idem import SegmentState, explicit_key
from woodpecker_idem.errors import StorageUnavailableError, WoodpeckerError
from woodpecker_idem.testing.history import History

WINDOW_S = 600
MAX_KEYS = 100_000


@pytest.fixture
def own_etcd() -> Iterator[EtcdServer]:
    server = EtcdServer().start()
    try:
        yield server
    finally:
        server.stop()


def _connect(path: Path, server: EtcdServer, prefix: str, **cfg: object) -> wp.WoodpeckerClient:
    return wp.connect(
        path,
        {
            "meta.type": "etcd",
            "meta.endpoints": [server.endpoint],
            "meta.prefix": prefix,
            "segment.max_entries": 10,
            "idempotency.snapshot_interval_s": 0.2,
            **cfg,
        },
    )


def _write(history: History, writer, key: str, failures: list[BaseException]) -> None:
    """One logical write, resent until acknowledged (each attempt recorded)."""
    deadline = time.monotonic() + 60
    payload = b"payload-" + key.encode()
    while True:
        start = history.now()
        try:
            result = writer.write(payload, idempotency_id=key)
        except WoodpeckerError as exc:
            history.failed(explicit_key(key), payload, exc, start)
            failures.append(exc)
            assert time.monotonic() < deadline, f"{key} never acknowledged: {exc!r}"
            time.sleep(0.05)
            continue
        history.ok(explicit_key(key), payload, result, start)
        return


def _judge(client: wp.WoodpeckerClient, log: wp.LogHandle, history: History, keys: list[str]):
    """After the faulted writer's close(): no segment left open (readers would stop there); a new
    writer takes over and resends every key: all duplicates; then the checker."""
    segments = client.meta.list_segments(log.log_id)
    assert all(s.state is not SegmentState.ACTIVE for s in segments), segments
    w2 = log.open_writer(idempotent=True, window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    for key in keys:
        payload = b"payload-" + key.encode()
        again = history.call(
            explicit_key(key), payload, lambda p=payload, k=key: w2.write(p, idempotency_id=k)
        )
        assert again.duplicate, key
    w2.close()
    plain = log.open_writer()  # completes every segment, so the reader sees the whole log
    plain.close()
    # the entries the nodes store, read around the LogReader (and the reader held to them)
    verdict = history.check_log(log, WINDOW_S * 1000, MAX_KEYS)
    assert verdict.ok, verdict.summary()
    assert verdict.keyed_entries == len(keys)


def test_etcd_restarted_mid_stream(tmp_path, own_etcd, etcd_prefix):
    client = _connect(tmp_path, own_etcd, etcd_prefix)
    log = client.open_log("restart", create=True)
    w = log.open_writer(idempotent=True, window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    history, failures = History(), []
    keys: list[str] = []
    down, back = threading.Event(), threading.Event()

    def restart() -> None:
        own_etcd.terminate()  # SIGTERM by PID; data and ports kept
        down.set()
        time.sleep(1.0)
        own_etcd.start()
        back.set()

    chaos = threading.Thread(target=restart)
    during, after_back = 0, 0
    while len(keys) < 300 or not back.is_set() or len(keys) < after_back + 50:
        if len(keys) == 95:  # a few writes land in the open segment, then a roll needs etcd
            chaos.start()
            down.wait(30)
        keys.append(f"k{len(keys)}")
        if down.is_set() and not back.is_set():
            during += 1  # issued while etcd is down
        _write(history, w, keys[-1], failures)
        if not back.is_set():
            after_back = len(keys)
        time.sleep(0.002)
    chaos.join(60)
    assert during > 0, "no write was issued while etcd was down"
    # The outage is shorter than meta.timeout_ms: calls retried through it; anything that failed
    # failed clearly (a call that may have reached etcd is not resent blindly).
    assert all(isinstance(e, StorageUnavailableError) for e in failures), failures
    assert w.metrics["segments_rolled"] >= len(keys) // 10 - 1
    w.close()
    _judge(client, log, history, keys)
    client.close()


def test_etcd_frozen_writes_go_on_and_roll_after_thaw(tmp_path, own_etcd, etcd_prefix):
    client = _connect(tmp_path, own_etcd, etcd_prefix, **{"meta.timeout_ms": 500})
    log = client.open_log("frozen", create=True)
    w = log.open_writer(idempotent=True, window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    history, failures = History(), []
    keys = [f"k{i}" for i in range(5000)]
    for key in keys[:25]:
        _write(history, w, key, failures)
    assert not failures
    own_etcd.freeze()
    rolls_before = w.metrics["segments_rolled"]
    slow: list[float] = []
    try:
        # Writes go on in the open segment: a roll needs etcd, fails after meta.timeout_ms, and
        # is retried with backoff (the segment limits are targets), so nothing fails.
        i = 25
        until = time.monotonic() + 2.0
        while time.monotonic() < until and i < 4000:
            started = time.monotonic()
            _write(history, w, keys[i], failures)
            slow.append(time.monotonic() - started)
            i += 1
    finally:
        own_etcd.thaw()
    assert not failures, failures
    # (each roll attempt holds the writer for up to meta.timeout_ms: few writes fit in 2 s)
    assert i > 31, ("no write went past the segment limit while etcd was frozen", i, slow)
    assert w.metrics["segments_rolled"] == rolls_before  # no roll could happen
    assert w.metrics["background_retries"] >= 1
    assert max(slow) >= 0.4  # a roll attempt waited out meta.timeout_ms
    # Thawed: the same writer rolls by itself, at the next retry of its roll, whose backoff grew
    # during the freeze: writes go on meanwhile (a busy machine stretches the wait; the bound
    # only ends a test that would otherwise hang).
    thawed_at, until = i, time.monotonic() + 120.0
    while i < len(keys) and time.monotonic() < until:
        _write(history, w, keys[i], failures)
        i += 1
        if w.metrics["segments_rolled"] > rolls_before and i >= thawed_at + 40:
            break
        time.sleep(0.005)
    keys = keys[:i]
    assert w.metrics["segments_rolled"] > rolls_before
    w.close()
    _judge(client, log, history, keys)
    client.close()


@pytest.mark.parametrize("meta_config", ["sqlite", "etcd"], indirect=True)
def test_a_roll_whose_create_answer_was_lost_leaves_no_segment_open(tmp_path, meta_config):
    """A create_segment that etcd applied but whose answer never came back (a timeout after the
    request went out): the writer must adopt that segment on its next roll, not leave it ACTIVE
    behind a newer one, where readers would wait for good."""
    client = wp.connect(tmp_path, {**meta_config, "segment.max_entries": 5})
    log = client.open_log("lost-answer", create=True)
    w = log.open_writer(idempotent=True, window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS)
    meta = client.meta
    real_create = meta.create_segment
    lost: list[int] = []

    def create_segment(epoch, seg):
        out = real_create(epoch, seg)
        if not lost:
            lost.append(seg.segment_id)
            raise StorageUnavailableError("metadata answer lost (injected)")
        return out

    meta.create_segment = create_segment
    history, failures = History(), []
    keys = [f"k{i}" for i in range(17)]
    try:
        for key in keys:
            _write(history, w, key, failures)
    finally:
        meta.create_segment = real_create
    assert lost and not failures, failures  # the roll is retried; writes went on meanwhile
    w.close()
    segments = meta.list_segments(log.log_id)
    assert all(s.state is not SegmentState.ACTIVE for s in segments), segments
    assert sorted(s.segment_id for s in segments) == list(range(len(segments)))
    # without a takeover first: what the nodes hold and readers see after close()
    verdict = history.check_log(log, WINDOW_S * 1000, MAX_KEYS)
    assert verdict.ok, verdict.summary()
    assert verdict.keyed_entries == len(keys)
    client.close()
