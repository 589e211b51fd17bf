"""The typed face of the package, checked the way users check their code (`mypy --strict`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import woodpecker_idem as wp
from woodpecker_idem import InvalidArgumentError

HERE = Path(__file__).resolve().parent.parent / "support"


def test_user_code_type_checks_strictly(tmp_path: Path) -> None:
    """`open_writer(idempotent=True)` is an `IdempotentLogWriter` (so `write_many` type-checks),
    a plain one a `LogWriter`, and misspelt or misplaced window options are type errors."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--warn-unused-ignores",
            "--follow-imports=silent",  # judge the user code, not the package's own strictness
            "--cache-dir",
            str(tmp_path / "mypy-cache"),
            str(HERE / "typecheck" / "user_code.py"),
        ],
        cwd=HERE.parent.parent,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_window_options_on_a_plain_writer_are_named(tmp_path: Path) -> None:
    client = wp.connect(str(tmp_path / "data"))
    try:
        log = client.create_log("plain")
        with pytest.raises(InvalidArgumentError, match="window_duration_s, window_max_keys"):
            log.open_writer(window_duration_s=5, window_max_keys=10)  # type: ignore[call-overload]
        with pytest.raises(TypeError, match="window_max_key"):
            log.open_writer(idempotent=True, window_max_key=10)  # type: ignore[call-overload]
        writer = log.open_writer(idempotent=True, window_max_keys=10)
        assert isinstance(writer, wp.IdempotentLogWriter)
        assert writer.window.max_keys == 10
    finally:
        client.close()
