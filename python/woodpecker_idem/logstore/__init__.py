"""LogStore nodes: the object-mode engine and the transports that reach it."""

from .engine import LogStoreEngine
from .transport import InProcessTransport, LogStoreTransport

__all__ = ["InProcessTransport", "LogStoreEngine", "LogStoreTransport"]
