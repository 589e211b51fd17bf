"""The rules of the history checker (`woodpecker_idem.testing.history`); each finding is a proof.

Facts the rules use (docs/semantics.md):
- An entry is created by one call of its key and stores that call's payload and a timestamp read
  during the call. The calls that may have created entry E (its *creators*) are the attempts of
  E's key with E's payload that failed, or were acknowledged at E with `duplicate=False`, and whose
  [start, end] holds E's timestamp. Creation (the window lookup) happens within its creator's call.
- An acknowledged entry is committed; entries commit in entry order within a segment, so an ack
  of a later entry of the segment proves an earlier one committed too.
- An attempt that timed out left the entry it waited for pending when it ended; when it is the
  only call that can have created an entry, that entry is the one it waited for.
- The window rule is the writer's: K is in the window at `now` iff its entry is committed,
  `now - timestamp < window_duration` and K is among the newest `window_max_keys` committed keys.

Findings (each problem text starts with its kind):
- lost / wrong id: an acknowledged id is not in the log, or holds another key;
- wrong payload: an entry acknowledged as created (`duplicate=False`) holds another payload, or an
  entry holds a payload no attempt of its key wrote;
- created twice: two attempts both claim (`duplicate=False`) to have created one entry;
- stale id: an attempt returned an older entry of K although a newer one existed before it began;
- duplicate in window: K's entry E2 was created while its previous entry E1 was certainly in the
  window: E1 acknowledged before E2's creators began, the oldest E1 and the newest E2 could be
  closer than the duration (by the attempts' times), and fewer than window_max_keys other keys
  could have been committed in between (keys still pending then, or created later, do not count);
- unkeyed copy / invented entry: an entry no attempt accounts for (one attempt creates at most
  one entry); an unkeyed one copying a keyed attempt's payload is an unkeyed copy;
- timestamp: an entry's timestamp lies outside every call that could have created it.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass

from ...types import LogMessage, LogMessageId
from .model import (
    CREATED_TWICE,
    DUPLICATE,
    INVENTED,
    LOST,
    NEVER,
    STALE_ID,
    TIMESTAMP,
    UNKEYED_COPY,
    UNKNOWN,
    WRONG_ID,
    WRONG_PAYLOAD,
    Attempt,
    Verdict,
)


@dataclass
class _Entry:
    """A keyed entry with what the attempts say about its creation."""

    pos: int
    msg: LogMessage
    creators: list[Attempt]
    lo_ms: int = UNKNOWN  # earliest possible timestamp
    hi_ms: int = NEVER  # latest possible timestamp
    lo_ns: int = UNKNOWN  # earliest possible creation
    hi_ns: int = NEVER  # latest possible creation


def _name(key: bytes | None) -> str:
    return key.hex() if key else "no key"


def _matching(entries: list[_Entry]) -> int:
    """How many entries can each get a creator of their own (Kuhn's augmenting paths)."""
    owner: dict[int, int] = {}

    def augment(i: int, seen: set[int]) -> bool:
        for a in entries[i].creators:
            if id(a) in seen:
                continue
            seen.add(id(a))
            if id(a) not in owner or augment(owner[id(a)], seen):
                owner[id(a)] = i
                return True
        return False

    return sum(augment(i, set()) for i in range(len(entries)))


class Judge:
    """One judgement of a log (list of messages in log order) against its attempts."""

    def __init__(
        self, attempts: list[Attempt], msgs: list[LogMessage], window_ms: int, max_keys: int
    ) -> None:
        self.attempts = attempts
        self.msgs = msgs
        self.window_ms = window_ms
        self.max_keys = max_keys
        self.problems: list[str] = []
        self.by_id = {m.message_id: m for m in msgs}
        self.acked_at: dict[LogMessageId, list[Attempt]] = defaultdict(list)
        self.of_key: dict[bytes | None, list[Attempt]] = defaultdict(list)
        for a in attempts:
            self.of_key[a.key].append(a)
            if a.message_id is not None:
                self.acked_at[a.message_id].append(a)
        self.entries: dict[bytes, list[_Entry]] = defaultdict(list)
        self.at_pos: dict[int, _Entry] = {}
        self.rewritten = 0

    def problem(self, kind: str, text: str) -> None:
        self.problems.append(f"{kind}: {text}")

    def verdict(self) -> Verdict:
        self.check_acknowledged()
        self.check_entries()
        self.check_unkeyed()
        committed_by = self.commit_evidence()
        for entries in self.entries.values():
            self.check_stale(entries)
            for e1, e2 in zip(entries, entries[1:], strict=False):
                self.check_pair(e1, e2, committed_by)
        acked = [a for a in self.attempts if a.ok]
        return Verdict(
            ok=not self.problems,
            problems=self.problems,
            attempts=len(self.attempts),
            acknowledged_keys=len({a.key for a in acked}),
            entries=len(self.msgs),
            keyed_entries=sum(len(v) for v in self.entries.values()),
            duplicates_returned=sum(bool(a.duplicate) for a in acked),
            rewritten_after_window=self.rewritten,
        )

    # --- acknowledgements --------------------------------------------------------------------

    def check_acknowledged(self) -> None:
        for a in self.attempts:
            if a.message_id is None:
                continue
            m = self.by_id.get(a.message_id)
            if m is None:
                self.problem(
                    LOST,
                    f"key {_name(a.key)} was acknowledged at {a.message_id}, "
                    f"which is not in the log",
                )
            elif (m.idempotency_key or None) != a.key:
                self.problem(
                    WRONG_ID,
                    f"key {_name(a.key)} was acknowledged at "
                    f"{a.message_id}, which holds {_name(m.idempotency_key)}",
                )
            elif not a.duplicate and m.payload != a.payload:
                self.problem(
                    WRONG_PAYLOAD,
                    f"key {_name(a.key)} was acknowledged as created at "
                    f"{a.message_id}, which holds another payload "
                    f"({m.payload[:40]!r}, not {a.payload[:40]!r})",
                )
        for mid, acks in self.acked_at.items():
            creators = [a for a in acks if not a.duplicate]
            if len(creators) > 1:
                self.problem(
                    CREATED_TWICE,
                    f"{len(creators)} attempts of key "
                    f"{_name(creators[0].key)} each claim to have created "
                    f"{mid} (duplicate=False)",
                )

    # --- where each entry came from ----------------------------------------------------------

    def check_entries(self) -> None:
        for pos, m in enumerate(self.msgs):
            if m.idempotency_key:
                e = self.at_pos[pos] = self.entry(pos, m)
                self.entries[m.idempotency_key].append(e)
        for key, entries in self.entries.items():
            made = [e for e in entries if e.creators]  # the others are reported already
            placed = _matching(made)
            if placed < len(made):
                self.problem(
                    INVENTED,
                    f"key {_name(key)} has {len(made)} entries but only "
                    f"{placed} of them can each have a call that created it",
                )

    def entry(self, pos: int, m: LogMessage) -> _Entry:
        key = m.idempotency_key
        attempts = self.of_key.get(key, [])
        e = _Entry(pos, m, [])
        if not attempts:
            self.problem(INVENTED, f"key {_name(key)} at {m.message_id} was never written")
            return e
        same = [
            a
            for a in attempts
            if a.payload == m.payload
            and (a.message_id is None or (a.message_id == m.message_id and not a.duplicate))
        ]
        if not same:
            if any(a.payload == m.payload for a in attempts):
                self.problem(
                    INVENTED,
                    f"{m.message_id} (key {_name(key)}): no attempt can have created it (those "
                    f"with its payload were answered as duplicates or elsewhere)",
                )
            elif not any(not a.duplicate for a in self.acked_at.get(m.message_id, [])):
                self.problem(
                    WRONG_PAYLOAD,
                    f"{m.message_id} (key {_name(key)}) holds a payload "
                    f"no attempt of its key wrote: {m.payload[:40]!r}",
                )
            return e
        e.creators = [a for a in same if a.start.ms <= m.timestamp_ms <= a.end.ms]
        if not e.creators:
            self.problem(
                TIMESTAMP,
                f"{m.message_id} (key {_name(key)}) has timestamp "
                f"{m.timestamp_ms}, outside every call that could have "
                f"created it ({len(same)} calls)",
            )
            e.creators = same
        e.lo_ms = min(a.start.ms for a in e.creators)
        e.hi_ms = max(a.end.ms for a in e.creators)
        e.lo_ns = min(a.start.ns for a in e.creators)
        e.hi_ns = max(a.end.ns for a in e.creators)
        joined = [a.end for a in self.acked_at.get(m.message_id, [])]
        if joined:  # whoever was answered with this id saw it exist
            e.hi_ms = min(e.hi_ms, min(s.ms for s in joined))
            e.hi_ns = min(e.hi_ns, min(s.ns for s in joined))
        return e

    def check_unkeyed(self) -> None:
        """Each plain attempt accounts for at most one unkeyed entry, with its payload."""
        claimed = {a.message_id for a in self.of_key.get(None, []) if a.message_id is not None}
        spare: dict[bytes, int] = defaultdict(int)
        for a in self.of_key.get(None, []):
            if a.message_id is None:
                spare[a.payload] += 1
        keyed_payloads = {a.payload: a.key for a in self.attempts if a.key is not None}
        for m in self.msgs:
            if m.idempotency_key or m.message_id in claimed:
                continue
            if spare[m.payload] > 0:
                spare[m.payload] -= 1
            elif m.payload in keyed_payloads:
                self.problem(
                    UNKEYED_COPY,
                    f"{m.message_id} has no key but copies the payload "
                    f"of key {_name(keyed_payloads[m.payload])}'s write",
                )
            else:
                self.problem(
                    INVENTED,
                    f"{m.message_id} has no key and no attempt wrote it ({m.payload[:40]!r})",
                )

    # --- the window --------------------------------------------------------------------------

    def commit_evidence(self) -> dict[LogMessageId, int]:
        """The earliest ns by which each acknowledged-or-earlier entry was surely committed."""
        by_segment: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for mid, acks in self.acked_at.items():
            by_segment[mid.segment_id].append((mid.entry_id, min(a.end.ns for a in acks)))
        suffix: dict[int, tuple[list[int], list[int]]] = {}
        for seg, firsts in by_segment.items():
            firsts.sort()
            best = [NEVER] * (len(firsts) + 1)
            for i in range(len(firsts) - 1, -1, -1):
                best[i] = min(best[i + 1], firsts[i][1])
            suffix[seg] = ([entry_id for entry_id, _ in firsts], best)
        committed_by: dict[LogMessageId, int] = {}
        for m in self.msgs:
            mid = m.message_id
            if mid.segment_id in suffix:
                entry_ids, best = suffix[mid.segment_id]
                committed_by[mid] = best[bisect.bisect_left(entry_ids, mid.entry_id)]
        return committed_by

    def check_stale(self, entries: list[_Entry]) -> None:
        ids = [e.msg.message_id for e in entries]
        for a in self.of_key.get(entries[0].msg.idempotency_key, []):
            if a.message_id is None or a.message_id not in self.by_id:
                continue
            for e in entries[bisect.bisect_right(ids, a.message_id) :]:
                if e.hi_ns < a.start.ns:
                    self.problem(
                        STALE_ID,
                        f"key {_name(a.key)} was answered with "
                        f"{a.message_id}, but it had been rewritten at "
                        f"{e.msg.message_id} before that call began",
                    )
                    break

    def check_pair(self, e1: _Entry, e2: _Entry, committed_by: dict[LogMessageId, int]) -> None:
        key = e1.msg.idempotency_key
        surely_committed = committed_by.get(e1.msg.message_id, NEVER) < e2.lo_ns
        age = e2.hi_ms - e1.lo_ms  # the oldest the first entry could have been
        if not surely_committed or age >= self.window_ms:
            self.rewritten += 1
            return
        newer = self.committed_between(e1, e2)
        if newer >= self.max_keys:
            self.rewritten += 1
            return
        self.problem(
            DUPLICATE,
            f"key {_name(key)} is at {e1.msg.message_id} and again at "
            f"{e2.msg.message_id}, created at most {age} ms later with at "
            f"most {newer} other keys committed in between (in window)",
        )

    def committed_between(self, e1: _Entry, e2: _Entry) -> int:
        """Distinct other keys that may have been committed between e1 and e2's creation (stops
        counting at window_max_keys)."""
        key = e1.msg.idempotency_key
        seen: set[bytes] = set()
        for i, m in enumerate(self.msgs[e1.pos + 1 : e2.pos]):
            other = m.idempotency_key
            if not other or other == key or other in seen:
                continue
            entry = self.at_pos[e1.pos + 1 + i]
            if entry.lo_ns > e2.hi_ns:
                continue  # created after e2 was
            if (
                len(entry.creators) == 1
                and entry.creators[0].timed_out
                and (entry.creators[0].end.ns > e2.hi_ns)
            ):
                continue  # its only possible creator waited for it in vain until after e2
            seen.add(other)
            if len(seen) >= self.max_keys:
                break
        return len(seen)
