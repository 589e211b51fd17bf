"""`woodpecker-idem cluster up|status|down`: a service-mode deployment on this machine (etcd,
moto's S3 server, three LogStore node processes), its `woodpecker.yaml` used by a client, and
every process it started stopped by PID (and, whatever happens in the test, killed at its end)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import woodpecker_idem as wp

WAIT_S = 600


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "woodpecker_idem.cli", *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids(root: Path) -> list[int]:
    try:
        state = json.loads((root / "cluster.json").read_text())
    except FileNotFoundError:
        return []
    return [
        p["pid"] for p in [*state.get("nodes", []), state.get("s3", {}), state.get("etcd", {})] if p
    ]


def test_cluster_up_serves_a_client_at_es3_and_down_stops_every_process(tmp_path: Path):
    root = tmp_path / "cluster"
    started: list[int] = []
    try:
        up = _cli("cluster", "up", "--dir", str(root))
        started = _pids(root)
        assert up.returncode == 0, up.stderr
        status = _cli("cluster", "status", "--dir", str(root), "--json")
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert [n["node_id"] for n in doc["nodes"]] == ["n0", "n1", "n2"]
        assert all(n["alive"] and n["address"].startswith("127.0.0.1:") for n in doc["nodes"])
        assert doc["etcd"]["alive"] and doc["s3"]["alive"]
        assert sorted(started) == sorted(
            [n["pid"] for n in doc["nodes"]] + [doc["etcd"]["pid"], doc["s3"]["pid"]]
        )

        client = wp.connect(config=str(root / "woodpecker.yaml"))
        try:
            log = client.open_log("orders", create=True)
            with log.open_writer(idempotent=True) as w:
                first = {i: w.write(b"o%d" % i, idempotency_id=f"o{i}") for i in range(50)}
                assert w.write(b"o7", idempotency_id="o7") == wp.WriteResult(
                    first[7].message_id, True
                )
            assert {tuple(s.nodes) for s in log.segments()} == {("n0", "n1", "n2")}
            msgs = list(log.open_reader("earliest"))
            assert [m.payload for m in msgs] == [b"o%d" % i for i in range(50)]
        finally:
            client.close()

        again = _cli("cluster", "up", "--dir", str(root))
        assert again.returncode == 2 and "already runs" in again.stderr

        down = _cli("cluster", "down", "--dir", str(root))
        assert down.returncode == 0, down.stderr
        assert not any(_alive(pid) for pid in started)
        gone = _cli("cluster", "status", "--dir", str(root))
        assert gone.returncode == 2 and "no cluster" in gone.stderr
    finally:
        for pid in started or _pids(root):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.timeout(900)  # a cluster, a JVM start and three Spark jobs
@pytest.mark.parametrize("storage", ["object", pytest.param("staged", marks=pytest.mark.slow)])
def test_the_spark_pipeline_runs_on_a_service_cluster_with_one_option(tmp_path: Path, storage):
    """The README's Spark job, unchanged, on service mode: `pipeline --config` names the
    cluster's woodpecker.yaml, and every executor writes through the three node processes (which
    keep segments in S3, or, staged, on their disks until each is uploaded)."""
    root = tmp_path / "cluster"
    try:
        up = _cli("cluster", "up", "--dir", str(root), "--storage", storage)
        assert up.returncode == 0, up.stderr
        job = _cli(
            "pipeline", "--config", str(root / "woodpecker.yaml"), "--orders", "3000",
            "--duplicates", "300", "--data-dir", str(tmp_path / "reports"),
        )  # fmt: skip
        assert job.returncode == 0, job.stderr[-3000:]
        assert "checker: PASS" in job.stdout, job.stdout
        assert "the deployment of" in job.stdout
    finally:
        _cli("cluster", "down", "--dir", str(root))
        for pid in _pids(root):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_cluster_up_with_staged_storage_writes_a_staged_config(tmp_path: Path):
    """`cluster up --storage staged`: the config the nodes and clients share names staged storage
    and a node-local directory under the cluster's (each node's files below it, by node id)."""
    from woodpecker_idem.cli import cluster
    from woodpecker_idem.config import load_config

    state = {"etcd": {"endpoint": "127.0.0.1:1"}, "s3": {"endpoint": "http://127.0.0.1:2"}}
    path = tmp_path / "woodpecker.yaml"
    path.write_text(cluster._config(state, tmp_path, "staged"))
    cfg = load_config(path)
    assert cfg.storage.type == "staged"
    assert cfg.storage.staged_dir == str(tmp_path / "staged")
    path.write_text(cluster._config(state, tmp_path))
    assert load_config(path).storage.type == "object"


def test_cluster_up_with_staged_storage_seals_segments_in_s3(tmp_path: Path):
    """`cluster up --storage staged`: the nodes keep segments under DIR/staged and upload each
    one to the cluster's S3 when it completes; the client sees them SEALED, read back whole."""
    import time

    from woodpecker_idem.types import SegmentState

    root = tmp_path / "cluster"
    started: list[int] = []
    try:
        up = _cli("cluster", "up", "--dir", str(root), "--storage", "staged")
        started = _pids(root)
        assert up.returncode == 0, up.stderr
        client = wp.connect(tmp_path / "client", config=str(root / "woodpecker.yaml"))
        try:
            log = client.open_log("orders", create=True)
            with log.open_writer(idempotent=True) as w:
                for i in range(50):
                    w.write(b"o%d" % i, idempotency_id=f"o{i}")
            deadline = time.monotonic() + WAIT_S
            while any(s.state is not SegmentState.SEALED for s in log.segments()):
                assert time.monotonic() < deadline, log.segments()
                time.sleep(0.1)
            sealed = client.objects.child("sealed")
            for seg in log.segments():
                assert sealed.get(f"{log.log_id}/{seg.segment_id}/footer") is not None
            assert list((root / "staged").glob(f"*/n*/{log.log_id}/0/data"))  # local copies
            msgs = list(log.open_reader("earliest"))
            assert [m.payload for m in msgs] == [b"o%d" % i for i in range(50)]
        finally:
            client.close()
        down = _cli("cluster", "down", "--dir", str(root))
        assert down.returncode == 0, down.stderr
    finally:
        for pid in started or _pids(root):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
