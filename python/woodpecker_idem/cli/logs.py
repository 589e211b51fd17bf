"""The commands about logs: `logs`, `stat LOG`, `cat LOG`, `truncate LOG`, `drop-group NAME`,
`readers list|delete`."""

from __future__ import annotations

import argparse
import base64
import difflib
import json
import sys
from collections.abc import Callable
from typing import Any

from ..client.client import WoodpeckerClient
from ..client.log import LogHandle
from ..client.reader import visible_last
from ..errors import InvalidArgumentError, LogNotFoundError, WoodpeckerError
from ..idempotency.snapshot import list_snapshots
from ..retention import age_cutoff
from ..types import LogMessage, LogMessageId, SegmentState
from .common import (
    add_store_args,
    duration_s,
    fmt_time,
    int_in,
    log_summary,
    message_id,
    open_client,
    print_json,
    print_table,
)


def add_parsers(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser(
        "logs", help="list logs and log groups: segments, entries, bytes, first/last id and time"
    )
    add_store_args(p)
    p = add_parser(
        "stat",
        help="one log: its segments and their states, the writer's epoch and lease, and the "
        "last dedup snapshot (age, keys, watermarks)",
    )
    p.add_argument("log", help="the log's name")
    add_store_args(p)
    p = add_parser("cat", help="print a log's entries (one per line)")
    p.add_argument("log", help="the log's name")
    p.add_argument(
        "--from",
        dest="start",
        type=message_id,
        default=None,
        metavar="ID",
        help="start at this id (SEGMENT:ENTRY; default: the earliest entry)",
    )
    p.add_argument(
        "--limit", type=int_in(1, 2**62), default=None, metavar="N", help="print at most N"
    )
    p.add_argument(
        "--follow", action="store_true", help="wait for new entries (until --limit or Ctrl-C)"
    )
    add_store_args(p, json_output=False)
    p.add_argument(
        "--json", action="store_true", help="one JSON object per line (id, time, key, payload)"
    )
    p = add_parser(
        "truncate",
        help="drop a log's entries before an id, or its segments completed before a time "
        "(keys that may still be in a dedup window are kept aside: retries stay deduplicated)",
    )
    p.add_argument("log", help="the log's name")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--before", type=message_id, metavar="ID", help="drop every entry before ID (S:E)"
    )
    how.add_argument(
        "--older-than",
        type=duration_s,
        metavar="DURATION",
        help="drop the completed segments completed more than DURATION ago (90s, 12h, 7d)",
    )
    p.add_argument("--dry-run", action="store_true", help="say what would go; change nothing")
    add_store_args(p, json_output=False)
    p = add_parser(
        "drop-group", help="delete a log group: every log in it, their entries and metadata"
    )
    p.add_argument("name", help="the log group's name")
    p.add_argument(
        "--force",
        action="store_true",
        help="drop it even if a writer's lease on one of its logs has not expired",
    )
    add_store_args(p, json_output=False)
    p = add_parser(
        "readers",
        help="a log's named readers (open_reader(name=...)): list them with their committed "
        "position and lag, or delete one",
    )
    which = p.add_subparsers(dest="readers_command", required=True, metavar="{list,delete}")
    q = which.add_parser(
        "list", help="each named reader: committed position, lag (entries behind the end), owner"
    )
    q.add_argument("log", help="the log's name")
    add_store_args(q)
    q = which.add_parser(
        "delete",
        help="forget a named reader: its position goes, it no longer holds retention back, and "
        "a live holder's next commit is refused",
    )
    q.add_argument("log", help="the log's name")
    q.add_argument("name", help="the reader's name")
    add_store_args(q, json_output=False)


def run(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        if args.command == "logs":
            return _logs(client, args.json)
        if args.command == "stat":
            return _stat(client, args.log, args.json)
        if args.command == "cat":
            return _cat(client, args.log, args.start, args.limit, args.follow, args.json)
        if args.command == "truncate":
            return _truncate(client, args.log, args.before, args.older_than, args.dry_run)
        if args.command == "readers":
            if args.readers_command == "list":
                return _readers(client, args.log, args.json)
            return _delete_reader(client, args.log, args.name)
        return _drop_group(client, args.name, args.force)


def open_log(client: WoodpeckerClient, name: str) -> LogHandle:
    """The log, or `LogNotFoundError` naming the closest names there are."""
    try:
        return client.open_log(name)
    except LogNotFoundError:
        names = client.list_logs()
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise LogNotFoundError(
            f"log {name!r} does not exist{hint} (`woodpecker-idem logs` lists them)"
        ) from None


# --- logs ------------------------------------------------------------------------------------


def _logs(client: WoodpeckerClient, as_json: bool) -> int:
    logs = [log_summary(client, m.name) for m in client.meta.list_logs()]
    groups = []
    for g in client.meta.list_log_groups():
        members = [row for row in logs if row["group"] == g.name]
        groups.append(
            {
                "name": g.name,
                "partitions": g.partitions,
                "created": fmt_time(g.created_ms),
                "logs": len(members),
                "segments": sum(r["segments"] for r in members),
                "entries": sum(r["entries"] for r in members),
                "bytes": sum(r["bytes"] for r in members),
            }
        )
    if as_json:
        print_json({"logs": logs, "groups": groups})
        return 0
    cols = ["name", "log_id", "group", "segments", "entries", "bytes", "first_id", "last_id"]
    cols += ["first_time", "last_time"]
    print_table(cols, [[row[c] for c in cols] for row in logs])
    if groups:
        print()
        gcols = ["name", "partitions", "logs", "segments", "entries", "bytes", "created"]
        print_table(
            [f"group {c}" if c == "name" else c for c in gcols],
            [[g[c] for c in gcols] for g in groups],
        )
    return 0


# --- stat ------------------------------------------------------------------------------------


def _stat(client: WoodpeckerClient, name: str, as_json: bool) -> int:
    handle = open_log(client, name)
    meta = client.meta.get_log_by_id(handle.log_id)
    now = client.clock.now_ms()
    summary = log_summary(client, name)
    segments = []
    for seg in client.meta.list_segments(handle.log_id):
        end = visible_last(client.ensemble.calls, seg)
        segments.append(
            {
                "segment_id": seg.segment_id,
                "state": seg.state.value,
                "nodes": list(seg.nodes),
                "created": fmt_time(seg.created_ms),
                "completed": fmt_time(seg.completed_ms),
                "last_entry_id": None if end < 0 else end,
                "bytes": seg.size_bytes if seg.state is not SegmentState.ACTIVE else None,
            }
        )
    keys = list_snapshots(client.objects, handle.log_id)
    snapshot: dict[str, Any] | None = None
    if keys:
        snapshot = {"key": keys[-1], "kept": len(keys)}
        data = client.objects.get(keys[-1])
        if data is not None:
            from .._core import decode_snapshot

            try:
                snap = decode_snapshot(data)
            except WoodpeckerError as exc:
                snapshot["error"] = str(exc)
            else:
                snapshot |= {
                    "epoch": snap.epoch,
                    "taken": fmt_time(snap.timestamp_ms),
                    "age_s": round((now - snap.timestamp_ms) / 1000, 1),
                    "keys": len(snap),
                    "bytes": len(data),
                    "window_ms": snap.window_ms,
                    "window_max_keys": snap.window_max_keys,
                    "watermarks": {str(k): v for k, v in sorted(snap.watermarks.items())},
                }
    lease_left = meta.lease_expires_ms - now if meta.lease_owner else None
    doc = {
        **summary,
        "created": fmt_time(meta.created_ms),
        "truncated_to": str(meta.truncated_to) if meta.truncated_to else None,
        "writer": {
            "epoch": meta.writer_epoch,
            "lease_owner": meta.lease_owner or None,
            "lease_expires": fmt_time(meta.lease_expires_ms),
            "lease_live": lease_left is not None and lease_left > 0,
        },
        "segment_list": segments,
        "snapshot": snapshot,
    }
    if as_json:
        print_json(doc)
        return 0
    print(
        f"log {meta.name!r} (id {meta.log_id}), group {meta.group or '-'}, created {doc['created']}"
    )
    print(
        f"entries {summary['entries']} ({summary['first_id'] or '-'} .. "
        f"{summary['last_id'] or '-'}), {summary['bytes']} bytes in completed segments, "
        f"truncated to {doc['truncated_to'] or '-'}"
    )
    if meta.lease_owner:
        state = "live" if lease_left is not None and lease_left > 0 else "expired"
        print(
            f"writer: epoch {meta.writer_epoch}, lease held by {meta.lease_owner}, "
            f"{state} (expires {doc['writer']['lease_expires']})"
        )
    else:
        print(f"writer: epoch {meta.writer_epoch}, no lease")
    print()
    cols = ["segment_id", "state", "nodes", "created", "completed", "last_entry_id", "bytes"]
    rows = [[",".join(s["nodes"]) if c == "nodes" else s[c] for c in cols] for s in segments]  # type: ignore[arg-type]
    print_table(cols, rows)
    print()
    if snapshot is None:
        print("snapshot: none")
    elif "error" in snapshot or "keys" not in snapshot:
        print(f"snapshot: {snapshot['key']} unreadable: {snapshot.get('error', 'gone')}")
    else:
        marks = ", ".join(f"{k}:{v}" for k, v in snapshot["watermarks"].items()) or "-"
        print(
            f"snapshot: {snapshot['key']} ({snapshot['kept']} kept), taken {snapshot['taken']} "
            f"({snapshot['age_s']} s ago) by epoch {snapshot['epoch']}: {snapshot['keys']} keys, "
            f"{snapshot['bytes']} bytes; watermarks {marks}"
        )
    return 0


# --- cat -------------------------------------------------------------------------------------


def _cat(
    client: WoodpeckerClient,
    name: str,
    start: LogMessageId | None,
    limit: int | None,
    follow: bool,
    as_json: bool,
) -> int:
    handle = open_log(client, name)
    reader = handle.open_reader(start if start is not None else "earliest")
    printed = 0
    try:
        while limit is None or printed < limit:
            msg = reader.read_next(None if follow else 0)
            if msg is None:
                break
            sys.stdout.write(_line(msg, as_json) + "\n")
            sys.stdout.flush()  # --follow is read as it comes (a pipe would hold it back)
            printed += 1
    except KeyboardInterrupt:
        pass
    return 0


def _line(msg: LogMessage, as_json: bool) -> str:
    key = msg.idempotency_key.hex() if msg.idempotency_key else None
    if not as_json:
        text = msg.payload.decode("utf-8", errors="backslashreplace")
        return f"{msg.message_id}\t{fmt_time(msg.timestamp_ms)}\t{key or '-'}\t{text}"
    doc: dict[str, Any] = {
        "id": str(msg.message_id),
        "timestamp_ms": msg.timestamp_ms,
        "key": key,
    }
    try:
        doc["payload"] = msg.payload.decode("utf-8")
    except UnicodeDecodeError:
        doc["payload_base64"] = base64.b64encode(msg.payload).decode()
    if msg.properties:
        doc["properties"] = dict(msg.properties)
    return json.dumps(doc)


# --- truncate --------------------------------------------------------------------------------


def _truncate(
    client: WoodpeckerClient,
    name: str,
    before: LogMessageId | None,
    older_than_s: float | None,
    dry_run: bool = False,
) -> int:
    handle = open_log(client, name)
    segments = handle.segments()
    if before is None:
        assert older_than_s is not None  # argparse requires one of them
        before = age_cutoff(segments, int(older_than_s * 1000), client.clock.now_ms())
        if before == LogMessageId(0, 0):
            print(f"{name}: no completed segment is older than {older_than_s:g} s; nothing to drop")
            return 0
    else:
        live = [s for s in segments if s.state is not SegmentState.TRUNCATED]
        end = LogMessageId(0, 0)
        if live:
            end = LogMessageId(
                live[-1].segment_id, visible_last(client.ensemble.calls, live[-1]) + 1
            )
        if before > end:
            raise InvalidArgumentError(
                f"--before {before} is past the end of log {name!r} (the next id is {end})"
            )
    was = client.meta.get_log_by_id(handle.log_id).truncated_to
    if was is not None and before <= was:
        print(f"{name}: already truncated to {was}; nothing to drop (truncation never goes back)")
        return 0
    dropped = [
        s.segment_id
        for s in segments
        if s.segment_id < before.segment_id and s.state is not SegmentState.TRUNCATED
    ]
    what = f"segments {dropped[0]}..{dropped[-1]}" if dropped else "no segment"
    if dry_run:
        print(f"{name}: would truncate to {before} (now {was or '0:0'}); {what} would be deleted")
        return 0
    handle.truncate(before)
    print(f"{name}: truncated to {before} (was {was or '0:0'}); {what} deleted")
    return 0


# --- readers ---------------------------------------------------------------------------------


def _readers(client: WoodpeckerClient, name: str, as_json: bool) -> int:
    handle = open_log(client, name)
    rows = [
        {
            "name": r.name,
            "position": str(r.position),
            "lag": r.lag,
            "epoch": r.epoch,
            "owner": r.owner or None,
            "updated": fmt_time(r.updated_ms),
        }
        for r in handle.readers()
    ]
    if as_json:
        print_json({"log": name, "readers": rows})
        return 0
    if not rows:
        print(f"{name}: no named readers")
        return 0
    cols = ["name", "position", "lag", "epoch", "owner", "updated"]
    print_table(cols, [[row[c] for c in cols] for row in rows])
    return 0


def _delete_reader(client: WoodpeckerClient, name: str, reader: str) -> int:
    handle = open_log(client, name)
    if not handle.delete_reader(reader):
        names = [r.name for r in handle.readers()]
        close = difflib.get_close_matches(reader, names, n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise InvalidArgumentError(
            f"log {name!r} has no named reader {reader!r}{hint} "
            f"(`woodpecker-idem readers list {name}` lists them)"
        )
    print(f"{name}: deleted reader {reader!r}")
    return 0


# --- drop-group ------------------------------------------------------------------------------


def _drop_group(client: WoodpeckerClient, name: str, force: bool) -> int:
    group = client.meta.get_log_group(name)
    members = [m for m in client.meta.list_logs() if m.group == name]
    if group is None and not members:
        names = [g.name for g in client.meta.list_log_groups()]
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise InvalidArgumentError(
            f"log group {name!r} does not exist{hint} (`woodpecker-idem logs` lists them)"
        )
    now = client.clock.now_ms()
    held = [m for m in members if m.lease_owner and m.lease_expires_ms > now]
    if held and not force:
        m = held[0]
        raise InvalidArgumentError(
            f"log {m.name!r} of group {name!r} has a writer ({m.lease_owner}) whose lease runs "
            f"until {fmt_time(m.lease_expires_ms)}; close it (a clean close releases the lease; "
            "a writer that died holds it until it expires, 30 s after it stopped), or pass "
            "--force (which fences the writer)"
        )
    for m in members:
        client.delete_log(m.name)
    client.meta.delete_log_group(name)
    print(f"dropped log group {name!r}: {len(members)} logs deleted")
    return 0
