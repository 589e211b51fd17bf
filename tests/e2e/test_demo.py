"""The README's main job: the demo must run and the history checker must pass it."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_runs_and_the_checker_passes(tmp_path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "woodpecker_idem",
            "demo",
            "--records",
            "900",
            "--data-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "checker: PASS" in out.stdout
    assert "SIGKILLed after" in out.stdout and "900 entries appended" in out.stdout
    in_flight = int(re.search(r"with (\d+) writes in flight", out.stdout).group(1))
    assert in_flight > 0, "the kill must land while new writes are in flight"
