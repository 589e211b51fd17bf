"""Argument checks shared by the public entry points.

Each check runs before anything is queued or written and raises a `WoodpeckerError` that names the
argument: `InvalidTypeError` for a wrong type, `InvalidArgumentError` for a bad value. bool is
never a number here (True would otherwise pass as 1), and NaN or infinity never pass as seconds.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from .errors import InvalidArgumentError, InvalidTypeError, WriteTimeoutError
from .types import LogMessageId

T = TypeVar("T")


def timeout_arg(value: object, name: str = "timeout", *, allow_zero: bool = True) -> float | None:
    """A wait in seconds: None (no limit) or a finite number >= 0 (> 0 unless `allow_zero`)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidTypeError(
            f"{name} must be a number of seconds or None, not {type(value).__name__} {value!r}"
        )
    seconds = float(value)
    if not math.isfinite(seconds):
        raise InvalidArgumentError(
            f"{name} must be a finite number of seconds (None waits without a limit), not {value!r}"
        )
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgumentError(f"{name} must be {bound} seconds or None, not {value!r}")
    return seconds


def bool_arg(value: object, name: str) -> bool:
    """A flag: only True or False (a truthy string must not silently switch a mode on)."""
    if not isinstance(value, bool):
        raise InvalidTypeError(
            f"{name} must be True or False, not {type(value).__name__} {value!r}"
        )
    return value


_ID_MAX = 2**32 - 1  # segment and entry ids are u32 in the window and the snapshot


def message_id_arg(value: object, name: str) -> LogMessageId:
    """A position: a `LogMessageId` or a (segment_id, entry_id) pair of ints in 0..2**32-1."""
    if not isinstance(value, tuple) or len(value) != 2:
        raise InvalidTypeError(
            f"{name} must be a LogMessageId (segment_id, entry_id), not {type(value).__name__} "
            f"{value!r}"
        )
    for part, field in zip(value, LogMessageId._fields, strict=True):
        if isinstance(part, bool) or not isinstance(part, int):
            raise InvalidTypeError(
                f"{name}.{field} must be an int, not {type(part).__name__} {part!r}"
            )
        if not 0 <= part <= _ID_MAX:
            raise InvalidArgumentError(f"{name}.{field} must be in 0..{_ID_MAX}, not {part}")
    return LogMessageId(int(value[0]), int(value[1]))


def wait_for(future: Future[T], timeout: float | None, pending: Callable[[], str]) -> T:
    """`future.result(timeout)`, but a wait that ends before the outcome raises our
    `WriteTimeoutError` (with `pending()` saying what became of the write), not a bare
    built-in TimeoutError. `pending` is called only then: the message costs nothing otherwise."""
    try:
        return future.result(timeout)
    except TimeoutError:
        if future.done():
            raise  # the write's own outcome (WriteTimeoutError or a storage timeout)
        raise WriteTimeoutError(
            f"not acknowledged within timeout={timeout:g} s: {pending()}"
        ) from None


__all__ = ["bool_arg", "message_id_arg", "timeout_arg", "wait_for"]
