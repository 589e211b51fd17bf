"""A text progress bar on stderr, fed from the driver by Spark's status tracker.

Each phase of the pipeline runs its jobs in a job group of its own; a thread polls the tracker
for the tasks of that group's stages (done / known) and redraws one line. On a terminal the line
is redrawn in place; otherwise (a log file, CI) a line is printed at each 10% step of a phase.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark import SparkContext

WIDTH = 30


@dataclass
class Timer:
    seconds: float = 0.0


class ProgressBar:
    """`with bar.phase("write"): ...` runs Spark jobs under a job group and draws their tasks."""

    def __init__(
        self, sc: SparkContext, phases: int, out: TextIO = sys.stderr, every_s: float = 0.2
    ):
        self._sc = sc
        self._phases = phases
        self._out = out
        self._every_s = every_s
        self._tty = out.isatty()
        self._done_phases = 0
        self._label = ""
        self._group: str | None = None
        self._last_step = -1
        self._last_line = ""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="woodpecker-progress", daemon=True)
        self._thread.start()

    @contextmanager
    def phase(self, label: str) -> Iterator[Timer]:
        """Run the block's Spark jobs as one phase of the bar; the timer gets its seconds."""
        timer = Timer()
        started = time.perf_counter()
        self._begin(label)
        try:
            yield timer
        finally:
            timer.seconds = time.perf_counter() - started
            self._end()

    def _begin(self, label: str) -> None:
        group = f"woodpecker-pipeline-{self._done_phases}"
        self._sc.setJobGroup(group, label)
        with self._lock:
            self._label, self._group, self._last_step = label, group, -1
        self._draw(0, 0, force=True)

    def _end(self) -> None:
        _, total = self._tasks()
        self._draw(total, total, force=True)
        with self._lock:
            self._done_phases += 1
            self._group = None

    def _tasks(self) -> tuple[int, int]:
        """Tasks done and known in the current phase's jobs (stages not yet planned count 0)."""
        with self._lock:
            group = self._group
        if group is None:
            return 0, 0
        tracker = self._sc.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else []:
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        return done, total

    def _draw(self, done: int, total: int, force: bool = False) -> None:
        with self._lock:  # the poller and the phase changes both draw
            fraction = (self._done_phases + (done / total if total else 0.0)) / self._phases
            fraction = min(fraction, 1.0)
            step = int(fraction * 10)
            if not self._tty and step == self._last_step and not force:
                return
            self._last_step = step
            filled = int(fraction * WIDTH)
            line = (
                f"[{'#' * filled}{'.' * (WIDTH - filled)}] {fraction * 100:5.1f}%  "
                f"{self._label}: {done}/{total} tasks"
            )
            if line == self._last_line:
                return
            self._last_line = line
            self._out.write(f"\r{line}\x1b[K" if self._tty else line + "\n")
            self._out.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                with self._lock:
                    idle = self._group is None
                if not idle:
                    done, total = self._tasks()
                    self._draw(done, total)
            except Exception:  # the JVM may be going away at the end: the bar is cosmetic
                if self._stop.is_set():
                    return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if self._tty:
            self._out.write("\n")
            self._out.flush()
