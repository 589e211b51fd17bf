"""One ObjectStore contract suite for the local-directory and S3 (moto) backends, plus the
backend-specific guarantees: local durability/atomicity, S3 outage handling and ambiguous puts."""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from woodpecker_idem.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    StorageAccessError,
    StorageUnavailableError,
)
from woodpecker_idem.objectstore import LocalObjectStore, ObjectStore, open_object_store
from woodpecker_idem.objectstore import local as local_mod

MiB = 1024 * 1024

# --- helpers -----------------------------------------------------------------------------------


def store_spec(store: ObjectStore) -> dict[str, Any]:
    """Enough to reopen the same store in another process."""
    if isinstance(store, LocalObjectStore):
        return {"type": "local", "path": store.root}
    from woodpecker_idem.objectstore import S3ObjectStore

    assert isinstance(store, S3ObjectStore)
    return {
        "type": "s3",
        "endpoint_url": store.endpoint_url,
        "bucket": store.bucket,
        "root": store.root,
        "access_key": "testing",
        "secret_key": "testing",
        "create_bucket": True,
    }


def _child_create(spec: dict[str, Any], key: str, data: bytes, barrier: Any, out: Any) -> None:
    """Runs in a spawned process: open the store, wait for the sibling, race a create."""
    store = open_object_store(spec.pop("type"), **spec)
    try:
        store.get("warm-up/none")  # connect before the race, so both start together
        barrier.wait(timeout=30)
        out.put((data, store.put(key, data, if_none_match=True)))
    finally:
        store.close()


def _s3(store: ObjectStore) -> Any:
    from woodpecker_idem.objectstore import S3ObjectStore

    assert isinstance(store, S3ObjectStore)
    return store


# --- the contract (both backends) ----------------------------------------------------------------


def test_put_get_list_delete(object_store: ObjectStore) -> None:
    assert object_store.put("logs/1/0/0.blk", b"hello") is True
    assert object_store.get("logs/1/0/0.blk") == b"hello"
    assert object_store.list("logs/") == ["logs/1/0/0.blk"]
    object_store.delete("logs/1/0/0.blk")
    assert object_store.get("logs/1/0/0.blk") is None
    assert object_store.list("logs/") == []


def test_replace(object_store: ObjectStore) -> None:
    assert object_store.put("k", b"old") is True
    assert object_store.put("k", b"new value") is True
    assert object_store.get("k") == b"new value"
    assert object_store.list("") == ["k"]


def test_create_if_absent_keeps_original(object_store: ObjectStore) -> None:
    assert object_store.put("fence/3.blk", b"original", if_none_match=True) is True
    assert object_store.put("fence/3.blk", b"intruder", if_none_match=True) is False
    assert object_store.put("fence/3.blk", b"original", if_none_match=True) is False
    assert object_store.get("fence/3.blk") == b"original"


def test_concurrent_create_if_absent_threads_one_winner(object_store: ObjectStore) -> None:
    for round_ in range(3):
        key = f"race/{round_}.blk"
        barrier = threading.Barrier(8)
        results: list[tuple[bytes, bool]] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def worker(
            i: int,
            key: str = key,
            barrier: threading.Barrier = barrier,
            results: list[tuple[bytes, bool]] = results,
            errors: list[BaseException] = errors,
            lock: threading.Lock = lock,
        ) -> None:
            data = f"writer-{i}-".encode() * 100
            try:
                barrier.wait(timeout=10)
                won = object_store.put(key, data, if_none_match=True)
            except BaseException as exc:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(exc)
                return
            with lock:
                results.append((data, won))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not errors, errors
        winners = [data for data, won in results if won]
        assert len(results) == 8
        assert len(winners) == 1, f"round {round_}: {len(winners)} winners"
        assert object_store.get(key) == winners[0]


def test_concurrent_create_if_absent_processes_one_winner(object_store: ObjectStore) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    out = ctx.Queue()
    key = "race/proc.blk"
    procs = [
        ctx.Process(
            target=_child_create,
            args=(store_spec(object_store), key, f"process-{i}".encode() * 1000, barrier, out),
        )
        for i in range(2)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    winners = [data for data, won in results if won]
    assert len(winners) == 1, results
    assert object_store.get(key) == winners[0]


def test_list_is_sorted_and_a_string_prefix(object_store: ObjectStore) -> None:
    keys = ["a/2", "a/1x", "a/10/y", "a/1/z/w", "a/1/x", "b/1", "a0", "a/1/10", "a/1/9"]
    for k in keys:
        object_store.put(k, k.encode())
    assert object_store.list("") == sorted(keys)
    # "a/1" is a plain string prefix: it includes "a/10/..." and "a/1x" ...
    assert object_store.list("a/1") == ["a/1/10", "a/1/9", "a/1/x", "a/1/z/w", "a/10/y", "a/1x"]
    # ... while "a/1/" only lists what is below "a/1/".
    assert object_store.list("a/1/") == ["a/1/10", "a/1/9", "a/1/x", "a/1/z/w"]
    assert object_store.list("a/1/1") == ["a/1/10"]
    assert object_store.list("a") == sorted(k for k in keys if k.startswith("a"))
    assert object_store.list("a/") == sorted(k for k in keys if k.startswith("a/"))
    assert object_store.list("c") == []
    assert object_store.list("a/3/") == []
    assert object_store.list("a/1/z/w") == ["a/1/z/w"]


def test_empty_and_binary_data(object_store: ObjectStore) -> None:
    every_byte = bytes(range(256)) * 4
    assert object_store.put("empty", b"") is True
    assert object_store.put("binary", every_byte, if_none_match=True) is True
    assert object_store.put("crlf", b"\r\n\x00\r\n") is True
    assert object_store.put("from-bytearray", bytearray(b"xyz")) is True
    assert object_store.put("from-memoryview", memoryview(b"0123456789")[2:5]) is True
    assert object_store.get("empty") == b""
    assert object_store.get("binary") == every_byte
    assert object_store.get("crlf") == b"\r\n\x00\r\n"
    assert object_store.get("from-bytearray") == b"xyz"
    assert object_store.get("from-memoryview") == b"234"


def test_unicode_keys(object_store: ObjectStore) -> None:
    assert object_store.put("ünï/çødé ≈ key.blk", b"u") is True
    assert object_store.list("ünï/") == ["ünï/çødé ≈ key.blk"]
    assert object_store.get("ünï/çødé ≈ key.blk") == b"u"


def test_large_objects(object_store: ObjectStore) -> None:
    big = os.urandom(5 * MiB)
    assert object_store.put("big/1", big, if_none_match=True) is True
    assert object_store.get("big/1") == big
    bigger = os.urandom(5 * MiB + 17)
    assert object_store.put("big/1", bigger) is True
    assert object_store.get("big/1") == bigger


BAD_KEYS = ["", "/abs", "a/../b", "..", "../x", "a\\b", "a\x00b", "a//b", "./a", "a/./b", "a/"]


@pytest.mark.parametrize("bad", BAD_KEYS)
def test_bad_keys_rejected(object_store: ObjectStore, bad: str) -> None:
    calls = [
        lambda: object_store.put(bad, b"x"),
        lambda: object_store.put(bad, b"x", if_none_match=True),
        lambda: object_store.get(bad),
        lambda: object_store.delete(bad),
    ]
    for call in calls:
        with pytest.raises(InvalidArgumentError, match="key") as info:
            call()
        assert isinstance(info.value, ValueError)
    assert object_store.list("") == []


@pytest.mark.parametrize("bad", ["/abs", "..", "a/../", "a\\", "a\x00"])
def test_bad_prefixes_rejected(object_store: ObjectStore, bad: str) -> None:
    with pytest.raises(InvalidArgumentError, match="prefix"):
        object_store.list(bad)
    with pytest.raises(InvalidArgumentError, match="prefix"):
        object_store.delete_prefix(bad)


def test_wrong_types_rejected(object_store: ObjectStore) -> None:
    with pytest.raises(InvalidTypeError, match="key"):
        object_store.put(b"bytes-key", b"x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="data"):
        object_store.put("k", "a str")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="prefix"):
        object_store.list(None)  # type: ignore[arg-type]


def test_missing_get_and_delete(object_store: ObjectStore) -> None:
    assert object_store.get("nope") is None
    assert object_store.get("no/such/dir/key") is None
    object_store.delete("nope")
    object_store.delete("no/such/dir/key")
    object_store.put("dir/key", b"x")
    assert object_store.get("dir") is None  # a "directory" is not an object
    object_store.delete("dir")
    assert object_store.get("dir/key") == b"x"


def test_delete_prefix(object_store: ObjectStore) -> None:
    for seg in range(3):
        for n in range(4):
            object_store.put(f"log/7/{seg}/{n}.blk", b"b")
    object_store.put("log/70/0/0.blk", b"other log")
    object_store.put("log/8/0/0.blk", b"other log")
    assert object_store.delete_prefix("log/7/1/") == 4
    assert object_store.list("log/7/1/") == []
    assert object_store.delete_prefix("log/7/") == 8
    assert object_store.list("log/") == ["log/70/0/0.blk", "log/8/0/0.blk"]
    assert object_store.delete_prefix("log/7/") == 0
    # Writing below a pruned directory works again.
    assert object_store.put("log/7/1/0.blk", b"again", if_none_match=True) is True
    assert object_store.get("log/7/1/0.blk") == b"again"


def test_child_is_the_prefix_with_the_same_contract(object_store: ObjectStore) -> None:
    """`child` (how connect() keeps each metadata store's objects apart) sees only its prefix."""
    object_store.put("OWNER", b"marker")
    object_store.put("other/1/0/0.blk", b"other store")
    child = object_store.child("store-a")
    assert child.list("") == []
    assert child.put("1/0/0.blk", b"mine", if_none_match=True) is True
    assert child.put("1/0/0.blk", b"theirs", if_none_match=True) is False
    assert child.get("1/0/0.blk") == b"mine"
    assert child.list("") == ["1/0/0.blk"]
    assert object_store.get("store-a/1/0/0.blk") == b"mine"
    nested = child.child("nodes/node-1")
    nested.put("k", b"n")
    assert object_store.list("store-a/") == ["store-a/1/0/0.blk", "store-a/nodes/node-1/k"]
    assert child.delete_prefix("") == 2
    assert object_store.list("") == ["OWNER", "other/1/0/0.blk"]
    for bad in ("", "/abs", "a/../b"):
        with pytest.raises(InvalidArgumentError):
            object_store.child(bad)


# --- local only ----------------------------------------------------------------------------------


def _all_files(root: str) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]


def test_local_no_temp_files_left(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "o")
    for i in range(200):
        store.put(f"s/{i % 7}/{i}.blk", b"x" * 1000, if_none_match=True)
        store.put(f"s/{i % 7}/{i}.blk", b"y", if_none_match=True)  # collides: temp discarded
        store.put("s/replaced", str(i).encode())
    files = _all_files(store.root)
    assert not [f for f in files if os.path.basename(f).startswith(local_mod.TEMP_PREFIX)]
    assert len(files) == 201
    assert store.get("s/replaced") == b"199"


def test_local_list_skips_temp_files(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "o")
    store.put("d/k", b"x")
    Path(store.root, "d", f"{local_mod.TEMP_PREFIX}k.deadbeef").write_bytes(b"partial")
    assert store.list("") == ["d/k"]
    assert store.list("d/") == ["d/k"]
    with pytest.raises(InvalidArgumentError, match="reserved"):
        store.put(f"d/{local_mod.TEMP_PREFIX}x", b"x")


def test_local_sweep_temp_files(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "o")
    store.put("d/k", b"x")
    old = Path(store.root, "d", f"{local_mod.TEMP_PREFIX}k.1.1")
    fresh = Path(store.root, "d", f"{local_mod.TEMP_PREFIX}k.1.2")
    old.write_bytes(b"crashed mid-put")
    fresh.write_bytes(b"in flight")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert store.sweep_temp_files(max_age_s=3600) == 1
    assert not old.exists() and fresh.exists()
    assert store.get("d/k") == b"x"


def test_local_store_sweeps_stale_temp_files_when_it_opens(tmp_path: Path) -> None:
    """A process killed mid-put leaves a temp file; the next open of the store removes it once
    it is older than STALE_TEMP_S, and leaves younger ones (a put in flight elsewhere) alone."""
    store = LocalObjectStore(tmp_path / "o")
    store.put("1/0/0.blk", b"x")
    stale = Path(store.root, "1", "0", f"{local_mod.TEMP_PREFIX}1.blk.4242.7")
    fresh = Path(store.root, "1", "0", f"{local_mod.TEMP_PREFIX}2.blk.4243.0")
    stale.write_bytes(b"killed mid-put")
    fresh.write_bytes(b"in flight")
    long_ago = time.time() - local_mod.STALE_TEMP_S - 60
    os.utime(stale, (long_ago, long_ago))
    LocalObjectStore(tmp_path / "o")
    assert not stale.exists() and fresh.exists()
    assert store.list("") == ["1/0/0.blk"] and store.get("1/0/0.blk") == b"x"


_STRACE_SCRIPT = """
import os, sys
from woodpecker_idem.objectstore import LocalObjectStore
store = LocalObjectStore(sys.argv[1])
store.put("warm/0", b"x")  # directories exist
os.access("/wp-mark-create", os.F_OK)
store.put("warm/1", b"y", if_none_match=True)
os.access("/wp-mark-replace", os.F_OK)
store.put("warm/1", b"z")
os.access("/wp-mark-newdir", os.F_OK)
store.put("new/dir/0", b"z")
os.access("/wp-mark-end", os.F_OK)
"""


def _syscalls(trace: str, start: str, end: str) -> list[str]:
    """The traced calls between two markers, as 'datasync', 'link', 'replace', 'fsync-dir'."""
    lines = trace[trace.index(f"/wp-mark-{start}") : trace.index(f"/wp-mark-{end}")].splitlines()
    fds: dict[str, str] = {}  # fd -> "file" | "dir"
    out: list[str] = []
    for line in lines[1:]:
        call = line.split(None, 1)[1]
        if call.startswith("openat(") and "= " in call:
            fds[call.rsplit("= ", 1)[1].strip()] = "file" if "O_CREAT" in call else "dir"
        elif call.startswith("fdatasync("):
            out.append("datasync" if fds.get(call[10:].split(")")[0]) == "file" else "?")
        elif call.startswith("fsync("):
            out.append("fsync-dir" if fds.get(call[6:].split(")")[0]) == "dir" else "fsync")
        elif call.startswith(("link(", "linkat(")):
            out.append("link")
        elif call.startswith(("rename(", "renameat(", "renameat2(")):
            out.append("replace")
    return out


def test_local_put_is_fsynced_before_publish(tmp_path: Path) -> None:
    """The file's data is synced before its name is published, the directory after: the real
    system calls, traced with strace (the put runs natively, out of reach of monkeypatching)."""
    import shutil
    import subprocess
    import sys

    strace = shutil.which("strace")
    assert strace, "strace is needed for this test (Debian: apt-get install strace)"
    out = tmp_path / "trace"
    subprocess.run(
        [
            strace, "-f", "-o", str(out),
            "-e", "trace=openat,fdatasync,fsync,link,linkat,rename,renameat,renameat2,"
            "access,faccessat",
            sys.executable, "-c", _STRACE_SCRIPT, str(tmp_path / "o"),
        ],
        check=True,
        timeout=60,
    )  # fmt: skip
    trace = out.read_text()
    assert _syscalls(trace, "create", "replace") == ["datasync", "link", "fsync-dir"]
    assert _syscalls(trace, "replace", "newdir") == ["datasync", "replace", "fsync-dir"]
    new_dir = _syscalls(trace, "newdir", "end")  # new directories: their parents are synced too
    assert new_dir.count("fsync-dir") == 3 and new_dir[-3:] == ["datasync", "replace", "fsync-dir"]
    assert LocalObjectStore(tmp_path / "o").get("new/dir/0") == b"z"


def test_local_reader_never_sees_partial_content(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "o")
    values = [bytes([65 + i]) * (2 * MiB - i * 4096) for i in range(3)]
    store.put("hot", values[0])
    stop = threading.Event()
    seen: dict[int, int] = {}
    bad: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            got = store.get("hot")
            if got is None or got not in values:
                bad.append("missing" if got is None else f"partial/mixed len={len(got)}")
                return
            seen[got[0]] = seen.get(got[0], 0) + 1

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    deadline = time.monotonic() + 2.0
    i = 0
    while time.monotonic() < deadline and not bad:
        i += 1
        store.put("hot", values[i % len(values)])
    stop.set()
    for t in readers:
        t.join(timeout=10)
    assert not bad, bad
    assert i > 3 and len(seen) >= 2, (i, seen)


def test_local_key_below_object_or_over_directory(tmp_path: Path) -> None:
    """A file cannot also be a directory locally: clear errors instead of OS errors."""
    store = LocalObjectStore(tmp_path / "o")
    store.put("f", b"file")
    with pytest.raises(InvalidArgumentError, match="key"):
        store.put("f/g", b"x")
    store.put("d/e", b"x")
    with pytest.raises(InvalidArgumentError, match="key"):
        store.put("d", b"x", if_none_match=True)
    with pytest.raises(InvalidArgumentError, match="key"):
        store.put("d", b"x")


def test_open_object_store_factory(tmp_path: Path) -> None:
    from woodpecker_idem.errors import ConfigError

    store = open_object_store("local", path=str(tmp_path), root="tenant-a")
    store.put("k", b"v")
    assert (tmp_path / "tenant-a" / "k").read_bytes() == b"v"
    with pytest.raises(ConfigError, match="objectstore.type"):
        open_object_store("gcs", path=str(tmp_path))
    with pytest.raises(ConfigError, match="path"):
        open_object_store("local")
    with pytest.raises(ConfigError, match="bucket"):
        open_object_store("s3", endpoint_url="http://127.0.0.1:1")


# --- S3 only -------------------------------------------------------------------------------------


def _fresh_s3(server: Any, **kw: Any) -> Any:
    return open_object_store(
        "s3",
        endpoint_url=server.endpoint_url,
        bucket=f"wp-test-{uuid.uuid4().hex[:16]}",
        access_key="testing",
        secret_key="testing",
        create_bucket=True,
        **kw,
    )


@pytest.mark.s3
def test_s3_unreachable_endpoint_raises_in_bounded_time() -> None:
    from serverproc import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"
    store = open_object_store(
        "s3",
        endpoint_url=endpoint,
        bucket="nothing-here",
        access_key="testing",
        secret_key="testing",
        retry_budget_s=1.0,
        connect_timeout_s=0.5,
    )
    t0 = time.monotonic()
    with pytest.raises(StorageUnavailableError, match=endpoint) as info:
        store.put("k", b"x", if_none_match=True)
    assert time.monotonic() - t0 < 3.0
    assert info.value.retriable and info.value.code == "STORAGE_UNAVAILABLE"


@pytest.mark.s3
def test_s3_frozen_server_raises_then_recovers(s3_server: Any) -> None:
    store = _fresh_s3(s3_server, connect_timeout_s=0.5, read_timeout_s=0.5, retry_budget_s=2.0)
    store.put("before", b"ok")
    sends: list[str] = []
    store.client.meta.events.register(
        "before-send.s3.PutObject", lambda request, **_: sends.append(request.url)
    )
    s3_server.freeze()
    try:
        t0 = time.monotonic()
        with pytest.raises(StorageUnavailableError, match=s3_server.endpoint_url) as info:
            store.put("during", b"x")
        elapsed = time.monotonic() - t0
        # Budget 2 s, plus at most one attempt (0.5 s read + botocore's 1 s 100-continue wait).
        assert 2.0 <= elapsed < 5.0, elapsed
        assert "put" in str(info.value)
        # botocore made no hidden retries: every HTTP send was one of our counted attempts.
        attempts = int(str(info.value).split(" attempt(s)")[0].rsplit(" ", 1)[-1])
        assert attempts >= 2 and len(sends) == attempts, (attempts, sends)
        with pytest.raises(StorageUnavailableError, match="get"):
            store.get("before")
    finally:
        s3_server.thaw()
    assert store.put("after", b"back", if_none_match=True) is True
    assert store.get("after") == b"back"
    assert store.get("before") == b"ok"
    store.close()


@pytest.mark.s3
def test_s3_outage_during_conditional_put_resolves_to_our_bytes(s3_server: Any) -> None:
    """Attempts time out (ambiguously) while the server is frozen; the put must still end True
    with our bytes. (Against moto the timed-out requests are dropped when the connection resets,
    so the 412-after-ambiguity path itself is covered by the fault-injection tests below.)"""
    store = _fresh_s3(
        s3_server,
        connect_timeout_s=0.3,
        read_timeout_s=0.3,
        retry_budget_s=20.0,
        backoff_initial_s=0.1,
        backoff_max_s=0.2,
    )
    store.put("warm", b"x")
    data = os.urandom(4096)
    result: list[bool | BaseException] = []

    def put() -> None:
        try:
            result.append(store.put("amb/0.blk", data, if_none_match=True))
        except BaseException as exc:  # noqa: BLE001
            result.append(exc)

    s3_server.freeze()
    try:
        t = threading.Thread(target=put)
        t.start()
        time.sleep(1.6)  # >= 1 attempt times out (1 s 100-continue wait + 0.3 s read)
    finally:
        s3_server.thaw()
    t.join(timeout=30)
    assert result == [True]
    assert store.get("amb/0.blk") == data
    store.close()


class _FaultyClient:
    """Wraps a boto3 client; `put_object` faults are scripted per call."""

    def __init__(self, real: Any, script: list[Any]) -> None:
        self._real = real
        self._script = script
        self.put_calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def put_object(self, **kwargs: Any) -> Any:
        self.put_calls += 1
        step = self._script.pop(0) if self._script else None
        if step is None:
            return self._real.put_object(**kwargs)
        return step(self._real, kwargs)


def _read_timeout() -> Exception:
    from botocore.exceptions import ReadTimeoutError

    return ReadTimeoutError(endpoint_url="http://fault-injected")


def _client_error(code: str, status: int) -> Exception:
    from botocore.exceptions import ClientError

    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


def _faulty_store(server: Any, script: list[Any]) -> tuple[Any, _FaultyClient]:
    base = _fresh_s3(server, retry_budget_s=10.0, backoff_initial_s=0.01)
    base.ensure_bucket()
    faulty = _FaultyClient(base.client, script)
    store = open_object_store(
        "s3",
        endpoint_url=server.endpoint_url,
        bucket=base.bucket,
        access_key="testing",
        secret_key="testing",
        retry_budget_s=10.0,
        backoff_initial_s=0.01,
    )
    store.client = faulty
    return store, faulty


@pytest.mark.s3
def test_s3_ambiguous_put_that_landed_returns_true(
    s3_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def landed_then_lost_reply(real: Any, kwargs: dict[str, Any]) -> Any:
        real.put_object(**kwargs)
        raise _read_timeout()

    store, faulty = _faulty_store(s3_server, [landed_then_lost_reply])
    with caplog.at_level(logging.INFO, logger="woodpecker_idem.objectstore.s3"):
        assert store.put("b/0.blk", b"ours", if_none_match=True) is True
    assert faulty.put_calls == 2
    assert "our put landed" in caplog.text
    assert store.get("b/0.blk") == b"ours"


@pytest.mark.s3
def test_s3_ambiguous_put_lost_to_another_writer_returns_false(s3_server: Any) -> None:
    def other_writer_wins(real: Any, kwargs: dict[str, Any]) -> Any:
        real.put_object(Bucket=kwargs["Bucket"], Key=kwargs["Key"], Body=b"theirs")
        raise _read_timeout()

    store, faulty = _faulty_store(s3_server, [other_writer_wins])
    assert store.put("b/0.blk", b"ours", if_none_match=True) is False
    assert faulty.put_calls == 2
    assert store.get("b/0.blk") == b"theirs"


@pytest.mark.s3
def test_s3_unambiguous_failure_then_412_is_false_even_for_equal_bytes(s3_server: Any) -> None:
    """Connect failures never sent the request: a later 412 is someone else's object."""
    from botocore.exceptions import EndpointConnectionError

    def other_writer_then_refused(real: Any, kwargs: dict[str, Any]) -> Any:
        real.put_object(Bucket=kwargs["Bucket"], Key=kwargs["Key"], Body=kwargs["Body"])
        raise EndpointConnectionError(endpoint_url="http://fault-injected")

    store, _ = _faulty_store(s3_server, [other_writer_then_refused])
    assert store.put("b/0.blk", b"same", if_none_match=True) is False


@pytest.mark.s3
def test_s3_conditional_conflict_409_is_retried(s3_server: Any) -> None:
    def conflict(real: Any, kwargs: dict[str, Any]) -> Any:
        raise _client_error("ConditionalRequestConflict", 409)

    store, faulty = _faulty_store(s3_server, [conflict, conflict])
    assert store.put("c/0.blk", b"ours", if_none_match=True) is True
    assert faulty.put_calls == 3

    def conflict_other_won(real: Any, kwargs: dict[str, Any]) -> Any:
        real.put_object(Bucket=kwargs["Bucket"], Key=kwargs["Key"], Body=kwargs["Body"])
        raise _client_error("ConditionalRequestConflict", 409)

    store2, _ = _faulty_store(s3_server, [conflict_other_won])
    assert store2.put("c/1.blk", b"same", if_none_match=True) is False


@pytest.mark.s3
def test_s3_5xx_and_throttling_retried_then_budget_exhausted(s3_server: Any) -> None:
    def throttled(real: Any, kwargs: dict[str, Any]) -> Any:
        raise _client_error("SlowDown", 503)

    store, faulty = _faulty_store(s3_server, [throttled, throttled])
    assert store.put("t/0", b"x") is True
    assert faulty.put_calls == 3

    store2, faulty2 = _faulty_store(s3_server, [throttled] * 1000)
    store2.retry_budget_s = 0.5
    t0 = time.monotonic()
    with pytest.raises(StorageUnavailableError, match="SlowDown"):
        store2.put("t/1", b"x")
    assert time.monotonic() - t0 < 2.0
    assert faulty2.put_calls > 2


@pytest.mark.s3
def test_s3_non_retriable_error_is_not_retried(s3_server: Any) -> None:
    def denied(real: Any, kwargs: dict[str, Any]) -> Any:
        raise _client_error("AccessDenied", 403)

    store, faulty = _faulty_store(s3_server, [denied] * 10)
    with pytest.raises(StorageAccessError, match="AccessDenied") as info:
        store.put("d/0", b"x")
    assert faulty.put_calls == 1
    assert store.bucket in str(info.value) and "credentials" in str(info.value)
    assert not info.value.retriable


@pytest.mark.s3
def test_s3_root_prefix_isolates_stores(s3_server: Any) -> None:
    a = _fresh_s3(s3_server, root="tenant-a/")
    b = open_object_store(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        bucket=a.bucket,
        root="tenant-b",
        access_key="testing",
        secret_key="testing",
    )
    a.put("k", b"a")
    b.put("k", b"b")
    assert a.list("") == ["k"] and b.list("") == ["k"]
    assert a.get("k") == b"a" and b.get("k") == b"b"
    raw = a.client.list_objects_v2(Bucket=a.bucket)["Contents"]
    assert sorted(o["Key"] for o in raw) == ["tenant-a/k", "tenant-b/k"]
    assert a.delete_prefix("") == 1
    assert b.get("k") == b"b"


@pytest.mark.s3
def test_s3_list_paginates(s3_server: Any) -> None:
    store = _fresh_s3(s3_server)
    keys = [f"p/{i:05d}" for i in range(1003)]  # more than one 1000-key page
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put(k, b""), keys))
    pages: list[int] = []
    store.client.meta.events.register(
        "after-call.s3.ListObjectsV2",
        lambda parsed, **_: pages.append(len(parsed.get("Contents", []))),
    )
    assert store.list("p/") == keys
    assert pages == [1000, 3]
    assert store.delete_prefix("p/") == 1003
    assert store.list("") == []


def test_import_does_not_load_boto3() -> None:
    import subprocess
    import sys

    code = (
        "import sys, woodpecker_idem.objectstore as o; "
        "assert 'boto3' not in sys.modules and 'botocore' not in sys.modules; "
        "o.S3ObjectStore; assert 'woodpecker_idem.objectstore.s3' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ.copy())
