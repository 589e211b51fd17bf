"""The log client: WoodpeckerClient, LogHandle, LogWriter, LogReader (`connect()`, which builds a
client, is the composition root one level up: `woodpecker_idem.connect`)."""

from .client import WoodpeckerClient
from .log import LogHandle
from .reader import LogReader
from .writer import LogWriter

__all__ = ["LogHandle", "LogReader", "LogWriter", "WoodpeckerClient"]
