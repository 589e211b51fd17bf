"""The log client: WoodpeckerClient, LogHandle, LogReader (`connect()`, which builds a client, is
the composition root one level up: `woodpecker_idem.connect`; the writers are in
`woodpecker_idem.writer`)."""

from .client import WoodpeckerClient
from .log import LogHandle
from .reader import LogReader

__all__ = ["LogHandle", "LogReader", "WoodpeckerClient"]
