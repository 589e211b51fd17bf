"""A service-mode deployment shared by many tests: three `logstore serve` node processes
(`node-0`, `node-1`, `node-2`, the names the in-process nodes have) with staged storage, over
the session's etcd and moto S3 server, under a metadata prefix and a bucket of their own.

Tests that take `meta_config` "service" (tests/conftest.py) connect their client to it, so a
test written for in-process nodes runs unchanged against node processes: its faults are the
client's (a `FaultInjectingTransport` around the gRPC transport), and its logs are its own (a
unique name per test), since every test of the session shares the one metadata store. Nodes
drop their local copy of a segment soon after it is SEALED (`storage.staged_grace_s`), so
readers, the window rebuild and the history checker's raw reads meet segments in S3 as well
as on the nodes' disks. Started once per test session (three process starts take seconds on
a busy machine), stopped by PID at its end."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nodeserver import LogStoreNode

NODES = ("node-0", "node-1", "node-2")
S3_KEYS = {"objectstore.access_key_id": "testing", "objectstore.secret_access_key": "testing"}


class ServiceCluster:
    """The nodes of one deployment; `config` is what a client of it connects with."""

    def __init__(self, etcd_endpoint: str, s3_endpoint: str):
        self.dir = Path(tempfile.mkdtemp(prefix="wp-service-cluster-"))
        self.config: dict[str, object] = {
            "quorum.nodes": "registry",
            "meta.type": "etcd",
            "meta.endpoints": [etcd_endpoint],
            "meta.prefix": f"/wp-cluster-{uuid.uuid4().hex[:12]}",
            "objectstore.type": "s3",
            "objectstore.endpoint_url": s3_endpoint,
            "objectstore.bucket": f"wp-cluster-{uuid.uuid4().hex[:12]}",
            "objectstore.region": "us-east-1",
            "objectstore.create_bucket": True,
            **S3_KEYS,
            "storage.type": "staged",
            # short: the copies of a sealed segment go while a test still reads it, so reads
            # and the checker's raw reads come from S3 as well as from the nodes' files
            "storage.staged_grace_s": 0.5,
        }
        node_config = {
            **self.config,
            "storage.staged_dir": str(self.dir / "staged"),
            "storage.fsync": "batch_ms:5",
        }
        self.nodes = [LogStoreNode(n, self.dir / "data", node_config) for n in NODES]

    def start(self) -> ServiceCluster:
        """Start the three at once (each start is seconds of imports on a busy machine); if one
        fails, stop the others."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            starts = [pool.submit(node.start) for node in self.nodes]
        failed = [f.exception() for f in starts if f.exception() is not None]
        if failed:
            self.stop()
            raise failed[0]  # type: ignore[misc]
        return self

    def stop(self) -> None:
        """Stop every node by PID, then remove the nodes' directory."""
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def local_copies(self, log_id: int) -> list[Path]:
        """The segment data files the nodes keep on disk of log `log_id` (dropped ones aside)."""
        return sorted((self.dir / "staged").glob(f"*/*/{log_id}/*/data"))
