"""Run a single-member etcd (Debian's `etcd-server`, 3.4+) as a child process for tests.

Client and peer URLs are 127.0.0.1 on free ports, the data directory is a temp dir, and the
process is stopped by PID. `freeze()`/`thaw()` send SIGSTOP/SIGCONT (connections still queue,
nothing answers: a hung or partitioned etcd); `restart()` stops it and starts it again on the same
ports and data, so what was committed survives, as it would on a real restart.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from serverproc import HOST, ServerProcess, free_port

logger = logging.getLogger(__name__)


def etcd_binary() -> str:
    """The etcd executable; scripts/test installs Debian's etcd-server where it is missing."""
    path = shutil.which("etcd") or shutil.which("etcd", path="/usr/bin:/usr/sbin")
    if path is None:
        raise RuntimeError("etcd is not installed: apt-get install etcd-server (or scripts/test)")
    return path


class EtcdServer(ServerProcess):
    """One etcd member; stop it with `stop()` (by PID, never by name)."""

    def __init__(self, *, start_timeout_s: float = 30.0):
        super().__init__(start_timeout_s=start_timeout_s)
        self.client_port = 0
        self.peer_port = 0
        self._dir: str | None = None

    @property
    def endpoint(self) -> str:
        """host:port, the form `meta.endpoints` takes."""
        return f"{HOST}:{self.client_port}"

    def start(self) -> EtcdServer:
        """Start on free ports (retrying if one was taken) and wait until /health says true."""
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="etcd-test-")
        restarting = bool(self.client_port)
        last = ""
        for _ in range(1 if restarting else 3):
            if not restarting:
                self.client_port, self.peer_port = free_port(), free_port()
            self._spawn()
            if self.wait_ready(self.healthy):
                logger.info("etcd pid %d at %s", self.pid, self.endpoint)
                return self
            last = self.log_tail()
            self.terminate()
            if not restarting:  # a port was taken: try others, from empty data
                shutil.rmtree(os.path.join(self._dir, "data"), ignore_errors=True)
        raise RuntimeError(f"etcd did not start: {last[-2000:]}")

    def _spawn(self) -> None:
        assert self._dir is not None
        client = f"http://{HOST}:{self.client_port}"
        peer = f"http://{HOST}:{self.peer_port}"
        cmd = [
            etcd_binary(),
            "--name=test",
            f"--data-dir={os.path.join(self._dir, 'data')}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=test={peer}",
            "--log-level=warn",
        ]
        # A file, not a pipe: an undrained pipe would block the server.
        log = open(os.path.join(self._dir, "etcd.log"), "ab")  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        finally:
            log.close()

    def healthy(self, timeout_s: float = 1.0) -> bool:
        try:
            url = f"http://{self.endpoint}/health"
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                return json.loads(resp.read()).get("health") == "true"
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def log_tail(self, limit: int = 4000) -> str:
        if self._dir is None:
            return ""
        try:
            with open(os.path.join(self._dir, "etcd.log"), "rb") as f:
                return f.read()[-limit:].decode(errors="replace")
        except OSError:
            return ""

    def restart(self, down_s: float = 0.0) -> None:
        """Stop (SIGTERM), stay down `down_s`, start again on the same ports and data."""
        self.terminate()
        if down_s:
            time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        """Terminate by PID and remove the data directory."""
        self.terminate()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
