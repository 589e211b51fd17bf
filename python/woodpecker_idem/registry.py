"""Every writer open in this process, weakly held: what the metrics collector and the retention
runner walk. A writer leaves when it is garbage collected; callers skip the closed ones."""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .client.log import LogHandle

_lock = threading.Lock()
_writers: weakref.WeakKeyDictionary[object, LogHandle] = weakref.WeakKeyDictionary()


def add(writer: object, handle: LogHandle) -> None:
    with _lock:
        _writers[writer] = handle


def writers() -> list[tuple[object, LogHandle]]:
    """(writer, its log) for every writer still referenced somewhere, open or not."""
    with _lock:
        return list(_writers.items())


def is_live(writer: object) -> bool:
    """Open and not fenced: it still owns its log."""
    core = getattr(writer, "core", writer)  # an idempotent writer wraps a LogWriter
    return not getattr(core, "stopped", True)
