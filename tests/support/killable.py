"""A child process SIGKILLed once it has done a given amount of work, for the kill-round tests
(consumers, processors): it writes one line per step to an output file (`P ...` per entry
processed), its stderr is drained, and it is stopped by PID on every way out (`stop()`).

Children run the package the tests run (the installed wheel: python/ of the checkout has no
_core) first on their PYTHONPATH."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from drain import Drain

import woodpecker_idem as wp

SUPPORT = Path(__file__).resolve().parent
PYTHONPATH = os.pathsep.join(
    [str(Path(wp.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
)


class KillableChild:
    """`script` (a file of tests/support/) run with `args`; `out` is the file it writes its lines
    to (also one of `args`)."""

    def __init__(self, script: str, out: Path, args: list[str]):
        self.out = out
        self.name = Path(script).stem
        self.proc = subprocess.Popen(
            [sys.executable, str(SUPPORT / script), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=PYTHONPATH),
        )
        self._stderr = Drain(self.proc.stderr)

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines() if self.out.exists() else []

    def run_until(self, processed: int) -> bool:
        """Until the child has written `processed` `P` lines (then SIGKILL: True) or ended by
        itself (False: it must have exited with status 0)."""
        deadline = time.monotonic() + 120  # a guard against a hang, not a timing claim
        while self.proc.poll() is None:
            if sum(ln.startswith("P ") for ln in self.lines()) >= processed:
                self.stop()
                return True
            assert time.monotonic() < deadline, f"{self.name} stuck: {self._stderr.text()[-2000:]}"
            time.sleep(0.002)
        assert self.proc.returncode == 0, self._stderr.text()[-3000:]
        return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._stderr.close()
