"""Service mode: three LogStore node processes (`woodpecker-idem logstore serve`) registered in the
metadata store, a client with `quorum.nodes: registry` and es=3 placing its segments on them over
gRPC; one node SIGKILLed mid-stream and restarted. Judged by the history checker, which reads the
nodes' storage through their RawRead (no engine of the client's), and by the readers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from nodeserver import LogStoreNode

import woodpecker_idem as wp
from woodpecker_idem.errors import NodeUnavailableError
from woodpecker_idem.testing import History, check_history, read_stored

WAIT_S = 60
WINDOW_MS, MAX_KEYS = 600_000, 100_000

SERVICE = {
    "quorum.nodes": "registry",
    "quorum.es": 3,
    "quorum.call_timeout_ms": 5_000,
    "append.timeout_ms": 30_000,
    "segment.max_entries": 90,  # rolls: segments placed again while a node is down
    "storage.fsync": "never",
}


def _until_answers(client, node: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            client.transport.last_add_confirmed(node, 0, 0)
            return
        except NodeUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        time.sleep(0.05)


@pytest.fixture
def nodes(tmp_path: Path):
    # es=3 over three nodes: a segment placed while one is down needs it still registered, so
    # the killed node's registration must outlast the test (test_a_killed_node_leaves... is
    # about it lapsing)
    long_ttl = ("--registry-ttl", "600")
    started = [LogStoreNode(f"n{i}", tmp_path / "data", args=long_ttl).start() for i in range(3)]
    try:
        yield started
    finally:
        for node in started:
            node.stop()


def test_es3_over_three_node_processes_survives_a_node_killed_mid_stream(tmp_path, nodes):
    client = wp.connect(tmp_path / "data", SERVICE)
    try:
        assert client.ensemble.directory.live() == ["n0", "n1", "n2"]
        log = client.open_log("orders", create=True)
        w = log.open_writer(idempotent=True)
        history = History(client.clock)
        killed = threading.Event()

        def write(i: int) -> None:
            key = f"order-{i % 400}"  # every key twice: the second time a duplicate
            history.call(
                wp.explicit_key(key),
                key.encode(),
                lambda: w.write(key.encode(), idempotency_id=key, timeout=WAIT_S),
            )

        for i in range(250):
            write(i)
        nodes[1].kill()  # mid-stream: an entry may be on it alone, unacknowledged
        killed.set()
        for i in range(250, 550):
            write(i)
        nodes[1].start()  # back over its storage, at the same address
        for i in range(550, 800):
            write(i)
        assert len(log.segments()) > 3  # rolled while n1 was down and after
        w.close()
        _until_answers(client, "n1")  # the restarted node, for the checker's read of it
        msgs = list(log.open_reader("earliest"))
        assert len(msgs) == 400
        verdict = check_history(history.attempts, msgs, WINDOW_MS, MAX_KEYS)
        assert verdict.ok, verdict
        stored = read_stored(client, log)  # the nodes' own storage, through RawRead
        assert stored.problems == [], stored.problems
        assert [m.message_id for m in stored.messages] == [m.message_id for m in msgs]
        duplicates = [a for a in history.attempts if a.duplicate]
        assert len(duplicates) == 400
        nodes[2].stop()  # SIGTERM: it deregisters as it leaves (its TTL would take 600 s)
        registered = lambda: [n.node_id for n in client.meta.list_nodes()]  # noqa: E731
        _until(lambda: registered() == ["n0", "n1"], "a node stopped with SIGTERM deregisters")
        assert "stopped" in nodes[2].output()
    finally:
        client.close()
    assert killed.is_set()
    for node in nodes:
        assert "serving on" in node.output()


def test_a_frozen_node_is_passed_at_the_call_deadline_and_a_restart_keeps_its_fences(
    tmp_path, nodes
):
    """SIGSTOP one node of three past `quorum.call_timeout_ms`: its calls fail at the deadline
    (retriable), writes go on at aq=2 without waiting for it, and it is dropped from the segment.
    Then a takeover fences the segments on the nodes; a node restarted after that still refuses
    the old writer's adds (the fence is on its disk, not in its memory)."""
    client = wp.connect(tmp_path / "data", {**SERVICE, "quorum.call_timeout_ms": 2_000})
    try:
        log = client.open_log("frozen", create=True)
        old = log.open_writer(idempotent=True)
        acked = {f"a{i}": old.write(b"a%d" % i, idempotency_id=f"a{i}") for i in range(20)}
        nodes[2].freeze()
        try:
            for i in range(20, 60):
                acked[f"a{i}"] = old.write(b"a%d" % i, idempotency_id=f"a{i}", timeout=WAIT_S)
        finally:
            nodes[2].thaw()
        other = wp.connect(tmp_path / "data", SERVICE)  # another client takes the log over
        try:
            new = other.open_log("frozen").open_writer(idempotent=True)
            nodes[0].kill()
            nodes[0].start()  # restarted: its fences must hold
            _until_answers(client, "n0")
            with pytest.raises(wp.WriterFencedError):
                for i in range(60, 200):  # the old writer's adds meet the fences, on n0 too
                    old.write(b"late%d" % i, idempotency_id=f"late{i}", timeout=WAIT_S)
            assert new.write(b"a0", idempotency_id="a0").duplicate  # the window came along
            new.close()
        finally:
            other.close()
        msgs = list(log.open_reader("earliest"))
        assert [m.payload for m in msgs][:60] == [b"a%d" % i for i in range(60)]
        assert not any(m.payload.startswith(b"late") for m in msgs)
        for key, result in acked.items():
            assert msgs[int(key[1:])].message_id == result.message_id
    finally:
        client.close()


def test_a_client_reaches_tls_nodes_with_the_quorum_tls_keys(tmp_path):
    """`logstore serve --tls-cert/--tls-key/--tls-client-ca` and the client's
    `quorum.tls_ca_cert` / `tls_client_cert` / `tls_client_key`: writes and reads over TLS with
    client certificates; a client without them cannot place a segment there."""
    from etcdtls import make_pki

    pki = make_pki(tmp_path)
    tls_args = (
        "--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--tls-client-ca", pki.ca,
    )  # fmt: skip
    node = LogStoreNode("secure", tmp_path / "data", args=tls_args).start()
    try:
        tls = {
            "quorum.nodes": "registry",
            "quorum.tls_ca_cert": pki.ca,
            "quorum.tls_client_cert": pki.client_cert,
            "quorum.tls_client_key": pki.client_key,
            "quorum.call_timeout_ms": 2_000,
        }
        with wp.connect(tmp_path / "data", tls) as client:
            log = client.open_log("secret", create=True)
            with log.open_writer(idempotent=True) as w:
                first = w.write(b"s", idempotency_id="s")
                assert w.write(b"s", idempotency_id="s") == wp.WriteResult(first.message_id, True)
            assert [m.payload for m in log.open_reader("earliest")] == [b"s"]
        plain = {k: v for k, v in tls.items() if not k.startswith("quorum.tls")}
        plain |= {"append.timeout_ms": 2_000, "append.max_retries": 1}
        with wp.connect(tmp_path / "data", plain) as client:
            w = client.open_log("secret").open_writer()  # metadata only: no node call yet
            with pytest.raises(wp.WoodpeckerError) as refused:
                w.write(b"plain", timeout=WAIT_S)  # the node refuses the handshake
            assert refused.value.retriable
            w.close(timeout=5)
        with wp.connect(tmp_path / "data", tls) as client:
            payloads = [m.payload for m in client.open_log("secret").open_reader("earliest")]
            assert payloads == [b"s"]  # nothing of the plain client's landed
    finally:
        node.stop()


@pytest.mark.parametrize("meta_config", ["sqlite", "etcd"], indirect=True)
def test_a_killed_node_leaves_the_registry_after_its_ttl_and_new_segments_avoid_it(
    tmp_path, meta_config
):
    """Four node processes registered with a short TTL (`logstore serve --registry-ttl`), es=3.
    One is SIGKILLed (it never deregisters): once its registration lapses the client's
    directory drops it, and the next segments (of a new log, whose first segment would start on
    it, and its rolls) are placed on live nodes only. Restarted with the same id, it registers
    again and is placed on again."""
    cfg = {**SERVICE, **meta_config}
    node_cfg = {"storage.fsync": "never", **meta_config}
    ttl = ("--registry-ttl", "5")  # renewed every 1.7 s: a busy machine keeps it
    nodes = [LogStoreNode(f"n{i}", tmp_path / "data", node_cfg, args=ttl) for i in range(4)]
    try:
        for node in nodes:
            node.start()
        client = wp.connect(tmp_path / "data", cfg)
        try:
            live = client.ensemble.directory.live
            _until(lambda: live() == ["n0", "n1", "n2", "n3"], "every node registered")
            nodes[1].kill()
            _until(lambda: live() == ["n0", "n2", "n3"], "the killed node leaves the directory")
            log = client.open_log("after-kill", create=True)
            with log.open_writer(idempotent=True) as w:
                for i in range(200):  # rolls at segment.max_entries: placed three times
                    w.write(b"a%d" % i, idempotency_id=f"a{i}", timeout=WAIT_S)
            placed = [s.nodes for s in log.segments()]
            assert len(placed) >= 3
            assert all("n1" not in nodes_of for nodes_of in placed), placed
            nodes[1].start()  # the same id, a new process
            _until(lambda: live() == ["n0", "n1", "n2", "n3"], "the restarted node is back")
            again = client.open_log("after-restart", create=True)
            with again.open_writer() as w:
                w.write(b"back", timeout=WAIT_S)
            assert again.segments()[0].nodes == ("n0", "n1", "n2")  # segment 0 starts at n0
            assert [m.payload for m in again.open_reader("earliest")] == [b"back"]
            payloads = [m.payload for m in log.open_reader("earliest")]
            assert payloads == [b"a%d" % i for i in range(200)]
        finally:
            client.close()
    finally:
        for node in nodes:
            node.stop()
