"""The native wire under the gRPC transport (`_core.NodeChannel`, `NodeServer`, `Completions`;
`logstore/remote.py`): what the transport contract suite does not reach. A started AddEntries
is answered once, on the transport's thread; closing the transport answers what is still out;
a node's stop drains the calls under way and refuses new ones; a handler's bug fails its call
only; a forked child reaches the nodes with a runtime of its own."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from woodpecker_idem._core import NodeChannel, NodeServer, RpcError, encode_entry
from woodpecker_idem.errors import NodeUnavailableError, SegmentFencedError
from woodpecker_idem.logstore.engine import LogStoreEngine
from woodpecker_idem.logstore.remote import SERVICE, GrpcTransport, LogStoreServer
from woodpecker_idem.logstore.segment_files import segment_storage
from woodpecker_idem.objectstore.local import LocalObjectStore

LOG, SEG, NODE = 7, 3, "n0"
WAIT_S = 60


def frame(first: int, last: int) -> bytes:
    return b"".join(
        encode_entry(SEG, i, 1_700_000_000_000 + i, b"p%d" % i, None, None)
        for i in range(first, last + 1)
    )


@pytest.fixture
def engine(tmp_path: Path) -> LogStoreEngine:
    return LogStoreEngine(segment_storage(LocalObjectStore(tmp_path, fsync=False), fsync=False))


@pytest.fixture
def node(engine: LogStoreEngine) -> Iterator[LogStoreServer]:
    server = LogStoreServer(engine).start()
    yield server
    server.stop(0)


class Answers:
    """`done` callbacks' calls: (result, error, thread name), and an event per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, BaseException | None, str]] = []
        self.event = threading.Event()

    def done(self, result: object, error: BaseException | None) -> None:
        self.calls.append((result, error, threading.current_thread().name))
        self.event.set()


def test_a_started_add_is_answered_once_on_the_transports_thread(node: LogStoreServer):
    remote = GrpcTransport({NODE: node.address}, timeout_s=WAIT_S)
    try:
        ok = Answers()
        assert remote.start_add_entries(NODE, LOG, SEG, 0, frame(0, 4), -1, ok.done)
        assert ok.event.wait(WAIT_S)
        assert ok.calls == [(4, None, "wp-net-answers")]
        remote.fence(NODE, LOG, SEG)
        refused = Answers()  # a node's error crosses as on a blocking call
        assert remote.start_add_entries(NODE, LOG, SEG, 5, frame(5, 5), 4, refused.done)
        assert refused.event.wait(WAIT_S)
        [(result, error, _)] = refused.calls
        assert result is None and isinstance(error, SegmentFencedError), error
        assert not remote.start_add_entries("nowhere", LOG, SEG, 0, b"", -1, ok.done)
    finally:
        remote.close()
    assert len(ok.calls) == 1  # nothing answered twice, closing included


def test_closing_the_transport_answers_the_started_calls_still_out(engine: LogStoreEngine):
    """A node that does not answer: the transport's close answers its started AddEntries with a
    retriable NodeUnavailableError (every send ends), and its answering thread is gone."""
    release = threading.Event()
    real = engine.add_entries
    engine.add_entries = lambda *a: release.wait(WAIT_S) and real(*a)  # type: ignore[method-assign]
    server = LogStoreServer(engine).start()
    remote = GrpcTransport({NODE: server.address}, timeout_s=WAIT_S)
    out = Answers()
    try:
        assert remote.start_add_entries(NODE, LOG, SEG, 0, frame(0, 1), -1, out.done)
        remote.close()
        [(result, error, _)] = out.calls
        assert result is None and isinstance(error, NodeUnavailableError) and error.retriable
        assert not [t for t in threading.enumerate() if t.name == "wp-net-answers"]
    finally:
        release.set()
        server.stop(WAIT_S)
    assert len(out.calls) == 1


def test_a_stopping_node_finishes_calls_under_way_and_refuses_new_ones(engine: LogStoreEngine):
    entered, release = threading.Event(), threading.Event()
    real = engine.add_entries

    def slow_add(*args):
        entered.set()
        release.wait(WAIT_S)
        return real(*args)

    engine.add_entries = slow_add  # type: ignore[method-assign]
    server = LogStoreServer(engine).start()
    remote = GrpcTransport({NODE: server.address}, timeout_s=WAIT_S)
    answers: list[object] = []
    caller = threading.Thread(
        target=lambda: answers.append(remote.add_entries(NODE, LOG, SEG, 0, frame(0, 2)))
    )
    caller.start()
    try:
        assert entered.wait(WAIT_S)
        stopper = threading.Thread(target=server.stop, args=(WAIT_S,))
        stopper.start()
        while stopper.is_alive() and not _refused(remote):
            pass  # until the stop has begun: a new call is then refused
        stopper.join(0.5)
        assert stopper.is_alive()  # the stop waits for the call under way
        release.set()
        caller.join(WAIT_S)
        stopper.join(WAIT_S)
        assert answers == [2]  # the call under way was answered
        assert not stopper.is_alive()
        with pytest.raises(NodeUnavailableError):
            remote.read(NODE, LOG, SEG, 0, 10)
    finally:
        release.set()
        remote.close()
        server.stop(0)


def _refused(remote: GrpcTransport) -> bool:
    try:
        remote.last_add_confirmed(NODE, LOG, SEG)
    except NodeUnavailableError:
        return True
    return False


def test_a_handler_bug_fails_its_call_only(node: LogStoreServer, engine: LogStoreEngine):
    remote = GrpcTransport({NODE: node.address}, timeout_s=WAIT_S)
    real = engine.read
    engine.read = lambda *a: 1 / 0  # type: ignore[method-assign]
    try:
        with pytest.raises(NodeUnavailableError, match="UNKNOWN.*ZeroDivisionError") as bug:
            remote.read(NODE, LOG, SEG, 0, 10)
        assert bug.value.retriable
        engine.read = real  # type: ignore[method-assign]
        assert remote.add_entries(NODE, LOG, SEG, 0, frame(0, 0)) == 0  # the node goes on
    finally:
        remote.close()


def test_the_native_surface_names_what_is_wrong(node: LogStoreServer):
    channel = NodeChannel(node.address, SERVICE)
    with pytest.raises(RpcError) as unknown:
        channel.call("NoSuchCall", b"", 10)
    assert unknown.value.args[0] == "UNIMPLEMENTED"
    with pytest.raises(RpcError) as other:
        NodeChannel(node.address, "another.Service").call("Read", b"", 10)
    assert other.value.args[0] == "UNIMPLEMENTED"
    with pytest.raises(ValueError, match="timeout_s"):
        channel.call("Read", b"", -1)
    with pytest.raises(ValueError, match="address"):
        NodeChannel("not an address", SERVICE)
    with pytest.raises(ValueError, match="callable"):
        NodeServer("127.0.0.1:0", SERVICE, "not callable")  # type: ignore[arg-type]
    with pytest.raises(OSError, match="cannot listen"):
        NodeServer(node.address, SERVICE, lambda m, b: b)  # the port is taken
    with pytest.raises(ValueError, match="key"):
        NodeChannel(node.address, SERVICE, tls=True, cert=b"pem")


def test_a_forked_child_reaches_the_node_with_a_runtime_of_its_own(node: LogStoreServer):
    """The runtime (and the channel) the parent made are unusable in a forked child, as in
    Spark's Python workers: the child makes its own on its first call."""
    remote = GrpcTransport({NODE: node.address}, timeout_s=WAIT_S)
    try:
        assert remote.add_entries(NODE, LOG, SEG, 0, frame(0, 1)) == 1  # the parent's runtime
        pid = os.fork()
        if pid == 0:  # the child: its exit status is the verdict
            code = 1
            try:
                if len(remote.read(NODE, LOG, SEG, 0, 10)) == 2:
                    code = 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + WAIT_S  # a child on the parent's runtime never returns
        while (status := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the forked child's call never ended")
            time.sleep(0.05)
        assert os.waitstatus_to_exitcode(status[1]) == 0
        assert len(remote.read(NODE, LOG, SEG, 0, 10)) == 2  # the parent's goes on
    finally:
        remote.close()
