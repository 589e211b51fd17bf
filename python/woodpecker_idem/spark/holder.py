"""A Python worker keeping a log's writer serves the streaming tasks that other Python workers
of its host run for that log: it writes their rows through the writer it keeps, so the log is not
taken over (and no new segment opened) each time Spark runs a route's task in another worker.

A served route is written by the same code as a task's own (route_write.py): the batch identity's
decision (`begin`, with the task's Spark partition as writer), the rows it lets through, the
window's eviction check and the report the task hands to the driver. The writer is taken out of
the kept ones for the whole session, so nothing else writes through it meanwhile; when the task
closes the session after writing all it was given, the writer is kept again; on any other end
(an error, the task's worker gone) it is closed, as a failed task closes its own, and the next
task takes the log over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError, WriterFencedError
from . import handoff
from . import kept as kept_writers
from .batches import BatchId
from .route_write import RouteWrite

log = logging.getLogger(__name__)


@dataclass
class _Server:
    pid: int
    directory: Path
    path: str
    # (store, log id, epoch) of the writers this process named itself the holder of: named
    # again only after a take-over (a new epoch), when another worker may have been named since
    published: set[tuple[str, int, int]] = field(default_factory=set)


_server: _Server | None = None
_failed_pid = 0  # the process whose server could not start (it does not try again)
# Held while the server starts and while it names a holder: the task's thread and the serving
# threads keep writers concurrently; under it, `published` matches what this process wrote.
_lock = threading.Lock()


def keep(key: str, kept: kept_writers.Kept) -> None:
    """Keep `kept` in this worker for the log's next micro-batch and name this worker as the
    one sibling workers hand that log's rows to."""
    kept_writers.keep(key, kept)
    w = kept.writer
    with _lock:
        server = _serving_locked()
        if server is None:
            return
        named = (kept.client.store_id(), w.log_id, w.epoch)
        if named in server.published:
            return
        try:
            holder = handoff.Holder(server.pid, server.path)
            handoff.publish(server.directory, named[0], w.log_id, holder)
        except OSError as exc:  # the writer still serves this worker's own tasks
            log.warning("log id %d: not offered to sibling workers: %s", w.log_id, exc)
            return
        server.published.add(named)


def _serving_locked() -> _Server | None:
    """This process's server, started on first use (None when it cannot be). A forked child
    has none of its parent's threads: it starts its own."""
    global _server, _failed_pid
    pid = os.getpid()
    if _server is not None and _server.pid == pid:
        return _server
    if _failed_pid == pid:
        return None
    directory = handoff.registry_dir()
    if directory is None:
        _failed_pid = pid
        return None
    path = str(directory / f"{pid}.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        handoff.sweep(directory)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a dead process's of the same pid
        listener.bind(path)
        listener.listen(16)
    except OSError as exc:
        listener.close()
        log.warning("no writer handoff from this Python worker: %s", exc)
        _failed_pid = pid
        return None
    threading.Thread(target=_accept, args=(listener,), name="wp-kept-holder", daemon=True).start()
    _server = _Server(pid, directory, path)
    return _server


def _accept(listener: socket.socket) -> None:
    with listener:  # closed when it fails: sibling workers' connections are refused at once
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                log.exception("the writer handoff server stopped")
                return
            threading.Thread(target=serve, args=(conn,), name="wp-kept-serve", daemon=True).start()


def serve(conn: socket.socket) -> None:
    """One task's session for one route (see handoff.py for the requests)."""
    session = _Session()
    with conn:
        try:
            while (msg := handoff.receive(conn)) is not None:
                header, body = msg
                reply, done = session.handle(header, body)
                handoff.send(conn, reply)
                if done:
                    break
        except OSError as exc:  # the task's worker went away: its task fails or has failed
            log.info("a task writing through this worker's writer went away: %s", exc)
        finally:
            session.end()


class _Session:
    def __init__(self) -> None:
        self.key = ""
        self.route: RouteWrite | None = None  # out of the kept writers while the session runs
        self.failed = False

    def handle(self, header: dict[str, Any], body: bytearray) -> tuple[dict[str, Any], bool]:
        """The reply to one request, and whether the session is over."""
        op = header.get("op")
        try:
            if op == "open":
                return self.open(header), False
            route = self.route
            if route is None:
                raise InvalidArgumentError(f"{op!r} before open")
            if op == "write":
                return {"duplicates": route.write(*handoff.decode_rows(body))}, False
            if op == "report":
                report = route.report()
                txn = None
                if report.txn is not None:
                    txn = [report.txn[0], dataclasses.asdict(report.txn[1])]
                return {**dataclasses.asdict(report), "txn": txn}, False
            if op == "close":
                # kept (or closed) before the task hears back: once the task ends, the
                # query's next micro-batch may look for the writer
                self.end(keep_writer=bool(header.get("keep")) and not self.failed)
                return {}, True
            raise InvalidArgumentError(f"unknown request {op!r}")
        except Exception as exc:  # the task fails with it, and the writer is not kept
            self.failed = True
            return handoff.error_reply(exc), False

    def open(self, header: dict[str, Any]) -> dict[str, Any]:
        if self.route is not None:
            raise InvalidArgumentError("a session writes one route")
        self.key = str(header["kept_key"])
        kept = kept_writers.take(self.key)
        if kept is None:
            return {"ok": False, "why": "no writer of that log is kept here"}
        if kept.writer.log_id != header["log_id"]:  # a log deleted and made again
            kept_writers.discard(kept)
            return {"ok": False, "why": "the log kept here is another one of that name"}
        route = self.route = RouteWrite(header["log"], kept.writer, kept.client, kept.tail)
        batch = BatchId(*header["batch"])
        try:
            route.begin(kept.client, kept.client.open_log(header["log"]), batch, header["writer"])
        except WriterFencedError as exc:  # nothing written: the task takes the log over
            self.failed = True
            return {"ok": False, "why": f"the writer kept here was taken over: {exc}"}
        return {"ok": True}

    def end(self, keep_writer: bool = False) -> None:
        """Keep the writer for the next micro-batch, or close it (a session cut short)."""
        route, self.route = self.route, None
        if route is None or route.writer is None or route.client is None:
            return
        kept = kept_writers.Kept(route.client, route.writer, route.tail, os.getpid())
        if keep_writer:
            keep(self.key, kept)
        else:
            kept_writers.discard(kept)
