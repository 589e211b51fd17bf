"""The suite's own harness fails a test that hides a failure: an exception in a background
thread (pyproject's filterwarnings makes pytest's warning about it an error) and a client whose
close() fails at the `wp_connect` fixture's teardown. Each runs a small test file in a pytest of
its own, with this repository's configuration and fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # tests/: its conftest.py holds the fixtures
ROOT = HERE.parent


def _run_pytest(tmp_path: Path, source: str) -> str:
    test = tmp_path / "test_probe.py"
    test.write_text(source)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "conftest",  # tests/conftest.py: the fixtures
            str(test),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return out.stdout + out.stderr


def test_an_exception_in_a_background_thread_fails_the_test(tmp_path: Path) -> None:
    out = _run_pytest(
        tmp_path,
        "import threading\n"
        "def test_probe():\n"
        "    t = threading.Thread(target=lambda: 1 / 0)\n"
        "    t.start()\n"
        "    t.join()\n",
    )
    assert "1 failed" in out and "ZeroDivisionError" in out, out[-3000:]


def test_a_client_close_that_fails_at_teardown_fails_the_test(tmp_path: Path) -> None:
    out = _run_pytest(
        tmp_path,
        "def test_probe(tmp_path, monkeypatch, wp_connect):\n"
        "    client = wp_connect(tmp_path)\n"
        "    real = client.close\n"
        "    def close(*args, **kwargs):\n"
        "        real(*args, **kwargs)\n"
        "        raise RuntimeError('close failed')\n"
        "    monkeypatch.setattr(client, 'close', close)\n",
    )
    assert "1 error" in out and "RuntimeError: close failed" in out, out[-3000:]
