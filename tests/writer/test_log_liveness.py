"""Liveness (docs/semantics.md): every accepted write ends, background repair survives every
error until the writer is closed, a log stays reopenable after any interrupted recovery, and
readers see every acknowledged entry. Faults are injected into the LogStore transport and the
metadata store; logs are judged with the history checker."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from woodpecker_idem._core import encode_entry, explicit_key
from woodpecker_idem.errors import (
    NodeUnavailableError,
    QuorumUnavailableError,
    SegmentClosedError,
    SegmentFencedError,
    StorageUnavailableError,
    WoodpeckerError,
    WriterClosedError,
    WriterFencedError,
    WriteTimeoutError,
)
from woodpecker_idem.meta.base import SegmentMeta
from woodpecker_idem.testing import FaultInjectingTransport
from woodpecker_idem.testing.history import History
from woodpecker_idem.types import SegmentState

WINDOW_S = 3600
ES3 = {"quorum.es": 3, "append.timeout_ms": 1000, "append.max_retries": 1, "append.linger_ms": 1}


# --- fault injection ------------------------------------------------------------------------------


class FlakyMeta:
    """Wraps a metadata store; `arm(method, count, fault)` makes the next `count` calls of
    `method` run `fault(inner)` first (which may raise, or act, e.g. a takeover by a third
    writer, before the call goes through)."""

    def __init__(self, inner):
        self.inner = inner
        self._faults: dict[str, list] = {}
        self._lock = threading.Lock()
        self.injected = 0

    def arm(self, method: str, count: int, fault: Callable) -> None:
        with self._lock:
            self._faults[method] = [count, fault]

    def _maybe_fail(self, method: str) -> None:
        with self._lock:
            armed = self._faults.get(method)
            if not armed or armed[0] <= 0:
                return
            armed[0] -= 1
            self.injected += 1
            fault = armed[1]
        fault(self.inner)

    def update_segment(self, epoch, seg):
        self._maybe_fail("update_segment")
        return self.inner.update_segment(epoch, seg)

    def create_segment(self, epoch, seg):
        self._maybe_fail("create_segment")
        return self.inner.create_segment(epoch, seg)

    def check_epoch(self, log_id, epoch):
        self._maybe_fail("check_epoch")
        return self.inner.check_epoch(log_id, epoch)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def storage_down(_inner) -> None:
    raise StorageUnavailableError("metadata store unreachable (injected)")


def third_writer_takes_over(log_id: int) -> Callable:
    def fault(inner) -> None:
        inner.take_over(log_id, "third-writer", 0, 30_000)

    return fault


class SegmentFaults(FaultInjectingTransport):
    """FaultInjectingTransport plus faults aimed at one segment or one call:
    `fail_writes(node, segment)` fails the writer's adds (not recovery copies) of that segment
    on that node; `break_fence(count, exc)` raises `exc` from the next `count` fence calls;
    `break_copies(count, exc)` from the next `count` recovery copies."""

    def __init__(self, inner):
        super().__init__(inner)
        self._segment_down: dict[tuple[str, int], type[Exception]] = {}
        self._fence_faults: list = [0, None]
        self._copy_faults: list = [0, None]

    def fail_writes(
        self, node: str, segment_id: int, error: type[Exception] = NodeUnavailableError
    ) -> None:
        with self._lock:
            self._segment_down[(node, segment_id)] = error

    def break_fence(self, count: int, exc: BaseException) -> None:
        with self._lock:
            self._fence_faults = [count, exc]

    def break_copies(self, count: int, exc: BaseException) -> None:
        with self._lock:
            self._copy_faults = [count, exc]

    def add_entries(
        self, node_id, log_id, segment_id, first_entry_id, frame, lac=-1, recovery=False
    ):
        with self._lock:
            down = None if recovery else self._segment_down.get((node_id, segment_id))
            count, exc = self._copy_faults
            broken = recovery and count > 0
            if broken:
                self._copy_faults[0] -= 1
        if broken:
            raise exc
        if down is not None:
            raise down(f"{node_id} refuses segment {segment_id} (injected)")
        return super().add_entries(
            node_id, log_id, segment_id, first_entry_id, frame, lac, recovery
        )

    def fence(self, node_id, log_id, segment_id):
        with self._lock:
            count, exc = self._fence_faults
            if count > 0:
                self._fence_faults[0] -= 1
        if count > 0:
            raise exc
        return super().fence(node_id, log_id, segment_id)


def faulty(client, cls=FaultInjectingTransport):
    faults = cls(client.transport)
    client.transport = faults
    return faults


def flaky(client) -> FlakyMeta:
    meta = FlakyMeta(client.meta)
    client.meta = meta
    return meta


# --- helpers --------------------------------------------------------------------------------------


def key(name: str) -> bytes:
    return explicit_key(name)


def payload(name: str) -> bytes:
    return b"payload of " + name.encode()


def write_until_ok(writer, history: History, name: str, within_s: float = 15.0):
    """Retry an idempotent write until it is acknowledged (recording every attempt)."""
    deadline = time.monotonic() + within_s
    while True:
        start = history.now()
        try:
            result = writer.write(payload(name), idempotency_id=name, timeout=2)
        except (QuorumUnavailableError, TimeoutError, SegmentClosedError) as exc:
            history.failed(key(name), payload(name), exc, start)
            assert time.monotonic() < deadline, f"{name}: writes did not resume ({exc})"
            time.sleep(0.05)
            continue
        history.ok(key(name), payload(name), result, start)
        return result


def record(history: History, name: str, future: Future) -> None:
    exc = future.exception(0)
    if exc is None:
        history.ok(key(name), payload(name), future.result(0))
    else:
        history.failed(key(name), payload(name), exc)


def wait_done(futures, within_s: float) -> list[int]:
    """Indexes of the futures still pending after `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and not all(f.done() for f in futures):
        time.sleep(0.02)
    return [i for i, f in enumerate(futures) if not f.done()]


def judge(handle, history: History, within_s: float = 0.0) -> list:
    """Read the whole log and check it; `within_s` > 0 while the writer is open (a tail reader
    sees the last entries once their LAC reached the nodes, soon after the ack)."""
    deadline = time.monotonic() + within_s
    while True:
        msgs = list(handle.open_reader())
        verdict = history.check(msgs, WINDOW_S * 1000, 100_000)
        if verdict.ok or time.monotonic() >= deadline:
            assert verdict.ok, verdict.summary()
            return msgs
        time.sleep(0.05)


def wait_sealed_before_current(handle, within_s: float = 10.0) -> list[SegmentMeta]:
    """Every segment but the last is completed (readers can move past it), within `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        segs = handle.segments()
        active = [s.segment_id for s in segs[:-1] if s.state is SegmentState.ACTIVE]
        if not active:
            return segs
        assert time.monotonic() < deadline, f"segments {active} stay ACTIVE behind the current one"
        time.sleep(0.05)


# --- 1. recovery reconciles nodes completed before the metadata ----------------------------------


def _half_recovered_segment(client, name: str):
    """Segment 0 of a crashed writer: node-0/1 hold entries 0..4, node-2 one more (5, never
    acknowledged); the log's current epoch is the crashed writer's."""
    handle = client.create_log(name)
    epoch = client.meta.take_over(handle.log_id, "crashed", 0, 30_000)
    client.meta.create_segment(
        epoch,
        SegmentMeta(
            log_id=handle.log_id,
            segment_id=0,
            state=SegmentState.ACTIVE,
            nodes=("node-0", "node-1", "node-2"),
            es=3,
            wq=3,
            aq=2,
            created_ms=0,
        ),
    )
    records = [
        encode_entry(0, i, int(time.time() * 1000), b"r%d" % i, None, key(f"r{i}"))
        for i in range(6)
    ]
    for node, last in {"node-0": 4, "node-1": 4, "node-2": 5}.items():
        client.transport.add_entries(node, handle.log_id, 0, 0, b"".join(records[: last + 1]))
    return handle


@pytest.mark.parametrize("fault", ["takeover", "transient"])
def test_log_reopens_after_recovery_completed_nodes_but_not_the_metadata(
    tmp_path, wp_connect, fault
):
    """A successor completes node-0/1 at 4 (node-2 unreachable), then its metadata seal fails:
    a third writer takes over at that moment, or the metadata store fails once. Every later
    open_writer (plain or idempotent) must still work: node-0's footer fixes the end at 4."""
    client = wp_connect(tmp_path, {**ES3, "append.timeout_ms": 3000})
    handle = _half_recovered_segment(client, "half")
    real_meta = client.meta
    faults = faulty(client)
    meta = flaky(client)
    faults.fail_node("node-2")
    if fault == "takeover":
        meta.arm("update_segment", 1, third_writer_takes_over(handle.log_id))
        with pytest.raises(WriterFencedError):
            handle.open_writer()
        assert handle.segments()[0].state is SegmentState.ACTIVE  # the seal did not happen
    else:
        meta.arm("update_segment", 1, storage_down)
        handle.open_writer().close()  # the seal is retried like the node calls
    assert meta.injected == 1
    engines = faults.inner.engines
    assert [engines[n].completed_end(handle.log_id, 0) for n in ("node-0", "node-1")] == [4, 4]

    client.meta = real_meta
    faults.heal_all()  # node-2 is back, with entry 5 past the end the footers fixed
    writer = handle.open_writer()
    seg0 = handle.segments()[0]
    assert seg0.state is SegmentState.SEALED and seg0.last_entry_id == 4
    if fault == "takeover":  # this recovery reached node-2: completed at the footers' end
        assert engines["node-2"].completed_end(handle.log_id, 0) == 4
    nxt = writer.write(b"next", timeout=5).message_id
    assert nxt.segment_id == handle.segments()[-1].segment_id > 0
    writer.close()
    idem = handle.open_writer(idempotent=True, window_duration_s=WINDOW_S)
    assert idem.write(b"again", idempotency_id="r3").message_id == (0, 3)  # r3 is in the window
    idem.close()
    assert [m.payload for m in handle.open_reader()] == [b"r%d" % i for i in range(5)] + [b"next"]


def test_live_repair_survives_a_refused_recovery_copy(tmp_path, wp_connect):
    """The refusal (`SegmentFencedError`) of a recovery step inside a live writer's repair is
    retried like any other failure: the repair task does not end, writes resume."""
    client = wp_connect(tmp_path, ES3)
    faults = faulty(client, SegmentFaults)
    handle = client.create_log("refused")
    writer = handle.open_writer(idempotent=True, window_duration_s=WINDOW_S)
    history = History()
    for i in range(5):
        write_until_ok(writer, history, f"a{i}")
    # the new entries reach node-0 only: the repair copies them, and the first copies are refused
    faults.break_copies(3, SegmentFencedError("node-1:1/0 is completed; add of 5 refused"))
    faults.fail_writes("node-1", 0)
    faults.fail_writes("node-2", 0)
    pending = {
        f"p{i}": writer.write_async(payload(f"p{i}"), idempotency_id=f"p{i}") for i in range(3)
    }
    assert wait_done(list(pending.values()), 10) == []
    for name, fut in pending.items():
        record(history, name, fut)
    for i in range(5):
        write_until_ok(writer, history, f"b{i}")
    writer.close()
    judge(handle, history)


def test_node_refusal_while_the_metadata_store_is_down_still_counts(tmp_path, wp_connect):
    """Two nodes refuse the segment (`SegmentFencedError`) and the writer cannot check its epoch
    (metadata store down): the refusals still count as node failures, so the quorum loss is
    repaired and the pending writes end, instead of staying pending forever."""
    client = wp_connect(tmp_path, {**ES3, "append.timeout_ms": 30_000})
    faults = faulty(client, SegmentFaults)
    meta = flaky(client)
    handle = client.create_log("refused-epoch")
    writer = handle.open_writer(idempotent=True, window_duration_s=WINDOW_S)
    history = History()
    write_until_ok(writer, history, "a0")
    meta.arm("check_epoch", 2, storage_down)
    faults.fail_writes("node-1", 0, SegmentFencedError)
    faults.fail_writes("node-2", 0, SegmentFencedError)
    pending = {
        f"p{i}": writer.write_async(payload(f"p{i}"), idempotency_id=f"p{i}") for i in range(3)
    }
    assert wait_done(list(pending.values()), 10) == [], "pending writes never ended"
    assert meta.injected == 2
    for name, fut in pending.items():
        record(history, name, fut)
    write_until_ok(writer, history, "b0")
    writer.close()
    judge(handle, history)


# --- 2. a roll the metadata store refuses ---------------------------------------------------------


@pytest.mark.parametrize("idempotent", [False, True])
def test_takeover_at_roll_fails_every_pending_write(tmp_path, wp_connect, idempotent):
    """The roll's create_segment finds the log taken over: every write accepted so far ends
    (acknowledged or `WriterFencedError`) at once, not only at close(); write() never blocks."""
    client = wp_connect(
        tmp_path, {"segment.max_entries": 5, "append.linger_ms": 200, "append.timeout_ms": 30_000}
    )
    meta = flaky(client)
    handle = client.create_log("roll-fenced")
    writer = (
        handle.open_writer(idempotent=idempotent, window_duration_s=WINDOW_S)
        if idempotent
        else handle.open_writer()
    )
    meta.arm("create_segment", 1, third_writer_takes_over(handle.log_id))
    futures: list[Future] = []
    refused = 0
    for i in range(12):
        try:
            if idempotent:
                futures.append(writer.write_async(payload(f"k{i}"), idempotency_id=f"k{i}"))
            else:
                futures.append(writer.write_async(payload(f"k{i}")))
        except WriterFencedError:
            refused += 1
    assert wait_done(futures, 5) == [], "writes stay pending after the takeover"
    for f in futures:
        exc = f.exception(0)
        assert exc is None or isinstance(exc, WriterFencedError), repr(exc)
    assert refused or any(f.exception(0) for f in futures)
    outcome: list[BaseException] = []

    def write_without_timeout() -> None:
        try:
            writer.write(b"x", **({"idempotency_id": "x"} if idempotent else {}))
        except BaseException as exc:  # noqa: BLE001 - judged below
            outcome.append(exc)

    blocked = threading.Thread(target=write_without_timeout, daemon=True)
    blocked.start()
    blocked.join(5)
    assert not blocked.is_alive(), "write() without a timeout blocks on a fenced writer"
    assert len(outcome) == 1 and isinstance(outcome[0], WriterFencedError), outcome
    writer.close(timeout=2)


@pytest.mark.parametrize("idempotent", [False, True])
def test_metadata_outage_at_roll_writes_go_on_and_roll_later(tmp_path, wp_connect, idempotent):
    """create_segment fails (SQLite locked, etcd down): writes go on in the current segment, the
    roll is retried with backoff and happens once the store is back; nothing is lost."""
    client = wp_connect(tmp_path, {"segment.max_entries": 5, "append.linger_ms": 1})
    meta = flaky(client)
    handle = client.create_log("roll-outage")
    writer = (
        handle.open_writer(idempotent=True, window_duration_s=WINDOW_S)
        if idempotent
        else handle.open_writer()
    )
    history = History()
    names = [f"k{i}" for i in range(40)]
    meta.arm("create_segment", 4, storage_down)
    results = {}
    for name in names:
        if idempotent:
            fut = writer.write_async(payload(name), idempotency_id=name)
        else:
            fut = writer.write_async(payload(name))
        results[name] = fut
    assert wait_done(list(results.values()), 10) == []
    for name, fut in results.items():
        assert fut.exception(0) is None, f"{name}: {fut.exception(0)!r}"
    # the store is back: the roll happens after its backoff
    deadline = time.monotonic() + 10
    rolled = False
    while not rolled:  # until a write lands in the next segment
        assert time.monotonic() < deadline, "the roll was never retried"
        late = f"late{len(results)}"  # a new key: a duplicate needs no segment (nor a roll)
        results[late] = writer.write_async(
            payload(late), **({"idempotency_id": late} if idempotent else {})
        )
        rolled = results[late].result(5).message_id.segment_id > 0
        time.sleep(0.05)
    assert meta.injected == 4
    wait_sealed_before_current(handle)
    writer.close()
    msgs = list(handle.open_reader())
    ids = {fut.result(0).message_id for fut in results.values()}
    assert {m.message_id for m in msgs} >= ids
    assert all(s.state is SegmentState.SEALED for s in handle.segments())
    if idempotent:
        for name, fut in results.items():
            history.ok(key(name), payload(name), fut.result(0))
        judge(handle, history)


def test_a_metadata_store_that_hangs_after_a_failed_roll_holds_no_write_back(tmp_path, wp_connect):
    """A roll fails (the store is down), then every metadata call hangs (an etcd that stopped
    answering): the later roll attempts run in the background, so writes go on in the current
    segment, acknowledged, while the store hangs; once it answers, the roll happens. (Retried
    under the writer's lock, each attempt held every write for the call's whole timeout.)"""
    client = wp_connect(tmp_path, {"segment.max_entries": 5, "append.linger_ms": 1})
    meta = flaky(client)
    handle = client.create_log("roll-hang")
    writer = handle.open_writer()
    answering = threading.Event()
    hung = threading.Event()

    def hang(_inner) -> None:
        hung.set()
        assert answering.wait(120), "the test never let the store answer"

    meta.arm("create_segment", 1, storage_down)  # the roll in the write path fails at once
    first = [writer.write_async(b"a%d" % i) for i in range(8)]  # past the 5-entry limit
    assert wait_done(first, 60) == []
    meta.arm("create_segment", 1_000_000, hang)
    try:
        # writes past the backoff: a roll attempt is due (and hangs in the background)
        later = []
        while not hung.is_set():
            later.append(writer.write_async(b"b%d" % len(later)))
            assert wait_done(later[-1:], 60) == [], "a write waited for the hung store"
            time.sleep(0.01)
        more = [writer.write_async(b"c%d" % i) for i in range(20)]
        assert wait_done(more, 60) == [], "writes waited for the hung store"
    finally:
        meta.arm("create_segment", 0, storage_down)
        answering.set()
    deadline = time.monotonic() + 60
    n = 0
    while writer.write(b"d%d" % n).message_id.segment_id == 0:  # rolls once the store answers
        n += 1
        assert time.monotonic() < deadline, "the roll never happened"
        time.sleep(0.01)
    writer.close()
    got = [m.payload for m in handle.open_reader()]
    assert got[:8] == [b"a%d" % i for i in range(8)] and len(got) == len(set(got))
    assert all(f.done() and f.exception() is None for f in first + later + more)


# --- 3. repair retries every failure until the outage ends ----------------------------------------


@pytest.mark.parametrize("where", ["recover", "seal", "open"])
def test_repair_retries_storage_and_metadata_errors_until_healed(tmp_path, wp_connect, where):
    """The quorum is lost; when the nodes come back, the repair meets a storage error (ENOSPC
    from a node), a metadata error sealing the segment, or one opening the next segment. The
    repair retries until it succeeds: writes resume by themselves and pending writes end."""
    client = wp_connect(tmp_path, {**ES3, "append.timeout_ms": 30_000})
    faults = faulty(client, SegmentFaults)
    meta = flaky(client)
    handle = client.create_log(f"repair-{where}")
    writer = handle.open_writer(idempotent=True, window_duration_s=WINDOW_S)
    history = History()
    for i in range(10):
        write_until_ok(writer, history, f"a{i}")
    faults.fail_node("node-1")
    faults.fail_node("node-2")
    pending = {
        f"p{i}": writer.write_async(payload(f"p{i}"), idempotency_id=f"p{i}") for i in range(5)
    }
    deadline = time.monotonic() + 10
    for n in range(1000):  # until the quorum loss is detected: new writes are refused
        try:
            writer.write(payload(f"probe{n}"), idempotency_id=f"probe{n}", timeout=0.3)
        except QuorumUnavailableError as exc:
            history.failed(key(f"probe{n}"), payload(f"probe{n}"), exc)
            break
        except TimeoutError as exc:
            history.failed(key(f"probe{n}"), payload(f"probe{n}"), exc)
        assert time.monotonic() < deadline
    if where == "recover":
        faults.break_fence(4, OSError(errno.ENOSPC, "No space left on device (injected)"))
    elif where == "seal":
        meta.arm("update_segment", 4, storage_down)
    else:
        meta.arm("create_segment", 4, storage_down)
    faults.heal_all()
    assert wait_done(list(pending.values()), 20) == [], "pending writes never ended"
    # acknowledged, or not written (docs/semantics.md, "Queued when a segment loses its
    # quorum"): SegmentClosedError for an entry the completed segment does not hold,
    # QuorumUnavailableError for a write still queued (not yet an entry) when the loss was seen
    not_written = set()
    for name, fut in pending.items():
        exc = fut.exception(0)
        assert exc is None or isinstance(exc, (SegmentClosedError, QuorumUnavailableError)), exc
        record(history, name, fut)
        if exc is not None:
            not_written.add(key(name))
    for i in range(10):
        write_until_ok(writer, history, f"b{i}")
    assert writer.metrics["background_retries"] >= 1
    if where != "recover":
        assert meta.injected == 4
    wait_sealed_before_current(handle)
    writer.close()
    assert all(s.state is SegmentState.SEALED for s in handle.segments())
    msgs = judge(handle, history)
    assert not not_written & {m.idempotency_key for m in msgs}


# --- 4. readers see every acknowledged entry ---------------------------------------------------


def test_rolled_segment_losing_its_quorum_leaves_the_current_one_current(tmp_path, wp_connect):
    """Segment 0 is rolled with writes in flight, then loses its quorum; its repair must not
    open a segment (that would leave the healthy current one ACTIVE, and readers stop there)."""
    client = wp_connect(tmp_path, {**ES3, "segment.max_entries": 5, "append.timeout_ms": 30_000})
    faults = faulty(client, SegmentFaults)
    handle = client.create_log("rolled-repair")
    writer = handle.open_writer(idempotent=True, window_duration_s=WINDOW_S)
    history = History()
    faults.fail_writes("node-1", 0)
    faults.fail_writes("node-2", 0)
    first = {
        f"k{i}": writer.write_async(payload(f"k{i}"), idempotency_id=f"k{i}") for i in range(8)
    }
    assert wait_done(list(first.values()), 15) == []
    for name, fut in first.items():
        record(history, name, fut)
    for i in range(12):
        write_until_ok(writer, history, f"m{i}")
    wait_sealed_before_current(handle)
    reader_saw = judge(handle, history, within_s=5)
    assert {m.payload for m in reader_saw} >= {payload(f"m{i}") for i in range(12)}
    writer.close()
    judge(handle, history)
    assert writer.metrics["segments_repaired"] == 1


def test_transient_metadata_error_sealing_a_rolled_segment_is_retried(tmp_path, wp_connect):
    """The seal of a rolled segment fails once: it is retried, so readers move past it to every
    later acknowledged entry, while the writer is open and after close()."""
    client = wp_connect(tmp_path, {"segment.max_entries": 5, "append.linger_ms": 1})
    meta = flaky(client)
    handle = client.create_log("seal-retry")
    writer = handle.open_writer(idempotent=True, window_duration_s=WINDOW_S)
    history = History()
    meta.arm("update_segment", 1, storage_down)
    for i in range(17):
        write_until_ok(writer, history, f"k{i}")
    assert meta.injected == 1
    wait_sealed_before_current(handle)
    assert len(judge(handle, history, within_s=5)) == 17
    writer.close()
    assert all(s.state is SegmentState.SEALED for s in handle.segments())
    assert len(judge(handle, history)) == 17


# --- 8. close honours its timeout ---------------------------------------------------------------


@pytest.mark.parametrize("idempotent", [False, True])
def test_close_honours_its_timeout_with_writes_in_flight(tmp_path, wp_connect, idempotent):
    """es=3, two nodes answer 3 s late: close(timeout=0.2) returns soon and every write it
    did not get acknowledged ends with `WriterClosedError`."""
    client = wp_connect(tmp_path, {**ES3, "append.timeout_ms": 30_000})
    faults = faulty(client)
    handle = client.create_log("close-timeout")
    writer = (
        handle.open_writer(idempotent=True, window_duration_s=WINDOW_S)
        if idempotent
        else handle.open_writer()
    )
    writer.write(b"first", **({"idempotency_id": "first"} if idempotent else {}), timeout=5)
    faults.delay("node-1", 3000)
    faults.delay("node-2", 3000)
    if idempotent:
        futures = [writer.write_async(b"p%d" % i, idempotency_id=f"p{i}") for i in range(20)]
    else:
        futures = [writer.write_async(b"p%d" % i) for i in range(20)]
    time.sleep(0.1)  # the batch is in flight, blocked in the slow nodes
    t0 = time.monotonic()
    writer.close(timeout=0.2)
    took = time.monotonic() - t0
    assert took < 1.5, f"close(timeout=0.2) took {took:.2f} s"
    assert wait_done(futures, 0.5) == []
    for f in futures:
        exc = f.exception(0)
        assert isinstance(exc, (WriterClosedError, WriteTimeoutError)) or exc is None, repr(exc)
    assert any(isinstance(f.exception(0), WriterClosedError) for f in futures)
    faults.heal_all()
    with pytest.raises(WriterClosedError):
        writer.write_async(b"late")
    assert isinstance(WriterClosedError("x"), WoodpeckerError)
