"""Shared pytest fixtures. The tests are in a folder per layer (core, logstore, writer, client,
idempotency, meta, objectstore, spark, e2e); their shared helpers (servers started by PID,
fault gates, child processes) are in `support/`, importable by name from every test."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Helpers by name from every test (`from gate import gate`); a few tests also take helpers of
# another test module (`from test_store_namespaces import s3_config`), so every folder is on the
# path, as when the tests were one folder (test module names are unique across folders).
_HERE = Path(__file__).resolve().parent
for _folder in sorted(p for p in _HERE.iterdir() if p.is_dir() and p.name.isidentifier()):
    sys.path.insert(0, str(_folder))
sys.path.insert(0, str(_HERE / "support"))

# --- the order of the files ----------------------------------------------------------------------

# `scripts/test` runs the suite in two workers, a file at a time each, in collection order
# (`--dist loadfile --no-loadscope-reorder`). The files that take longest go first, longest first,
# so that the two workers end together instead of one running a long file alone at the end. The
# order comes from the `--durations` list of CI runs; a file missing here only runs later.
_LONGEST_FIRST = (
    "e2e/test_cluster.py",
    "e2e/test_idem_campaign.py",
    "e2e/test_staged_service.py",
    "client/test_processor.py",
    "spark/test_spark_pipeline_kill.py",
    "spark/test_spark_txn.py",
    "e2e/test_service_faults.py",
    "client/test_named_readers.py",
    "e2e/test_shared_etcd_s3.py",
    "spark/test_spark_kept.py",
    "spark/test_spark_kill.py",
    "spark/test_pipeline.py",
    "spark/test_spark_sink.py",
    "spark/test_spark_source.py",
    "spark/test_spark_discovery.py",
    "idempotency/test_idem_stateful.py",
    "client/test_group_writer.py",
    "spark/test_spark_shared.py",
    "spark/test_spark_options.py",
    "spark/test_spark_defaults.py",
    "e2e/test_harness.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    last = len(_LONGEST_FIRST)

    def key(item: pytest.Item) -> int:
        return rank.get(item.nodeid.split("::", 1)[0].removeprefix("tests/"), last)

    items.sort(key=key)  # stable: the files not named keep their order, and so do the tests


# --- object storage (support/s3server.py, python/woodpecker_idem/objectstore) ---------------------

S3_TEST_ACCESS_KEY = "testing"
S3_TEST_SECRET_KEY = "testing"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[object]:
    """One moto S3 server process for the whole session (stopped by PID at the end)."""
    from s3server import MotoS3Server

    server = MotoS3Server().start()
    try:
        yield server
    finally:
        server.stop()


def _open_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    from woodpecker_idem.objectstore import open_object_store

    if kind == "local":
        return open_object_store("local", path=str(tmp_path / "objects"))
    server = request.getfixturevalue("s3_server")
    return open_object_store(
        "s3",  # root exercises key prefixing
        endpoint_url=server.endpoint_url,
        bucket=f"wp-test-{uuid.uuid4().hex[:16]}",
        root="root",
        access_key=S3_TEST_ACCESS_KEY,
        secret_key=S3_TEST_SECRET_KEY,
        retry_budget_s=10.0,
        create_bucket=True,
    )


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def object_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The same contract against a local directory and against S3 (a fresh bucket per test)."""
    store = _open_store(request.param, request, tmp_path)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def s3_object_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """An S3 store on a fresh bucket, for what only S3 has (multipart uploads)."""
    store = _open_store("s3", request, tmp_path)
    try:
        yield store
    finally:
        store.close()


# --- etcd (support/etcdserver.py, python/woodpecker_idem/meta/etcd.py) ----------------------------


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[object]:
    """One etcd process for the whole session (stopped by PID at the end). Tests keep apart by
    key prefix (`etcd_prefix`); a test that stops, freezes or restarts etcd starts its own."""
    from etcdserver import EtcdServer

    server = EtcdServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd_prefix() -> str:
    """A key prefix no other test uses."""
    return f"/wp-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def service_cluster(etcd_server: Any, s3_server: Any) -> Iterator[object]:
    """Three LogStore node processes with staged storage over the session's etcd and S3 server
    (support/servicecluster.py), for the whole session: its tests share one metadata store and
    keep apart by log name. Stopped by PID at the end."""
    from servicecluster import ServiceCluster

    cluster = ServiceCluster(etcd_server.endpoint, s3_server.endpoint_url).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def deployment(request: pytest.FixtureRequest) -> Callable[[str], dict[str, object]]:
    """`deployment(kind)`: the config keys of a deployment for this test: "sqlite" (embedded,
    no keys), "etcd" (the session server, under a prefix of the test's own), "etcd+s3" (the
    shared deployment: etcd, and objects in a fresh bucket of the session's moto S3 server) or
    "service" (service mode: the session's `service_cluster`, shared by every test using it, so
    such a test names its logs uniquely)."""

    def config(kind: str) -> dict[str, object]:
        if kind == "sqlite":
            return {}
        if kind == "service":
            return dict(request.getfixturevalue("service_cluster").config)
        server = request.getfixturevalue("etcd_server")
        cfg: dict[str, object] = {
            "meta.type": "etcd",
            "meta.endpoints": [server.endpoint],
            "meta.prefix": request.getfixturevalue("etcd_prefix"),
        }
        if kind == "etcd+s3":
            import boto3

            s3 = request.getfixturevalue("s3_server")
            monkeypatch = request.getfixturevalue("monkeypatch")
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_TEST_ACCESS_KEY)
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_TEST_SECRET_KEY)
            monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
            bucket = f"wp-test-{uuid.uuid4().hex[:16]}"
            boto3.client("s3", endpoint_url=s3.endpoint_url).create_bucket(Bucket=bucket)
            cfg |= {
                "objectstore.type": "s3",
                "objectstore.endpoint_url": s3.endpoint_url,
                "objectstore.bucket": bucket,
            }
        return cfg

    return config


@pytest.fixture(params=["sqlite"])
def meta_config(
    request: pytest.FixtureRequest, deployment: Callable[[str], dict[str, object]]
) -> dict[str, object]:
    """Config keys selecting the deployment (`deployment`): SQLite (the default, no keys) unless
    a test asks for more with `@pytest.mark.parametrize("meta_config", [...], indirect=True)`;
    a module may override it with params of its own."""
    return deployment(request.param)


# --- the log client (tests/test_log_*.py) --------------------------------------------------------


@pytest.fixture
def wp_connect() -> Iterator[object]:
    """A factory `wp_connect(data_dir, config=None, **kw)` for clients closed at teardown."""
    from woodpecker_idem.connect import connect

    opened: list[object] = []

    def factory(data_dir: object, config: object = None, **kwargs: object) -> object:
        client = connect(data_dir, config, **kwargs)
        opened.append(client)
        return client

    yield factory
    errors: list[str] = []
    for client in reversed(opened):
        try:
            client.close()
        except Exception as exc:  # noqa: BLE001 - every client is closed, then the test fails
            errors.append(f"{type(exc).__name__}: {exc}")
    if errors:
        pytest.fail("client.close() failed at teardown:\n  " + "\n  ".join(errors))
