"""The value types users see: positions, messages, results, segment states."""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field
from typing import NamedTuple

from .errors import InvalidArgumentError, InvalidTypeError


class LogMessageId(NamedTuple):
    """Position of an entry: ordered by (segment_id, entry_id), hashable, cheap to create."""

    segment_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.segment_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str) -> LogMessageId:
        """The id `str(id)` prints, `SEGMENT:ENTRY` (e.g. "3:120"), both non-negative integers.

        Raises `InvalidArgumentError` (a `ValueError`) naming the text when it is not one, and
        `InvalidTypeError` when it is not a str."""
        if not isinstance(text, str):
            raise InvalidTypeError(
                f"LogMessageId.parse takes a str like '3:120', not {type(text).__name__}"
            )
        seg, sep, entry = text.strip().partition(":")
        if not (sep and seg.isascii() and seg.isdigit() and entry.isascii() and entry.isdigit()):
            raise InvalidArgumentError(
                f"{text!r} is not a message id: write SEGMENT:ENTRY with two non-negative "
                "integers, e.g. '3:120' (as str(LogMessageId) prints it)"
            )
        return cls(int(seg), int(entry))


class Unconditional(enum.Enum):
    """The default of `expected_last`: append wherever the log ends (no condition)."""

    UNCONDITIONAL = "UNCONDITIONAL"


UNCONDITIONAL = Unconditional.UNCONDITIONAL
# What a conditional append expects the log's last entry to be (None: the log holds none)
ExpectedLast = LogMessageId | None | Unconditional


def expected_last_arg(value: object) -> ExpectedLast:
    """`expected_last` of a write: a `LogMessageId`, its text ("3:120"), None (the log must hold
    no entry) or `UNCONDITIONAL`; anything else is refused naming what it got."""
    if value is None or value is UNCONDITIONAL:
        return value
    if isinstance(value, str):
        return LogMessageId.parse(value)
    if isinstance(value, tuple) and len(value) == 2:
        seg, entry = value
        if (
            isinstance(seg, int)
            and isinstance(entry, int)
            and not isinstance(seg, bool)
            and not isinstance(entry, bool)
            and seg >= 0
            and entry >= 0
        ):
            return LogMessageId(seg, entry)
    raise InvalidArgumentError(
        f"expected_last must be a LogMessageId (or its text, e.g. '3:120'), or None for a log "
        f"that holds no entry; got {value!r}"
    )


class ReaderInfo(NamedTuple):
    """A named reader of a log (`LogHandle.readers()`): where its name resumes (`position`, the
    next entry it returns), how many entries it is behind the end of the log (`lag`), its epoch
    (opens so far) and who opened it last (host:pid) and when it last committed or opened."""

    name: str
    position: LogMessageId
    lag: int
    epoch: int
    owner: str
    updated_ms: int


class SegmentState(enum.Enum):
    """Woodpecker's segment life cycle: ACTIVE -> COMPLETED -> SEALED -> TRUNCATED."""

    ACTIVE = "ACTIVE"
    COMPLETED = "COMPLETED"
    SEALED = "SEALED"
    TRUNCATED = "TRUNCATED"


@dataclass(frozen=True, slots=True)
class WriteMessage:
    """A payload plus optional string properties (properties are not part of the content key)."""

    payload: bytes
    properties: dict[str, str] = field(default_factory=dict)


class WriteResult(NamedTuple):
    """Where a write landed; `duplicate` is True iff this call did not create the entry.

    A NamedTuple, not a dataclass: one is made per acknowledged write, on the hot path.
    """

    message_id: LogMessageId
    duplicate: bool = False


@dataclass(frozen=True)
class WriteManyResult:
    """Columnar results of a batch call (`write_many`, `write_keyed`, `write_arrow`): no object
    per row."""

    segment_ids: array  # array('q')
    entry_ids: array  # array('q')
    duplicate: bytearray  # 1 where the row did not create its entry

    def __len__(self) -> int:
        return len(self.entry_ids)

    def message_id(self, i: int) -> LogMessageId:
        return LogMessageId(self.segment_ids[i], self.entry_ids[i])


class LogMessage(NamedTuple):
    """An entry read back from the log.

    A NamedTuple, not a dataclass: a reader makes one per entry (a frozen dataclass cost half
    of a read-back's time).
    """

    message_id: LogMessageId
    payload: bytes
    properties: dict[str, str]
    timestamp_ms: int
    idempotency_key: bytes | None = None
