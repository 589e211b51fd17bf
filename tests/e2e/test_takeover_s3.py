"""A takeover on S3 after single writes (issue 32 item 2): the taking-over writer reads the old
writer's packs, not one object per write, and its window still holds every key (each retry is a
duplicate answered with the first write's id). Two clients over one bucket and one metadata
store; the first is abandoned without a close, as a crashed writer is."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from pathlib import Path

import pytest

import woodpecker_idem as wp

pytestmark = pytest.mark.s3

N = 300


@pytest.fixture
def s3_env(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.mark.parametrize("quiet", [True, False], ids=["writer-quiet", "writer-cut-short"])
def test_takeover_after_single_writes_reads_packs(
    tmp_path: Path, s3_server, s3_env, wp_connect, quiet: bool
) -> None:
    cfg = {
        "objectstore.type": "s3",
        "objectstore.endpoint_url": s3_server.endpoint_url,
        "objectstore.bucket": f"wp-take-{uuid.uuid4().hex[:12]}",
        "objectstore.region": "us-east-1",
        "objectstore.create_bucket": True,
        # no snapshot covers the writes: the takeover reads every key back from the log
        "idempotency.snapshot_interval_s": 3600,
        "idempotency.snapshot_threshold": 10**6,
    }
    a = wp_connect(tmp_path, cfg)
    writer = a.create_log("orders").open_writer(idempotent=True)
    first = {i: writer.write(b"o-%d" % i, idempotency_id=f"o-{i}") for i in range(N)}
    packer = a.transport.engines["node-0"].storage.packer
    if quiet:
        assert packer.wait_idle(60)  # every block in a pack
    packer.close()  # the writer stops here, without a close: nothing completes its segment

    b = wp_connect(tmp_path, cfg)
    gets: Counter[str] = Counter()
    opened = threading.Event()  # after open_writer: the segment's bytes counted in the background

    def count(request, **_) -> None:  # type: ignore[no-untyped-def]
        if not opened.is_set():
            gets.update(["pack" if ".pk" in request.url else "other"])

    b.objects.client.meta.events.register("before-send.s3.GetObject", count)
    w2 = b.open_log("orders").open_writer(idempotent=True)
    opened.set()
    assert w2.recovery is not None and w2.recovery.window_size == N, w2.recovery
    # 300 blocks: one pack of 256, 2 of 16 and one of the last 12 (quiet), or the blocks of the
    # packs not put yet read one by one (cut short: up to 44); the numbers probed past them, the
    # footer, the snapshot list's answer
    assert gets["pack"] <= 4 and gets["other"] <= (0 if quiet else 44) + 25, gets
    for i in range(N):
        again = w2.write(b"o-%d" % i, idempotency_id=f"o-{i}")
        assert again == wp.WriteResult(first[i].message_id, True), i
    w2.close()
    b.close()
