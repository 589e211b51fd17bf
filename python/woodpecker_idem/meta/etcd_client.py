"""The wire to etcd for `EtcdMetadataStore`: deadlines, endpoint failover, and lease keep-alive.

Why etcd3gw (etcd's v3 JSON gateway, served under /v3/ by etcd >= 3.4): it is synchronous like the
rest of the metadata layer, it needs neither grpcio nor a protobuf version (aetcd pins
protobuf < 7; the old etcd3 breaks on protobuf >= 5), and OpenStack maintains it.

Every call has one deadline (`meta.timeout_ms`): it tries the endpoints in turn with backoff until
one answers or the deadline passes, then raises `StorageUnavailableError` naming the endpoints. A
write is resent only when the request certainly never reached etcd (refused or connect timeout):
a resent transaction that had been applied would fail its own compare and be misreported.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import requests
import urllib3
from etcd3gw import exceptions as gwerr
from etcd3gw.client import Etcd3Client

from ..errors import (
    ClientClosedError,
    InvalidArgumentError,
    StorageAccessError,
    StorageUnavailableError,
    WoodpeckerError,
)
from ..retry import Backoff

log = logging.getLogger(__name__)

KV = dict[str, Any]


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


# --- transaction building blocks (etcd's JSON gateway: bytes are base64, int64s strings) ------


def put(key: str, value: bytes | str, lease: int = 0) -> KV:
    body: KV = {"key": b64(key), "value": b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def _range_end(prefix: str) -> str:
    return b64(prefix[:-1] + chr(ord(prefix[-1]) + 1))


def get(key: str, prefix: bool = False) -> KV:
    body = {"key": b64(key)}
    if prefix:
        body |= {"range_end": _range_end(key), "sort_order": "ASCEND", "sort_target": "KEY"}
    return {"request_range": body}


def delete(key: str, prefix: bool = False) -> KV:
    body = {"key": b64(key)}
    if prefix:
        body["range_end"] = _range_end(key)
    return {"request_delete_range": body}


def same_value(key: str, value: str) -> KV:
    return {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(value)}


def same_mod(key: str, revision: int) -> KV:
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def absent(key: str) -> KV:
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def present(key: str) -> KV:
    return {"key": b64(key), "target": "VERSION", "result": "GREATER", "version": "0"}


def range_kvs(response: KV) -> list[KV]:
    """The key-values of a txn's range response (or of a plain range result)."""
    return response.get("response_range", response).get("kvs", [])


@dataclass(frozen=True)
class EtcdSecurity:
    """TLS and authentication for etcd (config keys meta.ca_cert, meta.client_cert,
    meta.client_key, meta.user, meta.password). With a CA or a client certificate, endpoints
    written host:port are reached over https."""

    ca_cert: str | None = None  # PEM bundle that signed etcd's server certificate
    client_cert: str | None = None  # PEM client certificate (etcd --client-cert-auth)
    client_key: str | None = None  # its private key
    user: str | None = None  # etcd authentication (etcdctl auth enable)
    password: str | None = field(default=None, repr=False)  # never shown

    def __post_init__(self) -> None:
        if (self.client_cert is None) != (self.client_key is None):
            raise InvalidArgumentError("etcd: client_cert and client_key go together")
        if (self.user is None) != (self.password is None):
            raise InvalidArgumentError("etcd: user and password go together")
        for name in ("ca_cert", "client_cert", "client_key"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise InvalidArgumentError(f"etcd: meta.{name} {path!r} is not a readable file")

    @property
    def tls(self) -> bool:
        return self.ca_cert is not None or self.client_cert is not None


NO_SECURITY = EtcdSecurity()


def _endpoint(text: str, default_proto: str = "http") -> tuple[str, str, int]:
    """(protocol, host, port) from "host:port" or "http(s)://host:port"."""
    proto, _, rest = text.rpartition("://")
    host, sep, port = rest.rstrip("/").rpartition(":")
    if proto not in ("", "http", "https") or not sep or not host or not port.isdigit():
        raise InvalidArgumentError(
            f"etcd endpoint {text!r} must be host:port or http(s)://host:port"
        )
    return proto or default_proto, host.strip("[]"), int(port)


def _denied(text: str) -> bool:
    """etcd's answer to a call it will never accept from these credentials."""
    return any(
        m in text
        for m in ("permission denied", "user name is empty", "authentication failed", "auth token")
    )


def _never_sent(exc: BaseException) -> bool:
    """True if the request failed before reaching etcd, so resending it cannot apply it twice."""
    cause = exc.__context__
    if isinstance(cause, requests.exceptions.ConnectTimeout):
        return True
    if isinstance(cause, requests.exceptions.ConnectionError) and cause.args:
        reason = getattr(cause.args[0], "reason", None)
        return isinstance(reason, urllib3.exceptions.NewConnectionError)
    return False


class EtcdUnreachableError(StorageUnavailableError):
    """No endpoint answered within the deadline (as opposed to etcd answering with an error)."""


def _text(exc: BaseException | None) -> str:
    detail = getattr(exc, "detail_text", None)
    return str(detail or exc or "no attempt").strip()[:300]


class EtcdGateway:
    """Thread-safe calls to etcd's JSON gateway. One connection pool (session) per endpoint and
    process, shared by all threads; each thread has its own light client so that each call can
    carry its own remaining time. A forked child opens new pools (sockets never cross a fork)."""

    def __init__(
        self, endpoints: Sequence[str], timeout_s: float, security: EtcdSecurity = NO_SECURITY
    ):
        if isinstance(endpoints, str) or not endpoints:
            raise InvalidArgumentError("etcd needs a non-empty list of endpoints (meta.endpoints)")
        self.endpoints = tuple(endpoints)
        self.security = security
        default_proto = "https" if security.tls else "http"
        self._parsed = [_endpoint(e, default_proto) for e in self.endpoints]
        self.timeout_s = timeout_s
        self._token: str | None = None  # etcd auth token (meta.user), shared by every thread
        self._preferred = 0  # the endpoint that answered last
        self._local = threading.local()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._sessions: dict[int, requests.Session] = {}  # endpoint index -> this process's pool
        self.closed = False

    def _client(self, i: int) -> Etcd3Client:
        pid = os.getpid()
        clients = getattr(self._local, "clients", None)
        if clients is None or self._local.pid != pid:  # new thread, or first use after fork
            clients = self._local.clients = {}
            self._local.pid = pid
        client = clients.get(i)
        if client is None:
            with self._lock:
                if self._pid != pid:  # the parent's pools are the parent's: leave them alone
                    self._sessions, self._pid = {}, pid
                session = self._sessions.setdefault(i, requests.Session())
            proto, host, port = self._parsed[i]
            client = clients[i] = Etcd3Client(host, port, proto, api_path="/v3/", session=session)
        return client

    def _tls(self) -> dict[str, Any]:
        """TLS settings for each request: given per request, since requests lets the
        environment's REQUESTS_CA_BUNDLE override a session's own `verify`."""
        sec = self.security
        out: dict[str, Any] = {}
        if sec.ca_cert is not None:
            out["verify"] = sec.ca_cert
        if sec.client_cert is not None and sec.client_key is not None:
            out["cert"] = (sec.client_cert, sec.client_key)
        return out

    def _authenticate(self, client: Etcd3Client) -> str:
        """A token for meta.user (etcd's simple tokens expire: `call` asks again when refused)."""
        sec = self.security
        try:
            out = client.post(
                client.get_url("auth/authenticate"),
                json={"name": sec.user, "password": sec.password},
                **self._tls(),
            )
        except gwerr.Etcd3Exception as exc:
            if isinstance(exc, (gwerr.ConnectionFailedError, gwerr.ConnectionTimeoutError)):
                raise
            raise StorageAccessError(
                f"etcd at {self._where()} refused user {sec.user!r} (meta.user / meta.password): "
                f"{_text(exc)}"
            ) from exc
        token = out.get("token")
        if not token:
            raise StorageAccessError(
                f"etcd at {self._where()} gave no token for user {sec.user!r}: is auth enabled "
                "(etcdctl auth enable)?"
            )
        self._token = token
        return str(token)

    def call(self, op: str, path: str, body: KV, *, write: bool) -> KV:
        """POST `body` to /v3/`path`; retries unanswered calls across endpoints until the
        deadline. `write`: resend only requests that never reached etcd."""
        deadline = time.monotonic() + self.timeout_s
        reauthenticated = False
        backoff = Backoff(initial_s=0.02, max_s=0.5, budget_s=self.timeout_s)
        i = self._preferred
        tried = 0
        last: BaseException | None = None
        while True:
            if self.closed:
                raise ClientClosedError(
                    f"client is closed: etcd metadata store at {self._where()} is closed"
                )
            client = self._client(i)
            client.timeout = max(0.001, deadline - time.monotonic())
            try:
                kwargs = self._tls()
                if self.security.user is not None:
                    kwargs["headers"] = {"Authorization": self._token or self._authenticate(client)}
                result: KV = client.post(client.get_url(path), json=body, **kwargs)
                self._preferred = i
                return result
            except (gwerr.ConnectionFailedError, gwerr.ConnectionTimeoutError) as exc:
                if isinstance(exc.__context__, requests.exceptions.SSLError):
                    raise StorageAccessError(
                        f"etcd at {self._where()}: TLS failed ({_text(exc)}); check meta.ca_cert "
                        "(the CA that signed etcd's certificate), meta.client_cert and "
                        "meta.client_key, and that the endpoints are https://"
                    ) from exc
                last = exc
                if write and not _never_sent(exc):
                    break  # it may have been applied: resending could misreport it
            except gwerr.Etcd3Exception as exc:
                text = _text(exc)
                if self.security.user is not None and "auth token" in text and not reauthenticated:
                    # an expired or revoked token was refused before the request ran: a new
                    # token and the same request again cannot apply it twice
                    self._token = None
                    reauthenticated = True
                    continue
                if _denied(text):
                    raise StorageAccessError(
                        f"etcd at {self._where()} refused {op}: {text}; check meta.user and "
                        "meta.password (or the client certificate's user) and its role"
                    ) from exc
                raise StorageUnavailableError(
                    f"etcd at {self._where()} refused {op}: {text}"
                ) from exc
            tried += 1
            i = (i + 1) % len(self.endpoints)
            if time.monotonic() >= deadline:
                break
            if tried % len(self.endpoints) == 0 and not backoff.wait():
                break
        raise EtcdUnreachableError(
            f"etcd at {self._where()} did not answer {op} within {self.timeout_s * 1000:.0f} ms "
            f"(meta.timeout_ms): {_text(last)}"
        ) from last

    def _where(self) -> str:
        return ", ".join(self.endpoints)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            mine = list(self._sessions.values()) if self._pid == os.getpid() else []
            self._sessions = {}
        for session in mine:
            session.close()


def _held(key: Hashable) -> str:
    return f"node {key[1]}" if isinstance(key, tuple) else f"log id {key}"


class LeaseKeeper:
    """Keeps the etcd leases of this store's writers (held by log id) and of the LogStore nodes
    it registered (held by `("node", node_id)`) alive from one background thread.

    A lease only shows that a writer is alive (docs/architecture.md): losing one fences nothing. So
    the thread never gives up: errors are counted and logged, and it retries with backoff until
    `close()`. A lease that expired while etcd was away is handed to `on_expired` to replace.
    Leases no longer needed are revoked by the thread too, off the writer's take-over path.
    """

    def __init__(self, gateway: EtcdGateway, on_expired: Callable[[Hashable, int, int], None]):
        self._gw = gateway
        self._on_expired = on_expired
        self._leases: dict[Hashable, tuple[int, int, int]] = {}  # key -> (epoch, lease id, ttl s)
        self._stale: list[int] = []  # lease ids to revoke
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors = 0

    def grant(self, ttl_s: int) -> int:
        out = self._gw.call("lease grant", "lease/grant", {"TTL": ttl_s}, write=True)
        return int(out["ID"])

    def hold(self, log_id: Hashable, epoch: int, lease_id: int, ttl_s: int) -> None:
        """Keep `lease_id` alive for the writer at `epoch`; a lease of an older epoch is revoked."""
        with self._lock:
            old = self._leases.get(log_id)
            if old is None or old[0] <= epoch:
                self._leases[log_id] = (epoch, lease_id, ttl_s)
                drop = None if old is None else old[1]
            else:
                drop = lease_id  # a newer writer of this log already holds one here
            if drop is not None:
                self._stale.append(drop)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="etcd-lease", daemon=True)
                self._thread.start()

    def release(self, log_id: Hashable, epoch: int | None = None) -> None:
        """Stop keeping the log's lease (of `epoch`, if given) and revoke it."""
        with self._lock:
            held = self._leases.get(log_id)
            if held is None or (epoch is not None and held[0] != epoch):
                return
            del self._leases[log_id]
            self._stale.append(held[1])

    def revoke(self, lease_id: int) -> bool:
        """Best effort: an unrevoked lease expires by itself. False if etcd did not answer."""
        try:
            self._gw.call("lease revoke", "kv/lease/revoke", {"ID": lease_id}, write=True)
        except WoodpeckerError as exc:
            log.debug("etcd lease %x not revoked: %s", lease_id, exc)
            return not isinstance(exc, EtcdUnreachableError)
        return True

    def _run(self) -> None:
        backoff = Backoff(initial_s=0.1, max_s=2.0, stop=self._stop)
        while not self._stop.is_set():
            with self._lock:
                held = dict(self._leases)
                stale, self._stale = self._stale, []
            for lease_id in stale:
                self.revoke(lease_id)
            try:
                for log_id, (epoch, lease_id, ttl_s) in held.items():
                    out = self._gw.call(
                        "lease keep-alive", "lease/keepalive", {"ID": lease_id}, write=False
                    )
                    if int(out.get("result", {}).get("TTL", -1)) <= 0:
                        log.info("%s: etcd lease %x expired; replacing it", _held(log_id), lease_id)
                        self._on_expired(log_id, epoch, ttl_s)
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any error
                if self._stop.is_set():
                    return
                self.errors += 1
                log.warning("etcd lease keep-alive failed (%d so far): %s", self.errors, exc)
                backoff.wait()
                continue
            backoff = Backoff(initial_s=0.1, max_s=2.0, stop=self._stop)
            ttl = min((t for _, _, t in held.values()), default=3)
            self._stop.wait(max(0.2, ttl / 3))

    def close(self) -> None:
        """Stop the thread and revoke the leases still held (best effort)."""
        self._stop.set()
        with self._lock:
            leases = [lease for _, lease, _ in self._leases.values()] + self._stale
            self._leases.clear()
            self._stale = []
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._gw.timeout_s + 1)
        for lease_id in leases:
            if not self.revoke(lease_id):
                break  # etcd is away: one deadline is enough, the rest expire by themselves
