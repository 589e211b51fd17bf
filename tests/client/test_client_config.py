"""connect() honours the deployment keys it supports and refuses what a deployment lacks."""

from __future__ import annotations

import pytest

import woodpecker_idem as wp
from woodpecker_idem.errors import ConfigError


def test_a_staged_node_without_its_local_directory_is_refused_clearly(tmp_path) -> None:
    from woodpecker_idem.connect import open_node

    with pytest.raises(ConfigError, match="storage.staged_dir") as info:
        open_node({"storage.type": "staged"}, tmp_path / "a", "n0")
    assert "local directory" in str(info.value)
    assert not (tmp_path / "a").exists()  # refused before anything was opened or written


@pytest.mark.parametrize(("policy", "fsync"), [("always", True), ("never", False)])
def test_fsync_policy_reaches_the_local_store(tmp_path, policy: str, fsync: bool) -> None:
    client = wp.connect(tmp_path, {"storage.fsync": policy})
    try:
        assert client.objects._fsync is fsync
        log = client.open_log("f", create=True)
        with log.open_writer() as w:
            assert w.write(b"x").message_id == wp.LogMessageId(0, 0)
    finally:
        client.close()


def test_idempotent_metrics_count_what_happened(tmp_path) -> None:
    client = wp.connect(tmp_path, {"idempotency.snapshot_interval_s": 3600})
    try:
        log = client.open_log("m", create=True)
        w = log.open_writer(idempotent=True, window_duration_s=60, window_max_keys=100)
        first = w.write(b"a", idempotency_id="k")
        assert w.write(b"b", idempotency_id="k") == wp.WriteResult(first.message_id, True)
        w.write_many([b"a", b"c"], ids=["k", "k2"])
        m = w.metrics_snapshot()
        assert m["duplicates_suppressed"] == 2 and m["window_keys"] == 2 and m["pending"] == 0
        assert m["window_memory_bytes"] > 0 and m["recovery_seconds"] is not None
        w.close()
        assert w.metrics_snapshot()["snapshot_writes"] == 1  # a clean close leaves a snapshot
        w2 = log.open_writer(idempotent=True, window_duration_s=60, window_max_keys=100)
        r = w2.recovery
        assert r is not None and r.snapshot_key_count == 2 and r.snapshot_age_ms is not None
        w2.close()
    finally:
        client.close()
