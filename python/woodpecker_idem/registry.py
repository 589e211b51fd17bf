"""Every writer, reader, retention runner and upload queue (staged storage) of this process,
weakly held: what the metrics collector walks. One leaves when it is garbage collected; callers
skip the closed ones."""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .client.log import LogHandle

_lock = threading.Lock()
_writers: weakref.WeakKeyDictionary[object, LogHandle] = weakref.WeakKeyDictionary()
_readers: weakref.WeakKeyDictionary[object, LogHandle] = weakref.WeakKeyDictionary()
_runners: weakref.WeakSet[object] = weakref.WeakSet()
_uploads: weakref.WeakSet[object] = weakref.WeakSet()


def add(writer: object, handle: LogHandle) -> None:
    with _lock:
        _writers[writer] = handle


def add_reader(reader: object, handle: LogHandle) -> None:
    with _lock:
        _readers[reader] = handle


def add_runner(runner: object) -> None:
    with _lock:
        _runners.add(runner)


def add_uploads(uploads: object) -> None:
    with _lock:
        _uploads.add(uploads)


def uploads() -> list[object]:
    with _lock:
        return list(_uploads)


def readers() -> list[tuple[object, LogHandle]]:
    with _lock:
        return list(_readers.items())


def runners() -> list[object]:
    with _lock:
        return list(_runners)


def writers() -> list[tuple[object, LogHandle]]:
    """(writer, its log) for every writer still referenced somewhere, open or not."""
    with _lock:
        return list(_writers.items())


def is_live(writer: object) -> bool:
    """Open and not fenced: it still owns its log."""
    return not getattr(writer, "stopped", True)
