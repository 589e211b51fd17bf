"""`verify`: read every entry of every log on every replica and check what can be checked.

Per replica: each entry's CRC32C, that it parses and sits at its position, the batch and block
headers on the way (the LogStore checks those as it reads), and for a completed segment the footer
(it must name the lastEntryId the metadata recorded) and that every entry up to it is there. Per
log: every dedup snapshot decodes and belongs to the log, every kept-key archive of a truncated
segment passes its checksums. Per store: the owner marker names this metadata store.

A corrupt entry does not stop the walk: the rest of the segment is read entry by entry, so every
damaged position is named (one line per distinct damage: a bad batch header makes every later
read of its segment fail the same way, reported once with the entries it hides).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .._core import check_entries, decode_snapshot
from ..client.client import DELETE_OWNER_PREFIX, WoodpeckerClient
from ..client.keyarchive import archive_prefix
from ..connect import open_object_root
from ..errors import (
    CorruptEntryError,
    LogNotFoundError,
    NodeUnavailableError,
    ObjectStoreOwnedError,
    SnapshotCorruptError,
)
from ..idempotency.snapshot import list_snapshots
from ..logstore.blocks import decode_entry, record_entry, split_frame
from ..meta.base import LogMeta, SegmentMeta
from ..objectstore.owner import OWNER_KEY, read_owner
from ..types import SegmentState
from .common import (
    DONE,
    add_store_args,
    open_client,
    print_json,
    quiet_stdout,
    stdout_closed,
)
from .logs import open_log

log = logging.getLogger(__name__)

CHUNK = 1000


@dataclass
class Problem:
    where: str  # log, segment, entries, node: the position an operator looks at
    what: str  # the damage, as the store describes it (file and byte offset when it knows)
    corrupt: bool = True  # False: could not be checked (a node down), not damage

    def line(self) -> str:
        kind = "CORRUPT" if self.corrupt else "UNCHECKED"
        return f"{kind} {self.where}: {self.what}"


@dataclass
class Report:
    logs: int = 0
    segments: int = 0
    entries: int = 0  # entries read and checked, over all replicas
    snapshots: int = 0
    archives: int = 0
    dropped: int = 0  # segments truncated or deleted while the scan read them: not checked
    dropped_logs: int = 0  # logs deleted between the listing and their scan

    def __post_init__(self) -> None:
        self.problems: list[Problem] = []


def add_parsers(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_parser(
        "verify",
        help="read every entry of every log and check CRCs, footers, snapshots and the owner "
        "marker; exit status 1 naming each corrupt position",
    )
    p.add_argument(
        "--log",
        action="append",
        default=None,
        metavar="NAME",
        help="check only this log (repeat for more); the owner marker is checked always",
    )
    add_store_args(p)


def run(args: argparse.Namespace) -> int:
    report = Report()
    try:
        with open_client(args) as client:
            _owner(client, report)
            metas = client.meta.list_logs()
            if args.log:
                for name in args.log:
                    open_log(client, name)  # LogNotFoundError with "did you mean"
                metas = [m for m in metas if m.name in set(args.log)]
            for meta in metas:
                _log(client, meta, report)
    except ObjectStoreOwnedError as exc:  # connect() checks the marker first
        report.problems.append(Problem(f"object store {OWNER_KEY}", str(exc)))
    try:
        _print(args, report)
        sys.stdout.flush()
    except BrokenPipeError:
        if not stdout_closed():
            raise
        quiet_stdout()  # the output was cut (`verify | head`), the verdict stands
    return 1 if report.problems else 0


def _print(args: argparse.Namespace, report: Report) -> None:
    if args.json:
        print_json(
            {
                "ok": not report.problems,
                "logs": report.logs,
                "segments": report.segments,
                "entries_checked": report.entries,
                "snapshots": report.snapshots,
                "key_archives": report.archives,
                "dropped_during_scan": {"segments": report.dropped, "logs": report.dropped_logs},
                "problems": [
                    {"where": p.where, "what": p.what, "corrupt": p.corrupt}
                    for p in report.problems
                ],
            }
        )
    else:
        for problem in report.problems:
            print(problem.line())
        verdict = "OK" if not report.problems else f"{len(report.problems)} problems"
        print(
            f"verify: {verdict}: {report.logs} logs, {report.segments} segments, "
            f"{report.entries} entries checked on every replica, {report.snapshots} snapshots, "
            f"{report.archives} key archives{_dropped_note(report)}"
        )


def _dropped_note(report: Report) -> str:
    """What retention, `truncate` or a delete removed while the scan ran (not checked, no fault)."""
    parts = []
    if report.dropped:
        parts.append(f"{report.dropped} segments")
    if report.dropped_logs:
        parts.append(f"{report.dropped_logs} logs")
    return f" ({' and '.join(parts)} dropped during the scan)" if parts else ""


def _owner(client: WoodpeckerClient, report: Report) -> None:
    root = open_object_root(client.config, client.data_dir)
    try:
        data = root.get(OWNER_KEY)
    finally:
        root.close()
    store_id = client.meta.store_id()
    if data is None:
        report.problems.append(Problem(f"object store {OWNER_KEY}", "missing"))
    elif read_owner(data) != store_id:
        report.problems.append(
            Problem(
                f"object store {OWNER_KEY}",
                f"names {read_owner(data)!r}, not this metadata store {store_id!r}",
            )
        )


def _log(client: WoodpeckerClient, meta: LogMeta, report: Report) -> None:
    name = f"log {meta.name!r} (id {meta.log_id})"
    try:
        segments = client.meta.list_segments(meta.log_id)
    except LogNotFoundError:
        report.dropped_logs += 1  # deleted since the logs were listed
        return
    report.logs += 1
    for seg in segments:
        if seg.state is SegmentState.TRUNCATED:
            continue
        found = len(report.problems)
        for node in seg.nodes:
            _replica(client, seg, node, f"{name} segment {seg.segment_id} on {node}", report)
        if len(report.problems) > found:
            gone = _dropped_meanwhile(client, seg)
            if isinstance(gone, str):
                # files a truncation (retention, `truncate`) or a delete removed after the
                # listing: not damage. Only what the metadata still holds is reported.
                log.info("verify: %s segment %s %s", name, seg.segment_id, gone)
                del report.problems[found:]
                report.dropped += 1
                continue
            if gone is not None:  # why its entries are gone: one line, not one per replica
                report.problems[found:] = [Problem(f"{name} segment {seg.segment_id}", gone.what)]
        report.segments += 1
    for key in list_snapshots(client.objects, meta.log_id):
        report.snapshots += 1
        data = client.objects.get(key)
        if data is None:  # trimmed by a live writer meanwhile
            continue
        try:
            snap = decode_snapshot(data)
        except SnapshotCorruptError as exc:
            report.problems.append(Problem(f"{name} snapshot {key}", str(exc)))
            continue
        if snap.log_id != meta.log_id:
            report.problems.append(
                Problem(f"{name} snapshot {key}", f"belongs to log id {snap.log_id}")
            )
    for key in client.objects.list(archive_prefix(meta.log_id)):
        report.archives += 1
        data = client.objects.get(key)
        if data is None:
            continue
        try:
            for record in split_frame(data, key):
                decode_entry(record_entry(record, key), key)
        except CorruptEntryError as exc:
            report.problems.append(Problem(f"{name} key archive {key}", str(exc)))


@dataclass
class _Unfinished:
    what: str  # a delete that removed the segment's files but not the log


def _dropped_meanwhile(client: WoodpeckerClient, seg: SegmentMeta) -> str | _Unfinished | None:
    """Why `seg` is no longer the metadata's to check (read now, after its replicas showed a
    problem), or None if it still is. A truncation records the new start and marks segments
    TRUNCATED before it deletes their files; a delete fences the log (a lease owned by
    `delete_log:`) before it deletes files and records: under that lease, live, the delete is
    under way; once it expired, the delete stopped midway and left a log without its entries
    (`_Unfinished`: reported, with what to do)."""
    try:
        log_meta = client.meta.get_log_by_id(seg.log_id)
    except LogNotFoundError:
        return "was deleted with its log during the scan"
    current = client.meta.get_segment(seg.log_id, seg.segment_id)
    if current is None:
        return "was deleted during the scan"
    if current.state is SegmentState.TRUNCATED:
        return "was truncated during the scan"
    floor = log_meta.truncated_to
    if floor is not None and seg.segment_id < floor.segment_id:
        return f"is before the log's truncation point {floor} (set during the scan)"
    if log_meta.lease_owner.startswith(DELETE_OWNER_PREFIX):
        if log_meta.lease_expires_ms > client.clock.now_ms():
            return f"is being deleted with its log ({log_meta.lease_owner})"
        return _Unfinished(
            f"entries missing: a delete of the log ({log_meta.lease_owner}) removed them and "
            "did not finish; delete the log again (drop-group --force, or client.delete_log)"
        )
    return None


def _replica(
    client: WoodpeckerClient, seg: SegmentMeta, node: str, where: str, report: Report
) -> None:
    transport = client.ensemble.calls
    log_id, sid = seg.log_id, seg.segment_id
    try:
        if seg.state in DONE:
            end = seg.last_entry_id
            footer = transport.completed_end(node, log_id, sid)
            if footer is not None and footer != end:
                report.problems.append(
                    Problem(where, f"footer says the last entry is {footer}, metadata says {end}")
                )
        else:
            end, _ = transport.last_add_confirmed(node, log_id, sid)
    except NodeUnavailableError as exc:
        report.problems.append(Problem(where, f"unavailable: {exc}", corrupt=False))
        return
    except CorruptEntryError as exc:
        report.problems.append(Problem(where, str(exc)))
        return
    damage: dict[str, list[int]] = {}  # message -> [first, last] entry it was met at
    entry = 0
    while entry <= end:
        want = min(CHUNK, end - entry + 1)
        try:
            got = _read(client, seg, node, entry, want)
        except CorruptEntryError:
            got = []
            for e in range(entry, entry + want):  # find each damaged entry of the chunk
                try:
                    got = _read(client, seg, node, e, 1)
                except CorruptEntryError as exc:
                    span = damage.setdefault(str(exc), [e, e])
                    span[1] = e
                    continue
                except NodeUnavailableError as exc:
                    report.problems.append(Problem(where, f"unavailable: {exc}", corrupt=False))
                    return
                if not got:
                    break
                report.entries += 1
            entry += want
            continue
        except NodeUnavailableError as exc:
            report.problems.append(Problem(where, f"unavailable: {exc}", corrupt=False))
            return
        if not got:
            report.problems.append(
                Problem(where, f"entries {entry}..{end} are missing on this replica")
            )
            break
        report.entries += len(got)
        entry += len(got)
    for message, (first, last) in damage.items():
        at = f"entry {sid}:{first}" if first == last else f"entries {sid}:{first}..{sid}:{last}"
        report.problems.append(Problem(f"{where}, {at}", message))


def _read(client: WoodpeckerClient, seg: SegmentMeta, node: str, entry: int, n: int) -> list:
    raw = client.ensemble.calls.read(node, seg.log_id, seg.segment_id, entry, n)
    check_entries(raw, seg.segment_id, entry)
    return raw
