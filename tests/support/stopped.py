"""Waiting for a SIGSTOP to take effect (it is delivered asynchronously), for the harnesses that
stop a child, read everything it printed, then decide whether to kill it."""

from __future__ import annotations

import time


def wait_stopped(pid: int, timeout: float = 60.0) -> bool:
    """Until `pid` is stopped: True; False if it is gone (exited, or a zombie) instead."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        if state in ("Z", "X"):
            return False
        if state in ("T", "t"):
            return True
        assert time.monotonic() < deadline, f"process {pid} did not stop (state {state})"
        time.sleep(0.001)
