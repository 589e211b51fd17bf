"""etcd TLS and authentication (issue 22 item 5): meta.ca_cert, meta.client_cert, meta.client_key,
meta.user and meta.password, against an etcd serving https with client-certificate auth and an
etcd with user authentication enabled. Bad credentials fail at connect() with StorageAccessError
naming the key to change, at once (not after meta.timeout_ms of retries)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from etcdserver import EtcdServer
from etcdtls import EtcdTlsServer, Pki, enable_auth, make_pki

import woodpecker_idem as wp
from woodpecker_idem.errors import ConfigError, StorageAccessError

PASSWORD = "s3cret-pw"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_etcd(pki: Pki) -> Iterator[EtcdTlsServer]:
    server = EtcdTlsServer(pki).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def auth_etcd() -> Iterator[EtcdServer]:
    server = EtcdServer().start()
    try:
        enable_auth(server, PASSWORD)
        yield server
    finally:
        server.stop()


def _use(client: wp.WoodpeckerClient) -> None:
    """A log written (take-over, lease keep-alive, segment records) and read back."""
    writer = client.open_log("secure", create=True).open_writer(idempotent=True)
    writer.write(b"a", idempotency_id="a")
    assert writer.write(b"a", idempotency_id="a").duplicate
    writer.close()
    assert [m.payload for m in client.open_log("secure").open_reader()] == [b"a"]


def test_tls_with_a_client_certificate(tls_etcd: EtcdTlsServer, pki: Pki, tmp_path: Path) -> None:
    config = {
        "meta.type": "etcd",
        "meta.endpoints": [tls_etcd.endpoint],  # host:port: https, since a CA is given
        "meta.ca_cert": pki.ca,
        "meta.client_cert": pki.client_cert,
        "meta.client_key": pki.client_key,
    }
    with wp.connect(tmp_path, config) as client:
        _use(client)
        store_id = client.store_id()
    with wp.connect(tmp_path, {**config, "meta.endpoints": [tls_etcd.url]}) as client:
        assert client.store_id() == store_id


def test_tls_refusals_name_what_to_change(
    tls_etcd: EtcdTlsServer, pki: Pki, tmp_path: Path
) -> None:
    base = {"meta.type": "etcd", "meta.endpoints": [tls_etcd.url], "meta.timeout_ms": 60_000}
    with pytest.raises(StorageAccessError, match="meta.ca_cert"):  # the server is not trusted
        wp.connect(tmp_path, {**base, "meta.ca_cert": pki.other_ca})
    with pytest.raises(StorageAccessError, match="meta.client_cert"):  # no client certificate
        wp.connect(tmp_path, {**base, "meta.ca_cert": pki.ca})


def test_user_and_password(auth_etcd: EtcdServer, tmp_path: Path) -> None:
    config = {
        "meta.type": "etcd",
        "meta.endpoints": [auth_etcd.endpoint],
        "meta.user": "root",
        "meta.password": PASSWORD,
    }
    with wp.connect(tmp_path, config) as client:
        _use(client)
        gateway = client.meta._gw  # type: ignore[attr-defined]
        gateway._token = "expired-token"  # etcd's tokens expire: a new one is asked for
        assert client.list_logs() == ["secure"]
        assert gateway._token != "expired-token"


def test_bad_or_missing_credentials(auth_etcd: EtcdServer, tmp_path: Path) -> None:
    base = {"meta.type": "etcd", "meta.endpoints": [auth_etcd.endpoint], "meta.timeout_ms": 60_000}
    with pytest.raises(StorageAccessError, match="refused user 'root'") as info:
        wp.connect(tmp_path, {**base, "meta.user": "root", "meta.password": "wrong"})
    assert "wrong" not in str(info.value)
    with pytest.raises(StorageAccessError, match="meta.user"):
        wp.connect(tmp_path, base)


def test_security_keys_go_in_pairs_and_the_password_is_never_shown() -> None:
    etcd = {"meta.type": "etcd", "meta.endpoints": ["127.0.0.1:2379"]}
    with pytest.raises(ConfigError, match="meta.user and meta.password go together"):
        wp.load_config(overrides={**etcd, "meta.user": "root"})
    with pytest.raises(ConfigError, match="meta.client_cert and meta.client_key"):
        wp.load_config(overrides={**etcd, "meta.client_cert": "/x.pem"})
    cfg = wp.load_config(overrides={**etcd, "meta.user": "root", "meta.password": PASSWORD})
    assert PASSWORD not in repr(cfg)
