"""The log on S3 (the moto server): write, reopen, takeover, read back (docs/architecture.md)."""

from __future__ import annotations

import uuid

import pytest

from woodpecker_idem.errors import WriterFencedError
from woodpecker_idem.types import LogMessageId, SegmentState

pytestmark = pytest.mark.s3


@pytest.fixture
def s3_config(s3_server, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return {
        "objectstore.type": "s3",
        "objectstore.endpoint_url": s3_server.endpoint_url,
        "objectstore.bucket": f"wp-log-{uuid.uuid4().hex[:12]}",
        "objectstore.region": "us-east-1",
        "objectstore.create_bucket": True,
        "append.linger_ms": 2,
        "segment.max_entries": 40,
    }


def test_log_on_s3_write_reopen_takeover_read(tmp_path, wp_connect, s3_config):
    client = wp_connect(tmp_path, s3_config)
    handle = client.create_log("s3log")
    w1 = handle.open_writer()
    futures = [w1.write_async(b"one-%d" % i, properties={"i": str(i)}) for i in range(60)]
    acked = [f.result(30).message_id for f in futures]
    assert acked[40] == LogMessageId(1, 0)  # rolled on S3 too

    # no block lives in the local directory: everything went to the bucket
    assert (
        not list((tmp_path / "objects").rglob("*.blk")) if (tmp_path / "objects").exists() else True
    )
    keys = client.objects.list(f"{handle.log_id}/")
    assert any(k.endswith(".blk") for k in keys)

    # takeover from a second client (its own engine over the same bucket)
    c2 = wp_connect(tmp_path, s3_config)
    h2 = c2.open_log("s3log")
    w2 = h2.open_writer()
    with pytest.raises(WriterFencedError):
        w1.write(b"stale", timeout=20)
    more = [w2.write(b"two-%d" % i, timeout=20).message_id for i in range(5)]
    w2.close()
    w1.close()
    segs = h2.segments()
    assert all(s.state is SegmentState.SEALED for s in segs)
    assert segs[1].last_entry_id == 19

    # a third client reads everything back
    c3 = wp_connect(tmp_path, s3_config)
    msgs = list(c3.open_log("s3log").open_reader())
    assert [m.message_id for m in msgs] == acked + more
    assert [m.payload for m in msgs] == [b"one-%d" % i for i in range(60)] + [
        b"two-%d" % i for i in range(5)
    ]
    assert msgs[7].properties == {"i": "7"}
    r = c3.open_log("s3log").open_reader(LogMessageId(1, 10))
    assert r.read_next(0).payload == b"one-50"
