"""Command line: `woodpecker-idem`. The admin commands work on any deployment (`--data-dir` for an
embedded store, `--config` for etcd and S3) and never create a store:

- `logs`: logs and log groups, with segments, entries, bytes, first and last id and time;
- `stat LOG`: segments and their states, the writer's epoch and lease, the last dedup snapshot;
- `cat LOG [--from ID] [--limit N] [--follow]`: entries, one per line (`--json`: JSON lines);
- `truncate LOG --before ID | --older-than DURATION`;
- `drop-group NAME`: a log group with every log in it;
- `readers list LOG` / `readers delete LOG NAME`: a log's named readers (position, lag);
- `verify`: every entry of every log on every replica, footers, snapshots and the owner marker.

`logstore serve` runs a LogStore node as a process of its own (service mode, cli/node.py);
`cluster up|down|status` a service-mode deployment on this machine (cli/cluster.py).

`pipeline` and `demo` run the Spark job and the producer demo (cli/demo.py). Exit status: 0 fine,
1 the command found a problem (verify, the demo's checker), 2 a usage or storage error (one line
on stderr, no traceback).

`--data-dir`, `--config`, `--json` and `-v` may come before the command as well as after it
(`woodpecker-idem --data-dir D logs`). Output cut short by its reader (`... cat LOG | head`) ends
the command quietly with the status it has: 0, or verify's verdict (common.py, `stdout_closed`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .. import __version__
from . import cluster, demo, logs, node, verify
from .common import join_values, quiet_stdout, run_job, stdout_closed

_ADMIN = ("logs", "stat", "cat", "truncate", "drop-group", "readers")

# Options a command takes that may also come before it; parsed by the top parser into a dest of
# their own (a subparser's default of None would overwrite the value), then handed to the command.
_GLOBAL: tuple[tuple[tuple[str, ...], str, dict[str, object]], ...] = (
    (
        ("--data-dir",),
        "data_dir",
        {"type": Path, "metavar": "DIR", "help": "the store's data directory (embedded)"},
    ),
    (
        ("--config",),
        "config",
        {"type": Path, "metavar": "FILE", "help": "a YAML config naming the stores"},
    ),
    (("--json",), "json", {"action": "store_true", "help": "print JSON where the command can"}),
    (("-v", "--verbose"), "verbose", {"action": "store_true", "help": "log at INFO on stderr"}),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="woodpecker-idem",
        description="A write-ahead log with idempotent writes: admin commands and demos.",
    )
    parser.add_argument("--version", action="version", version=f"woodpecker-idem {__version__}")
    for flags, dest, kwargs in _GLOBAL:
        parser.add_argument(*flags, dest=f"global_{dest}", **kwargs)  # type: ignore[arg-type]
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{logs,stat,cat,truncate,drop-group,readers,verify,logstore,cluster,pipeline,demo}",
    )
    logs.add_parsers(sub.add_parser)
    verify.add_parsers(sub.add_parser)
    node.add_parsers(sub.add_parser)
    cluster.add_parsers(sub.add_parser)
    demo.add_parsers(sub.add_parser)
    return parser


def _hand_down(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Give the options written before the command to the command; a usage error when it does
    not take one, or when it is given both before and after with different values."""
    for flags, dest, _ in _GLOBAL:
        value = getattr(args, f"global_{dest}")
        delattr(args, f"global_{dest}")
        if value is None or value is False:
            continue
        if not hasattr(args, dest):
            parser.error(f"{flags[-1]} does not apply to {args.command!r}")
        given = getattr(args, dest)
        if given is not None and given is not False and given != value:
            parser.error(f"{flags[-1]} given twice, as {str(value)!r} and {str(given)!r}")
        setattr(args, dest, value)


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # what is still buffered meets a closed pipe here
    except BrokenPipeError:
        if not stdout_closed():
            raise
        quiet_stdout()
        return 0  # the reader (`| head`) had what it wanted
    return code


def _main(argv: list[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(join_values(sys.argv[1:] if argv is None else argv))
    _hand_down(parser, args)
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
    if args.command == "cluster":
        return run_job(f"cluster {args.verb}", lambda: cluster.run(args))
    return demo.run(args)


__all__ = ["main"]
