"""A read-only data directory whose segment has `fence` but no `fence-at` (issue 20 item 6): a
takeover was killed between the two files. No fencer can record the length there and nothing can
append, so the file's length is final: the segment's acknowledged entries are read, not hidden
for ever."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_error_surface import PACKAGE_ROOT, _read_only_runner

import woodpecker_idem as wp

READER = textwrap.dedent(
    """
    import sys, woodpecker_idem as wp
    with wp.connect(sys.argv[1]) as client:
        print("read", len(list(client.open_log("orders").open_reader())))
    """
)


def _read(data_dir: Path, way: str | None) -> int:
    cmd = [sys.executable, "-c", READER, str(data_dir)]
    if way is not None:
        cmd = _read_only_runner(way, data_dir)
        cmd[cmd.index(sys.executable) + 2] = READER  # the runner's script, replaced
    if way == "chmod":
        subprocess.run(["chmod", "-R", "a-w", str(data_dir)], check=True)
    try:
        out = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": PACKAGE_ROOT},
        )
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(data_dir)], check=True)
    if way == "ro-bind-mount" and "mount" in out.stderr and out.returncode != 0:
        pytest.skip(f"no read-only bind mount here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stdout + out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.parametrize("way", ["ro-bind-mount", "chmod"])
def test_fence_without_fence_at_on_a_read_only_dir(tmp_path: Path, way: str) -> None:
    data_dir = tmp_path / "data"
    client = wp.connect(data_dir)
    log = client.open_log("orders", create=True)
    with log.open_writer() as writer:
        for i in range(50):
            writer.write(f"a{i}".encode())
    writer = log.open_writer()  # segment 1 stays ACTIVE: the writer is "killed" below
    for i in range(50):
        writer.write(f"b{i}".encode())
    seg = Path(client.objects.root) / str(log.log_id) / "1"
    try:
        readable = _read(data_dir, None)  # what a reader sees before the takeover began
        assert readable > 50
        (seg / "fence").touch()  # the takeover's first file; it was killed before `fence-at`
        assert not (seg / "fence-at").exists()
        assert _read(data_dir, way) == readable  # 50 before: segment 1 hidden for ever
    finally:
        client.close()
