"""Idempotent writes: the writer, its snapshots and window recovery."""

from .writer import IdempotentLogWriter, WriteManyResult

__all__ = ["IdempotentLogWriter", "WriteManyResult"]
