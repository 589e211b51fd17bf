"""A LogStore node as a child process for tests (`woodpecker-idem logstore serve`, service
mode): 127.0.0.1, a free port read back from its port file, SIGSTOP/SIGCONT outages, SIGKILL
crashes, a restart over the same storage, and a stop by PID (never by name). Its output is kept
in a file and read after it exits (`output()`), so nothing it said is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from serverproc import HOST, ServerProcess


class LogStoreNode(ServerProcess):
    """Node `node_id` of the deployment `config` names (a dict of config keys), with `data_dir`
    (its metadata store and objects, as a client of the same deployment has them)."""

    def __init__(
        self,
        node_id: str,
        data_dir: Path,
        config: dict[str, object] | None = None,
        args: tuple[str, ...] = (),
    ):
        super().__init__(start_timeout_s=120.0)  # a start takes seconds; a busy machine slows it
        self.node_id = node_id
        self.data_dir = Path(data_dir)
        self.config = dict(config or {})
        self.args = args  # more `logstore serve` arguments (e.g. --tls-cert)
        self.port = 0
        self._dir = Path(tempfile.mkdtemp(prefix=f"wp-node-{node_id}-"))
        self._outputs: list[str] = []

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self) -> LogStoreNode:
        import yaml

        config = self._dir / "node.yaml"
        config.write_text(yaml.safe_dump(_nested(self.config)))
        port_file = self._dir / "port"
        port_file.unlink(missing_ok=True)
        log = open(self._dir / f"out-{len(self._outputs)}.txt", "wb")  # noqa: SIM115
        self._outputs.append(log.name)
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "woodpecker_idem.cli", "logstore", "serve",
                "--node-id", self.node_id, "--listen", f"{HOST}:{self.port}",
                "--port-file", str(port_file), "--config", str(config),
                "--data-dir", str(self.data_dir), *self.args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            # No preexec_fn resetting SIGINT (whoever started the tests may ignore it): the node
            # sets its own SIGINT handler (cli/node.py), and Python code run between fork and
            # exec can deadlock the child of a process with threads (the wire's, the senders'):
            # restarts of killed nodes hung on a busy machine.
        )  # fmt: skip
        log.close()
        if not self.wait_ready(lambda: port_file.exists()):
            if self.proc.poll() is None:  # still running: its threads' stacks say where it waits
                os.kill(self.proc.pid, signal.SIGUSR1)
                time.sleep(2)
                how = f"still starting after {self.start_timeout_s:g} s; its threads"
            else:
                how = f"exited with status {self.proc.returncode}"
            out = self.output()
            self.terminate()
            raise RuntimeError(f"LogStore node {self.node_id} did not start ({how}): {out}")
        self.port = int(port_file.read_text())  # a restart listens on the same port
        return self

    def kill(self) -> None:
        """SIGKILL by PID: a crash (nothing drained, nothing deregistered)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None

    def output(self) -> str:
        """Everything every run of the node wrote (read after it exited, or so far)."""
        return "".join(Path(p).read_text(errors="replace") for p in self._outputs)


def _nested(flat: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in flat.items():
        section, name = key.split(".", 1)
        out.setdefault(section, {})[name] = value  # type: ignore[index]
    return out
