"""A streaming task's route written by the Python worker on this host that keeps the log's
writer (holder.py), instead of taking the log over here.

Before any row is sent, anything in the way (no holder named, its process gone, the connection
refused or unanswered, its writer taken over or opened with other options) leaves the task to
take the log over itself, as it would without a holder: the holder has written nothing of the
task's. Once rows were sent, a holder that goes away fails the task with `HandoffError`: which
of the rows it wrote is unknown here, and Spark's retry of the task takes the log over and
writes what its batch identity finds missing.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from ..errors import HandoffError
from ..meta.base import TxnMeta
from ..types import LogMessageId
from . import handoff
from .route_write import RouteReport

if TYPE_CHECKING:
    import pyarrow as pa

    from .._core import Payloads
    from ..client.log import LogHandle
    from .batches import BatchId
    from .options import SinkOptions

log = logging.getLogger(__name__)


def reply_timeout_s(opts: SinkOptions) -> float:
    """How long a task waits for the holder's answer before it counts the holder as gone: a
    write is answered within its append timeout (the writer fails it then), so this only ends
    the wait on a holder that stopped (e.g. a stopped or swapping process)."""
    return 2 * opts.settings.get("append.timeout_ms") / 1000 + 60


class RemoteRoute:
    """One route of this task, written through the holder's session on `sock`. Its calls come
    one at a time (writes from the task's write thread, then the report and close from the
    task's thread once that thread ended), so requests and replies never interleave."""

    def __init__(self, sock: socket.socket, holder: handoff.Holder, name: str):
        self._sock = sock
        self.holder = holder
        self.name = name

    @classmethod
    def open(
        cls,
        opts: SinkOptions,
        store_id: str,
        handle: LogHandle,
        kept_key: str,
        batch: BatchId,
        writer_name: str,
    ) -> RemoteRoute | None:
        """A session with the worker holding the log's writer, which has begun `batch` there;
        None when there is none to write through (the task takes the log over)."""
        directory = handoff.registry_dir()
        if directory is None:
            return None
        holder = handoff.lookup(directory, store_id, handle.log_id)
        if holder is None or holder.pid == os.getpid():
            return None  # none, or this worker, whose kept writer was taken over or closed
        if not handoff.alive(holder.pid):
            log.info("log %s: the worker %d that held its writer is gone", handle.name, holder.pid)
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(reply_timeout_s(opts))
        request = {
            "op": "open",
            "log": handle.name,
            "log_id": handle.log_id,
            "kept_key": kept_key,
            "batch": [batch.app_id, batch.version],
            "writer": writer_name,
        }
        try:
            sock.connect(holder.socket)
            handoff.send(sock, request)
            # No row is sent before the answer: whatever the holder did meanwhile (at most
            # begin the batch's record under this task's partition), a take-over here replays
            # the batch from that record exactly as after a cut-short attempt.
            msg = handoff.receive(sock)
        except OSError as exc:
            sock.close()
            log.info("log %s: the worker %d holding its writer: %s", handle.name, holder.pid, exc)
            return None
        if msg is None:
            sock.close()
            return None
        try:
            reply = handoff.raise_reply(msg[0], holder)
        except BaseException:
            sock.close()
            raise
        if not reply.get("ok"):
            sock.close()
            log.info("log %s: worker %d: %s", handle.name, holder.pid, reply.get("why"))
            return None
        log.debug("log %s: written through worker %d's writer", handle.name, holder.pid)
        return cls(sock, holder, handle.name)

    def write(self, payloads: Payloads, keys: bytes) -> int:
        """As RouteWrite.write, in the holder."""
        reply = self._call({"op": "write"}, handoff.encode_rows(payloads, keys))
        return int(reply["duplicates"])

    def report(self) -> RouteReport:
        reply = self._call({"op": "report"})
        txn = None
        if reply["txn"] is not None:
            epoch, fields = reply["txn"]
            fields["start"] = LogMessageId(*fields["start"])
            txn = (int(epoch), TxnMeta(**fields))
        return RouteReport(
            early_evictions=int(reply["early_evictions"]),
            txn=txn,
            skipped=int(reply["skipped"]),
            replayed=int(reply["replayed"]),
        )

    def close(self, keep: bool) -> None:
        """End the session: `keep` (the task wrote all it was given) keeps the holder's writer
        for the next micro-batch; otherwise the holder closes it."""
        try:
            self._call({"op": "close", "keep": keep})
        except HandoffError as exc:  # every row is written or the task fails anyway
            log.info(
                "log %s: ending the session with worker %d: %s", self.name, self.holder.pid, exc
            )
        finally:
            self._sock.close()

    def _call(self, header: dict[str, Any], body: pa.Buffer | None = None) -> dict[str, Any]:
        try:
            handoff.send(self._sock, header, body)
            # While this waits, the holder's session has the writer to itself (taken out of its
            # kept ones); no answer within the timeout, or the connection gone, means the rows
            # sent may or may not be in the log: the task fails, and its retry reads it back.
            msg = handoff.receive(self._sock)
        except OSError as exc:
            raise self._gone(str(exc)) from exc
        if msg is None:
            raise self._gone("it closed the connection")
        return handoff.raise_reply(msg[0], self.holder)

    def _gone(self, why: str) -> HandoffError:
        return HandoffError(
            f"log {self.name}: the Python worker {self.holder.pid} holding its writer went away "
            f"while this task wrote through it ({why}): which rows it wrote is unknown here; "
            "the task's retry takes the log over and writes what the batch still misses"
        )
