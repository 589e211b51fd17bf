"""Command line: `woodpecker-idem`. The admin commands work on any deployment (`--data-dir` for an
embedded store, `--config` for etcd and S3) and never create a store:

- `logs`: logs and log groups, with segments, entries, bytes, first and last id and time;
- `stat LOG`: segments and their states, the writer's epoch and lease, the last dedup snapshot;
- `cat LOG [--from ID] [--limit N] [--follow]`: entries, one per line (`--json`: JSON lines);
- `truncate LOG --before ID | --older-than DURATION`;
- `drop-group NAME`: a log group with every log in it;
- `readers list LOG` / `readers delete LOG NAME`: a log's named readers (position, lag);
- `verify`: every entry of every log on every replica, footers, snapshots and the owner marker.

`logstore serve` runs a LogStore node as a process of its own (service mode, cli/node.py).

`pipeline` and `demo` run the Spark job and the producer demo (cli/demo.py). Exit status: 0 fine,
1 the command found a problem (verify, the demo's checker), 2 a usage or storage error (one line
on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import logging
import sys

from .. import __version__
from . import demo, logs, node, verify
from .common import join_values, run_job

_ADMIN = ("logs", "stat", "cat", "truncate", "drop-group", "readers")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="woodpecker-idem",
        description="A write-ahead log with idempotent writes: admin commands and demos.",
    )
    parser.add_argument("--version", action="version", version=f"woodpecker-idem {__version__}")
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{logs,stat,cat,truncate,drop-group,readers,verify,logstore,pipeline,demo}",
    )
    logs.add_parsers(sub.add_parser)
    verify.add_parsers(sub.add_parser)
    node.add_parsers(sub.add_parser)
    demo.add_parsers(sub.add_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(join_values(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.command in _ADMIN:
        return run_job(args.command, lambda: logs.run(args))
    if args.command == "verify":
        return run_job("verify", lambda: verify.run(args))
    if args.command == "logstore":
        return run_job("logstore serve", lambda: node.run(args))
    return demo.run(args)


__all__ = ["main"]
