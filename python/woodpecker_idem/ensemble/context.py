"""What a writer or reader of one log is given: the log, the client's settings and stores, and the
client's ensemble layer. Not the client: the layers above it do not reach back through it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..clock import Clock
    from ..config import Config
    from ..logstore.transport import LogStoreTransport
    from ..meta.base import MetadataStore
    from ..objectstore.base import ObjectStore
    from .ensemble import Ensemble


@dataclass(frozen=True, slots=True)
class LogContext:
    log_id: int
    name: str
    config: Config
    clock: Clock
    meta: MetadataStore
    objects: ObjectStore
    ensemble: Ensemble
    # How the log's nodes are reached, fixed when the context is made (a test may open one
    # writer through a fault injector and the next without): the senders call it as it is, and
    # `calls` wraps it with the ensemble's deadline for synchronous calls.
    transport: LogStoreTransport
    calls: LogStoreTransport
    client_closed: Callable[[], bool]  # the client's close has begun
