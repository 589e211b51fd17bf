"""etcd for the security tests: one member serving https with client-certificate authentication
(certificates made here, for 127.0.0.1), or plain http with etcd's user authentication enabled.
Both stop by PID like `EtcdServer`."""

from __future__ import annotations

import datetime
import json
import os
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from etcdserver import EtcdServer
from serverproc import HOST


@dataclass
class Pki:
    """PEM files: a CA, etcd's server certificate, a client certificate, and another CA."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str  # signed nothing here: a client trusting it must refuse etcd


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], name: str, server: bool
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    # etcd's JSON gateway calls its own gRPC server with the server certificate, as a client
    usage = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if server:
        usage.append(ExtendedKeyUsageOID.SERVER_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    )
    if server:
        import ipaddress

        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]),
            critical=False,
        )
    return builder.sign(ca[1], hashes.SHA256()), key


def make_pki(directory: Path) -> Pki:
    ca = _ca("woodpecker test CA")
    other = _ca("another CA")
    server = _leaf(ca, "etcd", server=True)
    client = _leaf(ca, "woodpecker-client", server=False)
    pem = serialization.Encoding.PEM
    return Pki(
        ca=_write(directory / "ca.pem", ca[0].public_bytes(pem)),
        server_cert=_write(directory / "server.pem", server[0].public_bytes(pem)),
        server_key=_write(directory / "server-key.pem", _key_pem(server[1])),
        client_cert=_write(directory / "client.pem", client[0].public_bytes(pem)),
        client_key=_write(directory / "client-key.pem", _key_pem(client[1])),
        other_ca=_write(directory / "other-ca.pem", other[0].public_bytes(pem)),
    )


class EtcdTlsServer(EtcdServer):
    """etcd serving clients on https only, requiring a client certificate signed by `pki.ca`."""

    def __init__(self, pki: Pki):
        super().__init__()
        self.pki = pki

    @property
    def url(self) -> str:
        return f"https://{HOST}:{self.client_port}"

    def _spawn(self) -> None:
        assert self._dir is not None
        client = self.url
        peer = f"http://{HOST}:{self.peer_port}"
        cmd = [
            "--name=test",
            f"--data-dir={os.path.join(self._dir, 'data')}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=test={peer}",
            f"--cert-file={self.pki.server_cert}",
            f"--key-file={self.pki.server_key}",
            f"--trusted-ca-file={self.pki.ca}",
            "--client-cert-auth=true",
            "--log-level=warn",
        ]
        self._popen(cmd)

    def _popen(self, args: list[str]) -> None:
        import subprocess

        from etcdserver import etcd_binary

        assert self._dir is not None
        log = open(os.path.join(self._dir, "etcd.log"), "ab")  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [etcd_binary(), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        finally:
            log.close()

    def healthy(self, timeout_s: float = 1.0) -> bool:
        ctx = ssl.create_default_context(cafile=self.pki.ca)
        ctx.load_cert_chain(self.pki.client_cert, self.pki.client_key)
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout_s, context=ctx) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError, urllib.error.URLError):
            return False


def enable_auth(server: EtcdServer, password: str) -> None:
    """etcdctl user add root; user grant-role root root; auth enable, through the JSON gateway."""
    for path, body in (
        ("auth/user/add", {"name": "root", "password": password}),
        ("auth/user/grant", {"user": "root", "role": "root"}),
        ("auth/enable", {}),
    ):
        request = urllib.request.Request(
            f"http://{server.endpoint}/v3/{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
