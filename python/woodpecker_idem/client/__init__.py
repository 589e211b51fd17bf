"""The log client: connect(), LogHandle, LogWriter, LogReader."""

from .client import WoodpeckerClient, connect
from .log import LogHandle
from .reader import LogReader
from .writer import LogWriter

__all__ = ["LogHandle", "LogReader", "LogWriter", "WoodpeckerClient", "connect"]
