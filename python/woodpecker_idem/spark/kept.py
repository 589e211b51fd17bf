"""Writers kept open in a Python worker between a streaming query's micro-batches.

Spark reuses its Python workers (`spark.python.worker.reuse`, on by default), and a worker runs
one task at a time. A micro-batch's task that wrote a route hands its writer back here when it
ends well; the next micro-batch's task for that route in this worker takes it again instead of
taking the log over, which would seal the writer's segment and open a new one (a segment per log
per micro-batch). A kept writer is used again only while it still holds the log's writer epoch:
when another attempt or another worker has taken the log over since, it is closed and the task
takes the log over itself. A task that runs in another worker of the same host hands its rows to
the worker keeping the writer instead (holder.py, remote.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import WoodpeckerError, WriterFencedError
from ..types import LogMessageId

if TYPE_CHECKING:
    from ..client.client import WoodpeckerClient
    from ..writer.api import IdempotentLogWriter
    from .options import SinkOptions

log = logging.getLogger(__name__)


@dataclass
class Kept:
    client: WoodpeckerClient  # the writer's own client, kept open with it
    writer: IdempotentLogWriter
    tail: LogMessageId | None  # where its next entry goes (after its last acknowledged write)
    pid: int


_KEPT: dict[str, Kept] = {}
# The worker's task thread and the threads serving sibling workers (holder.py) take and keep
# writers: a writer taken is out of _KEPT, so one user at a time writes through it.
_LOCK = threading.Lock()


def kept_key(opts: SinkOptions, route: int) -> str:
    """What a kept writer was opened for: a task with other window options or stores takes
    the log over instead. Text, so another worker can ask for it (holder.py)."""
    what = [
        opts.log,
        route,
        opts.data_dir,
        opts.settings.to_dict(),
        opts.window_max_keys,
        opts.window_duration_s,
    ]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def take(key: str) -> Kept | None:
    """The writer kept under `key` if it may still write its log (None otherwise)."""
    with _LOCK:
        kept = _KEPT.pop(key, None)
    if kept is None:
        return None
    if kept.pid != os.getpid():  # inherited across a fork: never touched here
        return None
    try:
        if kept.writer.fenced:
            raise WriterFencedError("fenced")
        kept.client.meta.check_epoch(kept.writer.log_id, kept.writer.epoch)
    except WriterFencedError:
        log.info("a kept writer of log id %d was taken over: closing it", kept.writer.log_id)
        discard(kept)
        return None
    return kept


def keep(key: str, kept: Kept) -> None:
    with _LOCK:
        old = _KEPT.pop(key, None)
        _KEPT[key] = kept
    if old is not None:
        discard(old)


def discard(kept: Kept) -> None:
    try:
        kept.writer.close()
    except WoodpeckerError:  # fenced or closed: nothing of ours is in flight
        log.debug("closing a kept writer failed", exc_info=True)
    finally:
        kept.client.close()
