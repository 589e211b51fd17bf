"""The README's main job: the Spark pipeline (`woodpecker-idem pipeline`, run by ./scripts/demo).

One end-to-end run at a small size in a subprocess (it starts its own JVM): an injected task
failure and a duplicate delivery in each of two runs of the job; the checker's verdict, the exit
status, and the printed counts against each other and against what was generated.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

ORDERS = 5000


def _count(label: str, text: str) -> int:
    found = re.search(rf"^{label}: ([\d,]+)", text, re.M)
    assert found, f"no {label!r} line in:\n{text}"
    return int(found.group(1).replace(",", ""))


@pytest.mark.timeout(600)  # a JVM start and three Spark jobs: minutes on a busy machine
def test_pipeline_writes_every_order_once_and_its_counts_agree(tmp_path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "woodpecker_idem",
            "pipeline",
            "--orders",
            str(ORDERS),
            "--failures",
            "1",
            "--duplicates",
            "1",
            "--data-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=560,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert re.search(rf"^checker: PASS: every one of {ORDERS:,} orders exactly once", text, re.M)
    rows_in = _count("rows in", text)
    appended = _count("rows appended", text)
    duplicates = _count("duplicates suppressed", text)
    resent = int(re.search(r"\+([\d,]+) re-sent by retried tasks", text).group(1).replace(",", ""))
    deliveries = 2 * (ORDERS + 1)  # the job twice, one order delivered twice in each run
    assert rows_in == deliveries
    assert appended == ORDERS  # rows appended == distinct orders
    # every row the sink received beyond the distinct orders was suppressed: the duplicate
    # deliveries, the re-run, and the rows the failed attempt had appended before it died
    assert duplicates == deliveries + resent - ORDERS
    assert 0 < resent <= 1250  # the failed attempt got part of its partition's rows in
    assert "10 attempts of 8 tasks, 2 retried" in text  # one failure in each of the two runs
    assert "100.0%" in out.stderr  # the progress bar reached its end
    # the log read back by spark.read agrees with a plain reader of the group
    from woodpecker_idem import connect

    client = connect(tmp_path)
    try:
        group = re.search(r"log group '([\w-]+)'", text).group(1)
        assert sum(len(list(client.open_log(f"{group}-{p}").open_reader())) for p in range(4)) == (
            ORDERS
        )
    finally:
        client.close()
