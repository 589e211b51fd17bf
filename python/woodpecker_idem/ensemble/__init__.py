"""The ensemble layer, one per client: what writers and readers ask of a segment's nodes.

ensemble.py   `Ensemble`: the parts below composed for one client
context.py    `LogContext`: what a writer or reader of one log is given (not the client)
members.py    the node directory (in-process engines, or the metadata store's registry)
placement.py  `new_ensemble(live, es, segment_id, exclude)`
senders.py    one sender per node per client (lanes, deadlines) and `NodeCalls`
scheduler.py  one scheduler per client: timers and ordered background tasks
replicas.py   quorum reads: an entry from whichever replica holds it intact
"""

from .context import LogContext
from .ensemble import Ensemble

__all__ = ["Ensemble", "LogContext"]
