"""LogStore nodes over gRPC (service mode): the client's transport and the node's service, one
wire between them (`proto/logstore.proto`, service `LogStore`).

The calls are the `LogStoreTransport` calls, one RPC each (`RPCS`), with the generated message
classes and no generated stubs: both sides build their handlers from the same table, so the
wire cannot drift from it. AddEntries carries the writer's batch frame as it is (no re-encoding
per entry). Every call has a deadline (`timeout_s`).

The wire itself is native (`_core.NodeChannel`, `_core.NodeServer`: tonic over tokio, rustls for
TLS): only protobuf bytes cross it, encoded and decoded here, and every decision stays here. A
client's call blocks its thread without the GIL; a node's handler runs on the server's threads
with it. Native at both ends because a gRPC library driven from Python could not answer two of
three nodes within the latency target (benches/README.md, "the grpcio latency floor").

Errors cross as the project's own: the node aborts a call with the error's stable `code` in the
trailing metadata (`wp-error`) and its message as details, and the client raises the same class
(`errors.by_code`), retriable exactly as in-process. A node that cannot be reached, or does not
answer within the deadline, is `NodeUnavailableError` (retriable).

One channel per node per client (HTTP/2 multiplexes every call of every writer over it). After a
connection fails, calls fail at once until the next try (100 ms, doubling to 1 s), so a
restarted node is reached within a second.
"""

from __future__ import annotations

import errno
import logging
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._core import Completions, NodeChannel, NodeServer, RpcError
from .._proto import logstore_pb2 as pb
from ..errors import (
    CorruptEntryError,
    InvalidArgumentError,
    NodeUnavailableError,
    WoodpeckerError,
    by_code,
)
from .engine import LogStoreEngine
from .storage import SealedSegment
from .transport import LogStoreTransport

log = logging.getLogger(__name__)

SERVICE = "woodpecker_idem.logstore.LogStore"
# The trailing metadata key of a project error's code (the native wire sets and reads it: an
# `RpcError`'s third argument)
ERROR_KEY = "wp-error"

# Calls whose deadline is this many times `timeout_s`: an upload puts a whole segment to object
# storage (a 256 MiB segment takes longer than a write's add ever may)
SLOW_CALLS = {"seal_segment": 10}


@dataclass(frozen=True)
class Rpc:
    """One transport call on the wire: its RPC name, its messages, and how each side maps its
    arguments and result to them."""

    name: str
    request: Any
    response: Any
    # client: the call's arguments (after node_id) -> request; response -> the call's result
    to_request: Callable[..., Any]
    from_response: Callable[[Any], Any]
    # node: the engine's call for a request -> response
    serve: Callable[[LogStoreEngine, Any], Any]


def _segment_req(log_id: int, segment_id: int, last_entry_id: int = -1) -> Any:
    return pb.SegmentRequest(log_id=log_id, segment_id=segment_id, last_entry_id=last_entry_id)


def _read_req(log_id: int, segment_id: int, first: int, n: int) -> Any:
    return pb.ReadRequest(log_id=log_id, segment_id=segment_id, from_entry_id=first, max_entries=n)


def _empty(call: Callable[..., None], *args: Any) -> Any:
    call(*args)
    return pb.Empty()


def _sealed(sealed: SealedSegment) -> Any:
    return pb.SealSegmentResponse(
        block_keys=sealed.block_keys,
        footer_key=sealed.footer_key,
        footer=pb.SegmentFooter(
            last_entry_id=sealed.last_entry_id,
            blocks=[
                pb.BlockIndex(block=n, first_entry_id=first, last_entry_id=last)
                for n, first, last in sealed.blocks
            ],
        ),
    )


def _last(pair: tuple[int, int]) -> Any:
    return pb.LastEntryResponse(last_entry_id=pair[0], lac=pair[1])


RPCS: dict[str, Rpc] = {
    "add_entries": Rpc(
        "AddEntries",
        pb.AddEntriesRequest,
        pb.AddEntriesResponse,
        lambda log_id, segment_id, first, frame, lac=-1, recovery=False: pb.AddEntriesRequest(
            log_id=log_id,
            segment_id=segment_id,
            first_entry_id=first,
            frame=frame,
            lac=lac,
            recovery=recovery,
        ),
        lambda r: r.last_entry_id,
        lambda e, q: pb.AddEntriesResponse(
            last_entry_id=e.add_entries(
                q.log_id, q.segment_id, q.first_entry_id, q.frame, q.lac, q.recovery
            )
        ),
    ),
    "fence": Rpc(
        "Fence",
        pb.SegmentRequest,
        pb.LastEntryResponse,
        _segment_req,
        lambda r: (r.last_entry_id, r.lac),
        lambda e, q: _last(e.fence(q.log_id, q.segment_id)),
    ),
    "complete": Rpc(
        "Complete",
        pb.SegmentRequest,
        pb.Empty,
        _segment_req,
        lambda r: None,
        lambda e, q: _empty(e.complete, q.log_id, q.segment_id, q.last_entry_id),
    ),
    "completed_end": Rpc(
        "CompletedEnd",
        pb.SegmentRequest,
        pb.CompletedEndResponse,
        _segment_req,
        lambda r: r.last_entry_id if r.HasField("last_entry_id") else None,
        lambda e, q: pb.CompletedEndResponse(last_entry_id=e.completed_end(q.log_id, q.segment_id)),
    ),
    "seal_segment": Rpc(
        "SealSegment",
        pb.SealSegmentRequest,
        pb.SealSegmentResponse,
        lambda log_id, segment_id, last: pb.SealSegmentRequest(
            log_id=log_id, segment_id=segment_id, last_entry_id=last
        ),
        lambda r: SealedSegment(
            tuple(r.block_keys),
            r.footer_key,
            r.footer.last_entry_id,
            tuple((b.block, b.first_entry_id, b.last_entry_id) for b in r.footer.blocks),
        ),
        lambda e, q: _sealed(e.seal_segment(q.log_id, q.segment_id, q.last_entry_id)),
    ),
    "read": Rpc(
        "Read",
        pb.ReadRequest,
        pb.ReadResponse,
        _read_req,
        lambda r: list(r.entries),
        lambda e, q: pb.ReadResponse(
            entries=e.read(q.log_id, q.segment_id, q.from_entry_id, q.max_entries)
        ),
    ),
    "last_add_confirmed": Rpc(
        "LastAddConfirmed",
        pb.SegmentRequest,
        pb.LastEntryResponse,
        _segment_req,
        lambda r: (r.last_entry_id, r.lac),
        lambda e, q: _last(e.last_add_confirmed(q.log_id, q.segment_id)),
    ),
    "delete_segment": Rpc(
        "DeleteSegment",
        pb.SegmentRequest,
        pb.Empty,
        _segment_req,
        lambda r: None,
        lambda e, q: _empty(e.delete_segment, q.log_id, q.segment_id),
    ),
    "delete_log": Rpc(
        "DeleteLog",
        pb.LogRequest,
        pb.Empty,
        lambda log_id: pb.LogRequest(log_id=log_id),
        lambda r: None,
        lambda e, q: _empty(e.delete_log, q.log_id),
    ),
    "raw_read": Rpc(
        "RawRead",
        pb.ReadRequest,
        pb.ReadResponse,
        _read_req,
        lambda r: list(r.entries),
        # a fresh engine over the node's storage, uncached: nothing the serving engine or its
        # storage holds is trusted
        lambda e, q: pb.ReadResponse(
            entries=LogStoreEngine(e.storage.uncached(), e.node_id).read(
                q.log_id, q.segment_id, q.from_entry_id, q.max_entries
            )
        ),
    ),
}


@dataclass(frozen=True)
class Tls:
    """PEM files. A client: `ca` verifies the nodes' certificates, `cert`/`key` is its own
    certificate for nodes that ask for one. A node: `cert`/`key` is its certificate, `ca` (if
    set) the CA whose client certificates it requires."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def read(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        def pem(path: str | None) -> bytes | None:
            return None if path is None else Path(path).read_bytes()

        return pem(self.ca), pem(self.cert), pem(self.key)


class GrpcTransport(LogStoreTransport):
    """Calls to LogStore node processes: `nodes` maps node id -> "host:port"; with `tls`, over
    TLS (see `Tls`)."""

    def __init__(self, nodes: Mapping[str, str], timeout_s: float, tls: Tls | None = None):
        self._nodes = dict(nodes)
        self.timeout_s = timeout_s
        self._tls = tls
        self._pem = tls.read() if tls is not None else (None, None, None)
        self._lock = threading.Lock()
        self._channels: dict[str, NodeChannel] = {}
        # AddEntries started and not answered (`start_add_entries`), by token: their outcomes
        # arrive in `_completions`, taken by one thread (`_answer`), made on the first start
        self._completions = Completions()
        self._started: dict[int, tuple[str, Callable[[Any, BaseException | None], None]]] = {}
        self._tokens = 0
        self._answerer: threading.Thread | None = None
        self._closed = False

    @property
    def node_ids(self) -> list[str]:
        return sorted(self._nodes)

    def set_nodes(self, nodes: Mapping[str, str]) -> None:
        """The node directory changed: nodes are reached where it says from now on (the channel
        of a node still at the same address is kept; one that moved or left is closed)."""
        with self._lock:
            gone = [n for n, a in self._nodes.items() if nodes.get(n) != a]
            self._nodes = dict(nodes)
            closing = [self._channels.pop(n) for n in gone if n in self._channels]
        for channel in closing:
            channel.close()

    def _channel(self, node_id: str) -> NodeChannel:
        channel = self._channels.get(node_id)
        if channel is not None:
            return channel
        with self._lock:
            address = self._nodes.get(node_id)
            if address is None:
                raise NodeUnavailableError(f"unknown LogStore node {node_id!r}")
            channel = self._channels.get(node_id)
            if channel is None:
                ca, cert, key = self._pem
                channel = NodeChannel(
                    address, SERVICE, tls=self._tls is not None, ca=ca, cert=cert, key=key
                )
                self._channels[node_id] = channel
            return channel

    def _invoke(self, node_id: str, method: str, *args: Any) -> Any:
        rpc = RPCS[method]
        request = rpc.to_request(*args).SerializeToString()
        timeout = self.timeout_s * SLOW_CALLS.get(method, 1)
        try:
            response = self._channel(node_id).call(rpc.name, request, timeout)
        except RpcError as exc:
            raise self._error(node_id, method, exc) from None
        return rpc.from_response(rpc.response.FromString(response))

    def start_add_entries(self, node_id, log_id, segment_id, first_entry_id, frame, lac, done):
        """See `LogStoreTransport.start_add_entries`: the call runs on the native runtime and its
        outcome is handed to `done` on this transport's answering thread (a write's sends reach
        three nodes with no thread of ours woken per call)."""
        try:
            channel = self._channel(node_id)
        except NodeUnavailableError:
            return False  # the blocking call raises it
        rpc = RPCS["add_entries"]
        request = rpc.to_request(log_id, segment_id, first_entry_id, frame, lac).SerializeToString()
        with self._lock:
            if self._closed:
                return False
            token = self._tokens
            self._tokens += 1
            self._started[token] = (node_id, done)
            if self._answerer is None:
                self._answerer = threading.Thread(
                    target=self._answer, name="wp-net-answers", daemon=True
                )
                self._answerer.start()
        try:
            channel.start(rpc.name, request, self.timeout_s, self._completions, token)
        except RpcError:  # not started (no runtime): the blocking call says why
            with self._lock:
                self._started.pop(token, None)
            return False
        return True

    def _answer(self) -> None:
        """The answering thread: each started call's outcome to its `done`, in arrival order."""
        while (item := self._completions.next()) is not None:
            self._deliver(*item)

    def _deliver(self, token: int, outcome: bytes | RpcError) -> None:
        """One started call's outcome to its `done`."""
        rpc = RPCS["add_entries"]
        with self._lock:
            started = self._started.pop(token, None)
        if started is None:
            return  # answered by close() already
        node_id, done = started
        result: Any = None
        error: BaseException | None = None
        if isinstance(outcome, RpcError):
            error = self._error(node_id, "add_entries", outcome)
        else:
            try:
                result = rpc.from_response(rpc.response.FromString(outcome))
            except Exception as exc:  # a reply that is no AddEntriesResponse
                error = NodeUnavailableError(f"LogStore node {node_id}: bad reply: {exc}")
        try:
            done(result, error)
        except Exception:  # a bug in a callback must not stop the answers to the others
            log.exception("LogStore node %s: an AddEntries callback failed", node_id)

    def _error(self, node_id: str, method: str, exc: RpcError) -> WoodpeckerError:
        """The project's error for a failed call (see the module doc)."""
        status, details, code = exc.args
        if code is not None:
            return by_code(code)(details or code)
        return NodeUnavailableError(
            f"LogStore node {node_id} ({self._nodes.get(node_id)}): {method} failed: "
            f"{status} {details or ''}".strip()
        )

    def add_entries(
        self, node_id, log_id, segment_id, first_entry_id, frame, lac=-1, recovery=False
    ):
        return self._invoke(
            node_id, "add_entries", log_id, segment_id, first_entry_id, frame, lac, recovery
        )

    def fence(self, node_id, log_id, segment_id):
        return self._invoke(node_id, "fence", log_id, segment_id)

    def complete(self, node_id, log_id, segment_id, last_entry_id):
        self._invoke(node_id, "complete", log_id, segment_id, last_entry_id)

    def completed_end(self, node_id, log_id, segment_id):
        return self._invoke(node_id, "completed_end", log_id, segment_id)

    def seal_segment(self, node_id, log_id, segment_id, last_entry_id):
        return self._invoke(node_id, "seal_segment", log_id, segment_id, last_entry_id)

    def read(self, node_id, log_id, segment_id, from_entry_id, max_entries):
        return self._invoke(node_id, "read", log_id, segment_id, from_entry_id, max_entries)

    def last_add_confirmed(self, node_id, log_id, segment_id):
        return self._invoke(node_id, "last_add_confirmed", log_id, segment_id)

    def delete_segment(self, node_id, log_id, segment_id):
        self._invoke(node_id, "delete_segment", log_id, segment_id)

    def delete_log(self, node_id, log_id):
        self._invoke(node_id, "delete_log", log_id)

    def raw_read(self, node_id, log_id, segment_id, from_entry_id, max_entries):
        return self._invoke(node_id, "raw_read", log_id, segment_id, from_entry_id, max_entries)

    def close(self) -> None:
        """Close the channels; a started call not answered yet is answered now, with a
        retriable `NodeUnavailableError` (its outcome, if it comes, is dropped)."""
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            answerer = self._answerer
        self._completions.close()
        if answerer is not None and answerer is not threading.current_thread():
            answerer.join()
        with self._lock:
            unanswered = list(self._started.values())
            self._started.clear()
        for node_id, done in unanswered:
            try:
                done(None, NodeUnavailableError(f"LogStore node {node_id}: its client closed"))
            except Exception:
                log.exception("LogStore node %s: an AddEntries callback failed", node_id)
        for channel in channels:
            channel.close()


class DropReplies:
    """A testing-only fault (`logstore serve --fault drop-replies:RATE`, a hidden option): the
    node applies an AddEntries and then, with probability RATE, drops its reply. The client
    cannot tell that from a reply lost on the wire or a deadline passed: it sees a failed call
    (UNAVAILABLE, no project error code: `NodeUnavailableError`) for a batch the node holds,
    and resends it, which the node must take as the same entries again. The draws are seeded
    (`seed`), so a run is repeatable; `dropped` counts the replies dropped so far."""

    def __init__(self, rate: float, seed: str = ""):
        if not 0.0 <= rate <= 1.0:
            raise InvalidArgumentError(f"drop-replies rate must be within 0..1, got {rate}")
        self.rate = rate
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self.dropped = 0

    @classmethod
    def parse(cls, text: str, seed: str = "") -> DropReplies:
        kind, _, rate = text.partition(":")
        try:
            if kind != "drop-replies":
                raise ValueError(kind)
            return cls(float(rate), seed)
        except ValueError:
            raise InvalidArgumentError(
                f"--fault {text!r}: the only fault is drop-replies:RATE (RATE within 0..1)"
            ) from None

    def drop(self) -> bool:
        with self._lock:
            if self._random.random() >= self.rate:
                return False
            self.dropped += 1
            return True


class DiskFull:
    """A testing-only fault (`logstore serve --fault disk-full-after:N`, a hidden option): the
    node's local segment files take N appends, then every append fails with ENOSPC, as on a
    disk that filled up (the file that met it refuses later appends, as after a real failed
    write). The client sees a retriable `StorageUnavailableError` from that node and drops it
    from the segment; `failed` counts the appends refused so far."""

    def __init__(self, after: int):
        if after < 0:
            raise InvalidArgumentError(f"disk-full-after takes a count >= 0, got {after}")
        self.after = after
        self._lock = threading.Lock()
        self.appends = 0
        self.failed = 0

    def check(self, path: str) -> None:
        """Before an append to `path`: raises ENOSPC once `after` appends went through."""
        with self._lock:
            if self.appends < self.after:
                self.appends += 1
                return
            self.failed += 1
        raise OSError(errno.ENOSPC, "No space left on device (testing fault)", path)


def parse_fault(text: str, seed: str = "") -> DropReplies | DiskFull:
    """`--fault` of `logstore serve`: drop-replies:RATE or disk-full-after:N."""
    kind, _, arg = text.partition(":")
    if kind == "disk-full-after":
        try:
            return DiskFull(int(arg))
        except ValueError:
            pass
    elif kind == "drop-replies":
        return DropReplies.parse(text, seed)
    raise InvalidArgumentError(
        f"--fault {text!r}: the faults are drop-replies:RATE (RATE within 0..1) and "
        "disk-full-after:N (N appends, then ENOSPC)"
    )


class LogStoreServer:
    """One node's service: `engine` behind a gRPC server on `address` ("127.0.0.1:0" picks a
    free port: `port` tells which, once started); with `tls`, TLS only (`Tls.ca` set: client
    certificates signed by it are required). `workers`: calls served at once. `fault` is for
    tests only (see `DropReplies`)."""

    def __init__(
        self,
        engine: LogStoreEngine,
        address: str = "127.0.0.1:0",
        workers: int = 8,
        tls: Tls | None = None,
        fault: DropReplies | None = None,
    ):
        self.engine = engine
        self.fault = fault
        self._listen = address
        self._workers = workers
        self._tls = tls
        self._pem = tls.read() if tls is not None else (None, None, None)
        if tls is not None and (self._pem[1] is None or self._pem[2] is None):
            raise InvalidArgumentError("a TLS node needs its certificate and its key")
        self._rpcs = {rpc.name: rpc for rpc in RPCS.values()}
        self._server: NodeServer | None = None
        self.port = 0
        self.address = ""

    def _handle(self, method: str, request: bytes) -> bytes:
        """One call (on a server thread, with the GIL): the response's bytes, or an `RpcError`
        whose status and project error code the client maps back (see the module doc)."""
        rpc = self._rpcs.get(method)
        if rpc is None:
            raise RpcError("UNIMPLEMENTED", f"no such method: {method}", None)
        try:
            response = rpc.serve(self.engine, rpc.request.FromString(request))
        except WoodpeckerError as exc:
            if isinstance(exc, CorruptEntryError):
                status = "DATA_LOSS"
            elif exc.retriable:
                status = "UNAVAILABLE"
            else:
                status = "ABORTED"
            raise RpcError(status, str(exc), exc.code) from None
        except OSError as exc:  # a full or failing disk: this node is out for the call
            log.error("%s failed on this node: %s", rpc.name, exc)
            raise RpcError("UNAVAILABLE", f"{rpc.name}: {exc}", NodeUnavailableError.code) from None
        except Exception as exc:  # a bug: the call fails, the node goes on
            log.exception("%s failed on this node", rpc.name)
            raise RpcError("UNKNOWN", f"{rpc.name}: {type(exc).__name__}: {exc}", None) from None
        if rpc.name == "AddEntries" and self.fault is not None and self.fault.drop():
            # applied, and the reply lost
            raise RpcError("UNAVAILABLE", "reply dropped (testing fault)", None)
        return response.SerializeToString()

    def start(self) -> LogStoreServer:
        """Listen and serve (`port` and `address` tell where)."""
        ca, cert, key = self._pem
        self._server = NodeServer(
            self._listen,
            SERVICE,
            self._handle,
            workers=self._workers,
            tls=self._tls is not None,
            ca=ca,
            cert=cert,
            key=key,
        )
        self.port = self._server.port
        host = self._listen.rsplit(":", 1)[0]
        self.address = f"{host}:{self.port}"
        return self

    def stop(self, grace_s: float | None = 5.0) -> None:
        """Stop taking calls; calls under way get `grace_s` to finish (SIGTERM drains)."""
        if self._server is not None:
            self._server.stop(grace_s or 0.0)
