"""Real crashes: a producer process (tests/idemproc.py) is SIGKILLed at random points, round after
round; each new process retries every key. The log must hold every key exactly once, at the id
every acknowledgement printed."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import woodpecker_idem as wp
from woodpecker_idem import LogMessageId, WriteResult, explicit_key
from woodpecker_idem.history import History

PACKAGE_ROOT = str(Path(wp.__file__).resolve().parent.parent)
HERE = Path(__file__).resolve().parent
N = 400
KILLS = 11  # rounds that end in SIGKILL; then one more runs to the end
MAX_ROUNDS = 40  # a timed kill misses when the producer finishes first: such rounds are extra


def run_round(
    data_dir: Path, kill_after: int | None, kill_delay: float = 0.0, timeout: float = 60.0
):
    """Start a producer; SIGKILL it once it printed `kill_after` acks (0: as soon as it is ready;
    -1: `kill_delay` seconds after the start, wherever it is; None: let it finish)."""
    env = dict(os.environ)
    # the child imports the same woodpecker_idem as this process (the installed wheel in CI)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT, env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "idemproc.py"), str(data_dir), str(N)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        bufsize=1,
    )
    lines: list[str] = []
    killed = False
    started = time.monotonic()
    deadline = started + timeout
    is_ready = False
    try:
        acks = 0
        while True:
            now = time.monotonic()
            if (kill_after == -1 and now - started >= kill_delay) or (
                kill_after is not None and kill_after >= 0 and is_ready and acks >= kill_after
            ):
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
                break
            left = deadline - now
            assert left > 0, f"producer stuck; stderr: {proc.stderr.read()[-2000:]}"
            wait = min(left, 1.0)
            if kill_after == -1:
                wait = max(0.0, min(wait, kill_delay - (now - started)))
            ready, _, _ = select.select([proc.stdout], [], [], wait)
            if not ready:
                continue
            line = proc.stdout.readline()
            if not line:
                break
            line = line.rstrip("\n")
            if line.startswith("k-"):
                lines.append(line)
                acks += 1
            elif line == "ready":
                is_ready = True
    finally:
        if proc.poll() is None and not killed:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        err = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
    if not killed:  # it ran to the end before the kill point, or it failed
        assert proc.returncode == 0, f"producer failed: {err[-3000:]}"
    # lines printed before the kill that are still in the pipe were read above; a torn last line
    # cannot happen (one write per line, smaller than PIPE_BUF)
    return lines, killed


def test_sigkill_rounds_every_key_exactly_once(tmp_path: Path):
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    seed = rng.randrange(2**32)
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    history = History()
    first_new: dict[str, tuple[int, LogMessageId]] = {}
    ids: dict[str, LogMessageId] = {}
    kills = 0
    rnd = 0
    while True:
        last = kills >= KILLS
        assert rnd < MAX_ROUNDS, f"seed {seed}: {kills} kills in {rnd} rounds"
        kill_after = (
            None
            if last
            else rng.choice(
                [-1, 0, rng.randrange(1, N), rng.randrange(1, 40), rng.randrange(1, 40)]
            )
        )
        delay = rng.uniform(0.02, 0.25)  # for -1: during start-up, recovery or the first writes
        lines, killed = run_round(data_dir, kill_after, delay)
        kills += killed
        print(
            f"round {rnd}: kill_after={kill_after} delay={delay:.2f} acks={len(lines)} "
            f"killed={killed}"
        )
        if last:
            assert len(lines) == N, f"seed {seed}: final round acknowledged {len(lines)} of {N}"
        for line in lines:
            name, seg, entry, dup = line.split()
            mid = LogMessageId(int(seg), int(entry))
            history.ok(explicit_key(name), WriteResult(mid, dup == "1"))
            if name in ids:
                assert ids[name] == mid, f"seed {seed}: {name} was {ids[name]}, now {mid}"
            ids[name] = mid
            if dup == "0":
                assert name not in first_new, (
                    f"seed {seed}: {name} created twice (rounds {first_new[name][0]} and {rnd})"
                )
                first_new[name] = (rnd, mid)
        if last:
            break
        rnd += 1
    client = wp.connect(data_dir)
    try:
        log = client.open_log("sigkill")
        log.open_writer().close()  # complete whatever the last killed writer left
        msgs = list(log.open_reader())
    finally:
        client.close()
    verdict = history.check(msgs, 3_600_000, 100_000)
    assert verdict.ok, f"seed {seed}: {verdict.summary()}"
    keyed = [m.idempotency_key for m in msgs if m.idempotency_key]
    assert sorted(keyed) == sorted(explicit_key(f"k-{i}") for i in range(N)), (
        f"seed {seed}: {len(keyed)} keyed entries for {N} keys"
    )
    for m in msgs:
        name = m.payload.decode().removeprefix("payload of ")
        assert m.idempotency_key == explicit_key(name)
