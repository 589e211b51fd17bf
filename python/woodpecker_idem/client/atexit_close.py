"""Writers still open at interpreter exit are closed by an atexit hook, like a Kafka producer.

Queued writes are flushed (every future ends either way) and every writer thread is joined
before the interpreter finalizes: a daemon thread that wakes inside a native call (a file put,
the key hasher) during finalization is killed by `pthread_exit`, which aborts the process with
"FATAL: exception not rethrown" (SIGABRT).
"""

from __future__ import annotations

import atexit
import logging
import os
import time
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .writer import LogWriter

log = logging.getLogger(__name__)

#: Every writer still open at exit is closed within this many seconds in all
EXIT_CLOSE_TIMEOUT_S = 30.0

_open: weakref.WeakSet[LogWriter] = weakref.WeakSet()
# A forked child's writers are its parent's: the child neither flushes nor completes them at exit.
os.register_at_fork(after_in_child=_open.clear)


def track(writer: LogWriter) -> None:
    """`writer` is open: close it at exit unless it is closed before."""
    _open.add(writer)


def untrack(writer: LogWriter) -> None:
    _open.discard(writer)


def close_open_writers(timeout: float = EXIT_CLOSE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    for writer in list(_open):
        try:
            writer.close(max(0.0, deadline - time.monotonic()))
        except Exception:
            log.exception("log %s: closing the writer at exit failed", writer.log_id)


atexit.register(close_open_writers)
