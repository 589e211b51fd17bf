"""The write pipeline (one for plain and idempotent writers) and the writers users hold."""

from ..types import WriteManyResult
from .api import IdempotentLogWriter, LogWriter

__all__ = ["IdempotentLogWriter", "LogWriter", "WriteManyResult"]
