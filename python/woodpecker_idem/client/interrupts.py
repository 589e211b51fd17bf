"""Ctrl-C held back across the writer's multi-step bookkeeping.

Python raises KeyboardInterrupt in the main thread between any two bytecodes. Some of the
writer's state changes must happen together: a run's ids taken and its entry put in every list
that sends and resolves it, queued writes taken off the queue and turned into entries. They run in
the caller's thread (with the writer's lock held) when it writes; an interrupt between two of
their steps would leave an entry that is never sent, or a write nobody resolves, and every later
write of the log would wait behind it. `HOLD_INTERRUPTS` holds SIGINT for the duration and
delivers it right after: the caller still gets its KeyboardInterrupt, with the writer whole.
Only the main thread needs it (Python runs signal handlers nowhere else); other threads pass
through at the cost of one check. A hold swaps the handler twice through `_signal`, the C
functions under `signal` (whose wrappers convert to enums, ~8 us a call): ~2 us in all.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C half: its wrappers cost ~8 us a call
import signal
import threading
from types import FrameType
from typing import Any

_MAIN = threading.main_thread()
_SIGINT = int(signal.SIGINT)


class _HoldInterrupts:
    """Re-entrant: nested holds deliver once, when the outermost ends."""

    __slots__ = ("_depth", "_previous", "_held")

    def __init__(self) -> None:
        self._depth = 0
        self._previous: Any = None
        self._held: list[FrameType | None] = []

    def __enter__(self) -> None:
        if threading.current_thread() is not _MAIN:
            return
        if self._depth == 0:
            previous = _signal.getsignal(_SIGINT)
            if previous is None:  # installed outside Python: cannot be put back, leave it
                self._previous = _UNTOUCHED
            else:
                _signal.signal(_SIGINT, self._hold)
                self._previous = previous
        self._depth += 1

    def __exit__(self, *exc: object) -> None:
        if threading.current_thread() is not _MAIN:
            return
        self._depth -= 1
        if self._depth:
            return
        previous = self._previous
        self._previous = None
        if previous is _UNTOUCHED:
            return
        _signal.signal(_SIGINT, previous)
        if not self._held:
            return
        frame = self._held[0]
        self._held.clear()
        if callable(previous):  # Python's default handler raises KeyboardInterrupt here
            previous(_SIGINT, frame)
        elif previous == signal.SIG_DFL:
            signal.raise_signal(_SIGINT)

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self._held.append(frame)


_UNTOUCHED = object()

HOLD_INTERRUPTS = _HoldInterrupts()
