"""Several processes (support/campaignproc.py) write the same keys to one log at once, taking it
over from each other, while faults land: SIGKILLs from here, and inside each worker es=3 nodes
down, acks dropped, storage (every node) and metadata outages. Each worker runs several producer
threads (write_async, write_many and sync writes mixed) into small in-flight bounds, so they wait
on backpressure all the time; new keys keep arriving for the whole run (a frontier every worker
shares moves on every second). Every line a worker printed is read (to the end of its pipe, also
after a SIGKILL), every attempt goes into one History with its own times, and the checker judges
the entries the nodes store (read around the LogReader) at the end.

Faults must meet new writes, or the campaign proves nothing: each worker counts the new writes
(entries sent to a node for the first time) each fault kind met, and the campaign asserts every
kind it injected met some, that new entries were created in every quarter of the run, and that
SIGKILLs landed: a kill lands when the killed worker had handed a write of a key nobody had
been answered for yet to its writer and not seen its outcome (evidence from its own lines). A
kill is aimed: the worker is stopped (SIGSTOP), its lines read, and it is killed only if such a
write is in flight; otherwise it goes on and its next burst is aimed at.

- `test_two_processes_race_the_same_keys`: two workers, repeated takeovers, no other fault.
- `test_fault_campaign_smoke`: the campaign for WP_CAMPAIGN_SMOKE_S seconds (default 20).
- `test_fault_campaign` (slow): WP_CAMPAIGN_S seconds (default 600; 45 with WP_SLOW_PROFILE=ci).
"""

from __future__ import annotations

import fcntl
import os
import random
import signal
import subprocess
import sys
import termios
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from drain import Drain
from slowprofile import size
from stopped import wait_stopped

import woodpecker_idem as wp
from woodpecker_idem import LogMessageId, WriteResult, explicit_key
from woodpecker_idem.clock import SYSTEM_CLOCK
from woodpecker_idem.testing.history import DUPLICATE, LOST, History, Stamp, Verdict, read_stored

PACKAGE_ROOT = str(Path(wp.__file__).resolve().parent.parent)
HERE = Path(__file__).resolve().parent.parent / "support"


def _stamp() -> Stamp:
    return Stamp(SYSTEM_CLOCK.now_ms(), time.monotonic_ns())


class Worker:
    """One worker process: its lines are read on a thread until its pipe ends."""

    def __init__(
        self, data_dir: Path, tag: str, keys: int, seconds: float, seed: int, extra: list[str]
    ) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT, env.get("PYTHONPATH", "")])
        self.tag = tag
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "campaignproc.py"),
                str(data_dir),
                tag,
                str(keys),
                f"{seconds:.1f}",
                str(seed),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.lines: list[str] = []
        self.killed_at: Stamp | None = None
        self.in_flight: list[str] = []  # handed to the writer, no outcome (set by _absorb)
        self.scanned = 0  # lines `_answered` has read
        # what `new_in_flight` has read: bursts with keys lacking an outcome, the handed ones
        self._parsed = 0
        self._open: dict[str, set[str]] = {}
        self._handed: set[str] = set()
        assert self.proc.stderr is not None
        self._stderr = Drain(self.proc.stderr)  # a full stderr pipe would block the worker
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd, buf = self.proc.stdout.fileno(), b""
        while chunk := os.read(fd, 1 << 16):
            buf += chunk
            *lines, buf = buf.split(b"\n")
            self.lines.extend(line.decode() for line in lines)
        # `buf` holds a line cut short by a SIGKILL, if any: dropped

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.killed_at = _stamp()

    def stop(self) -> bool:
        """SIGSTOP the worker and wait until everything it printed is in `lines`; False if it
        is gone already."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        if not wait_stopped(self.proc.pid):
            return False
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        stable = 0
        while stable < 3:  # the pipe empty and the reader idle for a few polls
            before = len(self.lines)
            time.sleep(0.002)
            unread = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
            empty = int.from_bytes(unread, sys.byteorder) == 0
            stable = stable + 1 if empty and len(self.lines) == before else 0
        return True

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def new_in_flight(self, answered: set[str]) -> bool:
        """Whether a key in a burst this worker handed to its writer has no outcome here and
        no acknowledgement anywhere (`answered`): a new write in flight. Reads the lines since
        the last call (a long run prints millions)."""
        lines = self.lines
        end = len(lines)
        for line in lines[self._parsed : end]:
            kind, _, rest = line.partition(" ")
            if kind == "B":
                parts = rest.split()
                self._open[parts[0]] = set(parts[3].split(","))
            elif kind == "S":
                self._handed.add(rest.split()[0])
            elif kind in ("A", "F"):
                burst, name = rest.split()[:2]
                names = self._open.get(burst)
                if names is not None:
                    names.discard(name)
                    if not names:
                        del self._open[burst]
                        self._handed.discard(burst)
        self._parsed = end
        return any(
            name not in answered for burst in self._handed for name in self._open.get(burst, ())
        )

    def finish(self, timeout: float) -> str:
        """Wait for the exit and the end of the output; returns stderr's tail."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGUSR1)  # every thread's stack to stderr
            time.sleep(1)
            self.kill()
            self.proc.wait(10)
            err = self._stderr.close()
            at = err.find("Thread 0x")  # faulthandler's dump: all of it, after the log's tail
            stacks = err[-3000:] if at < 0 else err[max(0, at - 3000) :]
            raise AssertionError(
                f"worker {self.tag} did not end in time (a hang); last lines "
                f"{self.lines[-5:]}; stderr and stacks:\n{stacks}"
            ) from None
        self._reader.join(30)
        err = self._stderr.close()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return err[-3000:]


@dataclass
class Report:
    attempts: int = 0
    acknowledged: int = 0
    kills: int = 0
    stops_without_new_write: int = 0  # aimed stops that found none in flight (then resumed)
    takeovers: int = 0
    takeovers_failed: int = 0
    fenced_writes: int = 0
    fenced_by_worker: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    evidence: Counter[str] = field(default_factory=Counter)
    met: Counter[str] = field(default_factory=Counter)  # new writes each fault kind met
    landed_kills: int = 0
    created_by_quarter: list[int] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    verdict: Verdict | None = None

    def lines(self) -> str:
        v = self.verdict
        assert v is not None
        dups = sum(p.startswith(DUPLICATE) for p in v.problems)
        lost = sum(p.startswith(LOST) for p in v.problems)
        return (
            f"attempts {self.attempts} ({self.acknowledged} acknowledged, "
            f"{v.duplicates_returned} answered as duplicates), entries {v.entries}\n"
            f"faults injected: SIGKILL {self.kills}, takeovers {self.takeovers} "
            f"({self.fenced_writes} writes failed fenced, {self.takeovers_failed} takeovers "
            f"failed and retried), {dict(self.faults)}\n"
            f"evidence they landed (calls refused): {dict(self.evidence)}; new writes each "
            f"met: {dict(self.met)}; SIGKILLs with new writes in flight {self.landed_kills} "
            f"(aimed stops that found none and resumed: {self.stops_without_new_write})\n"
            f"new entries created in each quarter of the run: {self.created_by_quarter}\n"
            f"hangs {len(self.hangs)}; duplicates in window {dups}; acknowledged writes lost "
            f"{lost}\nchecker: {v.summary()}"
        )


def _absorb(worker: Worker, history: History, report: Report) -> None:
    """Turn a finished worker's lines into attempts (sent, never answered: failed at its end)."""
    pending: dict[str, list[str]] = {}  # burst -> its names without an outcome yet
    starts: dict[str, Stamp] = {}
    handed: set[str] = set()
    evidence: dict[str, int] = {}
    met: dict[str, int] = {}
    end = worker.killed_at or _stamp()

    def take(burst: str, name: str) -> Stamp:
        names = pending.get(burst, [])
        if name not in names:
            raise AssertionError(
                f"worker {worker.tag}: an outcome for {name} that burst {burst} never sent"
            )
        names.remove(name)
        return starts[burst]

    for line in worker.lines:
        kind, _, rest = line.partition(" ")
        parts = rest.split()
        if kind == "B":
            burst = parts[0]
            starts[burst] = Stamp(int(parts[1]), int(parts[2]))
            pending[burst] = parts[3].split(",")
        elif kind == "S":
            handed.add(parts[0])
        elif kind == "A":
            burst, name, seg, entry, dup, ms, ns = parts
            result = WriteResult(LogMessageId(int(seg), int(entry)), dup == "1")
            history.ok(
                explicit_key(name),
                f"{worker.tag}:{name}".encode(),
                result,
                take(burst, name),
                Stamp(int(ms), int(ns)),
            )
            report.acknowledged += 1
        elif kind == "F":
            burst, name, timed_out, ms, ns, error = parts
            history.failed(
                explicit_key(name),
                f"{worker.tag}:{name}".encode(),
                error,
                take(burst, name),
                Stamp(int(ms), int(ns)),
                timed_out == "1",
            )
            if error == "WriterFencedError":
                report.fenced_writes += 1
                report.fenced_by_worker[worker.tag.split("-")[0]] += 1
        elif kind == "O":
            report.takeovers += 1
        elif kind == "X":
            report.takeovers_failed += 1
        elif kind == "T":
            report.faults[parts[0]] += 1
        elif kind == "E":
            evidence = {k: int(v) for k, v in (p.split("=") for p in parts)}
        elif kind == "M":
            met = {k: int(v) for k, v in (p.split("=") for p in parts)}
        elif kind == "H":
            report.hangs.append(f"{worker.tag}: {parts[0]} pending after close()")
    for burst, names in pending.items():
        for name in names:
            history.failed(
                explicit_key(name), f"{worker.tag}:{name}".encode(), "SIGKILL", starts[burst], end
            )
            if burst in handed:
                worker.in_flight.append(name)
    report.evidence.update(evidence)
    report.met.update(met)


def _answered(worker: Worker, answered: set[str]) -> None:
    """Add the keys `worker` printed acknowledgements of since the last call to `answered`."""
    lines = worker.lines
    end = len(lines)
    for line in lines[worker.scanned : end]:
        if line.startswith("A "):
            answered.add(line.split(" ", 3)[2])
    worker.scanned = end


def _landed_kills(killed: list[Worker], history: History) -> int:
    """Kills that found a new write in flight: a key the killed worker had handed to its writer
    (its `S` line was read) with no outcome, and nobody had been answered for before the kill."""
    first_answer: dict[bytes | None, int] = {}
    for a in history.attempts:
        if a.ok:
            first_answer[a.key] = min(first_answer.get(a.key, a.end.ns), a.end.ns)
    landed = 0
    for w in killed:
        assert w.killed_at is not None
        kill_ns = w.killed_at.ns
        landed += any(
            first_answer.get(explicit_key(name), kill_ns) >= kill_ns for name in w.in_flight
        )
    return landed


def _created_by_quarter(msgs: list, start_ms: int, end_ms: int) -> list[int]:
    """Keyed entries created in each quarter of [start_ms, end_ms) (by their timestamps)."""
    quarters = [0, 0, 0, 0]
    span = max(1, end_ms - start_ms)
    for m in msgs:
        if m.idempotency_key and start_ms <= m.timestamp_ms < end_ms:
            quarters[(m.timestamp_ms - start_ms) * 4 // span] += 1
    return quarters


def run_campaign(
    data_dir: Path,
    seconds: float,
    *,
    workers: int,
    keys: int,
    es: int,
    faults: bool,
    kill_every: float | None,
    takeover_every: float,
    seed: int,
    producers: int = 1,
    new_keys_per_s: float = 0.0,
) -> Report:
    rng = random.Random(seed)
    start_ms = SYSTEM_CLOCK.now_ms()
    extra = ["--es", str(es), "--takeover-every", str(takeover_every)]
    extra += ["--producers", str(producers), "--epoch-ns", str(time.monotonic_ns())]
    extra += ["--new-keys-per-s", str(new_keys_per_s)]
    extra += ["--faults"] if faults else []
    deadline = time.monotonic() + seconds
    incarnation = Counter()

    def start(slot: int) -> Worker:
        incarnation[slot] += 1
        return Worker(
            data_dir,
            f"w{slot}-{incarnation[slot]}",
            keys,
            max(1.0, deadline - time.monotonic()),
            rng.randrange(2**31),
            extra,
        )

    report = Report()
    history = History()
    live = {slot: start(slot) for slot in range(workers)}
    done: list[Worker] = []
    next_kill = time.monotonic() + (rng.uniform(0.5, 1.5) * kill_every if kill_every else 1e18)
    aim: tuple[int, int] | None = None  # (slot, lines read when aiming began)
    answered: set[str] = set()  # keys acknowledged to some worker (read up to `_answered`)
    while time.monotonic() < deadline - 2:
        time.sleep(0.02)
        if aim is None and time.monotonic() >= next_kill:
            slot = rng.randrange(workers)
            aim = (slot, len(live[slot].lines))
        if aim is not None:
            # kill once the worker hands writes to its writer again (a kill during start-up or
            # a takeover would meet no write: those moments are covered by the takeovers), and
            # only while one of them is a new write in flight: the worker is stopped and its
            # lines read first; if its writes were answered meanwhile, it goes on and the next
            # burst is aimed at (on a busy machine most bursts end before this process looks)
            slot, seen = aim
            w = live[slot]
            if any(line.startswith("S ") for line in w.lines[seen:]) and w.stop():
                for other in [*live.values(), *done]:
                    _answered(other, answered)
                if w.new_in_flight(answered):
                    w.kill()
                    report.kills += 1
                    done.append(w)
                    live[slot] = start(slot)
                    aim = None
                    next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * kill_every
                else:
                    report.stops_without_new_write += 1
                    aim = (slot, len(w.lines))
                    w.resume()
    done.extend(live.values())
    for w in done:
        err = w.finish(timeout=max(5.0, deadline - time.monotonic()) + 60)
        if w.killed_at is None:
            assert w.proc.returncode == 0 and w.lines and w.lines[-1] == "D", (
                f"worker {w.tag} failed (rc {w.proc.returncode}): {err}"
            )
        _absorb(w, history, report)
    # the quarters span the time the workers were told to write: a close that takes long on a
    # busy machine (a worker completing segments after an outage) must not stretch the last
    # quarter over a time when no write was meant to start
    end_ms = start_ms + round(seconds * 1000)
    report.attempts = len(history.attempts)
    report.landed_kills = _landed_kills([w for w in done if w.killed_at], history)
    client = wp.connect(data_dir, {"quorum.es": es})
    try:
        log = client.open_log("campaign")
        log.open_writer().close()  # complete whatever a killed worker left
        report.verdict = history.check_log(log, 3_600_000, 1_000_000)
        msgs = read_stored(client, log).messages
    finally:
        client.close()
    report.created_by_quarter = _created_by_quarter(msgs, start_ms, end_ms)
    keyed = [m.idempotency_key for m in msgs if m.idempotency_key]
    assert len(keyed) == len(set(keyed)), "a key appears twice in the log"
    return report


class HangError(AssertionError):
    """Writes still pending after close(): a liveness defect (docs/semantics.md)."""


def _judge(report: Report) -> None:
    print(report.lines())
    assert report.verdict is not None and report.verdict.ok, report.lines()


def _no_hangs(report: Report) -> None:
    """Last: everything else about the run is asserted first."""
    if report.hangs:
        raise HangError(f"{len(report.hangs)} writes pending after close(): {report.hangs[:5]}")


def test_a_worker_chatty_on_stderr_is_not_blocked(tmp_path: Path) -> None:
    """The harness drains a worker's stderr while it runs: a worker logging more than a pipe
    holds (64 KiB) under faults once blocked in its log call, which looked like a library hang."""
    chatty = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stderr.write('x' * 1_000_000); print('D')"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert chatty.stderr is not None and chatty.stdout is not None
    drained = Drain(chatty.stderr)
    try:
        assert chatty.wait(30) == 0
    finally:
        if chatty.poll() is None:
            os.kill(chatty.pid, signal.SIGKILL)
            chatty.wait(10)
    assert chatty.stdout.read() == b"D\n"
    chatty.stdout.close()
    assert len(drained.close()) == 1_000_000


def test_two_processes_race_the_same_keys(tmp_path: Path) -> None:
    """Two processes open idempotent writers on one log at once, taking it over from each other
    every ~0.7 s while resending the same 300 keys: the fenced one fails with WriterFencedError,
    and the log holds every key once, nothing acknowledged lost."""
    report = run_campaign(
        tmp_path,
        12,
        workers=2,
        keys=300,
        es=1,
        faults=False,
        kill_every=None,
        takeover_every=0.7,
        seed=random.randrange(2**31),
    )
    _judge(report)
    assert report.takeovers >= 6, report.lines()
    assert set(report.fenced_by_worker) == {"w0", "w1"}, (
        f"both writers must have been fenced at least once: {report.fenced_by_worker}"
    )
    _no_hangs(report)


CAMPAIGN = {
    "workers": 3,
    "keys": 2_000,  # at the start; then `new_keys_per_s` more every second, for the whole run
    "new_keys_per_s": 150.0,
    "producers": 4,
    "es": 3,
    "faults": True,
    "kill_every": 4.0,
    "takeover_every": 3.0,
}
# the fault kinds a worker injects (campaignproc.inject) and the takeovers: each must meet new
# writes in every run, or the campaign did not test them
MET_KINDS = ("node_down", "storage_down", "acks_dropped", "meta_down", "takeover")


def _campaign(tmp_path: Path, seconds: float, **overrides: Any) -> Report:
    seed = random.randrange(2**31)
    settings = {**CAMPAIGN, **overrides}
    print(f"campaign: {seconds:.0f} s, seed {seed}, {settings}")
    report = run_campaign(tmp_path, seconds, seed=seed, **settings)
    _judge(report)
    assert report.kills >= 1 and report.takeovers > report.kills, report.lines()
    for kind in MET_KINDS[:-1]:
        assert report.faults[kind] > 0, f"no {kind} fault injected: {report.lines()}"
    for kind in MET_KINDS:
        assert report.met[kind] > 0, f"{kind} met no new write: {report.lines()}"
    assert report.landed_kills >= 1, f"no SIGKILL found a new write in flight: {report.lines()}"
    assert all(report.created_by_quarter), (
        f"new keys did not keep arriving for the whole run: {report.lines()}"
    )
    return report


def test_fault_campaign_smoke(tmp_path: Path) -> None:
    # kills far more often than the long run, so that a short run has several
    seconds = float(os.environ.get("WP_CAMPAIGN_SMOKE_S", "20"))
    _no_hangs(_campaign(tmp_path, seconds, kill_every=0.75))


CAMPAIGN_S = float(os.environ.get("WP_CAMPAIGN_S", size(600, 45)))


@pytest.mark.slow
@pytest.mark.timeout(CAMPAIGN_S + 900)
def test_fault_campaign(tmp_path: Path) -> None:
    seconds = CAMPAIGN_S
    report = _campaign(tmp_path, seconds)
    for kind in ("node_down", "ack_lost", "meta_down"):
        assert report.evidence[kind] > 0, f"no call refused by {kind}: {report.lines()}"
    # a long run must keep its faults busy: most kills land (each is aimed at a stopped worker
    # with a new write in flight; one can still be answered elsewhere in the instant before the
    # kill), and every kind meets new writes all along (at least one per minute on average)
    assert report.landed_kills * 2 >= report.kills, report.lines()
    for kind in MET_KINDS:
        assert report.met[kind] >= seconds // 60, f"{kind} met few new writes: {report.lines()}"
    _no_hangs(report)
