"""etcd specifics of the metadata store (the shared contract is tests/meta/test_meta_contract.py):
deadlines against a frozen or stopped etcd, coming back by itself, the writer's etcd lease, the
store identity, closing and pickling. Fault tests start their own etcd (stopped by PID)."""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Iterator

import pytest
from etcdserver import EtcdServer
from serverproc import free_port

import woodpecker_idem as wp
from woodpecker_idem.errors import (
    ClientClosedError,
    InvalidArgumentError,
    StorageUnavailableError,
    WriterFencedError,
)
from woodpecker_idem.meta import open_metadata_store
from woodpecker_idem.meta.etcd import EtcdMetadataStore

NOW = 1_700_000_000_000


@pytest.fixture
def own_etcd() -> Iterator[EtcdServer]:
    """An etcd for this test alone: it may be frozen, stopped or restarted."""
    server = EtcdServer().start()
    try:
        yield server
    finally:
        server.stop()


def _open(server: EtcdServer, prefix: str, timeout_ms: int = 5000) -> EtcdMetadataStore:
    store = open_metadata_store(
        "etcd", endpoints=[server.endpoint], prefix=prefix, timeout_ms=timeout_ms
    )
    assert isinstance(store, EtcdMetadataStore)
    return store


def _writer_key(prefix: str, server: EtcdServer, log_id: int) -> dict | None:
    """The raw `writers/{log_id}` key (owner + lease), read over HTTP like any client would."""
    import base64
    import json
    import urllib.request

    key = f"{prefix}/#/writers/{log_id:020d}".encode()  # the documented key layout
    body = json.dumps({"key": base64.b64encode(key).decode()}).encode()
    req = urllib.request.Request(f"http://{server.endpoint}/v3/kv/range", data=body)
    with urllib.request.urlopen(req, timeout=5) as resp:
        kvs = json.loads(resp.read()).get("kvs", [])
    return kvs[0] if kvs else None


def test_frozen_etcd_fails_each_call_after_its_deadline_then_recovers(own_etcd, etcd_prefix):
    """Each call waits out one deadline (meta.timeout_ms), not several: counted as the
    deadlines the gateway started and their budgets, so a busy machine, which only makes a
    call slower, neither fails nor passes it (the wall clock only bounds it below)."""
    store = _open(own_etcd, etcd_prefix, timeout_ms=500)
    m = store.create_log("a", NOW)
    epoch = store.take_over(m.log_id, "A", NOW, 5000)
    gateway = store._gw
    deadlines: list[float] = []  # the budget of each gateway call this thread made
    real_call = gateway.call
    me = threading.get_ident()

    def counted(*args, **kwargs):
        if threading.get_ident() == me:  # not the lease keeper's keep-alives
            deadlines.append(gateway.timeout_s)
        return real_call(*args, **kwargs)

    gateway.call = counted  # type: ignore[method-assign]
    own_etcd.freeze()
    try:
        for call in (
            lambda: store.get_log("a"),
            lambda: store.check_epoch(m.log_id, epoch),
            lambda: store.renew_lease(m.log_id, epoch, "A", NOW, 5000),
        ):
            deadlines.clear()
            started = time.monotonic()
            with pytest.raises(StorageUnavailableError) as info:
                call()
            took = time.monotonic() - started
            assert took > 0.4, f"failed after {took:.3f} s, before its 500 ms deadline"
            assert deadlines == [0.5], f"the call spent {len(deadlines)} deadlines: {deadlines}"
            assert info.value.retriable
            assert own_etcd.endpoint in str(info.value) and "500 ms" in str(info.value)
    finally:
        own_etcd.thaw()
        gateway.call = real_call  # type: ignore[method-assign]
    store.check_epoch(m.log_id, epoch)  # the same handle works again, by itself
    assert store.get_log("a").writer_epoch == epoch
    store.close()


def test_stopped_etcd_fails_clearly_and_a_restart_is_picked_up(own_etcd, etcd_prefix):
    store = _open(own_etcd, etcd_prefix, timeout_ms=400)
    m = store.create_log("a", NOW)
    own_etcd.terminate()  # down, same ports and data kept for the restart
    with pytest.raises(StorageUnavailableError, match=own_etcd.endpoint):
        store.list_logs()
    own_etcd.start()
    assert store.get_log("a") == m  # what was committed survived; no reconnect call needed
    store.close()


def test_a_restart_within_the_deadline_is_invisible(own_etcd, etcd_prefix):
    store = _open(own_etcd, etcd_prefix, timeout_ms=20_000)
    m = store.create_log("a", NOW)
    own_etcd.restart(down_s=0.5)
    epoch = store.take_over(m.log_id, "A", NOW, 5000)  # connection refused, then retried
    assert store.get_log("a").writer_epoch == epoch == 1
    store.close()


def test_unreachable_endpoint_at_connect_names_it(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(StorageUnavailableError, match=endpoint):
        wp.connect(
            tmp_path, {"meta.type": "etcd", "meta.endpoints": [endpoint], "meta.timeout_ms": 300}
        )
    assert time.monotonic() - started < 3


def test_second_endpoint_serves_when_the_first_is_dead(etcd_server, etcd_prefix):
    dead = f"127.0.0.1:{free_port()}"
    store = open_metadata_store(
        "etcd", endpoints=[dead, etcd_server.endpoint], prefix=etcd_prefix, timeout_ms=3000
    )
    assert store.create_log("a", NOW).name == "a"
    store.close()


def test_bad_arguments_are_refused():
    for endpoints in (["nohost"], ["h:port"], ["ftp://h:1"], "h:2379", []):
        with pytest.raises(InvalidArgumentError):
            EtcdMetadataStore(endpoints)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="prefix"):
        EtcdMetadataStore(["h:1"], "woodpecker")
    for timeout in (0, -5, True, 1.5):
        with pytest.raises(InvalidArgumentError, match="timeout_ms"):
            EtcdMetadataStore(["h:1"], timeout_ms=timeout)  # type: ignore[arg-type]


def test_store_id_is_created_once_per_prefix(etcd_server, etcd_prefix):
    a = _open(etcd_server, etcd_prefix)
    b = _open(etcd_server, etcd_prefix)
    other = _open(etcd_server, etcd_prefix + "-other")
    assert a.store_id() == b.store_id() != other.store_id()
    assert len(a.store_id()) == 36
    for s in (a, b, other):
        s.close()


def test_writer_lease_is_kept_alive_and_revoked_on_close(etcd_server, etcd_prefix):
    store = _open(etcd_server, etcd_prefix)
    m = store.create_log("a", NOW)
    store.take_over(m.log_id, "A", NOW, 2000)  # an etcd lease of 2 s
    first = _writer_key(etcd_prefix, etcd_server, m.log_id)
    assert first is not None and first["lease"] != "0"
    time.sleep(3.5)  # well past the TTL: only the keep-alive thread keeps it
    kept = _writer_key(etcd_prefix, etcd_server, m.log_id)
    assert kept is not None and kept["lease"] == first["lease"]
    # A take-over from another store moves the key to its lease, and fences this one.
    other = _open(etcd_server, etcd_prefix)
    e2 = other.take_over(m.log_id, "B", NOW, 2000)
    moved = _writer_key(etcd_prefix, etcd_server, m.log_id)
    assert moved is not None and moved["lease"] != first["lease"]
    with pytest.raises(WriterFencedError):
        store.renew_lease(m.log_id, e2 - 1, "A", NOW, 2000)
    other.close()  # revokes B's lease: the key goes with it
    assert _writer_key(etcd_prefix, etcd_server, m.log_id) is None
    assert store.get_log("a").writer_epoch == e2  # the epoch is not tied to any lease
    store.close()


def test_lease_keeper_survives_an_outage_and_replaces_an_expired_lease(own_etcd, etcd_prefix):
    store = _open(own_etcd, etcd_prefix, timeout_ms=300)
    m = store.create_log("a", NOW)
    store.take_over(m.log_id, "A", NOW, 2000)
    before = _writer_key(etcd_prefix, own_etcd, m.log_id)
    assert before is not None
    own_etcd.freeze()
    time.sleep(3.0)  # keep-alives fail (counted), and the 2 s lease runs out meanwhile
    own_etcd.thaw()
    deadline = time.monotonic() + 10
    after = None
    while time.monotonic() < deadline:
        after = _writer_key(etcd_prefix, own_etcd, m.log_id)
        if after is not None and after["lease"] != before["lease"]:
            break
        time.sleep(0.1)
    assert store.lease_errors > 0
    assert after is not None and after["lease"] != before["lease"], (before, after)
    assert after["value"] == before["value"]  # same owner, new lease
    store.close()


def test_an_expired_lease_is_replaced_only_while_the_epoch_holds(etcd_server, etcd_prefix):
    """What the keeper does when it finds a writer's lease expired (`_replace_lease`): attach a
    new lease to the `writers` key only if the epoch it was granted for is still the log's. A
    store whose writer was fenced meanwhile leaves the new writer's key alone (else the key
    would move to the fenced process's lease and vanish when that process goes) and stops
    keeping a lease for the log; the writer that holds the epoch gets its new lease."""
    a, b = _open(etcd_server, etcd_prefix), _open(etcd_server, etcd_prefix)
    try:
        m = a.create_log("relet", NOW)
        fenced = a.take_over(m.log_id, "A", NOW, 60_000)
        current = b.take_over(m.log_id, "B", NOW, 60_000)
        held = _writer_key(etcd_prefix, etcd_server, m.log_id)
        assert held is not None and held["value"] != ""
        a._replace_lease(m.log_id, fenced, 60)  # noqa: SLF001 - the keeper's step, driven here
        assert _writer_key(etcd_prefix, etcd_server, m.log_id) == held
        assert m.log_id not in a._leases._leases  # noqa: SLF001
        a.close()  # revokes whatever A still holds: B's key stays
        assert _writer_key(etcd_prefix, etcd_server, m.log_id) == held
        b._replace_lease(m.log_id, current, 60)  # noqa: SLF001 - B holds the epoch: replaced
        now = _writer_key(etcd_prefix, etcd_server, m.log_id)
        assert now is not None and now["value"] == held["value"] and now["lease"] != held["lease"]
    finally:
        a.close()
        b.close()


def test_closed_store_refuses_calls(etcd_server, etcd_prefix):
    store = _open(etcd_server, etcd_prefix)
    store.close()
    with pytest.raises(ClientClosedError, match="closed") as info:
        store.list_logs()
    assert not info.value.retriable


def test_store_pickles_as_a_reopen(etcd_server, etcd_prefix):
    store = _open(etcd_server, etcd_prefix, timeout_ms=1234)
    store.create_log("a", NOW)
    copy = pickle.loads(pickle.dumps(store))
    assert copy is not store and copy.store_id() == store.store_id()
    assert copy.get_log("a") == store.get_log("a")
    copy.close()
    store.close()


def test_threads_share_connections(etcd_server, etcd_prefix):
    """Short-lived threads (a writer's workers, Spark tasks) must not each keep a connection open:
    one pool per endpoint serves them all."""
    import threading

    import psutil

    store = _open(etcd_server, etcd_prefix)
    store.create_log("a", NOW)
    port = int(etcd_server.endpoint.rsplit(":", 1)[1])

    def use() -> None:
        store.get_log("a")

    for _ in range(40):
        t = threading.Thread(target=use)
        t.start()
        t.join()
    proc = psutil.Process()
    listing = getattr(proc, "net_connections", None) or proc.connections  # psutil < 6
    conns = [
        c
        for c in listing(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    ]
    assert len(conns) <= 4, len(conns)
    store.close()


def test_close_with_etcd_frozen_takes_one_deadline(own_etcd, etcd_prefix):
    """close() revokes this store's leases, best effort: once etcd does not answer, the rest are
    left to expire instead of waiting a deadline each."""
    store = _open(own_etcd, etcd_prefix, timeout_ms=500)
    for name in "abcde":
        store.take_over(store.create_log(name, NOW).log_id, "A", NOW, 30_000)
    own_etcd.freeze()
    try:
        started = time.monotonic()
        store.close()
        took = time.monotonic() - started
    finally:
        own_etcd.thaw()
    assert took < 1.5, took
