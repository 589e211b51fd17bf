"""The error surface (issue 11 item 10): every error is a `WoodpeckerError` exported by the package,
names what is wrong, and a closed client or a read-only data directory fails clearly."""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import woodpecker_idem as wp
from woodpecker_idem import errors

# children import the same woodpecker_idem as this process (the installed wheel in CI)
PACKAGE_ROOT = str(Path(wp.__file__).resolve().parent.parent)


# --- exports -----------------------------------------------------------------------------------


def test_every_error_class_is_exported_from_the_package() -> None:
    classes = [
        obj
        for _, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, wp.WoodpeckerError) and obj.__module__ == errors.__name__
    ]
    assert len(classes) > 20
    for cls in classes:
        assert getattr(wp, cls.__name__, None) is cls, f"{cls.__name__} not importable from wp"
        assert cls.__name__ in wp.__all__, f"{cls.__name__} missing from __all__"
    codes = [cls.code for cls in classes]
    assert len(set(codes)) == len(codes), "every error has its own stable code"


# --- bad data_dir and reader start -------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda d: d / "a-file", wp.InvalidArgumentError),  # a file, not a directory
        (lambda d: d / "a-file" / "below", wp.InvalidArgumentError),  # below a file
        (lambda d: 42, wp.InvalidTypeError),
        (lambda d: "", wp.InvalidArgumentError),
        (lambda d: b"bytes-path", wp.InvalidTypeError),
    ],
)
def test_bad_data_dir_is_a_woodpecker_error_naming_it(tmp_path: Path, make, error) -> None:
    """These escaped as FileExistsError, NotADirectoryError and TypeError."""
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(error, match="data_dir"):
        wp.connect(make(tmp_path))


def test_unusable_meta_path_is_a_woodpecker_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(wp.WoodpeckerError, match="a-file"):
        wp.connect(tmp_path / "d", {"meta.path": str(tmp_path / "a-file" / "meta.sqlite")})


@pytest.mark.parametrize(
    ("start", "error", "argument"),
    [
        ("bogus", wp.InvalidArgumentError, "start"),
        ("EARLIEST", wp.InvalidArgumentError, "start"),
        (5, wp.InvalidTypeError, "start"),
        (None, wp.InvalidTypeError, "start"),
        ((0,), wp.InvalidTypeError, "start"),
        ((0, 0, 0), wp.InvalidTypeError, "start"),
        ((-1, 0), wp.InvalidArgumentError, "start.segment_id"),
        ((0, -1), wp.InvalidArgumentError, "start.entry_id"),
        ((2**32, 0), wp.InvalidArgumentError, "start.segment_id"),
        ((0.5, 0), wp.InvalidTypeError, "start.segment_id"),
        ((0, "1"), wp.InvalidTypeError, "start.entry_id"),
        ((True, 0), wp.InvalidTypeError, "start.segment_id"),
    ],
)
def test_bad_reader_start_names_the_argument(tmp_path: Path, start, error, argument) -> None:
    """`open_reader("bogus")` raised a bare ValueError, a negative id nothing at all."""
    with wp.connect(tmp_path) as client:
        log = client.open_log("r", create=True)
        with pytest.raises(error) as exc:
            log.open_reader(start)
        assert argument in str(exc.value)


def test_bad_truncate_position_names_the_argument(tmp_path: Path) -> None:
    with wp.connect(tmp_path) as client:
        log = client.open_log("r", create=True)
        with pytest.raises(wp.InvalidArgumentError, match="message_id.segment_id"):
            log.truncate((-1, 0))
        with pytest.raises(wp.InvalidTypeError, match="message_id"):
            log.truncate("0:0")


# --- a closed client ---------------------------------------------------------------------------


def test_every_entry_point_of_a_closed_client_raises_client_closed(tmp_path: Path) -> None:
    """These raised a retriable StorageUnavailableError ("SQLite ... is closed")."""
    client = wp.connect(tmp_path)
    log = client.open_log("c", create=True)
    plain = client.open_log("p", create=True).open_writer()
    writer = log.open_writer(idempotent=True)
    writer.write(b"x", idempotency_id="x")
    reader = log.open_reader()
    client.close()
    client.close()  # idempotent
    calls = {
        "create_log": lambda: client.create_log("new"),
        "open_log": lambda: client.open_log("c"),
        "list_logs": client.list_logs,
        "delete_log": lambda: client.delete_log("c"),
        "open_writer": log.open_writer,
        "open_writer(idempotent)": lambda: log.open_writer(idempotent=True),
        "open_reader": log.open_reader,
        "segments": log.segments,
        "truncate": lambda: log.truncate((0, 0)),
        "read_next": reader.read_next,
        "iter(reader)": lambda: list(reader),
        "write": lambda: writer.write(b"y", idempotency_id="y"),
        "write_async": lambda: writer.write_async(b"y", idempotency_id="y"),
        "write_many": lambda: writer.write_many([b"y"]),
        "flush": writer.flush,
        "plain write": lambda: plain.write(b"y"),
        "plain flush": plain.flush,
    }
    for name, call in calls.items():
        with pytest.raises(wp.ClientClosedError, match="client is closed") as exc:
            call()
        assert not exc.value.retriable, name
        assert exc.value.code == "CLIENT_CLOSED"
    writer.close()  # closing again is fine
    with wp.connect(tmp_path) as again:  # nothing the refused calls did reached the log
        assert [m.payload for m in again.open_log("c").open_reader()] == [b"x"]
        assert again.list_logs() == ["c", "p"]


def test_a_reader_waiting_for_entries_stops_when_the_client_closes(tmp_path: Path) -> None:
    import threading

    client = wp.connect(tmp_path)
    reader = client.open_log("t", create=True).open_reader()
    outcome: list[BaseException | None] = []

    def tail() -> None:
        try:
            reader.read_next(timeout=None)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            outcome.append(exc)

    thread = threading.Thread(target=tail)
    thread.start()
    client.close()
    thread.join(5)
    assert not thread.is_alive()
    assert isinstance(outcome[0], wp.ClientClosedError)


RACE = textwrap.dedent(
    """
    import sys, tempfile, threading
    import woodpecker_idem as wp

    def hammer(client, log, errors):
        reader = log.open_reader()
        while True:
            try:
                client.list_logs()
                log.segments()
                reader.read_next(0)
            except wp.ClientClosedError:
                return
            except BaseException as exc:
                errors.append(repr(exc))
                return

    errors = []
    for _ in range(int(sys.argv[1])):
        client = wp.connect(tempfile.mkdtemp(dir=sys.argv[2]))
        log = client.open_log("r", create=True)
        threads = [threading.Thread(target=hammer, args=(client, log, errors)) for _ in range(4)]
        for t in threads:
            t.start()
        client.close()
        for t in threads:
            t.join(10)
    print("errors", errors[:3], len(errors))
    """
)


def test_calls_racing_close_get_client_closed_and_never_crash(tmp_path: Path) -> None:
    """Threads calling the client while it closes: each call ends with ClientClosedError. Before,
    some got a retriable StorageUnavailableError, and a statement running while close() closed
    its SQLite connection could crash the process (a segmentation fault, seen once in the suite)."""
    out = subprocess.run(
        [sys.executable, "-c", RACE, "40", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": PACKAGE_ROOT},
    )
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert out.stdout.strip() == "errors [] 0", out.stdout


# --- a read-only data directory ----------------------------------------------------------------

READER = textwrap.dedent(
    """
    import sys, woodpecker_idem as wp
    data_dir = sys.argv[1]
    with wp.connect(data_dir) as client:
        log = client.open_log("ro")
        print("read", [m.payload.decode() for m in log.open_reader()])
        print("logs", client.list_logs())
        for name, call in [
            ("open_writer", log.open_writer),
            ("open_writer(idempotent)", lambda: log.open_writer(idempotent=True)),
            ("create_log", lambda: client.create_log("new")),
            ("open_log(create)", lambda: client.open_log("new", create=True)),
        ]:
            try:
                call()
                print(name, "wrote")
            except wp.StorageReadOnlyError as exc:
                print(name, "refused", type(exc).__name__, exc.retriable, exc)
    try:
        wp.connect(data_dir + "/fresh")
    except wp.WoodpeckerError as exc:
        print("fresh", type(exc).__name__, exc)
    """
)


def _read_only_runner(way: str, data_dir: Path) -> list[str]:
    """The command that runs Python where `data_dir` cannot be written. Tests run as root, and
    chmod does not stop root: either a read-only bind mount in a private mount namespace, or
    chmod -w with the capabilities that let root ignore it dropped."""
    python = [sys.executable, "-c", READER, str(data_dir)]
    if way == "ro-bind-mount":
        if shutil.which("unshare") is None:
            pytest.skip("unshare(1) is not installed")
        script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
        return ["unshare", "-m", "sh", "-c", script, str(data_dir), *python]
    if os.geteuid() != 0:
        return python  # chmod alone stops an ordinary user
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv(1) is not installed")
    caps = "-dac_override,-dac_read_search,-fowner"
    return ["setpriv", f"--bounding-set={caps}", *python]


@pytest.mark.parametrize("way", ["ro-bind-mount", "chmod"])
@pytest.mark.parametrize("cleanly_closed", [True, False])
def test_a_read_only_data_dir_can_be_read(tmp_path: Path, way, cleanly_closed) -> None:
    """Opening a client on a read-only data directory failed ("unable to open database file"),
    so its logs could not even be read. Now reads work and writers fail clearly."""
    data_dir = tmp_path / "data"
    client = wp.connect(data_dir)
    writer = client.open_log("ro", create=True).open_writer(idempotent=True)
    for i in range(3):
        writer.write(f"e{i}".encode(), idempotency_id=str(i))
    if cleanly_closed:
        client.close()  # no WAL file left: SQLite must open the file immutable
    if way == "chmod":
        subprocess.run(["chmod", "-R", "a-w", str(data_dir)], check=True)
    try:
        out = subprocess.run(
            _read_only_runner(way, data_dir),
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": PACKAGE_ROOT},
        )
        if way == "ro-bind-mount" and "mount" in out.stderr and out.returncode != 0:
            pytest.skip(f"no read-only bind mount here: {out.stderr.strip()}")
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(data_dir)], check=True)
        if not cleanly_closed:
            client.close()
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "read ['e0', 'e1', 'e2']" in lines
    assert "logs ['ro']" in lines
    for name in ("open_writer", "open_writer(idempotent)", "create_log", "open_log(create)"):
        line = next(x for x in lines if x.startswith(name + " "))
        assert line.startswith(f"{name} refused StorageReadOnlyError False"), line
        assert "read-only" in line and "meta.sqlite" in line
    fresh = next(x for x in lines if x.startswith("fresh "))
    assert "data_dir" in fresh and "fresh" in fresh
