"""LogStore nodes: the object-mode engine and the transports that reach it."""

from .engine import LogStoreEngine
from .transport import FaultInjectingTransport, InProcessTransport, LogStoreTransport

__all__ = ["FaultInjectingTransport", "InProcessTransport", "LogStoreEngine", "LogStoreTransport"]
