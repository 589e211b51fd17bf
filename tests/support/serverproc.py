"""What every server a test starts has in common: 127.0.0.1 on a free port, a readiness wait,
SIGSTOP/SIGCONT outages, and a stop by PID (never by name). `etcdserver.py` and `s3server.py`
add how their server is started and probed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

HOST = "127.0.0.1"

S = TypeVar("S", bound="ServerProcess")


def free_port() -> int:
    """A TCP port that was free a moment ago (bind to 0 and read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A server child process. Subclasses set `self.proc` in `start()` and may extend `stop()`."""

    def __init__(self, *, start_timeout_s: float = 30.0):
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._frozen = False

    @property
    def pid(self) -> int:
        assert self.proc is not None, "server not started"
        return self.proc.pid

    def start(self: S) -> S:
        raise NotImplementedError

    def wait_ready(self, probe: Callable[[], bool]) -> bool:
        """Poll `probe` until it is true (ready), the process ends, or start_timeout_s passes."""
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if probe():
                return True
            time.sleep(0.05)
        return False

    def freeze(self) -> None:
        """SIGSTOP: connections still queue in the backlog, but nothing is answered."""
        os.kill(self.pid, signal.SIGSTOP)
        self._frozen = True

    def thaw(self) -> None:
        """SIGCONT: resume serving (queued requests are then processed)."""
        os.kill(self.pid, signal.SIGCONT)
        self._frozen = False

    def terminate(self, timeout_s: float = 10.0) -> None:
        """SIGTERM by PID (thawed first: a stopped process ignores it), then SIGKILL if it
        lingers."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            if self._frozen:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                self._frozen = False
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        self.proc = None

    def stop(self) -> None:
        self.terminate()

    def __enter__(self: S) -> S:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
