"""Where a Spark round's CPU goes, by process: `bench_spark.py`'s 100 B rows (ROWS, default
1,000,000) through the idempotent sink, the plain sink, a no-op Python sink (its task only reads
the Arrow batches: the Python Data Source's own cost), Spark's parquet writer, and a count of the
prepared DataFrame (source, routes, shuffle: no write), interleaved. Each round reads the CPU time
of the JVM's threads (executor task threads, JIT compilers, GC, the rest) and of the Python
workers (`/proc/<pid>/stat`: a process's time includes its threads'), of this process's
descendants only (another Spark on the machine is not counted), and prints medians.

    .venv/bin/python benches/spark_cpu_probe.py 5            # rounds
    WOODPECKER_BENCH_SPARK_ROWS=1000 ... benches/spark_cpu_probe.py 7          # per-job costs

Needs what `bench_spark.py` needs (Java 17, PYSPARK_PYTHON, SPARK_LOCAL_IP=127.0.0.1).
"""

from __future__ import annotations

import collections
import glob
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_spark  # noqa: E402

from woodpecker_idem.spark import prepare  # noqa: E402
from woodpecker_idem.spark.orders_job import local_spark  # noqa: E402

SIDES = ("idempotent", "plain", "null", "parquet", "count")
TICK = os.sysconf("SC_CLK_TCK")


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _cpu(stat_path: str) -> float:
    fields = _read(stat_path).rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def _descendants(root: int) -> list[str]:
    """The /proc directories of `root`'s descendants: this Spark's JVM and its Python workers,
    not another Spark's on the same machine."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            ppid = int(_read(proc + "/stat").rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # ended meanwhile
            continue
        children[ppid].append(int(proc[6:]))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(f"/proc/{child}")
            todo.append(child)
    return out


def cpu_by_group() -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    for proc in _descendants(os.getpid()):
        try:
            argv = _read(proc + "/cmdline").split(b"\0")
            if argv[0].endswith(b"java"):
                for task in glob.glob(proc + "/task/*"):
                    name = _read(task + "/comm").decode().strip()
                    group = (
                        "jvm-task"
                        if name.startswith("Executor task")
                        else "jvm-jit"
                        if "Compiler" in name
                        else "jvm-gc"
                        if "GC" in name
                        else "jvm-other"
                    )
                    out[group] += _cpu(task + "/stat")
            elif any(b"pyspark" in a for a in argv[1:]):
                out["python-workers"] += _cpu(proc + "/stat")
        except OSError:  # a process or thread that ended meanwhile
            continue
    return out


def main(rounds: int) -> None:
    spark = local_spark(2, 10_000, {"spark.buffer.size": "65536"})
    spark.dataSource.register(bench_spark.NullSink)
    tmp = tempfile.mkdtemp()
    prepared = prepare(bench_spark.source(spark), "order_id", bench_spark.P)

    def run(side: str, r: int) -> tuple[float, dict[str, float]]:
        before, started = cpu_by_group(), time.perf_counter()
        if side == "parquet":
            prepared.write.mode("overwrite").parquet(f"{tmp}/pq-{r}")
        elif side == "count":
            prepared.count()
        elif side == "null":
            prepared.write.format("nullsink").mode("append").save()
        else:
            (
                prepared.write.format("woodpecker")
                .option("log", f"{side}-{r}")
                .option("partitions", bench_spark.P)
                .option("idempotencyKey", "order_id")
                .option("payloadColumn", "body")
                .option("dataDir", f"{tmp}/wp")
                .option("windowMaxKeys", max(100_000, bench_spark.ROWS))
                .option("idempotent", str(side == "idempotent").lower())
                .mode("append")
                .save()
            )
        wall, after = time.perf_counter() - started, cpu_by_group()
        return wall, {g: after[g] - before[g] for g in after}

    for side in SIDES:
        run(side, -1)  # warm-up: workers, JIT
    results: dict[str, list[tuple[float, dict[str, float]]]] = {s: [] for s in SIDES}
    for r in range(rounds):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            results[side].append(run(side, r))
    print(f"{bench_spark.ROWS:,} rows, {rounds} interleaved rounds, medians (s, core-s):")
    for side, runs in results.items():
        groups = sorted({g for _, d in runs for g in d})
        cpu = " ".join(
            f"{g} {statistics.median(d.get(g, 0.0) for _, d in runs):.2f}" for g in groups
        )
        print(f"  {side:<10} wall {statistics.median(w for w, _ in runs):.2f}  {cpu}")
    spark.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
