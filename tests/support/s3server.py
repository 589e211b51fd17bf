"""Run moto's standalone S3 server as a child process for tests (127.0.0.1 only).

`freeze()`/`thaw()` send SIGSTOP/SIGCONT: the kernel still accepts TCP connections into the
listen backlog, but nothing answers: what a hung or partitioned object store looks like to a client.

moto checks `If-None-Match: *` and then stores the object in two separate steps (not atomically), so
two racing conditional PUTs can both succeed there, unlike on S3. With `atomic_conditional_puts`
(the default) the server runs through a tiny bootstrap that serializes PutObject calls under one
lock, which restores S3's documented behaviour (exactly one creator wins).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

from serverproc import HOST, ServerProcess, free_port

from woodpecker_idem.cli.cluster import MOTO_BOOTSTRAP

logger = logging.getLogger(__name__)

# moto's conditional PUTs made atomic, as on S3 (the module doc): the same bootstrap as the
# package's own `woodpecker-idem cluster up` runs
_BOOTSTRAP = MOTO_BOOTSTRAP


class MotoS3Server(ServerProcess):
    """A moto S3 server process; stop it with `stop()` (by PID, never by name)."""

    def __init__(self, *, atomic_conditional_puts: bool = True, start_timeout_s: float = 30.0):
        super().__init__(start_timeout_s=start_timeout_s)
        self.atomic_conditional_puts = atomic_conditional_puts
        self.port = 0
        self._log: tempfile._TemporaryFileWrapper[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> MotoS3Server:
        """Start on a free port and wait until it answers HTTP (retrying if the port was taken)."""
        last_err = ""
        for _ in range(3):
            self.port = free_port()
            args = ["-H", HOST, "-p", str(self.port)]
            if self.atomic_conditional_puts:
                cmd = [sys.executable, "-c", _BOOTSTRAP, *args]
            else:
                cmd = [sys.executable, "-m", "moto.server", *args]
            env = dict(os.environ)
            env.setdefault("AWS_ACCESS_KEY_ID", "testing")
            env.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
            # A file, not a pipe: moto logs every request, and an undrained pipe would block it.
            self._log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log")  # noqa: SIM115
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
            )
            if self.wait_ready(self._answers):
                logger.info("moto S3 server pid %d at %s", self.proc.pid, self.endpoint_url)
                return self
            last_err = self._stop_and_collect()
        raise RuntimeError(f"moto server did not start: {last_err[-2000:]}")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1.0):
                return True
        except urllib.error.HTTPError:
            return True  # any HTTP answer means it is serving
        except OSError:
            return False

    def log_tail(self, limit: int = 4000) -> str:
        """The end of the server's combined output (for failure messages)."""
        if self._log is None:
            return ""
        with open(self._log.name, "rb") as f:
            data = f.read()
        return data[-limit:].decode(errors="replace")

    def _stop_and_collect(self) -> str:
        tail = self.log_tail()
        self.stop()
        return tail

    def stop(self) -> None:
        """Terminate by PID, wait, then kill if it lingers."""
        self.terminate(timeout_s=5)
        if self._log is not None:
            self._log.close()
            self._log = None
