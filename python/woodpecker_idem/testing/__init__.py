"""Tools for drills against your own deployment, as the project's tests use them: the history
checker (`History`: record every write attempt, read the log back, list every violation it can
prove; `woodpecker_idem.testing.history`) and a transport that injects faults between the writer
and the LogStore nodes (nodes down, adds failing, acks lost; `woodpecker_idem.testing.faults`).
See docs/architecture.md and docs/semantics.md, "Checking a history yourself"."""

from .faults import FaultInjectingTransport
from .history import KINDS, Attempt, History, Stamp, StoredLog, Verdict, check_history, read_stored

__all__ = [
    "KINDS",
    "Attempt",
    "FaultInjectingTransport",
    "History",
    "Stamp",
    "StoredLog",
    "Verdict",
    "check_history",
    "read_stored",
]
