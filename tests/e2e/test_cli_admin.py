"""The admin CLI (issue 22 item 1): `--version`, `logs`, `stat`, `cat`, `truncate`, `drop-group` and
`verify`, each against a real embedded store (`--data-dir`) and against etcd + moto S3
(`--config`), including a corrupt byte planted in a segment that `verify` must find and name.

Most commands run in this process through `cli.main` (the same code path as the console script,
cheaper than a Python start per command); `--version`, a usage error and `cat --follow` run as
subprocesses, as a user runs them.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
import yaml

import woodpecker_idem as wp
from woodpecker_idem.cli import main, verify
from woodpecker_idem.client.client import DELETE_OWNER_PREFIX
from woodpecker_idem.meta.base import SegmentMeta
from woodpecker_idem.spark.options import ensure_log_group

PACKAGE_ROOT = str(Path(wp.__file__).resolve().parent.parent)


def cli_proc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "woodpecker_idem", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": PACKAGE_ROOT},
    )


@dataclass
class Store:
    """A store to test against: `args` say where it is; `config` opens it with connect()."""

    kind: str
    data_dir: Path
    config: dict[str, object]
    args: list[str]

    def connect(self) -> wp.WoodpeckerClient:
        return wp.connect(self.data_dir, {**self.config, "segment.max_entries": 10})


@pytest.fixture(
    params=["embedded", pytest.param("etcd+s3", marks=pytest.mark.s3)],
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "embedded":
        yield Store("embedded", tmp_path / "data", {}, ["--data-dir", str(tmp_path / "data")])
        return
    yield from _shared(request, tmp_path)


def _shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    etcd = request.getfixturevalue("etcd_server")
    s3 = request.getfixturevalue("s3_server")
    monkeypatch = request.getfixturevalue("monkeypatch")
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    bucket = f"wp-cli-{os.urandom(6).hex()}"
    boto3.client("s3", endpoint_url=s3.endpoint_url).create_bucket(Bucket=bucket)
    config: dict[str, object] = {
        "meta.type": "etcd",
        "meta.endpoints": [etcd.endpoint],
        "meta.prefix": request.getfixturevalue("etcd_prefix"),
        "objectstore.type": "s3",
        "objectstore.endpoint_url": s3.endpoint_url,
        "objectstore.bucket": bucket,
    }
    path = tmp_path / "wp.yaml"
    nested: dict[str, dict[str, object]] = {}
    for key, value in config.items():
        section, name = key.split(".", 1)
        nested.setdefault(section, {})[name] = value
    path.write_text(yaml.safe_dump(nested))
    yield Store("etcd+s3", tmp_path / "writer-host", config, ["--config", str(path)])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def write_orders(store: Store, n: int = 35) -> list[wp.LogMessageId]:
    """n orders in log `orders` (segments of 10), one duplicate, the writer closed."""
    with store.connect() as client:
        writer = client.open_log("orders", create=True).open_writer(idempotent=True)
        ids = [
            writer.write(f"order {i}".encode(), idempotency_id=f"o{i}").message_id for i in range(n)
        ]
        assert writer.write(b"again", idempotency_id="o0").duplicate
        writer.close()
    return ids


# --- --version and usage ---------------------------------------------------------------------


def test_version_prints_the_package_version() -> None:
    out = cli_proc("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"woodpecker-idem {wp.__version__}"


def test_admin_commands_need_a_store_and_never_create_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "logs")
    assert code == 2 and "--data-dir DIR" in err and "--config FILE" in err
    missing = tmp_path / "nothing-here"
    code, _, err = run(capsys, "logs", "--data-dir", str(missing))
    assert code == 2 and "is not an existing directory" in err
    assert not missing.exists()
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "verify", "--data-dir", str(tmp_path / "empty"))
    assert code == 2 and "holds no store" in err
    assert list((tmp_path / "empty").iterdir()) == []
    out = cli_proc("truncate", "orders", "--data-dir", str(tmp_path))  # neither --before nor ...
    assert out.returncode == 2 and "one of the arguments --before --older-than" in out.stderr


def test_config_without_data_dir_must_name_shared_stores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "local.yaml"
    path.write_text("quorum:\n  es: 1\n")
    code, _, err = run(capsys, "logs", "--config", str(path))
    assert code == 2
    assert "meta.type: etcd (or meta.path)" in err and "objectstore.type: s3" in err


def test_store_options_before_the_command(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`woodpecker-idem --data-dir DIR logs` (the order docs/operations.md shows first) is the
    same command as `woodpecker-idem logs --data-dir DIR`; issue 29: it was "invalid choice"."""
    write_orders(store)
    after = run(capsys, "logs", *store.args, "--json")
    before = run(capsys, *store.args, "logs", "--json")
    assert after[0] == 0 and before == after
    assert json.loads(before[1])["logs"][0]["entries"] == 35
    code, out, _ = run(capsys, *store.args, "--json", "-v", "stat", "orders")
    assert code == 0 and json.loads(out)["name"] == "orders"
    code, out, _ = run(capsys, *store.args, "verify")
    assert code == 0 and out.startswith("verify: OK: 1 logs")
    code, out, _ = run(capsys, *store.args, "cat", "orders", *store.args, "--limit", "1")
    assert code == 0 and out.startswith("0:0\t")  # the same store twice: one store
    code, _, err = run(capsys, *store.args, "logs", store.args[0], str(tmp_path / "other"))
    assert code == 2 and f"{store.args[0]} given twice" in err
    code, _, err = run(capsys, "--json", "demo")
    assert code == 2 and "--json does not apply to 'demo'" in err
    if store.kind == "embedded":  # and as a user runs it
        out = cli_proc(*store.args, "logs")
        assert out.returncode == 0 and out.stdout.startswith("name "), out.stderr


# --- output cut short (`| head`) ---------------------------------------------------------------


def into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI with its stdout a pipe whose reader is gone before the first line: every write
    meets EPIPE, whatever the machine's speed."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "woodpecker_idem", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": PACKAGE_ROOT},
        )
    finally:
        os.close(write_end)


def test_output_cut_short_ends_quietly(tmp_path: Path) -> None:
    """Issue 29: `cat LOG | head -1` ended with a BrokenPipeError line (or a traceback from the
    flush at exit) and status 2. Now: no output on stderr, status 0 (the reader had what it
    wanted), and verify keeps its verdict (1: damage) however much of its output was read."""
    store = Store("embedded", tmp_path / "data", {}, ["--data-dir", str(tmp_path / "data")])
    with store.connect() as client:
        writer = client.open_log("orders", create=True).open_writer()
        for i in range(5000):  # ~0.5 MB of lines: more than a pipe and Python's buffer hold
            writer.write_async(b"order %d " % i + b"x" * 80)
        writer.close()
    args = store.args
    proc = subprocess.Popen(
        [sys.executable, "-m", "woodpecker_idem", "cat", "orders", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": PACKAGE_ROOT},
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith(b"0:0\t")  # `| head -1`
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(120) == 0 and err == b"", err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for command in (["cat", "orders"], ["logs"], ["--json", "logs"], ["verify"]):
        done = into_a_closed_pipe(*command, *args)
        assert done.returncode == 0 and done.stderr == "", (command, done.stderr)
    with store.connect() as client:
        store_id, log_id = client.store_id(), client.open_log("orders").log_id
    _flip_last_byte_of_segment(store, store_id, log_id, 0)
    for command in (["verify"], ["verify", "--json"]):
        done = into_a_closed_pipe(*command, *args)
        assert done.returncode == 1 and done.stderr == "", (command, done.stderr)


# --- logs, stat, cat -------------------------------------------------------------------------


def test_logs_lists_logs_and_groups(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    ids = write_orders(store)
    with store.connect() as client:
        ensure_log_group(client, "clicks", 2)
    code, out, _ = run(capsys, "logs", *store.args, "--json")
    assert code == 0
    doc = json.loads(out)
    orders = next(row for row in doc["logs"] if row["name"] == "orders")
    assert orders["entries"] == 35 and orders["segments"] == 4
    assert orders["first_id"] == str(ids[0]) == "0:0" and orders["last_id"] == str(ids[-1])
    assert orders["bytes"] > 35 * len("order 0")  # completed segments record their bytes
    assert orders["first_time"] and orders["last_time"]
    assert [g["name"] for g in doc["groups"]] == ["clicks"]
    assert doc["groups"][0]["partitions"] == 2 and doc["groups"][0]["logs"] == 2
    assert {r["name"] for r in doc["logs"] if r["group"] == "clicks"} == {"clicks-0", "clicks-1"}
    code, out, _ = run(capsys, "logs", *store.args)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split()[:5] == ["name", "log_id", "group", "segments", "entries"]
    assert any(r.split()[0] == "orders" and r.split()[4] == "35" for r in rows)
    assert any(r.startswith("clicks ") for r in rows)


def test_stat_shows_segments_writer_and_snapshot(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    write_orders(store)
    code, out, _ = run(capsys, "stat", "orders", *store.args, "--json")
    assert code == 0
    doc = json.loads(out)
    assert [s["segment_id"] for s in doc["segment_list"]] == [0, 1, 2, 3]
    assert {s["state"] for s in doc["segment_list"]} <= {"SEALED", "COMPLETED"}
    assert [s["last_entry_id"] for s in doc["segment_list"]] == [9, 9, 9, 4]
    assert doc["writer"]["epoch"] >= 1 and doc["writer"]["lease_owner"]
    snap = doc["snapshot"]  # the closing writer's final snapshot
    assert snap["keys"] == 35 and snap["age_s"] >= 0 and snap["epoch"] == doc["writer"]["epoch"]
    assert snap["watermarks"] == {"0": 9, "1": 9, "2": 9, "3": 4}
    code, out, _ = run(capsys, "stat", "orders", *store.args)
    assert code == 0
    assert "entries 35 (0:0 .. 3:4)" in out and "35 keys" in out and "watermarks 0:9" in out


def test_stat_of_a_misspelt_log_suggests_the_name(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    write_orders(store, 3)
    code, _, err = run(capsys, "stat", "ordres", *store.args)
    assert code == 2 and "LogNotFoundError" in err and "did you mean 'orders'?" in err


def test_cat_prints_entries_from_an_id_with_a_limit(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    write_orders(store)
    code, out, _ = run(capsys, "cat", "orders", *store.args, "--from", "1:5", "--limit", "3")
    assert code == 0
    lines = out.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["1:5", "1:6", "1:7"]
    assert [line.split("\t")[-1] for line in lines] == ["order 15", "order 16", "order 17"]
    code, out, _ = run(capsys, "cat", "orders", *store.args, "--json")
    docs = [json.loads(line) for line in out.splitlines()]
    assert len(docs) == 35  # the duplicate is not in the log
    assert docs[3] == {
        "id": "0:3",
        "timestamp_ms": docs[3]["timestamp_ms"],
        "key": wp.explicit_key("o3").hex(),
        "payload": "order 3",
    }
    code, _, err = run(capsys, "cat", "orders", *store.args, "--from", "3-1")
    assert code == 2 and "write SEGMENT:ENTRY" in err


def test_cat_follow_prints_new_entries_as_they_are_written(store: Store) -> None:
    with store.connect() as client:
        writer = client.open_log("tail", create=True).open_writer()
        writer.write(b"first")
        proc = subprocess.Popen(
            [sys.executable, "-m", "woodpecker_idem", "cat", "tail", *store.args]
            + ["--follow", "--limit", "3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": PACKAGE_ROOT},
        )
        try:
            assert proc.stdout is not None
            lines = [_read_line(proc)]
            writer.write(b"second")
            lines.append(_read_line(proc))
            writer.write(b"third")
            lines.append(_read_line(proc))
            assert proc.wait(60) == 0  # --limit 3 reached: it exits
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        writer.close()
    assert [line.split("\t")[-1] for line in lines] == ["first", "second", "third"]


def test_cat_follow_behind_a_truncation_gets_the_truth(tmp_path: Path) -> None:
    """`cat --follow` blocked on a full stdout pipe while everything it was to print next is
    truncated: it ends with EntryTruncatedError naming the first entry kept (exit status 2),
    instead of retrying a NodeUnavailableError for ever."""
    store = Store("embedded", tmp_path / "data", {}, ["--data-dir", str(tmp_path / "data")])
    with store.connect() as client:
        log = client.open_log("tail", create=True)
        writer = log.open_writer()
        futures = [writer.write_async(b"x" * 200) for _ in range(3000)]  # ~700 KB of lines
        last = [f.result(60).message_id for f in futures][-1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "woodpecker_idem", "cat", "tail", *store.args, "--follow"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": PACKAGE_ROOT},
        )
        try:
            first = _read_line(proc)  # then it fills the pipe (64 KiB) and blocks
            log.truncate(wp.LogMessageId(last.segment_id, 0))
            assert proc.stdout is not None and proc.stderr is not None
            printed = 1 + len(proc.stdout.read().splitlines())  # drain: it goes on, then ends
            assert proc.wait(60) == 2
            err = proc.stderr.read().decode()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        writer.close()
    assert first.startswith("0:0\t") and printed < 3000
    assert "EntryTruncatedError" in err and f"first entry kept is {last.segment_id}:0" in err


def _read_line(proc: subprocess.Popen[bytes], timeout: float = 60) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "cat --follow printed nothing"
    return proc.stdout.readline().decode().rstrip("\n")


# --- truncate, drop-group --------------------------------------------------------------------


def test_truncate_before_an_id_and_older_than(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    write_orders(store)
    code, out, _ = run(capsys, "truncate", "orders", *store.args, "--older-than", "1h")
    assert code == 0 and "nothing to drop" in out
    # the end is 3:5 (segment 3 holds 3:0..3:4): one entry or one segment past it is refused
    for past in ("9:0", "4:0", "3:6"):
        code, _, err = run(capsys, "truncate", "orders", *store.args, "--before", past)
        assert code == 2 and "past the end" in err and "the next id is 3:5" in err, past
    code, out, _ = run(capsys, "truncate", "orders", *store.args, "--before", "2:0", "--dry-run")
    assert code == 0 and "would truncate to 2:0" in out and "segments 0..1 would be" in out
    code, out, _ = run(capsys, "cat", "orders", *store.args, "--limit", "1")
    assert out.startswith("0:0\t")  # the dry run changed nothing
    code, out, _ = run(capsys, "truncate", "orders", *store.args, "--before", "2:0")
    assert code == 0 and "truncated to 2:0" in out and "segments 0..1 deleted" in out
    code, out, _ = run(capsys, "truncate", "orders", *store.args, "--before", "1:0")
    assert code == 0 and "already truncated to 2:0" in out
    code, out, _ = run(capsys, "cat", "orders", *store.args)
    assert out.splitlines()[0].split("\t")[-1] == "order 20" and len(out.splitlines()) == 15
    time.sleep(0.01)  # every completed segment is now older than 1 ms
    code, out, _ = run(capsys, "truncate", "orders", *store.args, "--older-than", "1ms")
    assert code == 0 and "truncated to 4:0" in out and "segments 2..3 deleted" in out
    code, out, _ = run(capsys, "logs", *store.args, "--json")
    orders = json.loads(out)["logs"][0]
    assert orders["entries"] == 0 and orders["segments"] == 0
    with store.connect() as client:  # the keys stay in the window: a retry is still a duplicate
        writer = client.open_log("orders").open_writer(idempotent=True)
        again = writer.write(b"late retry", idempotency_id="o7")
        assert again.duplicate and again.message_id == wp.LogMessageId(0, 7)
        writer.close()


def test_negative_looking_values_are_refused_with_our_own_message(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    write_orders(store)
    for argv, said in (
        (["truncate", "orders", "--before", "-1:0"], "'-1:0' is not a message id (ids are never"),
        (["truncate", "orders", "--before=-1:0"], "'-1:0' is not a message id (ids are never"),
        (["truncate", "orders", "--older-than", "-5s"], "'-5s' is negative; a duration counts"),
        (["cat", "orders", "--from", "-3:1"], "'-3:1' is not a message id"),
    ):
        code, _, err = run(capsys, *argv, *store.args)
        assert code == 2 and said in err, err
        assert "expected one argument" not in err
    code, out, _ = run(capsys, "cat", "orders", *store.args, "--limit", "1")
    assert out.startswith("0:0\t")  # nothing was truncated


def test_readers_list_and_delete(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    ids = write_orders(store)
    code, out, _ = run(capsys, "readers", "list", "orders", *store.args)
    assert code == 0 and "no named readers" in out
    with store.connect() as client:
        log = client.open_log("orders")
        with log.open_reader(name="billing") as r:
            for _ in range(12):
                r.read_next(0)
            r.commit()
        log.open_reader(name="audit", start="latest").close()
    code, out, _ = run(capsys, "readers", "list", "orders", *store.args, "--json")
    got = {r["name"]: (r["position"], r["lag"]) for r in json.loads(out)["readers"]}
    assert code == 0 and got == {"audit": ("3:5", 0), "billing": (str(ids[12]), 35 - 12)}
    code, out, _ = run(capsys, "readers", "list", "orders", *store.args)
    assert out.splitlines()[0].split() == ["name", "position", "lag", "epoch", "owner", "updated"]
    code, _, err = run(capsys, "readers", "delete", "orders", "bill", *store.args)
    assert code == 2 and "no named reader 'bill'; did you mean 'billing'?" in err
    code, out, _ = run(capsys, "readers", "delete", "orders", "billing", *store.args)
    assert code == 0 and "deleted reader 'billing'" in out
    code, out, _ = run(capsys, "readers", "list", "orders", *store.args, "--json")
    assert [r["name"] for r in json.loads(out)["readers"]] == ["audit"]


def test_drop_group_deletes_its_logs_and_record(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    write_orders(store, 3)
    with store.connect() as client:
        ensure_log_group(client, "clicks", 2)
        ensure_log_group(client, "views", 1)
        writer = client.open_log("clicks-1").open_writer()
        writer.write(b"x")
        live = client.open_log("views-0").open_writer()
        live.write(b"y")
        code, _, err = run(capsys, "drop-group", "clikcs", *store.args)
        assert code == 2 and "did you mean 'clicks'?" in err
        code, _, err = run(capsys, "drop-group", "clicks", *store.args)
        assert code == 2 and "has a writer" in err and "--force" in err  # its lease is live
        writer.close()  # a clean close releases the lease: no 30 s wait for it to expire
        code, out, _ = run(capsys, "drop-group", "clicks", *store.args)
        assert code == 0 and "2 logs deleted" in out
        code, out, _ = run(capsys, "drop-group", "views", *store.args, "--force")
        assert code == 0 and "1 logs deleted" in out
        with pytest.raises(wp.WriterFencedError):  # the live writer was fenced by the delete
            live.write(b"z")
        live.close()
    with store.connect() as client:
        assert client.list_logs() == ["orders"]
        assert client.meta.list_log_groups() == []
        assert client.objects.list("3/") == []  # clicks-1 (log id 3) left no entries


# --- verify ----------------------------------------------------------------------------------


def test_verify_passes_a_healthy_store(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    write_orders(store)
    code, out, _ = run(capsys, "verify", *store.args, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"], doc
    assert doc["entries_checked"] == 35 and doc["segments"] == 4 and doc["snapshots"] >= 1


def test_verify_finds_and_names_a_corrupt_byte(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    write_orders(store)
    with store.connect() as client:
        store_id, log_id = client.store_id(), client.open_log("orders").log_id
    _flip_last_byte_of_segment(store, store_id, log_id, 1)
    code, out, _ = run(capsys, "verify", *store.args)
    assert code == 1, out
    problems = [line for line in out.splitlines() if line.startswith("CORRUPT")]
    assert len(problems) == 1, out
    assert "log 'orders' (id 1) segment 1 on node-0, entry 1:9" in problems[0]
    assert "checksum" in problems[0]
    if store.kind == "embedded":  # the file and byte offset of the damaged batch
        assert "/1/data@" in problems[0]
    assert "1 problems" in out.splitlines()[-1]
    code, out, _ = run(capsys, "verify", *store.args, "--json")
    doc = json.loads(out)
    assert code == 1 and not doc["ok"] and doc["entries_checked"] == 34
    with store.connect() as client:  # another log, intact: checked alone, it passes
        writer = client.open_log("clean", create=True).open_writer()
        writer.write(b"x")
        writer.close()
    code, out, _ = run(capsys, "verify", *store.args, "--log", "clean")
    assert code == 0 and "1 logs, 1 segments, 1 entries" in out
    code, _, err = run(capsys, "verify", *store.args, "--log", "claen")
    assert code == 2 and "did you mean 'clean'?" in err


def test_verify_names_a_corrupt_snapshot(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    write_orders(store, 3)
    with store.connect() as client:
        keys = client.objects.list("dedup_snapshot/1/snapshot_")
        data = bytearray(client.objects.get(keys[-1]) or b"")
        data[len(data) // 2] ^= 0xFF
        client.objects.put(keys[-1], bytes(data))
    code, out, _ = run(capsys, "verify", *store.args)
    assert code == 1
    assert f"CORRUPT log 'orders' (id 1) snapshot {keys[-1]}:" in out


def test_verify_names_a_foreign_owner_marker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    store = Store("embedded", data, {}, ["--data-dir", str(data)])
    write_orders(store, 3)
    (data / "objects" / "woodpecker" / "OWNER").write_text('{"format": 1, "store_id": "other"}')
    code, out, _ = run(capsys, "verify", *store.args)
    assert code == 1
    assert out.startswith("CORRUPT object store OWNER: ")
    assert "belongs to metadata store other" in out


def _before_the_first_read(
    monkeypatch: pytest.MonkeyPatch, action: Callable[[], None]
) -> list[SegmentMeta]:
    """Run `action` once, after `verify` listed a log's segments and before it reads the first
    replica (as retention or a delete in another process may); returns the segments read."""
    real = verify._replica
    read: list[SegmentMeta] = []

    def replica(client: object, seg: SegmentMeta, *args: object) -> None:
        if not read:
            action()
        read.append(seg)
        real(client, seg, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(verify, "_replica", replica)
    return read


def test_verify_tells_segments_dropped_during_its_scan_from_damage(
    store: Store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: a truncation (retention, `truncate`) between verify's listing and its reads made
    it report CORRUPT "missing" for every segment it deleted, and exit 1. Now they are counted as
    dropped; damage in a segment still held is reported as before."""
    write_orders(store)
    with store.connect() as client:
        store_id, log_id = client.store_id(), client.open_log("orders").log_id
    _flip_last_byte_of_segment(store, store_id, log_id, 3)

    def truncate() -> None:
        with store.connect() as client:
            client.open_log("orders").truncate(wp.LogMessageId(2, 0))

    read = _before_the_first_read(monkeypatch, truncate)
    code, out, _ = run(capsys, "verify", *store.args)
    assert [seg.segment_id for seg in read] == [0, 1, 2, 3]  # listed before the truncation
    problems = [line for line in out.splitlines() if line.startswith(("CORRUPT", "UNCHECKED"))]
    assert len(problems) == 1 and "segment 3 on node-0, entry 3:4" in problems[0], out
    assert code == 1
    assert out.splitlines()[-1].startswith("verify: 1 problems: 1 logs, 2 segments, 14 entries")
    assert "(2 segments dropped during the scan)" in out
    code, out, _ = run(capsys, "verify", *store.args, "--json")  # the hook acted once: a rerun
    doc = json.loads(out)
    assert code == 1 and doc["segments"] == 2 and len(doc["problems"]) == 1
    assert doc["dropped_during_scan"] == {"segments": 0, "logs": 0}


def test_verify_passes_a_log_deleted_during_its_scan(
    store: Store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_orders(store)

    def delete() -> None:
        with store.connect() as client:
            client.delete_log("orders")

    _before_the_first_read(monkeypatch, delete)
    code, out, _ = run(capsys, "verify", *store.args, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["problems"] == [], doc
    assert doc["dropped_during_scan"]["segments"] == 4 and doc["segments"] == 0


def test_verify_and_a_truncation_half_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A truncation records the log's new start first, then marks its segments and deletes
    them: files of segments before that start, still marked SEALED, are not damage."""
    store = Store("embedded", tmp_path / "data", {}, ["--data-dir", str(tmp_path / "data")])
    write_orders(store)

    def truncate_point_and_files() -> None:
        with store.connect() as client:
            log_id = client.open_log("orders").log_id
            client.meta.set_truncation(log_id, wp.LogMessageId(2, 0))
            for seg in client.meta.list_segments(log_id)[:2]:
                for node in seg.nodes:
                    client.ensemble.calls.delete_segment(node, log_id, seg.segment_id)

    _before_the_first_read(monkeypatch, truncate_point_and_files)
    code, out, _ = run(capsys, "verify", *store.args)
    assert code == 0 and "(2 segments dropped during the scan)" in out, out


@pytest.mark.parametrize("lease_live", [True, False])
def test_verify_and_a_delete_under_way_or_interrupted(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    lease_live: bool,
) -> None:
    """A delete removes the files before the records, under a lease of its own: files missing
    under that lease, live, are a delete under way; once it expired, a delete that died midway
    left a log without its entries, which verify reports once per segment, saying so."""
    store = Store("embedded", tmp_path / "data", {}, ["--data-dir", str(tmp_path / "data")])
    write_orders(store)

    def delete_files() -> None:  # `delete_log` up to its last step
        with store.connect() as client:
            log_id = client.open_log("orders").log_id
            now = client.clock.now_ms() if lease_live else 0
            client.meta.take_over(log_id, f"{DELETE_OWNER_PREFIX}test", now, 60_000)
            client.ensemble.delete_log(log_id, client.meta.list_segments(log_id))

    _before_the_first_read(monkeypatch, delete_files)
    code, out, _ = run(capsys, "verify", *store.args)
    missing = [line for line in out.splitlines() if "missing" in line]
    if lease_live:
        assert code == 0 and missing == [] and "(4 segments dropped during the scan)" in out, out
    else:
        assert code == 1 and [m.split(":")[0] for m in missing] == [
            f"CORRUPT log 'orders' (id 1) segment {i}" for i in range(4)
        ], out
        assert all("a delete of the log (delete_log:test) removed them" in m for m in missing)
        assert all("delete the log again" in m for m in missing)


def test_verify_reports_a_segment_file_removed_behind_the_metadata(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Files missing while the metadata still holds the segment are damage, whenever removed."""
    store = Store("embedded", tmp_path / "data", {}, ["--data-dir", str(tmp_path / "data")])
    write_orders(store)
    with store.connect() as client:
        store_id, log_id = client.store_id(), client.open_log("orders").log_id
    segment = store.data_dir / "objects" / "woodpecker" / store_id / str(log_id) / "1"
    for path in segment.iterdir():
        path.unlink()
    code, out, _ = run(capsys, "verify", *store.args)
    problems = [line for line in out.splitlines() if line.startswith("CORRUPT")]
    assert code == 1 and len(problems) == 1, out
    assert "segment 1 on node-0" in problems[0] and "missing" in problems[0]
    assert "dropped during the scan" not in out


def _flip_last_byte_of_segment(store: Store, store_id: str, log_id: int, segment: int) -> None:
    """Damage the last stored byte of the segment's entries (its last entry's record)."""
    if store.kind == "embedded":
        path = store.data_dir / "objects" / "woodpecker" / store_id / str(log_id) / str(segment)
        data_file = path / "data"
        raw = bytearray(data_file.read_bytes())
        raw[-1] ^= 0xFF
        data_file.write_bytes(bytes(raw))
        return
    bucket = str(store.config["objectstore.bucket"])
    s3 = boto3.client("s3", endpoint_url=str(store.config["objectstore.endpoint_url"]))
    prefix = f"woodpecker/{store_id}/{log_id}/{segment}/"
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    blocks = sorted(
        (o["Key"] for o in listing if o["Key"].endswith(".blk")),
        key=lambda k: int(k.rsplit("/", 1)[1].split(".")[0]),
    )
    key = blocks[-1]
    raw = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    raw[-1] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(raw))
