"""One contract for every transport: what a client may count on from a LogStore node, in process
and over gRPC (a node's server in a process of its own, started by `woodpecker-idem logstore
serve` and stopped by PID). The node rules are the engine's; this checks that each transport
carries them, and its errors, unchanged: same results, same error classes, same `retriable`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from heldputs import HeldPuts

from woodpecker_idem._core import encode_entry
from woodpecker_idem.errors import (
    EntryConflictError,
    InvalidArgumentError,
    NodeUnavailableError,
    SegmentFencedError,
    SegmentIncompleteError,
    StorageUnavailableError,
    by_code,
)
from woodpecker_idem.logstore import staged as staged_module
from woodpecker_idem.logstore.blocks import decode_entry
from woodpecker_idem.logstore.engine import LogStoreEngine
from woodpecker_idem.logstore.remote import GrpcTransport, LogStoreServer
from woodpecker_idem.logstore.segment_files import TEMP_PREFIX, FileSegmentStorage, segment_storage
from woodpecker_idem.logstore.staged import StagedSegmentStorage
from woodpecker_idem.logstore.transport import InProcessTransport, LogStoreTransport
from woodpecker_idem.objectstore.local import LocalObjectStore

LOG, SEG = 7, 3
NODE = "n0"
WAIT_S = 60


def rec(entry_id: int, payload: bytes | None = None, seg: int = SEG) -> bytes:
    body = payload if payload is not None else b"payload-%d" % entry_id
    return encode_entry(seg, entry_id, 1_700_000_000_000 + entry_id, body, None, None)


def frame(first: int, last: int, **kw) -> bytes:
    return b"".join(rec(i, **kw) for i in range(first, last + 1))


def payloads(raw: list[bytes]) -> list[bytes]:
    return [decode_entry(r, "t").payload for r in raw]


def _engine(tmp_path: Path, layout: str) -> LogStoreEngine:
    objects = LocalObjectStore(tmp_path / "objects", fsync=False)
    if layout == "blocks":
        return LogStoreEngine(objects, NODE)
    return LogStoreEngine(segment_storage(objects, fsync=False), NODE)


@pytest.fixture(params=["in-process", "grpc"])
def transport(request, tmp_path: Path) -> Iterator[LogStoreTransport]:
    engine = _engine(tmp_path, "files")
    if request.param == "in-process":
        yield InProcessTransport({NODE: engine})
        return
    server = LogStoreServer(engine).start()
    remote = GrpcTransport({NODE: server.address}, timeout_s=10)
    try:
        yield remote
    finally:
        remote.close()
        server.stop(0)


def test_added_entries_are_read_back_and_confirmed(transport):
    assert transport.add_entries(NODE, LOG, SEG, 0, frame(0, 4), -1) == 4
    assert transport.add_entries(NODE, LOG, SEG, 5, frame(5, 6), 4) == 6
    assert payloads(transport.read(NODE, LOG, SEG, 2, 10)) == [
        b"payload-%d" % i for i in range(2, 7)
    ]
    assert transport.last_add_confirmed(NODE, LOG, SEG) == (6, 4)
    assert payloads(transport.raw_read(NODE, LOG, SEG, 0, 100)) == payloads(
        transport.read(NODE, LOG, SEG, 0, 100)
    )


def test_a_resend_is_acknowledged_only_with_the_same_bytes(transport):
    transport.add_entries(NODE, LOG, SEG, 0, frame(0, 2))
    assert transport.add_entries(NODE, LOG, SEG, 0, frame(0, 2)) == 2  # a lost ack's resend
    with pytest.raises(EntryConflictError) as conflict:
        transport.add_entries(NODE, LOG, SEG, 1, rec(1, b"other bytes"))
    assert not conflict.value.retriable


def test_a_fence_refuses_adds_but_not_recovery_copies(transport):
    transport.add_entries(NODE, LOG, SEG, 0, frame(0, 1), 0)
    assert transport.fence(NODE, LOG, SEG) == (1, 0)
    with pytest.raises(SegmentFencedError) as fenced:
        transport.add_entries(NODE, LOG, SEG, 2, frame(2, 2))
    assert not fenced.value.retriable
    assert transport.add_entries(NODE, LOG, SEG, 2, frame(2, 2), recovery=True) == 2


def test_a_completed_segment_ends_where_it_was_completed(transport):
    transport.add_entries(NODE, LOG, SEG, 0, frame(0, 5))
    assert transport.completed_end(NODE, LOG, SEG) is None
    transport.fence(NODE, LOG, SEG)
    transport.complete(NODE, LOG, SEG, 3)
    assert transport.completed_end(NODE, LOG, SEG) == 3
    assert len(transport.read(NODE, LOG, SEG, 0, 100)) == 4
    with pytest.raises(SegmentFencedError):
        transport.add_entries(NODE, LOG, SEG, 6, frame(6, 6))


def test_deleted_segments_and_logs_are_gone(transport):
    transport.add_entries(NODE, LOG, SEG, 0, frame(0, 1))
    transport.add_entries(NODE, LOG, SEG + 1, 0, frame(0, 1, seg=SEG + 1))
    transport.delete_segment(NODE, LOG, SEG)
    assert transport.read(NODE, LOG, SEG, 0, 10) == []
    assert len(transport.read(NODE, LOG, SEG + 1, 0, 10)) == 2
    transport.delete_log(NODE, LOG)
    assert transport.read(NODE, LOG, SEG + 1, 0, 10) == []
    transport.delete_log(NODE, LOG)  # deleting what is gone is no error


def test_an_unknown_node_is_unavailable(transport):
    with pytest.raises(NodeUnavailableError) as unknown:
        transport.read("nowhere", LOG, SEG, 0, 1)
    assert unknown.value.retriable


def test_every_error_class_crosses_by_its_code():
    assert by_code("SEGMENT_FENCED") is SegmentFencedError
    assert by_code("SEGMENT_INCOMPLETE") is SegmentIncompleteError  # a subclass's own code
    assert by_code("NODE_UNAVAILABLE") is NodeUnavailableError
    assert by_code("no such code").__name__ == "WoodpeckerError"


# --- a node process ------------------------------------------------------------------------------


def _serve(tmp_path: Path, port_file: Path) -> subprocess.Popen:
    config = tmp_path / "node.yaml"
    config.write_text(
        f"objectstore:\n  path: {tmp_path / 'node-objects'}\nstorage:\n  fsync: never\n"
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "woodpecker_idem.cli",
            "logstore",
            "serve",
            "--config",
            str(config),
            "--node-id",
            NODE,
            "--listen",
            "127.0.0.1:0",
            "--port-file",
            str(port_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # no preexec_fn: the node sets its own SIGINT handler (see tests/support/nodeserver.py)
    )


def _wait_for_port(proc: subprocess.Popen, port_file: Path) -> int:
    import time

    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return int(port_file.read_text())
        if proc.poll() is not None:
            raise AssertionError(f"node exited {proc.returncode}: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError("node did not listen")


def test_a_node_process_serves_drains_on_sigterm_and_is_unavailable_after(tmp_path: Path):
    """`woodpecker-idem logstore serve`: a node of its own; SIGTERM stops it cleanly (exit 0,
    what it acknowledged is kept: a new node over the same storage serves it); then the client
    gets a retriable NodeUnavailableError, not a hang."""
    port_file = tmp_path / "port"
    proc = _serve(tmp_path, port_file)
    try:
        port = _wait_for_port(proc, port_file)
        remote = GrpcTransport({NODE: f"127.0.0.1:{port}"}, timeout_s=10)
        assert remote.add_entries(NODE, LOG, SEG, 0, frame(0, 9)) == 9
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT_S)
        assert proc.returncode == 0, (out, err)
        assert "stopped" in err, err  # it said so, on its way out
        with pytest.raises(NodeUnavailableError) as down:
            remote.read(NODE, LOG, SEG, 0, 10)
        assert down.value.retriable
        remote.close()
        port_file.unlink()
        again = _serve(tmp_path, port_file)  # the same storage: what was acknowledged is there
        try:
            port = _wait_for_port(again, port_file)
            remote = GrpcTransport({NODE: f"127.0.0.1:{port}"}, timeout_s=10)
            assert payloads(remote.read(NODE, LOG, SEG, 0, 100)) == [
                b"payload-%d" % i for i in range(10)
            ]
            remote.close()
        finally:
            again.kill()
            again.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=WAIT_S)


# --- TLS -----------------------------------------------------------------------------------------


def test_a_tls_node_serves_only_clients_that_trust_it_and_show_a_certificate(tmp_path: Path):
    """`Tls` on both sides (certificates the test makes, for 127.0.0.1): a client that trusts the
    node's CA and shows a client certificate its CA signed is served; one over plain gRPC, one
    trusting another CA, and one without a client certificate get a retriable
    NodeUnavailableError (a node they cannot reach), never an answer."""
    from etcdtls import make_pki

    from woodpecker_idem.logstore.remote import Tls

    pki = make_pki(tmp_path)
    engine = _engine(tmp_path, "files")
    server = LogStoreServer(
        engine, tls=Tls(ca=pki.ca, cert=pki.server_cert, key=pki.server_key)
    ).start()
    address = {NODE: server.address}
    clients = {
        "trusted": GrpcTransport(
            address, 10, Tls(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
        ),
        "plain": GrpcTransport(address, 10),
        "other CA": GrpcTransport(
            address, 10, Tls(ca=pki.other_ca, cert=pki.client_cert, key=pki.client_key)
        ),
        "no client certificate": GrpcTransport(address, 10, Tls(ca=pki.ca)),
    }
    try:
        assert clients["trusted"].add_entries(NODE, LOG, SEG, 0, frame(0, 2)) == 2
        for name in ("plain", "other CA", "no client certificate"):
            with pytest.raises(NodeUnavailableError) as refused:
                clients[name].read(NODE, LOG, SEG, 0, 10)
            assert refused.value.retriable, name
        assert len(clients["trusted"].read(NODE, LOG, SEG, 0, 10)) == 3
    finally:
        for client in clients.values():
            client.close()
        server.stop(0)


# --- staged storage: SealSegment ------------------------------------------------------------------


def _staged_engine(tmp_path: Path, node: str = NODE) -> tuple[LogStoreEngine, StagedSegmentStorage]:
    local = FileSegmentStorage(tmp_path / "staged" / node, fsync=False)
    storage = StagedSegmentStorage(local, LocalObjectStore(tmp_path / "objects", fsync=False))
    return LogStoreEngine(storage, node), storage


@pytest.fixture(params=["in-process", "grpc"])
def staged(request, tmp_path: Path) -> Iterator[tuple[LogStoreTransport, StagedSegmentStorage]]:
    engine, storage = _staged_engine(tmp_path)
    if request.param == "in-process":
        yield InProcessTransport({NODE: engine}), storage
        engine.close()
        return
    server = LogStoreServer(engine).start()
    remote = GrpcTransport({NODE: server.address}, timeout_s=10)
    try:
        yield remote, storage
    finally:
        remote.close()
        server.stop(0)
        engine.close()


def _sealed_reader(tmp_path: Path) -> LogStoreEngine:
    """A node of its own over the sealed objects only: what object storage holds, and nothing
    any staged node keeps locally."""
    return LogStoreEngine(LocalObjectStore(tmp_path / "objects", fsync=False), "reader")


def test_seal_segment_uploads_blocks_then_the_footer_and_a_retry_changes_nothing(
    staged, tmp_path: Path, monkeypatch
):
    transport, storage = staged
    monkeypatch.setattr(staged_module, "UPLOAD_BLOCK_ENTRIES", 4)  # several blocks
    transport.add_entries(NODE, LOG, SEG, 0, frame(0, 5))
    transport.add_entries(NODE, LOG, SEG, 6, frame(6, 9))
    sealed = transport.seal_segment(NODE, LOG, SEG, 8)  # the end the client decided
    assert sealed.last_entry_id == 8
    assert sealed.block_keys == (f"{LOG}/{SEG}/0.blk", f"{LOG}/{SEG}/1.blk", f"{LOG}/{SEG}/2.blk")
    assert sealed.footer_key == f"{LOG}/{SEG}/footer"
    assert sealed.blocks == ((0, 0, 3), (1, 4, 7), (2, 8, 8))
    assert transport.completed_end(NODE, LOG, SEG) == 8  # completed as Complete does
    with pytest.raises(SegmentFencedError):
        transport.add_entries(NODE, LOG, SEG, 10, frame(10, 10))
    before = {k: storage.sealed_store.get(k) for k in storage.sealed_store.list(f"{LOG}/")}
    assert transport.seal_segment(NODE, LOG, SEG, 8) == sealed  # a retry: the same objects
    after = {k: storage.sealed_store.get(k) for k in storage.sealed_store.list(f"{LOG}/")}
    assert after == before
    reader = _sealed_reader(tmp_path)
    assert payloads(reader.read(LOG, SEG, 0, 100)) == [b"payload-%d" % i for i in range(9)]


def test_seal_segment_at_another_end_than_the_completed_one_is_a_conflict(staged):
    transport, _ = staged
    transport.add_entries(NODE, LOG, SEG, 0, frame(0, 5))
    transport.complete(NODE, LOG, SEG, 3)
    with pytest.raises(EntryConflictError) as conflict:
        transport.seal_segment(NODE, LOG, SEG, 5)
    assert not conflict.value.retriable


def test_a_node_lacking_entries_up_to_the_end_refuses_to_seal_and_writes_nothing(staged):
    transport, storage = staged
    transport.add_entries(NODE, LOG, SEG, 0, frame(0, 2))
    with pytest.raises(SegmentIncompleteError, match="another node"):  # its code crosses
        transport.seal_segment(NODE, LOG, SEG, 5)
    assert storage.sealed_store.list(f"{LOG}/") == []
    assert transport.completed_end(NODE, LOG, SEG) is None  # not completed at an end it lacks


def test_a_dropped_local_copy_is_read_from_object_storage(staged):
    transport, storage = staged
    transport.add_entries(NODE, LOG, SEG, 0, frame(0, 9))
    with pytest.raises(StorageUnavailableError):  # not uploaded: the local copy is kept
        storage.drop_local(LOG, SEG)
    transport.seal_segment(NODE, LOG, SEG, 9)
    seg_dir = Path(storage.local.segment_dir(LOG, SEG))
    # a create a SIGKILL cut between its temp file's write and its link leaves the temp file
    (seg_dir / f"{TEMP_PREFIX}4242-7").write_bytes(b"half a footer")
    engine = transport.engines[NODE] if isinstance(transport, InProcessTransport) else None
    if engine is not None:
        engine.drop_local(LOG, SEG)
    else:  # the node process's own call (its sweeper's), made here on the engine it serves
        storage.drop_local(LOG, SEG)
    assert sorted(p.name for p in seg_dir.iterdir()) == ["sealed"]  # the tombstone only
    assert payloads(transport.raw_read(NODE, LOG, SEG, 0, 100)) == [
        b"payload-%d" % i for i in range(10)
    ]
    assert transport.completed_end(NODE, LOG, SEG) == 9
    transport.delete_segment(NODE, LOG, SEG)
    assert storage.sealed_store.list(f"{LOG}/") == [] and not seg_dir.exists()


def test_another_nodes_upload_of_the_same_segment_writes_the_same_objects(tmp_path: Path):
    """Two replicas that got the entries in other batches (a resend, a recovery copy) upload
    the same bytes: the second upload, after the first stopped halfway (its footer missing),
    finds every block it puts already there and identical, and completes it."""
    a, a_storage = _staged_engine(tmp_path, "a")
    b, _ = _staged_engine(tmp_path, "b")
    a.add_entries(LOG, SEG, 0, frame(0, 9))
    for i in range(10):
        b.add_entries(LOG, SEG, i, frame(i, i))
    first = a.seal_segment(LOG, SEG, 9)
    a_storage.sealed_store.delete(first.footer_key)  # a died before its footer
    second = b.seal_segment(LOG, SEG, 9)
    assert second == first
    reader = _sealed_reader(tmp_path)
    assert payloads(reader.read(LOG, SEG, 0, 100)) == [b"payload-%d" % i for i in range(10)]


def test_blocks_of_another_layout_holding_the_same_entries_are_kept(
    staged, tmp_path: Path, monkeypatch
):
    """Another node's upload cut the segment into other blocks (4 entries each: an earlier
    release's layout). Sealed whole, it is taken as it is (nothing put); stopped after two of
    its blocks, they are kept and this node's upload goes on after them in its own cut (3)."""
    transport, storage = staged
    other, other_storage = _staged_engine(tmp_path, "other")
    other.add_entries(LOG, SEG, 0, frame(0, 9))
    transport.add_entries(NODE, LOG, SEG, 0, frame(0, 9))
    monkeypatch.setattr(staged_module, "UPLOAD_BLOCK_ENTRIES", 4)
    theirs = other.seal_segment(LOG, SEG, 9)
    assert theirs.blocks == ((0, 0, 3), (1, 4, 7), (2, 8, 9))
    monkeypatch.setattr(staged_module, "UPLOAD_BLOCK_ENTRIES", 3)
    objects = storage.sealed_store
    before = {k: objects.get(k) for k in objects.list(f"{LOG}/")}
    assert transport.seal_segment(NODE, LOG, SEG, 9).blocks == theirs.blocks
    assert {k: objects.get(k) for k in objects.list(f"{LOG}/")} == before

    objects.delete(theirs.footer_key)  # the other node died after its second block
    objects.delete(theirs.block_keys[2])
    mine = transport.seal_segment(NODE, LOG, SEG, 9)
    assert mine.blocks == ((0, 0, 3), (1, 4, 7), (2, 8, 9))  # its own cut: 8..9 in one block
    assert objects.get(theirs.block_keys[0]) == before[theirs.block_keys[0]]
    reader = _sealed_reader(tmp_path)
    assert payloads(reader.read(LOG, SEG, 0, 100)) == [b"payload-%d" % i for i in range(10)]
    other_storage.close()


def test_a_sealed_copy_holding_other_entries_is_a_conflict(staged, tmp_path: Path):
    """Object storage holds the segment with other bytes at an entry (another copy, half
    uploaded): the upload stops at the first block that differs, with a conflict no retry
    changes, and writes nothing."""
    transport, storage = staged
    other, other_storage = _staged_engine(tmp_path, "other")
    other.add_entries(LOG, SEG, 0, frame(0, 4) + rec(5, b"other") + frame(6, 9))
    transport.add_entries(NODE, LOG, SEG, 0, frame(0, 9))
    theirs = other.seal_segment(LOG, SEG, 9)
    storage.sealed_store.delete(theirs.footer_key)
    objects = storage.sealed_store
    before = {k: objects.get(k) for k in objects.list(f"{LOG}/")}
    with pytest.raises(EntryConflictError, match="entry 5 with other bytes") as conflict:
        transport.seal_segment(NODE, LOG, SEG, 9)
    assert not conflict.value.retriable
    assert {k: objects.get(k) for k in objects.list(f"{LOG}/")} == before
    other_storage.close()


def test_a_segment_deleted_while_its_upload_runs_leaves_nothing_behind(staged):
    """The segment is deleted (truncation, retention) while its upload waits in a put: the
    upload's puts land after the deletion, and the upload deletes the segment again once they
    returned, local copy and objects, and fails; a later upload finds nothing to upload."""
    transport, storage = staged
    held = HeldPuts(storage.sealed.store)
    storage.sealed.store = held
    transport.add_entries(NODE, LOG, SEG, 0, frame(0, 9))
    held.hold.set()
    outcome: list[BaseException | object] = []
    upload = threading.Thread(
        target=lambda: outcome.append(_call(transport.seal_segment, NODE, LOG, SEG, 9))
    )
    upload.start()
    try:
        assert held.held.wait(WAIT_S), "the upload never put"
        transport.delete_segment(NODE, LOG, SEG)
    finally:
        held.hold.clear()
        held.release.set()
        upload.join(WAIT_S)
    (error,) = outcome
    assert isinstance(error, SegmentFencedError) and "deleted while" in str(error), error
    assert storage.sealed_store.list(f"{LOG}/") == []
    assert not Path(storage.local.segment_dir(LOG, SEG)).exists()
    with pytest.raises(SegmentFencedError, match="holds no copy"):
        transport.seal_segment(NODE, LOG, SEG, 9)
    # nor an empty one (its end -1 asks for no entry): a footer of a deleted segment would stay
    with pytest.raises(SegmentFencedError, match="holds no copy"):
        transport.seal_segment(NODE, LOG, SEG + 1, -1)
    assert storage.sealed_store.list(f"{LOG}/") == []


def _call(fn, *args):
    try:
        return fn(*args)
    except BaseException as exc:  # noqa: BLE001 - the caller judges it
        return exc


def test_a_node_on_object_storage_refuses_seal_segment_by_name(transport):
    transport.add_entries(NODE, LOG, SEG, 0, frame(0, 1))
    with pytest.raises(InvalidArgumentError, match="staged"):
        transport.seal_segment(NODE, LOG, SEG, 1)


def test_a_node_completed_short_of_the_end_refuses_to_seal_and_writes_nothing(staged):
    """Completed at 5 while its last batch was on the way: it holds 0..3 only, and must not
    upload a copy that ends early (another node's upload would then meet other blocks)."""
    transport, storage = staged
    transport.add_entries(NODE, LOG, SEG, 0, frame(0, 3))
    transport.complete(NODE, LOG, SEG, 5)
    with pytest.raises(SegmentIncompleteError, match="another node"):  # its code crosses
        transport.seal_segment(NODE, LOG, SEG, 5)
    assert storage.sealed_store.list(f"{LOG}/") == []
