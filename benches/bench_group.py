"""Many producers, one log group (issue 29): entries/s of a group written by four processes, each
a group writer owning a quarter of the routes, against one process owning them all.

Run: `.venv/bin/python -m pytest benches/bench_group.py -p no:cacheprovider -s
--benchmark-json=bench-results/group.json`.

Each round starts its processes, waits until their group writers own every route between them
(the membership settled), then times from a start signal to the last process's flush: N
(default 40,000; `WP_BENCH_GROUP_N`) idempotent 100 B writes with `write_async`, each process
writing the keys of its own routes (it skips the others by `route_of`, without a refusal).
Rounds interleave one process and four, 3 each, on a fresh embedded store each (SQLite, a local
directory). On this 2-core machine four processes share the same two cores as one: the figure
says what splitting a group costs, not what it gains. Asserted: four processes >= 0.5x one
(fencing or a serialized hand-over between members would fall far below).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

N = int(os.environ.get("WP_BENCH_GROUP_N", "40000"))
P = 8
ROUNDS = 3
MIN_RATIO = 0.5

MEMBER = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_DFL)
from woodpecker_idem import connect
from woodpecker_idem._core import explicit_key
from woodpecker_idem.client.group import route_of
data, members, n, parts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
client = connect(data)  # the default 30 s lease: no member runs out under load
member = client.open_group_writer("bench", parts)
def settled():  # every member joined, and this one owns its share
    live = client.meta.list_group_members("bench", client.clock.now_ms())
    return len(live) == members and len(member.rebalance()) == parts // members
while not settled():
    time.sleep(0.05)
print("ready", flush=True)
while not os.path.exists(os.path.join(data, "start")):
    time.sleep(0.001)
mine = member.routes()
payload = b"x" * 100
futures = []
for k in range(n):
    ident = "k%d" % k
    if route_of(explicit_key(ident), parts) in mine:
        futures.append(member.write_async(payload, idempotency_id=ident))
for f in futures:
    f.result(120)
print("done", len(futures), flush=True)
member.close()
client.close()
"""


def _round(members: int) -> float:
    """Seconds from the start signal to the last member's flush."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("WP_BENCH_DIR")) as tmp:
        from woodpecker_idem import connect

        with connect(tmp) as client:  # the group, made once before the members race for it
            client.open_group_writer("bench", P).close()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", MEMBER, tmp, str(members), str(N), str(P)],
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            for _ in range(members)
        ]
        try:
            for proc in procs:
                assert proc.stdout is not None
                assert proc.stdout.readline().strip() == "ready"
            start = time.perf_counter()
            Path(tmp, "start").touch()
            written = 0
            for proc in procs:
                assert proc.stdout is not None
                line = proc.stdout.readline().split()
                assert line[0] == "done", line
                written += int(line[1])
            elapsed = time.perf_counter() - start
            assert written == N
            for proc in procs:
                proc.wait(120)
            return elapsed
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(60)


def test_group_written_by_four_processes_vs_one(benchmark: Any) -> None:
    one: list[float] = []
    four: list[float] = []
    for _ in range(ROUNDS):
        one.append(_round(1))
        four.append(_round(4))
    one_rate, four_rate = N / statistics.median(one), N / statistics.median(four)
    info = {
        "one_process_entries_per_s": one_rate,
        "four_processes_entries_per_s": four_rate,
        "ratio": four_rate / one_rate,
    }
    benchmark.extra_info.update(info)
    benchmark.pedantic(lambda: None, rounds=1)
    print({k: round(v, 2) for k, v in info.items()})
    assert info["ratio"] >= MIN_RATIO, info
