"""Quiet logging (issue 22 item 4): the package logger has a NullHandler, so an application that set
up no logging sees nothing on stderr, even when a writer is fenced; one that did sees the records.
Also `client.store_id()`, which docs/operations.md names (issue 22 item 5)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import woodpecker_idem as wp

PACKAGE_ROOT = str(Path(wp.__file__).resolve().parent.parent)

# A fence (logged as a warning), a truncation, a read, a snapshot and a clean close.
SCRIPT = """
import logging, sys
if sys.argv[2] == "configured":
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
import woodpecker_idem as wp
with wp.connect(sys.argv[1], {"segment.max_entries": 5}) as client:
    log = client.open_log("q", create=True)
    a = log.open_writer(idempotent=True)
    for i in range(12):
        a.write(b"x", idempotency_id=f"k{i}")
    b = log.open_writer(idempotent=True)
    try:
        a.write(b"y", idempotency_id="late")
    except wp.WriterFencedError:
        print("fenced")
    assert b.write(b"z", idempotency_id="k1").duplicate
    log.truncate(wp.LogMessageId(1, 0))
    print(len(list(log.open_reader())))
    b.close()
"""


def _run(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / mode), mode],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": PACKAGE_ROOT},
    )


def test_no_logging_configured_prints_nothing_on_stderr(tmp_path: Path) -> None:
    out = _run(tmp_path, "unconfigured")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["fenced", "7"]
    assert out.stderr == ""


def test_configured_logging_still_sees_the_warnings(tmp_path: Path) -> None:
    out = _run(tmp_path, "configured")
    assert out.returncode == 0, out.stderr
    assert "writer fenced" in out.stderr


def test_store_id_is_the_prefix_of_the_objects(tmp_path: Path) -> None:
    with wp.connect(tmp_path) as client:
        store_id = client.store_id()
        assert store_id == client.meta.store_id()
        writer = client.open_log("a", create=True).open_writer()
        writer.write(b"x")
        writer.close()
    assert (tmp_path / "objects" / "woodpecker" / store_id / "1").is_dir()
    with wp.connect(tmp_path) as client:
        assert client.store_id() == store_id  # made once, kept
