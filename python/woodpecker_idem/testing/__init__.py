"""Tools for drills against your own deployment, as the project's tests use them: the history
checker (`History`: record every write attempt, read the log back, list every violation it can
prove) and a transport that injects faults between the writer and the LogStore nodes (nodes
down, adds failing, acks lost). See docs/architecture.md and the README's "Operating it"."""

from ..history import Attempt, History, Stamp, Verdict, check_history
from ..logstore.transport import FaultInjectingTransport

__all__ = ["Attempt", "FaultInjectingTransport", "History", "Stamp", "Verdict", "check_history"]
