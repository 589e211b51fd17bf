"""One log, two hosts: etcd for metadata, S3 (moto) for entries and snapshots, and two processes
with their own data directories (nothing shared on disk).

Host A (support/hostproc.py, a separate process) writes with ids and is SIGKILLed mid-stream. Host B
(this process) takes the log over, recovers the window from A's snapshot and log, resends every one
of A's writes (acknowledged or not) and writes its own. The history checker then proves every key
is in the log once and nothing acknowledged was lost; A's acknowledged writes come back to B as
duplicates with A's ids.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
from drain import Drain

import woodpecker_idem as wp
from woodpecker_idem import LogMessageId, WriteResult, explicit_key
from woodpecker_idem.testing.history import History

HERE = Path(__file__).resolve().parent.parent / "support"
PACKAGE_ROOT = str(Path(wp.__file__).resolve().parent.parent)
N_A = 1000
KILL_AFTER = 150


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT, env.get("PYTHONPATH", "")])
    env.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1"
    )
    return env


def _snapshot_in(s3: object, bucket: str) -> bool:
    listed = s3.list_objects_v2(Bucket=bucket)  # type: ignore[attr-defined]
    return any("dedup_snapshot/" in o["Key"] for o in listed.get("Contents", []))


def _host_a(data_dir: Path, config: dict, timeout: float = 60.0) -> list[str]:
    """Run host A until it has acknowledged KILL_AFTER writes and written a dedup snapshot, then
    SIGKILL it (by PID). Waiting for the snapshot, not for a time, is what makes B's "started from
    A's snapshot" hold on a busy machine, where 150 acks can come before the snapshot thread ran."""
    cmd = [sys.executable, str(HERE / "hostproc.py"), str(data_dir), json.dumps(config), str(N_A)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    assert proc.stdout is not None and proc.stderr is not None
    stderr = Drain(proc.stderr)  # a full stderr pipe would block host A
    acked: list[str] = []
    fd, buf = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    s3 = boto3.client("s3", endpoint_url=config["objectstore.endpoint_url"])
    try:
        while len(acked) < KILL_AFTER or not _snapshot_in(s3, config["objectstore.bucket"]):
            assert time.monotonic() < deadline, f"host A stuck: {stderr.text()[-2000:]}"
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            assert chunk, f"host A ended early: {stderr.close()[-3000:]}"
            *lines, buf = (buf + chunk).split(b"\n")
            acked.extend(line.decode() for line in lines if line.startswith(b"a-"))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
        stderr.close()
    return acked


def test_writer_on_host_b_takes_over_from_killed_host_a(
    tmp_path, etcd_server, etcd_prefix, s3_server, monkeypatch
):
    for name, value in _env().items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    bucket = f"wp-shared-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server.endpoint_url).create_bucket(Bucket=bucket)
    config = {
        "meta.type": "etcd",
        "meta.endpoints": [etcd_server.endpoint],
        "meta.prefix": etcd_prefix,
        "objectstore.type": "s3",
        "objectstore.endpoint_url": s3_server.endpoint_url,
        "objectstore.bucket": bucket,
        "segment.max_entries": 60,  # several segments before the kill
        "idempotency.snapshot_interval_s": 0.2,
        "idempotency.snapshot_threshold": 40,
    }
    lines = _host_a(tmp_path / "host-a", config)

    history = History()
    first: dict[str, LogMessageId] = {}
    for line in lines:
        key, seg, entry, dup = line.split()
        first[key] = LogMessageId(int(seg), int(entry))
        payload = f"payload of {key}".encode()
        history.ok(explicit_key(key), payload, WriteResult(first[key], dup == "1"))
    for i in range(N_A):  # A's writes not acknowledged when it was killed: they may have landed
        key = f"a-{i}"
        if key not in first:
            history.failed(explicit_key(key), f"payload of {key}".encode(), "host A was SIGKILLed")

    client = wp.connect(tmp_path / "host-b", config)
    try:
        log = client.open_log("shared")  # created by host A: B sees it through etcd
        b = log.open_writer(idempotent=True, window_duration_s=3600, window_max_keys=100_000)
        assert b.recovery.snapshot_key_count > 0, "B did not start from A's snapshot"
        for i in range(N_A):  # every write A was asked for, acknowledged or not
            key = f"a-{i}"
            payload = f"payload of {key}".encode()
            r = history.call(
                explicit_key(key), payload, lambda p=payload, k=key: b.write(p, idempotency_id=k)
            )
            if key in first:
                assert r == WriteResult(first[key], True), (key, r)
        for i in range(100):
            key = f"b-{i}"
            payload = f"payload of {key}".encode()
            history.call(
                explicit_key(key), payload, lambda p=payload, k=key: b.write(p, idempotency_id=k)
            )
        b.close()
        # the entries the nodes store, read around the LogReader (and the reader held to them)
        verdict = history.check_log(log, 3600 * 1000, 100_000)
    finally:
        client.close()
    assert verdict.ok, verdict.summary()
    assert verdict.keyed_entries == N_A + 100
    assert not (tmp_path / "host-b" / "meta.sqlite").exists()  # no local metadata on either host
    assert not (tmp_path / "host-a" / "meta.sqlite").exists()
