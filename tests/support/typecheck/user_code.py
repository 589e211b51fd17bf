"""User code as a type checker sees it: `e2e/test_typing.py` runs `mypy --strict` over this file.

Not collected by pytest and never run: it only has to type-check (every `type: ignore` below must
be needed, or mypy's `warn_unused_ignores` fails the check).
"""

from __future__ import annotations

from typing import assert_type

import woodpecker_idem as wp


def bulk(log: wp.LogHandle, payloads: list[bytes], ids: list[str]) -> int:
    writer = log.open_writer(idempotent=True, window_duration_s=60, window_max_keys=100_000)
    assert_type(writer, wp.IdempotentLogWriter)
    result = writer.write_many(payloads, ids)
    assert_type(result, wp.WriteManyResult)
    first: wp.LogMessageId = result.message_id(0)
    writer.close()
    return first.entry_id + len(result)


def plain(log: wp.LogHandle) -> wp.WriteResult:
    writer = log.open_writer()
    assert_type(writer, wp.LogWriter)
    return writer.write(b"payload")


def either(log: wp.LogHandle, idempotent: bool) -> None:
    writer = log.open_writer(idempotent, window_max_keys=10)
    writer.write(b"payload")


def mistakes(log: wp.LogHandle) -> None:
    log.open_writer(idempotent=True, window_max_key=10)  # type: ignore[call-overload]
    log.open_writer(window_max_keys=10)  # type: ignore[call-overload]
    log.open_writer().write_many([b"x"], ids=["id"])  # type: ignore[call-arg]  # ids: idempotent only
