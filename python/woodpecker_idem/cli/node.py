"""`woodpecker-idem logstore serve`: a LogStore node as a process of its own (service mode).

The node serves the `LogStore` gRPC service (`logstore/remote.py`) over its storage in the
deployment its config names (`nodes/{node_id}/` of the store's objects), registers itself in
that metadata store under its address with a TTL (`--registry-ttl`: renewed while it runs, so a
node killed without deregistering drops out of the registry, and out of new segments, when the
TTL runs out; a node restarted with the same id registers again), and on SIGTERM (or SIGINT)
stops taking calls, lets the calls under way finish (`--grace`), deregisters and exits 0.

`--fault drop-replies:RATE` and `--fault disk-full-after:N` are hidden, testing-only options (the
fault tests' node that applies a write and drops its reply, and one whose disk fills up after N
appends: `logstore/remote.py` `DropReplies`, `DiskFull`); no deployment sets them.
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..connect import open_node
from ..errors import InvalidArgumentError
from ..logstore.engine import LogStoreEngine
from ..logstore.remote import DiskFull, DropReplies, LogStoreServer, Tls, parse_fault
from ..logstore.segment_files import FileSegmentStorage
from ..logstore.staged import StagedSegmentStorage
from ..meta import NodeInfo
from ..meta.base import MIN_NODE_TTL_MS
from .common import add_store_args

#: How long a node that stopped renewing its registration (killed, frozen) stays registered.
DEFAULT_TTL_S = 10.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def add_parsers(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser("logstore", help="run a LogStore node (service mode)")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="{serve}")
    serve = verbs.add_parser(
        "serve",
        help="serve one LogStore node over gRPC until SIGTERM",
    )
    serve.add_argument("--node-id", required=True, metavar="ID", help="the node's id")
    serve.add_argument(
        "--listen",
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="where to listen (default 127.0.0.1, a free port)",
    )
    serve.add_argument(
        "--port-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the port listened on to FILE once serving (for scripts: --listen HOST:0)",
    )
    serve.add_argument(
        "--grace",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="on SIGTERM, how long calls under way may take to finish (default 5)",
    )
    serve.add_argument(
        "--registry-ttl",
        type=float,
        default=DEFAULT_TTL_S,
        metavar="SECONDS",
        help="how long the node stays registered after it stops renewing (killed, frozen, cut "
        f"off): clients stop placing segments on it then (default {DEFAULT_TTL_S:g}, at least "
        f"{MIN_NODE_TTL_MS / 1000:g})",
    )
    serve.add_argument(  # testing only: logstore/remote.py DropReplies
        "--fault", default=None, help=argparse.SUPPRESS
    )
    tls = serve.add_argument_group("TLS (all PEM files; without them the node serves plain gRPC)")
    tls.add_argument("--tls-cert", metavar="FILE", help="the node's certificate")
    tls.add_argument("--tls-key", metavar="FILE", help="its private key")
    tls.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="require client certificates signed by this CA (clients: quorum.tls_client_cert)",
    )
    add_store_args(serve, json_output=False)


def _fill_disk(engine: LogStoreEngine, fault: DiskFull) -> None:
    """Put the disk-full fault on the node's local segment files (refused: no local files)."""
    storage = engine.storage
    local = storage.local if isinstance(storage, StagedSegmentStorage) else storage
    if not isinstance(local, FileSegmentStorage):
        raise InvalidArgumentError(
            "--fault disk-full-after: this node keeps no local segment files (storage.type "
            "staged, or objectstore.type local, has them)"
        )
    local.write_fault = fault.check


def run(args: argparse.Namespace) -> int:
    # `kill -USR1 PID` writes every thread's stack to the node's stderr (a node that seems stuck,
    # e.g. one that never starts serving, says where it waits)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    tls = None
    if args.tls_cert or args.tls_key or args.tls_client_ca:
        if not (args.tls_cert and args.tls_key):
            raise InvalidArgumentError("--tls-cert and --tls-key go together (set both)")
        tls = Tls(args.tls_client_ca, args.tls_cert, args.tls_key)
    ttl_ms = round(args.registry_ttl * 1000)
    if ttl_ms < MIN_NODE_TTL_MS:
        raise InvalidArgumentError(
            f"--registry-ttl must be at least {MIN_NODE_TTL_MS / 1000:g} seconds, "
            f"got {args.registry_ttl:g}"
        )
    fault = None if args.fault is None else parse_fault(args.fault, seed=args.node_id)
    engine, meta, objects = open_node(args.config, args.data_dir, args.node_id)
    if isinstance(fault, DiskFull):
        _fill_disk(engine, fault)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        drop = fault if isinstance(fault, DropReplies) else None
        server = LogStoreServer(engine, args.listen, tls=tls, fault=drop)
        try:
            server.start()
            meta.register_node(NodeInfo(args.node_id, server.address, _now_ms()), ttl_ms)
            if args.port_file is not None:
                tmp = args.port_file.with_suffix(".tmp")
                tmp.write_text(str(server.port))
                tmp.replace(args.port_file)  # whole, or not there: a reader never sees half
            sys.stderr.write(f"LogStore node {args.node_id} serving on {server.address}\n")
            sys.stderr.flush()
            stop.wait()
            server.stop(args.grace)  # drains: calls under way finish, new ones are refused
            meta.unregister_node(args.node_id)
            if isinstance(fault, DropReplies):
                sys.stderr.write(f"fault drop-replies: {fault.dropped} replies dropped\n")
            elif isinstance(fault, DiskFull):
                sys.stderr.write(f"fault disk-full: {fault.failed} appends refused\n")
            sys.stderr.write(f"LogStore node {args.node_id} stopped\n")
        finally:
            server.stop(0)
    finally:
        engine.close()
        meta.close()
        objects.close()
    return 0
