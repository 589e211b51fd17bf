"""Read a child's pipe to its end on a thread.

A child whose stderr nobody reads blocks in its next log call once the pipe's 64 KiB fill up:
a chatty worker under faults then looks exactly like a hang in the library. Every harness that
pipes a child's stderr drains it with this.
"""

from __future__ import annotations

import os
import threading
from typing import IO


class Drain:
    def __init__(self, pipe: IO[bytes] | IO[str]) -> None:
        self._pipe = pipe
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        fd = self._pipe.fileno()
        while chunk := os.read(fd, 1 << 16):
            with self._lock:
                self._chunks.append(chunk)

    def text(self) -> str:
        """What the child wrote so far."""
        with self._lock:
            return b"".join(self._chunks).decode(errors="replace")

    def close(self, timeout: float = 30.0) -> str:
        """Wait for the end of the pipe (the child is gone), close it, return all it wrote."""
        self._thread.join(timeout)
        self._pipe.close()
        return self.text()
