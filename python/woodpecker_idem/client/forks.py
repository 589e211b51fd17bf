"""Forks: a writer's threads exist only in the process that opened it.

`FORKS` is bumped in every forked child, so a writer made before the fork sees it changed with one
list read per call (cheaper than `os.getpid()`). A write there would wait forever for threads that
do not exist; it raises `WriterForkedError` instead (both writers check).
"""

from __future__ import annotations

import os

from ..errors import WriterForkedError

FORKS = [0]


def _after_fork_in_child() -> None:
    FORKS[0] += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def forked_error(what: str, pid: int) -> WriterForkedError:
    """The error for `what`, opened in process `pid`, used in a process forked since (callers
    compare `FORKS[0]` with the generation they saw at open, which is cheaper than a call)."""
    return WriterForkedError(
        f"{what} was opened in process {pid} and used in process {os.getpid()} (a fork): its "
        "threads do not exist here; open a client and writer in this process"
    )
