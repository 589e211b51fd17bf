"""What every command shares: where the store is (`--data-dir` / `--config`), argument types,
tables and JSON, and turning a `WoodpeckerError` into one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..client.client import WoodpeckerClient
from ..client.reader import visible_last
from ..config import Config, load_config
from ..connect import connect
from ..errors import InvalidArgumentError, WoodpeckerError
from ..types import LogMessageId, SegmentState

DONE = (SegmentState.COMPLETED, SegmentState.SEALED)


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer in lo..hi, or a usage error that says so."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is not in {lo:,}..{hi:,}")
        return value

    return parse


def message_id(text: str) -> LogMessageId:
    """An argparse type: `SEGMENT:ENTRY` (as `cat` prints ids)."""
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", text)
    if m is None:
        sign = " (ids are never negative)" if text.strip().startswith("-") else ""
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a message id{sign}; write SEGMENT:ENTRY, e.g. 3:0"
        )
    return LogMessageId(int(m.group(1)), int(m.group(2)))


# Options whose value may look like an option ("--before -1:0", "--older-than -5s"): argparse
# takes a token that starts with "-" for the next option and fails with "expected one argument",
# which says nothing about the value. `join_values` hands such a value to the option, whose type
# then refuses it with our own message.
VALUE_OPTIONS = ("--before", "--older-than", "--from", "--limit")


def join_values(argv: Sequence[str]) -> list[str]:
    """`argv` with `OPTION -VALUE` written `OPTION=-VALUE` for VALUE_OPTIONS when the value
    starts with a minus and a digit or a dot (a negative-looking value, never an option)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if tok in VALUE_OPTIONS and nxt is not None and re.match(r"-[\d.]", nxt):
            out.append(f"{tok}={nxt}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration_s(text: str) -> float:
    """An argparse type: a duration like 90s, 30m, 12h, 7d, 2w or 1500ms (no unit: seconds)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*", text)
    if m is None and text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is negative; a duration counts back from now, so write it without a "
            "sign: 90s, 30m, 12h, 7d, 2w"
        )
    if m is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration; write a number with a unit: 90s, 30m, 12h, 7d, 2w"
        )
    return float(m.group(1)) * _DURATION_UNITS[m.group(2) or "s"]


def add_store_args(parser: argparse.ArgumentParser, json_output: bool = True) -> None:
    where = parser.add_argument_group("where the store is (one of them, or both)")
    where.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="an existing data directory (embedded: meta.sqlite and objects/ in it)",
    )
    where.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="a YAML config naming the stores (e.g. meta.type: etcd and objectstore.type: s3); "
        "WOODPECKER_* environment variables apply as for connect()",
    )
    if json_output:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO on stderr")


def _check_shared(cfg: Config) -> None:
    missing = []
    if cfg.meta.type == "sqlite" and cfg.meta.path is None:
        missing.append("meta.type: etcd (or meta.path)")
    if cfg.objectstore.type == "local" and cfg.objectstore.path is None:
        missing.append("objectstore.type: s3 (or objectstore.path)")
    if missing:
        raise InvalidArgumentError(
            "--config without --data-dir must name the stores; missing: " + ", ".join(missing)
        )


@contextmanager
def open_client(args: argparse.Namespace) -> Iterator[WoodpeckerClient]:
    """A client of the store the arguments name. An admin command never creates a store: a data
    directory must exist and hold one (unless the config puts both stores elsewhere)."""
    data_dir: Path | None = args.data_dir
    config_path: Path | None = args.config
    if data_dir is None and config_path is None:
        raise InvalidArgumentError(
            "say where the store is: --data-dir DIR (embedded) or --config FILE (etcd, S3, ...)"
        )
    cfg = load_config(config_path)
    tmp: Path | None = None
    if data_dir is None:
        _check_shared(cfg)
        tmp = data_dir = Path(tempfile.mkdtemp(prefix="woodpecker-admin-"))
    else:
        if not data_dir.is_dir():
            raise InvalidArgumentError(f"--data-dir {str(data_dir)!r} is not an existing directory")
        meta_path = cfg.meta_path(data_dir)
        if cfg.meta.type == "sqlite" and not meta_path.exists():
            raise InvalidArgumentError(
                f"--data-dir {str(data_dir)!r} holds no store ({meta_path} does not exist)"
            )
    try:
        client = connect(data_dir, cfg)
        try:
            yield client
        finally:
            client.close()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def stdout_closed() -> bool:
    """Whether stdout is a pipe its reader closed (`woodpecker-idem cat LOG | head -1`): what
    tells that `BrokenPipeError` from a socket or file, which is an error, from output no longer
    wanted, which is not."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # replaced (tests) or closed
        return False
    if not hasattr(select, "poll"):  # Windows: no poll on pipes; the error is stdout's
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(event & select.POLLERR for _, event in poller.poll(0))


def quiet_stdout() -> None:
    """Point stdout at devnull, so Python's flush at exit does not fail again on the closed
    pipe (and print a traceback): the recipe of Python's docs (`signal`, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def run_job(command: str, job: Callable[[], int]) -> int:
    """Run a command; a failure is one line on stderr and exit status 2, not a traceback."""
    try:
        return job()
    except (WoodpeckerError, OSError) as exc:
        if isinstance(exc, BrokenPipeError) and stdout_closed():
            raise  # the reader went away: `main` ends quietly
        print(f"woodpecker-idem {command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


# --- output ----------------------------------------------------------------------------------


def print_json(doc: object) -> None:
    print(json.dumps(doc, indent=2, sort_keys=False, default=str))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    numeric = [
        all(isinstance(row[i], int | float) or row[i] is None for row in rows) and bool(rows)
        for i in range(len(headers))
    ]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in cells:
        out = [
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(row, widths, numeric, strict=True)
        ]
        print("  ".join(out).rstrip())


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def fmt_time(ms: int | None) -> str | None:
    """UTC, to the second (what an operator compares with other logs)."""
    if not ms:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


# --- what a log holds ------------------------------------------------------------------------


def entry_time(client: WoodpeckerClient, name: str, at: LogMessageId) -> int | None:
    """The timestamp of the entry at `at` (None if it cannot be read)."""
    try:
        reader = client.open_log(name).open_reader(at)
        msg = reader.read_next(0)
    except WoodpeckerError:
        return None
    return msg.timestamp_ms if msg is not None and msg.message_id == at else None


def log_summary(client: WoodpeckerClient, name: str, times: bool = True) -> dict[str, Any]:
    """Segments, entries, bytes, first and last id (and their times) of one log."""
    meta = client.meta.get_log(name)
    segments = [
        s for s in client.meta.list_segments(meta.log_id) if s.state is not SegmentState.TRUNCATED
    ]
    floor = meta.truncated_to or LogMessageId(0, 0)
    entries = 0
    first: LogMessageId | None = None
    last: LogMessageId | None = None
    for seg in segments:
        end = visible_last(client.ensemble.calls, seg)
        start = floor.entry_id if seg.segment_id == floor.segment_id else 0
        if seg.segment_id < floor.segment_id or end < start:
            continue
        entries += end - start + 1
        if first is None:
            first = LogMessageId(seg.segment_id, start)
        last = LogMessageId(seg.segment_id, end)
    out: dict[str, Any] = {
        "name": meta.name,
        "log_id": meta.log_id,
        "group": meta.group or None,
        "segments": len(segments),
        "entries": entries,
        "bytes": sum(s.size_bytes for s in segments),  # completed ones: recorded at completion
        "first_id": str(first) if first else None,
        "last_id": str(last) if last else None,
    }
    if times:
        out["first_time"] = fmt_time(entry_time(client, name, first)) if first else None
        out["last_time"] = fmt_time(entry_time(client, name, last)) if last else None
    return out
