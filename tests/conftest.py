"""Shared pytest fixtures."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# --- object storage (tests/s3server.py, python/woodpecker_idem/objectstore) ----------------------

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


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def object_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    """The same contract against a local directory and against S3 (a fresh bucket per test)."""
    from woodpecker_idem.objectstore import open_object_store

    if request.param == "local":
        store = open_object_store("local", path=str(tmp_path / "objects"))
    else:
        server = request.getfixturevalue("s3_server")
        store = open_object_store(
            "s3",  # root exercises key prefixing
            endpoint_url=server.endpoint_url,
            bucket=f"wp-test-{uuid.uuid4().hex[:16]}",
            root="root",
            access_key=S3_TEST_ACCESS_KEY,
            secret_key=S3_TEST_SECRET_KEY,
            retry_budget_s=10.0,
            create_bucket=True,
        )
    try:
        yield store
    finally:
        store.close()


# --- the log client (tests/test_log_*.py) --------------------------------------------------------


@pytest.fixture
def wp_connect() -> Iterator[object]:
    """A factory `wp_connect(data_dir, config=None, **kw)` for clients closed at teardown."""
    from woodpecker_idem.client.client import connect

    opened: list[object] = []

    def factory(data_dir: object, config: object = None, **kwargs: object) -> object:
        client = connect(data_dir, config, **kwargs)
        opened.append(client)
        return client

    yield factory
    for client in reversed(opened):
        try:
            client.close()
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass
