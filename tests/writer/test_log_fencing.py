"""Writer takeover and fencing (docs/architecture.md): in-process, other process, SIGKILL,
and the block-put vs fence-marker race at the engine level."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from drain import Drain

import woodpecker_idem
from woodpecker_idem._core import encode_entry
from woodpecker_idem.ensemble.recovery import recover_segment
from woodpecker_idem.errors import SegmentFencedError, WoodpeckerError, WriterFencedError
from woodpecker_idem.logstore.blocks import KIND_FENCE, decode_block_header
from woodpecker_idem.logstore.engine import LogStoreEngine
from woodpecker_idem.logstore.transport import InProcessTransport
from woodpecker_idem.meta.base import SegmentMeta
from woodpecker_idem.objectstore.local import LocalObjectStore
from woodpecker_idem.types import LogMessageId, SegmentState

LOGPROC = Path(__file__).resolve().parent.parent / "support" / "logproc.py"
# the child imports the same woodpecker_idem as this process (the installed wheel in CI)
PYTHONPATH = str(Path(woodpecker_idem.__file__).resolve().parent.parent)


def read_all(handle, start="earliest"):
    return list(handle.open_reader(start))


# --- in-process takeover --------------------------------------------------------------------------


def test_second_writer_fences_first_every_later_call_fails(tmp_path, wp_connect):
    client = wp_connect(tmp_path)
    handle = client.create_log("t")
    w1 = handle.open_writer()
    acked = [w1.write(b"w1-%d" % i).message_id for i in range(20)]
    w2 = handle.open_writer()
    assert w2.epoch == w1.epoch + 1
    # the first writer's segment was completed by the takeover at its last acknowledged entry
    seg0 = handle.segments()[0]
    assert seg0.state is SegmentState.SEALED and seg0.last_entry_id == 19

    with pytest.raises(WriterFencedError):
        w1.write(b"w1-late", timeout=10)
    assert w1.fenced
    for _ in range(3):
        with pytest.raises(WriterFencedError):
            w1.write(b"again", timeout=10)
        with pytest.raises(WriterFencedError):
            w1.write_async(b"again").result(10)
        with pytest.raises(WriterFencedError):
            w1.flush(timeout=5)
    w1.close()  # a fenced writer closes without touching the log

    mine = [w2.write(b"w2-%d" % i).message_id for i in range(5)]
    w2.close()
    msgs = read_all(handle)
    assert [m.message_id for m in msgs] == acked + mine
    assert [m.payload for m in msgs] == [b"w1-%d" % i for i in range(20)] + [
        b"w2-%d" % i for i in range(5)
    ]
    assert not any(m.payload.startswith(b"w1-late") or m.payload == b"again" for m in msgs)


def test_takeover_during_streaming_from_another_client(tmp_path, wp_connect):
    """Client A streams with write_async; client B (its own engine over the same directory) takes
    over. Every write A saw acknowledged is in the log at its id, once; after A's first fenced error
    no later call of A succeeds."""
    cfg = {"append.linger_ms": 1}
    a = wp_connect(tmp_path, cfg)
    b = wp_connect(tmp_path, cfg)
    handle_a = a.create_log("s")
    w1 = handle_a.open_writer()
    outcomes: list[tuple[int, object]] = []  # (i, LogMessageId | exception), in call order
    started = threading.Event()
    stop = threading.Event()

    def stream():
        inflight = []
        i = 0
        while not stop.is_set() and i < 20_000:
            try:
                inflight.append((i, w1.write_async(b"a-%d" % i)))
            except WoodpeckerError as exc:
                outcomes.append((i, exc))
                break
            i += 1
            if len(inflight) >= 16:
                j, f = inflight.pop(0)
                try:
                    outcomes.append((j, f.result(30).message_id))
                except WoodpeckerError as exc:
                    outcomes.append((j, exc))
                if j == 100:
                    started.set()
        for j, f in inflight:
            try:
                outcomes.append((j, f.result(30).message_id))
            except WoodpeckerError as exc:
                outcomes.append((j, exc))
        started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(30)
    w2 = b.open_log("s").open_writer()
    t.join(60)
    stop.set()
    assert not t.is_alive()
    new_ids = [w2.write(b"b-%d" % i).message_id for i in range(5)]
    w2.close()

    acked = {i: v for i, v in outcomes if isinstance(v, LogMessageId)}
    errors = [(i, v) for i, v in outcomes if not isinstance(v, LogMessageId)]
    assert errors, "the first writer never noticed it was fenced"
    assert all(isinstance(e, WriterFencedError) for _, e in errors), errors[:3]
    first_fenced = min(i for i, _ in errors)
    assert all(i < first_fenced for i in acked), "an acknowledgement after a fenced error"
    with pytest.raises(WriterFencedError):
        w1.write(b"more", timeout=5)

    msgs = read_all(a.open_log("s"))
    by_payload = {}
    for m in msgs:
        assert m.payload not in by_payload, f"duplicate entry {m.payload!r}"
        by_payload[m.payload] = m.message_id
    for i, mid in acked.items():
        assert by_payload.get(b"a-%d" % i) == mid, f"acknowledged a-{i} at {mid} missing"
    # the log is A's records in order, then B's
    a_seq = [int(m.payload[2:]) for m in msgs if m.payload.startswith(b"a-")]
    assert a_seq == list(range(len(a_seq)))
    assert [m.message_id for m in msgs][-5:] == new_ids
    w1.close()


# --- other processes ------------------------------------------------------------------------------


class Child:
    """support/logproc.py in a subprocess; stdout lines collected by a thread; stopped by PID."""

    def __init__(self, data_dir, log_name, count, config=None, inflight=1, tag="child"):
        env = dict(os.environ, PYTHONPATH=PYTHONPATH)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(LOGPROC),
                str(data_dir),
                log_name,
                str(count),
                "--config",
                json.dumps(config or {}),
                "--inflight",
                str(inflight),
                "--tag",
                tag,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            bufsize=1,
        )
        self.lines: list[str] = []
        self._stderr = Drain(self.proc.stderr)  # a full stderr pipe would block the child
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append("<EOF>")
            self._cond.notify_all()

    def acks(self) -> dict[int, LogMessageId]:
        out = {}
        with self._cond:
            lines = list(self.lines)
        for line in lines:
            if line.startswith("ACK "):
                _, i, s, e = line.split()
                out[int(i)] = LogMessageId(int(s), int(e))
        return out

    def wait_for(self, pred, timeout) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not pred(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or "<EOF>" in self.lines:
                    return pred(self.lines)
                self._cond.wait(left)
            return True

    def stderr_tail(self) -> str:
        return self._stderr.text()[-3000:]

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(5)
        self.proc.stdout.close()
        self._stderr.close()


@pytest.fixture
def children():
    started: list[Child] = []

    def spawn(*args, **kwargs) -> Child:
        c = Child(*args, **kwargs)
        started.append(c)
        return c

    yield spawn
    for c in started:
        c.stop()


def n_acks(n):
    return lambda lines: sum(1 for ln in lines if ln.startswith("ACK ")) >= n


def check_child_acks_in_log(msgs, acks: dict[int, LogMessageId], tag="child"):
    prefix = tag.encode() + b"-"
    seen: dict[int, LogMessageId] = {}
    for m in msgs:
        if m.payload.startswith(prefix):
            i = int(m.payload[len(prefix) :])
            assert i not in seen, f"{tag}-{i} appears twice ({seen[i]} and {m.message_id})"
            seen[i] = m.message_id
    for i, mid in acks.items():
        assert seen.get(i) == mid, f"acknowledged {tag}-{i} at {mid} is {seen.get(i)} in the log"
    order = [i for i in seen]  # dict keeps log order
    assert order == sorted(order), "the child's records are out of order in the log"
    return seen


def test_other_process_writer_is_fenced(tmp_path, wp_connect, children):
    child = children(tmp_path, "x", 1_000_000, inflight=8)
    assert child.wait_for(n_acks(50), 30), (child.lines[-5:], child.stderr_tail())
    client = wp_connect(tmp_path)
    handle = client.open_log("x")
    writer = handle.open_writer()
    mine = [writer.write(b"parent-%d" % i).message_id for i in range(10)]
    # the child must stop with a fenced error, soon
    assert child.wait_for(lambda ls: any(ln.startswith("FENCED") for ln in ls), 20), (
        child.lines[-5:],
        child.stderr_tail(),
    )
    assert child.proc.wait(20) == 3, child.stderr_tail()
    child.wait_for(lambda ls: "<EOF>" in ls, 5)
    assert not any(ln.startswith("ERR") for ln in child.lines), [
        ln for ln in child.lines if ln.startswith("ERR")
    ]
    writer.close()

    acks = child.acks()
    assert len(acks) >= 50
    msgs = read_all(handle)
    check_child_acks_in_log(msgs, acks)
    assert [m.message_id for m in msgs][-10:] == mine
    # no acknowledgement came after the fence: each acknowledged id lies within the segment as the
    # takeover completed it
    segs = {s.segment_id: s for s in handle.segments()}
    for mid in acks.values():
        assert mid.entry_id <= segs[mid.segment_id].last_entry_id


def test_sigkilled_writer_process_new_writer_completes_segment(tmp_path, wp_connect, children):
    child = children(tmp_path, "k", 1_000_000, inflight=32)
    assert child.wait_for(n_acks(300), 30), (child.lines[-5:], child.stderr_tail())
    os.kill(child.proc.pid, signal.SIGKILL)
    assert child.proc.wait(10) == -signal.SIGKILL
    assert child.wait_for(lambda ls: "<EOF>" in ls, 10)
    acks = child.acks()
    assert len(acks) >= 300

    client = wp_connect(tmp_path)
    handle = client.open_log("k")
    assert handle.segments()[-1].state is SegmentState.ACTIVE  # left behind by the dead writer
    writer = handle.open_writer()
    for s in handle.segments()[:-1]:
        assert s.state is SegmentState.SEALED
    new = writer.write(b"after-kill").message_id
    writer.close()
    msgs = read_all(handle)
    seen = check_child_acks_in_log(msgs, acks)
    # whatever landed but was not acknowledged is a contiguous continuation (no holes in the order)
    assert sorted(seen) == list(range(len(seen)))
    assert msgs[-1].message_id == new and msgs[-1].payload == b"after-kill"
    ids = [m.message_id for m in msgs]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # the segments the dead writer left were completed by the takeover's recovery, which
    # records their size as a clean close would: each stored record with its 8-byte header
    # (issue 29: it recorded 0)
    # (counted after the takeover, in the background)
    node = handle.segments()[0].nodes[0]
    deadline = time.monotonic() + 60
    for seg in handle.segments():
        stored = client.transport.read(node, handle.log_id, seg.segment_id, 0, 10**9)
        assert len(stored) == seg.last_entry_id + 1
        size = sum(8 + len(data) for data in stored)
        while client.meta.get_segment(handle.log_id, seg.segment_id).size_bytes != size:
            assert time.monotonic() < deadline, seg
            time.sleep(0.01)


# --- the fencing race, at the engine level -----------------------------------------


class _RacingStore:
    """The new writer's view of the store: just before its first create-if-absent put (the fence
    marker), the old writer's block lands."""

    def __init__(self, inner, before_first_put):
        self._inner = inner
        self._hook = before_first_put

    def put(self, key, data, *, if_none_match=False):
        hook, self._hook = self._hook, None
        if hook is not None:
            hook()
        return self._inner.put(key, data, if_none_match=if_none_match)

    def put_parts(self, key, parts):
        hook, self._hook = self._hook, None
        if hook is not None:
            hook()
        return self._inner.put_parts(key, parts)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _records(seg_id, first, last, tag):
    return b"".join(
        encode_entry(seg_id, i, 1_700_000_000_000, b"%s-%d" % (tag, i), None, None)
        for i in range(first, last + 1)
    )


def _segment(client, name):
    handle = client.create_log(name)
    epoch = client.meta.take_over(handle.log_id, "old", 0, 30_000)
    meta = client.meta.create_segment(
        epoch,
        SegmentMeta(
            log_id=handle.log_id,
            segment_id=0,
            state=SegmentState.ACTIVE,
            nodes=("node-0",),
            es=1,
            wq=1,
            aq=1,
            created_ms=0,
        ),
    )
    return handle, meta


def test_block_landing_before_fence_marker_is_kept(tmp_path, wp_connect):
    store_dir = tmp_path / "objects"
    old = LogStoreEngine(LocalObjectStore(store_dir), "node-0")
    shared = LocalObjectStore(store_dir)
    new = LogStoreEngine(
        _RacingStore(
            shared, lambda: old.add_entries(log_id, 0, 5, _records(0, 5, 9, b"old"), lac=4)
        ),
        "node-0",
    )
    client = wp_connect(tmp_path, transport=InProcessTransport({"node-0": new}))
    handle, seg = _segment(client, "race")
    log_id = handle.log_id
    old.add_entries(log_id, 0, 0, _records(0, 0, 4, b"old"))

    # the new writer fences: its first put collides with the old writer's block 1, so the marker
    # goes to block 2 and block 1 stays part of the segment
    epoch = client.meta.take_over(log_id, "new", 0, 30_000)
    done = recover_segment(client.transport, client.meta, epoch, seg, 1)
    assert done.state is SegmentState.SEALED and done.last_entry_id == 9
    seg_dir = store_dir / str(log_id) / "0"
    kinds = {p.name: decode_block_header(p.read_bytes(), "").kind for p in seg_dir.glob("*.blk")}
    assert kinds.get("2.blk") == KIND_FENCE and kinds.get("1.blk") != KIND_FENCE, kinds
    msgs = read_all(handle)
    assert [m.payload for m in msgs] == [b"old-%d" % i for i in range(10)]

    # the old writer's next put collides with the marker
    with pytest.raises(SegmentFencedError):
        old.add_entries(log_id, 0, 10, _records(0, 10, 12, b"old"))
    assert [m.payload for m in read_all(handle)] == [b"old-%d" % i for i in range(10)]
    # a third engine (another process opening later) sees the same segment
    third = LogStoreEngine(LocalObjectStore(store_dir), "node-0")
    assert len(third.read(log_id, 0, 0, 100)) == 10


def test_block_put_after_fence_is_refused(tmp_path, wp_connect):
    store_dir = tmp_path / "objects"
    old = LogStoreEngine(LocalObjectStore(store_dir), "node-0")
    new = LogStoreEngine(LocalObjectStore(store_dir), "node-0")
    client = wp_connect(tmp_path, transport=InProcessTransport({"node-0": new}))
    handle, seg = _segment(client, "late")
    log_id = handle.log_id
    old.add_entries(log_id, 0, 0, _records(0, 0, 4, b"old"))
    epoch = client.meta.take_over(log_id, "new", 0, 30_000)
    assert new.fence(log_id, 0)[0] == 4
    with pytest.raises(SegmentFencedError):
        old.add_entries(log_id, 0, 5, _records(0, 5, 9, b"old"))
    with pytest.raises(SegmentFencedError):  # and every retry too
        old.add_entries(log_id, 0, 5, _records(0, 5, 9, b"old"))
    done = recover_segment(client.transport, client.meta, epoch, seg, 1)
    assert done.last_entry_id == 4
    assert [m.payload for m in read_all(handle)] == [b"old-%d" % i for i in range(5)]
    # metadata fencing too: the old epoch can no longer change segments
    with pytest.raises(WriterFencedError):
        client.meta.create_segment(
            epoch - 1,
            SegmentMeta(
                log_id=log_id,
                segment_id=1,
                state=SegmentState.ACTIVE,
                nodes=("node-0",),
                es=1,
                wq=1,
                aq=1,
                created_ms=0,
            ),
        )
