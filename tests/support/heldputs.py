"""An object store wrapper whose puts can be held: what a test uses to keep an upload inside a
put while it does something else (a deletion, a retention pass)."""

from __future__ import annotations

import threading

WAIT_S = 60


class HeldPuts:
    """An object store whose puts wait at `release` once `hold` is set (`held` says one is)."""

    def __init__(self, inner):
        self.inner = inner
        self.hold = threading.Event()
        self.held = threading.Event()
        self.release = threading.Event()

    def put(self, key, data, *, if_none_match=False):
        if self.hold.is_set():
            self.held.set()
            assert self.release.wait(WAIT_S), "never released"
        return self.inner.put(key, data, if_none_match=if_none_match)

    def __getattr__(self, name):
        return getattr(self.inner, name)
