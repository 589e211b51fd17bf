"""Many producers, one log group: `GroupWriter` (`client.open_group_writer`).

A log group is P logs `{group}-{route}`; a key's route is `route_keys(key, P)`, as Spark's
`prepare` computes it, so a key always meets the same log. A log has one writer at a time (a new
writer fences the one before, by epoch): several processes writing one group therefore split its
routes. Each `GroupWriter` is a member of the group in the metadata store (`join_group`, renewed
every third of `writer.lease_ms`, left on close) and owns the routes the live members' sorted ids
assign it (route r to member r mod M). It opens a writer for each route it owns, refuses keys of
the others with `RouteNotOwnedError`, and on every membership tick (or `rebalance()`) gives up
routes that moved away (flushes and closes their writers: the leases are released) and takes up
routes that moved to it once their previous writer's lease is over (released, or run out: a
member that died). So live members never fence each other, and a dead member's routes move once
its lease runs out.

Its writers share the client's senders and scheduler (the membership tick is a timer of the
client's scheduler, its work a task there): threads do not grow with routes.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, NamedTuple

from .._core import content_key, explicit_key, route_keys
from ..args import timeout_arg
from ..errors import (
    InvalidArgumentError,
    LogExistsError,
    LogGroupSizeMismatchError,
    LogNotFoundError,
    RouteNotOwnedError,
    WoodpeckerError,
    WriterFencedError,
)
from ..types import LogMessage, LogMessageId
from . import reader as reader_module

if TYPE_CHECKING:
    from ..types import WriteMessage, WriteResult
    from .client import WoodpeckerClient
    from .reader import LogReader

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 30.0  # a route given up: its writer's flush and close


def log_name(group: str, route: int) -> str:
    """The log of `route` in `group` (also the Spark sink's)."""
    return f"{group}-{route}"


def route_of(key: bytes, partitions: int) -> int:
    """The route of one 16-byte key among `partitions` logs."""
    return int.from_bytes(route_keys(key, partitions)[:4], "little")


class GroupWriter:
    """See the module doc. Thread-safe; close it (or use it as a context manager) to leave the
    group at once (else its membership and leases run out after `writer.lease_ms`)."""

    def __init__(
        self,
        client: WoodpeckerClient,
        group: str,
        partitions: int,
        *,
        idempotent: bool = True,
    ):
        self.client = client
        self.group = group
        self.partitions = partitions
        self.idempotent = idempotent
        self.member = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._lease_ms = client.config.writer.lease_ms
        self._lock = threading.Lock()  # guards _writers, _closed
        self._writers: dict[int, Any] = {}  # route -> its writer, for the routes owned
        self._assigned: frozenset[int] = frozenset()  # what the last tick assigned this member
        self._closed = False
        self._ensure_group()
        self._join()
        self.rebalance()
        scheduler = client.ensemble.scheduler
        self._task_key = f"group-{group}-{self.member}"
        self._timer = scheduler.timer(self._tick, self._task_key)
        self._timer.at(time.monotonic() + self._lease_ms / 3000)

    # --- writing -----------------------------------------------------------------------------

    def route_of(
        self, message: WriteMessage | bytes, *, idempotency_id: str | bytes | None = None
    ) -> int:
        """The route (and log, `log_name(group, route)`) a write of `message` goes to."""
        payload = message if isinstance(message, bytes) else bytes(message.payload)
        key = content_key(payload) if idempotency_id is None else explicit_key(idempotency_id)
        return route_of(key, self.partitions)

    def routes(self) -> frozenset[int]:
        """The routes this member owns now (it writes keys of these only)."""
        with self._lock:
            return frozenset(self._writers)

    def write(
        self,
        message: WriteMessage | bytes,
        *,
        idempotency_id: str | bytes | None = None,
        timeout: float | None = None,
    ) -> WriteResult:
        """Write to the log of the key's route, if this member owns it (else
        `RouteNotOwnedError`, retriable: ownership moves); as the route's writer's `write`."""
        writer, route = self._writer_for(message, idempotency_id)
        kw = {"idempotency_id": idempotency_id} if idempotency_id is not None else {}
        try:
            return writer.write(message, timeout=timeout, **kw)
        except WriterFencedError as exc:  # another member took the route over meanwhile
            raise self._moved(route, exc) from exc

    def write_async(
        self, message: WriteMessage | bytes, *, idempotency_id: str | bytes | None = None
    ) -> Future[WriteResult]:
        """`write`, queued: the future resolves with the route's writer's outcome."""
        writer, _ = self._writer_for(message, idempotency_id)
        kw = {"idempotency_id": idempotency_id} if idempotency_id is not None else {}
        return writer.write_async(message, **kw)

    def _writer_for(
        self, message: WriteMessage | bytes, idempotency_id: str | bytes | None
    ) -> tuple[Any, int]:
        if idempotency_id is not None and not self.idempotent:
            raise self._plain_with_id()
        route = self.route_of(message, idempotency_id=idempotency_id)
        with self._lock:
            self.client.check_open()
            if self._closed:
                raise RouteNotOwnedError(
                    f"group writer {self.member} of {self.group!r} is closed", route=route
                )
            writer = self._writers.get(route)
        if writer is None or writer.stopped:
            raise self._moved(route)
        return writer, route

    def _moved(self, route: int, cause: BaseException | None = None) -> RouteNotOwnedError:
        owner = None
        try:
            found = self.client.meta.get_log(log_name(self.group, route))
            if found.lease_owner:
                owner = found.lease_owner
        except WoodpeckerError:
            pass
        why = f" ({cause})" if cause is not None else ""
        return RouteNotOwnedError(
            f"route {route} of group {self.group!r} (log {log_name(self.group, route)!r}) is not "
            f"owned by this group writer ({self.member}; it owns {sorted(self.routes())}); its "
            f"writer is {owner or 'being handed over'}{why}. Send the key to the member that "
            "owns the route, or retry once the group has rebalanced",
            route=route,
            owner=owner,
        )

    def _plain_with_id(self) -> WoodpeckerError:
        return InvalidArgumentError(
            "idempotency_id given to a plain group writer; open it with idempotent=True"
        )

    # --- membership --------------------------------------------------------------------------

    def _ensure_group(self) -> None:
        meta, now = self.client.meta, self.client.clock.now_ms()
        try:
            meta.create_log_group(self.group, self.partitions, now)
        except LogGroupSizeMismatchError as exc:
            raise LogGroupSizeMismatchError(
                f"{exc}. The route of a key depends on P, so a group keeps its P: open it with "
                "the partitions it was created with, or use a new group name"
            ) from exc
        for route in range(self.partitions):
            try:
                meta.create_log(log_name(self.group, route), now, group=self.group)
            except LogExistsError:
                pass

    def _join(self) -> None:
        self.client.meta.join_group(
            self.group, self.member, self.client.clock.now_ms(), self._lease_ms
        )

    def _tick(self) -> float | None:
        """On the scheduler's timer thread: the membership round runs as a task (it makes
        metadata calls and opens writers)."""
        if self._closed or self.client.closed:
            return None
        self.client.ensemble.scheduler.submit(self._task_key, self._round)
        return self._lease_ms / 3000

    def _round(self) -> None:
        if self._closed or self.client.closed:
            return
        try:
            self._join()
            self.rebalance()
        except WoodpeckerError as exc:  # the metadata store is down: the next round retries
            log.warning(
                "group %s member %s: membership round failed: %s", self.group, self.member, exc
            )

    def rebalance(self) -> frozenset[int]:
        """Apply the group's membership now (the tick does it every third of
        `writer.lease_ms`): give up the routes assigned elsewhere (their writers flushed and
        closed) and take up the routes assigned here whose previous writer's lease is over.
        Returns the routes owned afterwards."""
        meta, now = self.client.meta, self.client.clock.now_ms()
        members = meta.list_group_members(self.group, now)
        if self.member not in members:  # our own record ran out (a stall): join again
            self._join()
            members = sorted([*members, self.member])
        me = members.index(self.member)
        assigned = frozenset(r for r in range(self.partitions) if r % len(members) == me)
        with self._lock:
            if self._closed:
                return frozenset()
            self._assigned = assigned
            leaving = [(r, w) for r, w in self._writers.items() if r not in assigned or w.stopped]
            for r, _ in leaving:
                del self._writers[r]
            missing = [r for r in sorted(assigned) if r not in self._writers]
        for route, writer in leaving:
            log.info("group %s member %s: route %s moves away", self.group, self.member, route)
            _close_quietly(writer)
        for route in missing:
            name = log_name(self.group, route)
            held = meta.get_log(name)
            if held.lease_owner and held.lease_expires_ms > now:
                continue  # its writer (another member's, handing over) still holds the lease
            try:
                writer = self.client.open_log(name).open_writer(self.idempotent)
            except WriterFencedError as exc:
                # another member took it up between our look at its lease and our takeover
                # (its view of the membership was older or newer): it keeps it; the next
                # round looks again
                log.info("group %s route %s: taken up elsewhere: %s", self.group, route, exc)
                continue
            with self._lock:
                if self._closed or route not in self._assigned:
                    keep = False
                else:
                    self._writers[route] = writer
                    keep = True
            if not keep:
                _close_quietly(writer)
            else:
                log.info("group %s member %s: took route %s", self.group, self.member, route)
        return self.routes()

    # --- closing -----------------------------------------------------------------------------

    def close(self, timeout: float | None = CLOSE_TIMEOUT_S) -> None:
        """Flush and close every route's writer (their leases released) and leave the group: the
        other members take its routes up at their next round."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            writers = list(self._writers.values())
            self._writers.clear()
        self._timer.cancel()
        for writer in writers:
            _close_quietly(writer, timeout)
        try:
            self.client.meta.leave_group(self.group, self.member)
        except WoodpeckerError as exc:  # its record runs out by itself
            log.warning("group %s member %s: not left: %s", self.group, self.member, exc)

    def __enter__(self) -> GroupWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_quietly(writer: Any, timeout: float | None = CLOSE_TIMEOUT_S) -> None:
    try:
        writer.close(timeout)
    except WoodpeckerError as exc:
        log.warning("closing a route's writer: %s", exc)


# --- reading a group ---------------------------------------------------------------------------

GROUP_READ_CHUNK = 500  # entries taken from one log before the next log's turn


class GroupEntry(NamedTuple):
    """An entry of a group read by a `GroupReader`: its route (the log `{group}-{route}`) and
    the message."""

    route: int
    message: LogMessage


class GroupReader:
    """Reads every log of a group (`client.open_group_reader`): one `LogReader` per route, taken
    in turns (a chunk from each), each log's entries in their order (there is no order across
    logs). Named, each route's reader keeps its position under the name (`commit`); a writer of
    the same client wakes it as it wakes a `LogReader`. A context manager."""

    def __init__(
        self,
        client: WoodpeckerClient,
        group: str,
        start: str | LogMessageId = "earliest",
        *,
        name: str | None = None,
        start_time_ms: int | None = None,
    ):
        found = client.meta.get_log_group(group)
        if found is None:
            raise LogNotFoundError(f"no log group {group!r} (write it first, or check the name)")
        self.group = group
        self.partitions = found.partitions
        self.name = name
        self._readers: list[LogReader] = []
        try:
            for route in range(found.partitions):
                log = client.open_log(log_name(group, route))
                self._readers.append(log.open_reader(start, name=name, start_time_ms=start_time_ms))
        except BaseException:
            self.close()
            raise
        self._client = client
        self._tails = client.ensemble.tails
        self._log_ids = tuple(r.log_id for r in self._readers)
        self._turn = 0  # the route whose turn it is
        self._taken = 0  # entries taken from it in this turn

    def read_next(self, timeout: float | None = 0.0) -> GroupEntry | None:
        """The next entry of any log of the group; waits up to `timeout` seconds (None: forever)
        for one to be written."""
        timeout = timeout_arg(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = reader_module.POLL_MIN_S
        while True:
            seen = self._tails.version(self._log_ids)
            entry = self._take()
            if entry is not None:
                return entry
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            self._client.check_open()
            wait = delay if left is None else min(delay, left)
            if self._tails.wait(self._log_ids, seen, wait):
                delay = reader_module.POLL_MIN_S
            else:
                delay = min(delay * 2, reader_module.POLL_MAX_S)

    def _take(self) -> GroupEntry | None:
        """The next entry now, in turns: up to GROUP_READ_CHUNK from a log, then the next."""
        n = len(self._readers)
        for _ in range(n + 1):
            route = self._turn
            if self._taken < GROUP_READ_CHUNK:
                message = self._readers[route].read_next(0)
                if message is not None:
                    self._taken += 1
                    return GroupEntry(route, message)
            self._turn = (route + 1) % n
            self._taken = 0
        return None

    def __iter__(self) -> Iterator[GroupEntry]:
        """Every entry currently in the group's logs from the positions on (does not wait)."""
        while True:
            entry = self._take()
            if entry is None:
                return
            yield entry

    def positions(self) -> dict[int, LogMessageId]:
        """Each route's next entry."""
        return {route: r.position for route, r in enumerate(self._readers)}

    def commit(self) -> dict[int, LogMessageId]:
        """Commit each route's position (a named group reader): the next open of the name
        resumes after the entries returned. `ReaderFencedError` if the name was opened again."""
        return {route: r.commit() for route, r in enumerate(self._readers)}

    def close(self) -> None:
        """Close every route's reader (commits asked for with `commit_async` are stored)."""
        for r in self._readers:
            r.close()

    def __enter__(self) -> GroupReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
