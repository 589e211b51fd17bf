"""The command line (issue 11 item 11): the demo never touches existing logs, refuses bad arguments
with a usage error, and its internal child command is hidden and fails without a traceback.

The CLI runs as a subprocess, as a user runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import woodpecker_idem as wp

# children import the same woodpecker_idem as this process (the installed wheel in CI)
PACKAGE_ROOT = str(Path(wp.__file__).resolve().parent.parent)


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "woodpecker_idem", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": PACKAGE_ROOT},
    )


def test_demo_leaves_an_existing_log_named_demo_alone(tmp_path: Path) -> None:
    """`demo --data-dir D` used to delete the log named `demo` in D, silently."""
    with wp.connect(tmp_path) as client:
        writer = client.open_log("demo", create=True).open_writer(idempotent=True)
        ids = [
            writer.write(f"user {i}".encode(), idempotency_id=f"u{i}").message_id for i in range(5)
        ]
        client.create_log("orders")
    out = cli("demo", "--records", "200", "--data-dir", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "checker: PASS" in out.stdout and "200 entries appended" in out.stdout
    with wp.connect(tmp_path) as client:
        user = list(client.open_log("demo").open_reader())
        assert [m.payload for m in user] == [f"user {i}".encode() for i in range(5)]
        assert [m.message_id for m in user] == ids
        logs = client.list_logs()
        assert "orders" in logs
        new = [name for name in logs if name not in ("demo", "orders")]
        assert len(new) == 1 and new[0].startswith("demo-"), logs
        assert f"demo log: {new[0]!r}" in out.stdout
        assert len(list(client.open_log(new[0]).open_reader())) == 200


def test_two_demo_runs_in_one_data_dir_use_two_logs(tmp_path: Path) -> None:
    for _ in range(2):
        out = cli("demo", "--records", "100", "--data-dir", str(tmp_path))
        assert out.returncode == 0, out.stdout + out.stderr
    with wp.connect(tmp_path) as client:
        logs = client.list_logs()
        assert len(logs) == 2
        assert all(len(list(client.open_log(n).open_reader())) == 100 for n in logs)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--records", "0"], "--records: 0 is not in 100..10,000,000"),
        (["--records", "-5"], "--records: -5 is not in"),
        (["--records", "99"], "--records: 99 is not in"),
        (["--records", "10000001"], "--records: 10000001 is not in"),
        (["--records", "many"], "--records: 'many' is not an integer"),
        (["--records", "1.5"], "--records: '1.5' is not an integer"),
        (["--seed", "x"], "--seed"),
    ],
)
def test_demo_refuses_bad_arguments_with_a_usage_error(tmp_path: Path, args, message) -> None:
    """`--records 0` used to print "checker: PASS" and exit 1."""
    out = cli("demo", *args, "--data-dir", str(tmp_path / "d"))
    assert out.returncode == 2
    assert message in out.stderr and "usage:" in out.stderr
    assert "PASS" not in out.stdout and "Traceback" not in out.stderr
    assert not (tmp_path / "d").exists()  # nothing was created, let alone written


def test_demo_on_a_data_dir_that_is_a_file_fails_cleanly(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("not a directory")
    out = cli("demo", "--records", "100", "--data-dir", str(target))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "InvalidArgumentError" in out.stderr and "data_dir" in out.stderr
    assert target.read_text() == "not a directory"


def test_the_internal_child_command_is_hidden_and_fails_cleanly(tmp_path: Path) -> None:
    """`_produce` showed in --help, and a bad call printed a traceback."""
    top = cli("--help")
    assert top.returncode == 0 and "demo" in top.stdout
    assert "_produce" not in top.stdout and "SUPPRESS" not in top.stdout
    for args in (
        [str(tmp_path / "missing"), "demo", "0", "10"],  # no such data dir
        [str(tmp_path), "no-such-log", "0", "10"],  # no such log
        [str(tmp_path), "demo", "0", "-1"],  # bad range
        [str(tmp_path), "demo", "zero", "10"],
    ):
        out = cli("_produce", *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr, out.stderr
        assert out.stderr.strip(), args
    assert not (tmp_path / "missing").exists()
