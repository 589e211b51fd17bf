"""Window recovery beyond the seed cases: a writer reopening with another window configuration,
corrupt and lagging replicas (readers, the recovery gap, a takeover), a snapshot taken while
entries were pending, truncation inside the window.

Same conventions as test_idem_edge_cases.py (its `Env` is reused): in-process, a ManualClock, a
"crash" is a writer abandoned without close(), every test ends with the history checker.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from segfile_util import flip_entry_byte
from test_idem_edge_cases import Env, wait_for

import woodpecker_idem as wp
from woodpecker_idem import CorruptEntryError, LogMessageId, explicit_key
from woodpecker_idem._core import decode_snapshot
from woodpecker_idem.errors import EntryTruncatedError, NodeUnavailableError
from woodpecker_idem.testing import FaultInjectingTransport

NODES = ("node-0", "node-1", "node-2")
_IDEM = wp.load_config().idempotency
DEFAULT_WINDOW = (int(_IDEM.window_duration_s * 1000), _IDEM.window_max_keys)  # env.writer()


@pytest.fixture
def env_factory(tmp_path: Path):
    """`make(es=1, **config)`: an Env (one client) on tmp_path/d; several share the directory."""
    made: list[Env] = []

    def make(es: int = 1, **cfg: object) -> Env:
        made.append(Env(tmp_path / "d", es, **cfg))
        return made[-1]

    yield make
    for e in made:
        e.close()


def drop_snapshots(env: Env) -> None:
    env.client.objects.delete_prefix(f"dedup_snapshot/{env.log.log_id}/")


def recovered(env: Env, **window) -> list[tuple[bytes, int, int, int]]:
    """The committed window a new writer recovers (it takes the log over: nothing is written)."""
    return env.writer(**window).window.committed_entries()


# --- a writer reopening with another window configuration (docs/architecture.md) -----------

SMALL = {"window_duration_s": 10, "window_max_keys": 1000}


@pytest.mark.parametrize(
    "large",
    [
        {"window_duration_s": 100, "window_max_keys": 1000},  # longer
        {"window_duration_s": 10, "window_max_keys": 5000},  # the same duration, more keys
        {"window_duration_s": 100, "window_max_keys": 5000},  # both
    ],
    ids=["duration", "capacity", "both"],
)
def test_reopen_with_larger_window_reads_back_what_the_snapshot_evicted(env_factory, large):
    env = env_factory(**{"segment.max_entries": 25})
    # the first writer's bounds: 10 s, and 12 keys when the capacity grows later
    small = dict(SMALL, window_max_keys=12) if large["window_max_keys"] > 1000 else SMALL
    step = 1000 if large["window_duration_s"] > 10 else 100  # ms between writes
    w = env.writer(**small)
    acked = {}
    for i in range(60):  # segments 0, 1 and 10 entries of 2
        acked[f"k{i}"] = env.write(w, b"p%d" % i, f"k{i}")
        env.clock.advance(step)
    assert w.snapshotter.write_now()
    snap = decode_snapshot(env.client.objects.get(w.snapshotter.last_key))
    assert 0 < len(snap) < 50, "the snapshot's own bounds evicted the older keys"
    for i in range(60, 70):  # the gap: after the snapshot
        acked[f"k{i}"] = env.write(w, b"p%d" % i, f"k{i}")
    # crash; the successor has a larger window that holds every key written
    w2 = env.writer(**large)
    rep = w2.recovery
    assert rep.snapshot_key_count == len(snap)
    assert rep.window_size == 70
    calls = env.faults.calls.get("add_entries", 0)
    for k, first in acked.items():
        assert env.write(w2, b"retry", k) == wp.WriteResult(first.message_id, True), k
    assert env.faults.calls.get("add_entries", 0) == calls
    assert rep.entries_backfilled == 60 - len(snap)  # what precedes the snapshot's oldest key
    with_snapshot = w2.window.committed_entries()
    drop_snapshots(env)
    assert recovered(env, **large) == with_snapshot, "the same log gives the same window"
    env.check(large["window_duration_s"] * 1000, large["window_max_keys"])


@pytest.mark.parametrize(
    "smaller",
    [
        {"window_duration_s": 3, "window_max_keys": 1000},
        {"window_duration_s": 60, "window_max_keys": 7},
    ],
    ids=["duration", "capacity"],
)
def test_reopen_with_smaller_window_evicts_to_the_writers_bounds(env_factory, smaller):
    env = env_factory(**{"segment.max_entries": 25})
    w = env.writer(window_duration_s=60, window_max_keys=1000)
    acked = {f"k{i}": env.write(w, b"p%d" % i, f"k{i}") for i in range(30)}
    for i in range(30, 40):
        env.clock.advance(1000)
        acked[f"k{i}"] = env.write(w, b"p%d" % i, f"k{i}")
    assert w.snapshotter.write_now()
    env.clock.advance(500)
    w2 = env.writer(**smaller)
    window = w2.window.committed_entries()
    # 3 s: k37 (2.5 s old) .. k39; 7 keys: k33 .. k39
    first = 37 if smaller["window_duration_s"] == 3 else 33
    assert [key for key, *_ in window] == [explicit_key(f"k{i}") for i in range(first, 40)]
    drop_snapshots(env)
    w3 = env.writer(**smaller)
    assert w3.window.committed_entries() == window, "the same log gives the same window"
    assert env.write(w3, b"retry", "k39") == wp.WriteResult(acked["k39"].message_id, True)
    again = env.write(w3, b"retry", f"k{first - 1}")  # out of the smaller window: a new write
    assert again.duplicate is False and again.message_id != acked[f"k{first - 1}"].message_id
    env.check(smaller["window_duration_s"] * 1000, smaller["window_max_keys"])


# --- corrupt and lagging replicas (docs/architecture.md) ------------------------------------


def corrupt_entry(
    env: Env, node: str, segment_id: int, entry_id: int, in_header: bool = False
) -> Path:
    """Flip one payload byte of an entry in `node`'s segment file on disk (with `in_header`, a
    byte of the header of the batch holding it); returns the file."""
    nodes = Path(env.client.objects.root) / "nodes"  # {root}/{store_id}/nodes
    seg_dir = nodes / node / str(env.log.log_id)
    return flip_entry_byte(seg_dir / str(segment_id), entry_id, in_header)[0]


def write_keys(env: Env, w, keys: range) -> dict[str, wp.WriteResult]:
    return {f"k{i}": env.write(w, b"p%d" % i, f"k{i}") for i in keys}


def on_every_node(env: Env, segment_id: int, entry_id: int) -> None:
    wait_for(
        lambda: all(env.inner.read(n, env.log.log_id, segment_id, entry_id, 1) for n in NODES),
        what=f"{segment_id}:{entry_id} on every node",
    )


def successor(make, env: Env) -> Env:
    """A second client on the same directory (no cached blocks), sharing the history."""
    env2 = make(es=3)
    env2.history = env.history
    env2.clock.advance(env.clock.now_ms() - env2.clock.now_ms())
    return env2


def test_reader_skips_a_corrupt_replica_and_reports_it(env_factory, caplog):
    env = env_factory(es=3)
    w = env.writer()
    acked = write_keys(env, w, range(30))
    on_every_node(env, 0, 29)
    w.close()
    blk = corrupt_entry(env, "node-0", 0, 7)  # node-0 is the first replica of segment 0
    env2 = successor(env_factory, env)
    reader = env2.log.open_reader()
    msgs = list(reader)
    assert [m.idempotency_key for m in msgs] == [explicit_key(f"k{i}") for i in range(30)]
    assert reader.corrupt_replica_reads >= 1
    fault = reader.last_replica_fault
    assert fault.node == "node-0" and fault.segment_id == 0
    assert "entry 7" in fault.error and blk.name in fault.error
    assert any(
        r.levelname == "WARNING" and "node-0" in r.getMessage() and "corrupt" in r.getMessage()
        for r in caplog.records
    )
    # the idempotent writer rebuilding its window from the log (no snapshot) skips it too
    drop_snapshots(env2)
    w2 = env2.writer()
    rep = w2.recovery
    assert rep.snapshot_age_ms is None and rep.window_size == 30
    assert [f.node for f in rep.corrupt_replicas] == ["node-0"]
    assert "entry 7" in rep.corrupt_replicas[0].error
    for k, first in acked.items():
        assert env2.write(w2, b"retry", k) == wp.WriteResult(first.message_id, True)
    env2.check(*DEFAULT_WINDOW)


@pytest.mark.parametrize("snapshot", [False, True], ids=["no-snapshot", "in-gap"])
@pytest.mark.parametrize("bad", [("node-0",), NODES], ids=["one-replica", "every-replica"])
def test_corrupt_entry_in_recovery_gap(env_factory, snapshot, bad):
    env = env_factory(es=3)
    w = env.writer()
    acked = write_keys(env, w, range(5))
    if snapshot:
        assert w.snapshotter.write_now()  # watermark 0:4: entry 7 is in the gap
    acked.update(write_keys(env, w, range(5, 30)))
    on_every_node(env, 0, 29)
    if not snapshot:
        drop_snapshots(env)
    for node in bad:  # the writer crashes; then entry 0:7 is damaged on disk
        corrupt_entry(env, node, 0, 7)
    env2 = successor(env_factory, env)
    if len(bad) == len(NODES):  # no intact copy: a skipped key could be written twice
        with pytest.raises(CorruptEntryError) as exc:
            env2.writer()
        msg = str(exc.value)
        assert "entry 0:7" in msg and all(n in msg for n in NODES), msg
        with pytest.raises(CorruptEntryError, match="entry 0:7"):
            list(env2.log.open_reader())
        return
    w2 = env2.writer()
    rep = w2.recovery
    assert rep.window_size == 30
    assert rep.entries_replayed == (25 if snapshot else 30)
    assert {f.node for f in rep.corrupt_replicas} == {"node-0"}
    for k, first in acked.items():
        assert env2.write(w2, b"retry", k) == wp.WriteResult(first.message_id, True), k
    env2.check(*DEFAULT_WINDOW)


def test_replicas_corrupt_at_different_entries_still_serve_every_entry(env_factory):
    env = env_factory(es=3)
    w = env.writer()
    acked = write_keys(env, w, range(30))
    on_every_node(env, 0, 29)
    w.close()
    drop_snapshots(env)
    corrupt_entry(env, "node-0", 0, 5)
    corrupt_entry(env, "node-1", 0, 20)
    env2 = successor(env_factory, env)
    env2.faults.fail_node("node-2")  # the one intact replica is down
    reader = env2.log.open_reader()
    assert [m.message_id for m in reader] == [r.message_id for r in acked.values()]
    assert reader.corrupt_replica_reads >= 2
    w2 = env2.writer()  # segment 0 is sealed: the takeover does not need node-2
    assert {f.node for f in w2.recovery.corrupt_replicas} == {"node-0", "node-1"}
    assert w2.recovery.window_size == 30
    # both readable replicas corrupt at one entry, the third down: retriable, names each node
    corrupt_entry(env, "node-1", 0, 5)
    env3 = successor(env_factory, env)
    env3.faults.fail_node("node-2")
    with pytest.raises(NodeUnavailableError) as exc:
        list(env3.log.open_reader())
    msg = str(exc.value)
    assert "entry 0:5" in msg and "node-2" in msg and msg.count("corrupt") == 2, msg
    env3.faults.heal_node("node-2")
    assert len(list(env3.log.open_reader())) == 30
    for k, first in acked.items():
        assert env2.write(w2, b"retry", k) == wp.WriteResult(first.message_id, True)
    # entry 0:5 is now damaged on node-0 and node-1 on disk: the check reads it from node-2
    # (objects mode read it from a block env2 had cached before the damage)
    env2.faults.heal_node("node-2")
    env2.check(*DEFAULT_WINDOW)


class RecordingTransport(FaultInjectingTransport):
    """Records every read: (node, first entry asked, entries answered)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.reads: list[tuple[str, int, int]] = []

    def read(self, node_id, log_id, segment_id, from_entry_id, max_entries):
        raw = super().read(node_id, log_id, segment_id, from_entry_id, max_entries)
        self.reads.append((node_id, from_entry_id, len(raw)))
        return raw


def test_recovery_gap_read_from_a_lagging_first_replica(env_factory):
    env = env_factory(es=3, **{"append.max_retries": 0})
    faults_a = FaultInjectingTransport(env.inner)
    env.client.transport = faults_a
    a = env.writer()
    acked = write_keys(env, a, range(5))
    assert a.snapshotter.write_now()  # watermark 0:4
    acked.update(write_keys(env, a, range(5, 10)))
    on_every_node(env, 0, 9)
    faults_a.fail_node("node-0")  # the first replica of segment 0 misses 0:10 on
    acked.update(write_keys(env, a, range(10, 30)))
    for n in NODES:  # crash
        faults_a.fail_node(n)
    recorder = RecordingTransport(env.inner)
    env.client.transport = recorder
    b = env.writer()
    assert env.client.meta.get_segment(env.log.log_id, 0).last_entry_id == 29
    assert not env.inner.read("node-0", env.log.log_id, 0, 10, 1), "node-0 lags"
    rep = b.recovery
    assert rep.snapshot_key_count == 5 and rep.entries_replayed == 25 and rep.window_size == 30
    reads = recorder.reads  # the gap 0:5..0:29: a short answer, then the rest from another node
    assert ("node-0", 5, 5) in reads and ("node-0", 10, 0) in reads, reads
    assert any(node != "node-0" and (first, n) == (10, 20) for node, first, n in reads), reads
    for k, first in acked.items():
        assert env.write(b, b"retry", k) == wp.WriteResult(first.message_id, True), k
    assert len(list(env.log.open_reader(LogMessageId(0, 0)))) >= 30
    env.check(*DEFAULT_WINDOW)


# --- a snapshot taken while entries were pending, then a crash -------------------------------


def test_snapshot_with_pending_entries_then_crash(env_factory):
    """Pending entries are not in the snapshot; after the crash, those some node holds are
    recovered (BookKeeper's rule: duplicates at their ids), those no node holds are new writes."""
    # batches of 5 are full, so each is sent while the one before is still in flight
    cfg = {"append.max_retries": 100, "append.timeout_ms": 60_000, "append.max_batch_entries": 5}
    env = env_factory(es=3, **cfg)
    faults_a = FaultInjectingTransport(env.inner)
    env.client.transport = faults_a
    a = env.writer()
    env.client.transport = env.faults
    acked = write_keys(env, a, range(10))  # 0:0..0:9
    on_every_node(env, 0, 9)
    time.sleep(0.05)  # the last acks land before acks start getting lost
    log_id = env.log.log_id

    pool = ThreadPoolExecutor(3)  # write_many blocks: each call waits in its own thread

    def send(prefix: str) -> list:
        # one write_many: its 5 rows are admitted together, one full batch (a lone write_async
        # would go alone at once, group commit, and the other four in a second batch)
        rows = [b"%s%d" % (prefix.encode(), i) for i in range(5)]
        return [pool.submit(a.write_many, rows, [f"{prefix}{i}" for i in range(5)])]

    def on(nodes, entry_id):
        wait_for(
            lambda: all(env.inner.read(n, log_id, 0, entry_id, 1) for n in nodes),
            what=f"0:{entry_id} on {nodes}",
        )

    faults_a.fail_node("node-2")
    faults_a.drop_acks("node-1", 10**6)  # node-1 applies and retries q* (in order) for ever
    quorum = send("q")  # 0:10..0:14 reach node-0 (acked: 1 of aq=2) and node-1 (ack lost)
    on(("node-0", "node-1"), 14)
    single = send("s")  # 0:15..0:19 reach node-0 only: node-1 is still retrying q*
    on(("node-0",), 19)
    faults_a.fail_node("node-0")
    nowhere = send("r")  # 0:20..0:24 reach no node
    wait_for(lambda: a.metrics_snapshot()["pending"] == 15, what="15 pending entries")
    assert a.snapshotter.write_now()
    snap = decode_snapshot(env.client.objects.get(a.snapshotter.last_key))
    assert len(snap) == 10 and snap.watermarks[0] == 9, "pending entries are not in a snapshot"
    assert not any(f.done() for f in quorum + single + nowhere)
    for prefix in "qsr":  # the writer crashes before it learns anything
        for i in range(5):
            env.history.failed(
                explicit_key(f"{prefix}{i}"),
                b"%s%d" % (prefix.encode(), i),
                RuntimeError("writer crashed"),
            )
    b = env.writer()
    assert env.client.meta.get_segment(log_id, 0).last_entry_id == 19
    rep = b.recovery
    assert rep.snapshot_key_count == 10 and rep.entries_replayed == 10 and rep.window_size == 20
    for i in range(5):
        assert env.write(b, b"x", f"q{i}") == wp.WriteResult(LogMessageId(0, 10 + i), True)
        assert env.write(b, b"x", f"s{i}") == wp.WriteResult(LogMessageId(0, 15 + i), True)
        r = env.write(b, b"r%d" % i, f"r{i}")
        assert r.duplicate is False and r.message_id.segment_id >= 1
    for k, first in acked.items():
        assert env.write(b, b"x", k) == wp.WriteResult(first.message_id, True)
    faults_a.heal_all()  # the old writer comes back: fenced, it writes nothing more
    wait_for(lambda: a.fenced, what="old writer fenced")
    pool.shutdown(wait=True)  # the fenced writer failed every call
    b.close()
    v = env.check(*DEFAULT_WINDOW)
    assert v.keyed_entries == 25


# --- truncating entries still in the window (docs/semantics.md) -------------------------------


@pytest.mark.parametrize("snapshot", [False, True], ids=["no-snapshot", "snapshot-mid-segment"])
def test_truncate_inside_window_keys_stay_duplicates(env_factory, snapshot):
    """Truncation deletes entries, not the window's promise: a retry of a truncated key still in
    the window returns its original id, from the live writer and from a recovered one alike."""
    env = env_factory(**{"segment.max_entries": 10})
    w = env.writer()
    acked = write_keys(env, w, range(13))  # 0:0..0:9, 1:0..1:2
    if snapshot:
        assert w.snapshotter.write_now()  # knows segment 1 up to 1:2 only
    acked.update(write_keys(env, w, range(13, 25)))  # .. 1:9, 2:0..2:4
    log_id = env.log.log_id
    wait_for(
        lambda: env.client.meta.get_segment(log_id, 1).state is wp.SegmentState.SEALED,
        what="segment 1 sealed",
    )
    env.clock.advance(1000)
    env.log.truncate(LogMessageId(2, 2))
    assert {env.client.meta.get_segment(log_id, s).state for s in (0, 1)} == {
        wp.SegmentState.TRUNCATED
    }
    with pytest.raises(EntryTruncatedError):
        env.log.open_reader(acked["k3"].message_id)
    live = w.window.committed_entries()
    for k, first in acked.items():  # the live writer
        assert env.write(w, b"retry", k) == wp.WriteResult(first.message_id, True), k
    w2 = env.writer()  # crash + takeover: the entries of segments 0 and 1 are gone
    assert w2.window.committed_entries() == live
    for k, first in acked.items():
        assert env.write(w2, b"retry", k) == wp.WriteResult(first.message_id, True), k
    fresh = env.write(w2, b"new", "new")
    assert fresh.duplicate is False
    # out of the window, the kept keys go: the next truncation deletes them, recovery forgets
    env.clock.advance(600_000)
    env.log.truncate(fresh.message_id)
    assert env.client.objects.list(f"dedup_snapshot/{log_id}/truncated_") == []
    w3 = env.writer()
    assert env.write(w3, b"k0", "k0").duplicate is False
    # the truncated entries are gone by request: judge the rest
    floor = fresh.message_id
    env.history.attempts = [a for a in env.history.attempts if not a.ok or a.message_id >= floor]
    env.check(*DEFAULT_WINDOW)


@pytest.mark.parametrize("snapshot", [False, True], ids=["log-only", "snapshot"])
def test_keys_of_segments_completed_in_the_older_half_of_the_window_stay_duplicates(
    env_factory, snapshot
):
    """A takeover 0.6 of the window after the keys were written and their segments completed:
    every key is still in the window, so each retry returns its original id. Guards a rebuild
    that skipped the segments completed in the older half of the window (they were read as out
    of it), from the log alone and from a snapshot taken before those segments opened."""
    window = {"window_duration_s": 4, "window_max_keys": 1000}
    env = env_factory(**{"segment.max_entries": 2})
    w = env.writer(**window)
    acked = write_keys(env, w, range(2))  # 0:0, 0:1 (segment 0 full, still open)
    if snapshot:
        assert w.snapshotter.write_now()  # knows segment 0 only
    acked.update(write_keys(env, w, range(2, 5)))  # 1:0, 1:1, then 2:0: segments 0, 1 complete
    log_id = env.log.log_id
    wait_for(
        lambda: env.client.meta.get_segment(log_id, 1).state is not wp.SegmentState.ACTIVE,
        what="segment 1 completed",
    )
    if not snapshot:
        drop_snapshots(env)
    env.clock.advance(2400)  # 0.6 of the window: the keys and segments 0, 1 are 2.4 s old
    w2 = env.writer(**window)  # crash + takeover
    assert (w2.recovery.snapshot_age_ms is not None) is snapshot
    for k, first in acked.items():
        assert env.write(w2, b"retry", k) == wp.WriteResult(first.message_id, True), k
    env.check(4000, 1000)


@pytest.mark.parametrize("header", [False, True], ids=["entry", "block-header"])
def test_takeover_completes_a_segment_past_a_corrupt_replica(env_factory, header):
    """Completing a crashed writer's segment fences every replica and reads the entries past the
    lagging one's end; one corrupt replica must not stop the takeover (nor lose an entry). A
    corrupt block header breaks the replica's fence, a corrupt entry its read."""
    env = env_factory(es=3, **{"append.max_retries": 0})
    faults_a = FaultInjectingTransport(env.inner)
    env.client.transport = faults_a
    a = env.writer()
    acked = write_keys(env, a, range(10))
    on_every_node(env, 0, 9)
    faults_a.fail_node("node-0")  # node-0 lags from 0:10 on
    acked.update(write_keys(env, a, range(10, 30)))
    wait_for(
        lambda: all(env.inner.read(n, env.log.log_id, 0, 29, 1) for n in ("node-1", "node-2")),
        what="0:29 on node-1 and node-2",
    )
    for n in NODES:  # crash, with segment 0 ACTIVE
        faults_a.fail_node(n)
    corrupt_entry(env, "node-1", 0, 15, header)
    env2 = successor(env_factory, env)
    b = env2.writer()
    assert env2.client.meta.get_segment(env.log.log_id, 0).last_entry_id == 29
    assert b.recovery.window_size == 30
    for k, first in acked.items():
        assert env2.write(b, b"retry", k) == wp.WriteResult(first.message_id, True), k
    b.close()
    env2.check(*DEFAULT_WINDOW)


def test_truncating_a_plain_log_keeps_nothing_and_reads_one_entry_per_segment(env_factory):
    env = env_factory(**{"segment.max_entries": 10})
    w = env.log.open_writer()
    env.writers.append(w)
    ids = [w.write(b"m%d" % i).message_id for i in range(25)]
    w.close()
    recorder = RecordingTransport(env.inner)
    env.client.transport = recorder
    env.log.truncate(LogMessageId(2, 0))
    assert [(n, first, got) for n, first, got in recorder.reads] == [
        ("node-0", 0, 1),
        ("node-0", 0, 1),
    ], "one entry of each truncated segment: no key, so nothing to keep"
    assert env.client.objects.list(f"dedup_snapshot/{env.log.log_id}/") == []
    assert [m.message_id for m in env.log.open_reader()] == ids[20:]
