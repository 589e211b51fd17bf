"""The object-storage contract the LogStore and the snapshot writer rely on."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable


class ObjectStore(ABC):
    """Flat key -> bytes storage with create-if-absent puts.

    Keys are relative, "/"-separated, never start with "/" and never contain "..". `put` with
    `if_none_match=True` is the fencing primitive: exactly one of several concurrent creators wins.
    Transient failures are retried with backoff inside the backend; when retries run out the backend
    raises `StorageUnavailableError`. What no retry fixes (credentials, access, a missing bucket)
    raises `StorageAccessError` at once.
    """

    @abstractmethod
    def put(self, key: str, data: bytes, *, if_none_match: bool = False) -> bool:
        """Store `data` at `key`. With `if_none_match`, returns False (and writes nothing) if the
        key exists; otherwise returns True. Without it, atomically replaces. Durable on return."""

    def put_parts(self, key: str, parts: Iterable[bytes]) -> int:
        """Store the concatenation of `parts` at `key`, atomically replacing it, durable on
        return; returns the bytes written. For objects too large to hold whole (a snapshot of a
        large window is produced a chunk at a time): a backend writes each part as it comes and
        publishes the object only once the last is written, so a failure part way leaves the key
        as it was. This default joins the parts and puts them (for stores of small objects)."""
        data = b"".join(parts)
        self.put(key, data)
        return len(data)

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None if absent."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Every key starting with `prefix`, sorted lexicographically."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove `key`; deleting an absent key is not an error."""

    def delete_prefix(self, prefix: str) -> int:
        """Remove every key under `prefix`; returns how many were removed."""
        keys = self.list(prefix)
        for key in keys:
            self.delete(key)
        return len(keys)

    @abstractmethod
    def child(self, prefix: str) -> ObjectStore:
        """A store for the keys under `prefix/`, sharing this store's connections (closing either
        closes them). How one metadata store's objects are kept apart from another's."""

    def probe(self) -> None:  # noqa: B027 - optional hook
        """Check the store can be used (reachable, credentials, bucket), raising a clear error
        within a short budget. A local directory was checked when it was opened."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the default has none."""
