"""`woodpecker-idem cluster up|down|status --dir DIR`: a service-mode deployment on this machine,
for development, tests and the README's service section.

`up` starts etcd (Debian's etcd-server), moto's S3 server and three LogStore nodes
(`logstore serve`) on 127.0.0.1, each in a session of its own (they outlive the command), and
writes `DIR/woodpecker.yaml` (for `connect(config=...)` and the Spark options) and
`DIR/cluster.json` (what it started). `status` says which of them still run (`--json`:
`{"nodes": [{"node_id", "pid", "address"}, ...], "etcd": {"pid", "endpoint"}, "s3": {"pid",
"endpoint"}}`, each with `"alive"`). `down` stops what `up` started, by PID (SIGTERM, then
SIGKILL after a few seconds), nodes first. `up --storage staged` gives the nodes staged storage
(`storage.type: staged`, their local segment files under DIR/staged).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError, StorageUnavailableError

HOST = "127.0.0.1"
NODES = 3
START_S = 60.0
STATE = "cluster.json"
CONFIG = "woodpecker.yaml"
BUCKET = "woodpecker"
S3_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}

# moto checks `If-None-Match: *` and stores the object in two steps, so two racing conditional
# PUTs can both succeed there (not on S3); serialized, exactly one creator wins, as on S3, which
# the block fencing relies on.
MOTO_BOOTSTRAP = """
import sys, threading
import moto.server
from moto.s3.responses import S3Response
_lock = threading.Lock()
_orig_put = S3Response.put_object
def _put_object(self, *args, **kwargs):
    with _lock:
        return _orig_put(self, *args, **kwargs)
S3Response.put_object = _put_object
moto.server.main(sys.argv[1:])
"""


def add_parsers(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser("cluster", help="a service-mode deployment on this machine (development)")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="{up,down,status}")
    for verb, text in (
        ("up", "start etcd, an S3 server and three LogStore nodes; write DIR/woodpecker.yaml"),
        ("down", "stop what `up` started, by PID"),
        ("status", "which of them still run"),
    ):
        sub = verbs.add_parser(verb, help=text)
        sub.add_argument("--dir", type=Path, required=True, metavar="DIR", help="the cluster's")
        if verb == "status":
            sub.add_argument("--json", action="store_true", help="print JSON instead of lines")
        if verb == "up":
            sub.add_argument(
                "--storage",
                choices=("object", "staged"),
                default="object",
                help="the nodes' storage.type: object (blocks straight to S3, the default) or "
                "staged (each node keeps the segments it holds under DIR/staged and uploads "
                "each one to S3 when it completes)",
            )
        sub.add_argument("-v", "--verbose", action="store_true", help="log at INFO on stderr")


def run(args: argparse.Namespace) -> int:
    return {"up": up, "down": down, "status": status}[args.verb](args)


# --- up ------------------------------------------------------------------------------------------


def up(args: argparse.Namespace) -> int:
    root: Path = args.dir.resolve()
    if (root / STATE).exists() and any(_alive(p["pid"]) for p in _processes(_read(root))):
        raise InvalidArgumentError(f"a cluster already runs in {root} (`cluster down --dir` it)")
    root.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {"nodes": []}
    try:
        state["etcd"] = _etcd(root)
        _write(root, state)
        state["s3"] = _s3(root)
        _write(root, state)
        (root / CONFIG).write_text(_config(state, root, getattr(args, "storage", "object")))
        for i in range(NODES):
            state["nodes"].append(_node(root, f"n{i}"))
            _write(root, state)
    except BaseException:
        _stop_all(state)
        raise
    print(f"cluster up in {root}: etcd {state['etcd']['endpoint']}, S3 {state['s3']['endpoint']}")
    for node in state["nodes"]:
        print(f"  LogStore node {node['node_id']} at {node['address']} (pid {node['pid']})")
    print(f"connect with: woodpecker_idem.connect(config={str(root / CONFIG)!r})")
    return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # outlives this command; `down` stops it by PID
        )


def _wait(proc: subprocess.Popen, ready: Callable[[], bool], what: str, log: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if ready():
            return
        time.sleep(0.05)
    _kill(proc.pid)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise StorageUnavailableError(f"cluster: {what} did not start (log {log}):\n{tail}")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True  # an HTTP answer: it serves
    except OSError:
        return False


def _etcd(root: Path) -> dict[str, Any]:
    binary = shutil.which("etcd") or shutil.which("etcd", path="/usr/bin:/usr/sbin")
    if binary is None:
        raise InvalidArgumentError("cluster needs etcd: apt-get install etcd-server")
    client, peer = f"http://{HOST}:{_free_port()}", f"http://{HOST}:{_free_port()}"
    log = root / "etcd.log"
    proc = _spawn(
        [
            binary,
            "--name=wp",
            f"--data-dir={root / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=wp={peer}",
            "--log-level=warn",
        ],
        log,
    )
    _wait(proc, lambda: _http_ok(f"{client}/health"), "etcd", log)
    return {"pid": proc.pid, "endpoint": client}


def _s3(root: Path) -> dict[str, Any]:
    try:
        import moto.server  # noqa: F401 - only whether it is there
    except ImportError:
        raise InvalidArgumentError(
            "cluster needs moto's S3 server: pip install 'moto[server]'"
        ) from None
    endpoint = f"http://{HOST}:{_free_port()}"
    log = root / "s3.log"
    port = endpoint.rsplit(":", 1)[1]
    proc = _spawn(
        [sys.executable, "-c", MOTO_BOOTSTRAP, "-H", HOST, "-p", port],
        log,
        env={**os.environ, **S3_KEYS},
    )
    _wait(proc, lambda: _http_ok(f"{endpoint}/moto-api/"), "the S3 server", log)
    return {"pid": proc.pid, "endpoint": endpoint}


def _config(state: dict[str, Any], root: Path, storage: str = "object") -> str:
    staged = ["  type: staged", f"  staged_dir: {str(root / 'staged')!r}"]
    return "\n".join(
        [
            "# written by `woodpecker-idem cluster up`: service mode on this machine",
            "quorum:",
            "  nodes: registry",
            "  es: 3",
            "meta:",
            "  type: etcd",
            f"  endpoints: [{state['etcd']['endpoint']!r}]",
            "objectstore:",
            "  type: s3",
            f"  endpoint_url: {state['s3']['endpoint']!r}",
            f"  bucket: {BUCKET}",
            "  region: us-east-1",
            f"  access_key_id: {S3_KEYS['AWS_ACCESS_KEY_ID']}",
            f"  secret_access_key: {S3_KEYS['AWS_SECRET_ACCESS_KEY']}",
            "  create_bucket: true",
            "storage:",
            "  fsync: batch_ms:5",
            *(staged if storage == "staged" else []),
            "",
        ]
    )


def _node(root: Path, node_id: str) -> dict[str, Any]:
    port_file = root / f"{node_id}.port"
    port_file.unlink(missing_ok=True)
    log = root / f"{node_id}.log"
    proc = _spawn(
        [
            sys.executable, "-m", "woodpecker_idem.cli", "logstore", "serve",
            "--node-id", node_id, "--listen", f"{HOST}:0", "--port-file", str(port_file),
            "--config", str(root / CONFIG), "--data-dir", str(root / node_id),
        ],
        log,
    )  # fmt: skip
    _wait(proc, port_file.exists, f"LogStore node {node_id}", log)
    return {"node_id": node_id, "pid": proc.pid, "address": f"{HOST}:{port_file.read_text()}"}


# --- status and down --------------------------------------------------------------------------


def _read(root: Path) -> dict[str, Any]:
    try:
        return json.loads((root / STATE).read_text())
    except FileNotFoundError:
        raise InvalidArgumentError(
            f"no cluster in {root} (`cluster up --dir` starts one)"
        ) from None


def _write(root: Path, state: dict[str, Any]) -> None:
    tmp = root / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(root / STATE)


def _processes(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Nodes first, then the S3 server and etcd (the order `down` stops them in)."""
    return [*state.get("nodes", []), *(state[k] for k in ("s3", "etcd") if k in state)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie of ours (started by this process and not reaped) is gone too
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def status(args: argparse.Namespace) -> int:
    state = _read(args.dir.resolve())
    for proc in _processes(state):
        proc["alive"] = _alive(proc["pid"])
    if args.json:
        print(json.dumps(state, indent=2))
    else:
        for name in ("etcd", "s3"):
            p = state[name]
            print(f"{name}: pid {p['pid']} {p['endpoint']} {'up' if p['alive'] else 'DOWN'}")
        for n in state["nodes"]:
            print(f"{n['node_id']}: pid {n['pid']} {n['address']} {'up' if n['alive'] else 'DOWN'}")
    return 0 if all(p["alive"] for p in _processes(state)) else 1


def down(args: argparse.Namespace) -> int:
    root = args.dir.resolve()
    _stop_all(_read(root))
    (root / STATE).unlink()
    print(f"cluster down in {root}")
    return 0


def _stop_all(state: dict[str, Any]) -> None:
    procs = _processes(state)
    for proc in procs:
        _signal(proc["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 10
    for proc in procs:
        while _alive(proc["pid"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(proc["pid"]):
            _kill(proc["pid"])


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _kill(pid: int) -> None:
    _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
