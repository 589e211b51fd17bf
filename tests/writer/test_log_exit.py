"""Interpreter exit with writes queued (issue 11 item 7), in real child processes: the exit is
clean (no SIGABRT from a writer thread killed inside a native call during finalization) and
the queued writes are written (an atexit hook closes open writers, flushing them)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import woodpecker_idem
from woodpecker_idem.connect import connect

EXITPROC = Path(__file__).resolve().parent.parent / "support" / "exitproc.py"
PYTHONPATH = str(Path(woodpecker_idem.__file__).resolve().parent.parent)
RUNS = 3
CASES = [pytest.param(False, 1, id="plain-es1"), pytest.param(True, 3, id="idempotent-es3")]


@contextmanager
def child(
    data_dir: Path, mode: str, idempotent: bool, es: int, n: int = 0
) -> Iterator[subprocess.Popen]:
    """The child process (support/exitproc.py, which gives SIGINT Python's handler even when
    this process ignores it); killed by PID on every way out of the block (a failed assert, a
    timeout, Ctrl-C), so a burst child never outlives its test writing on."""
    proc = subprocess.Popen(
        [sys.executable, str(EXITPROC), str(data_dir), mode, str(int(idempotent)), str(es), str(n)],
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()  # reaps it and closes its pipes


def payloads(data_dir: Path, es: int) -> list[int]:
    """The `p<i>` numbers in the log, in log order."""
    client = connect(data_dir, {"quorum.es": es})
    try:
        return [int(m.payload[1:]) for m in client.open_log("exit").open_reader()]
    finally:
        client.close()


@pytest.mark.parametrize(("idempotent", "es"), CASES)
def test_exit_with_writes_queued_writes_them_and_exits_cleanly(tmp_path, idempotent, es):
    for run in range(RUNS):
        data_dir = tmp_path / f"run{run}"
        with child(data_dir, "queued", idempotent, es, 1000) as proc:
            out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"run {run}: rc {proc.returncode}\n{err[-2000:]}"
        assert "FATAL" not in err and "Traceback" not in err, err[-2000:]
        assert payloads(data_dir, es) == list(range(1000)), f"run {run}: queued writes lost"


@pytest.mark.parametrize(("idempotent", "es"), CASES)
def test_sigint_during_a_write_async_burst_exits_as_python_does(tmp_path, idempotent, es):
    """Ctrl-C lands anywhere in a burst: the process ends as Python ends on KeyboardInterrupt
    (killed by SIGINT after the traceback), never by SIGABRT; the writes accepted before it are
    in the log in order, without gaps or duplicates."""
    rng = random.Random(11)
    for run in range(RUNS):
        data_dir = tmp_path / f"run{run}"
        with child(data_dir, "burst", idempotent, es) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.05, 0.4))
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGINT, f"run {run}: rc {proc.returncode}\n{err[-2000:]}"
        assert "FATAL" not in err, err[-2000:]
        assert "KeyboardInterrupt" in err
        got = payloads(data_dir, es)
        assert got and got == list(range(len(got))), f"run {run}: {len(got)} entries, not 0..n-1"
