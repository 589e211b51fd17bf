"""A Spark Python worker's imports are frozen out of the cyclic collector once (`spark.sink.
freeze_worker_heap`): pyspark's daemon collects after every task, and walking ~80,000 import-time
objects each time cost more than the task's own garbage. Each case runs in a fresh interpreter,
since freezing is for the life of a process."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("pyspark")

PROBE = """
import gc, sys, types
if sys.argv[1] == "worker":  # as `python -m pyspark.daemon` runs a Spark Python worker
    sys.modules["__main__"].__spec__ = types.SimpleNamespace(name="pyspark.daemon")
from woodpecker_idem.spark.sink import freeze_worker_heap
freeze_worker_heap()
frozen = gc.get_freeze_count()
freeze_worker_heap()  # once per process
again = gc.get_freeze_count() == frozen
class Node:
    pass
a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made after the freeze is still collected
del a, b
collected = gc.collect()
print(frozen, again, collected >= 2, "pandas" in sys.modules)
"""


def run(kind: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, kind], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_a_spark_worker_freezes_its_imports_once_and_collects_what_comes_after():
    frozen, again, collected, pandas = run("worker")
    assert int(frozen) > 10_000  # pyspark's, pyarrow's and this package's objects
    assert again == "True" and collected == "True"
    pandas_installed = subprocess.run(
        [sys.executable, "-c", "import pandas"], capture_output=True, check=False
    )
    # pyspark's worker imports pandas (through pyarrow) for each task's commit message: that
    # import is made before the freeze, so it is frozen too
    assert pandas == str(pandas_installed.returncode == 0)


def test_any_other_process_is_left_alone():
    frozen, _, collected, _ = run("driver")
    assert frozen == "0" and collected == "True"
