"""Local-directory ObjectStore: the embedded default.

Every object is one file below `root`. Puts are atomic and durable: the bytes go to a temp file in
the target directory, which is fsynced and then published with `os.link` (create-if-absent: the
kernel refuses an existing name, so exactly one of several concurrent creators wins, across threads
and processes) or `os.replace` (overwrite); the directory is fsynced afterwards so the new name
survives a crash. Readers therefore see either the whole old or the whole new file, never a part.
That sequence is one native call (`_core.put_file`), so a put gives up the GIL once, not per call.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import time
from collections.abc import Iterable, Iterator

from woodpecker_idem._core import put_file
from woodpecker_idem.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    StorageUnavailableError,
)
from woodpecker_idem.objectstore.base import ObjectStore

logger = logging.getLogger(__name__)

#: Temp files start with this; `list` skips them and keys may not use it (so switching backends
#: never makes a valid key invalid).
TEMP_PREFIX = ".wp-tmp-"
#: A temp file this old is a leftover of a killed process (a put writes, syncs and publishes it
#: within one call, and writing keeps its mtime fresh), so opening the store removes it.
STALE_TEMP_S = 600.0

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC
# Temp names: pid + a process-wide counter (next() on a count is atomic under the GIL); cheaper
# than a random name per put. O_EXCL still guards against a crashed process's leftovers.
_temp_seq = itertools.count()
_FULL = (errno.ENOSPC, errno.EDQUOT)
# put_file outcomes
_PUBLISHED, _EXISTS, _TEMP_TAKEN, _NO_DIRECTORY = 0, 1, 2, 3


def validate_key(key: object, *, name: str = "key") -> str:
    """Reject keys that are not portable across backends or could escape the root."""
    if not isinstance(key, str):
        raise InvalidTypeError(f"{name} must be a str, got {type(key).__name__}")
    if not key:
        raise InvalidArgumentError(f"{name} must not be empty")
    _check_common(key, name)
    for part in key.split("/"):
        if part in ("", "."):
            raise InvalidArgumentError(
                f"{name} {key!r} has an empty or '.' path component (use single '/' separators)"
            )
        if part.startswith(TEMP_PREFIX):
            raise InvalidArgumentError(f"{name} {key!r} uses the reserved prefix {TEMP_PREFIX!r}")
    return key


def validate_prefix(prefix: object, *, name: str = "prefix") -> str:
    """Like `validate_key`, but a prefix may be empty and may end with '/' (a string prefix)."""
    if not isinstance(prefix, str):
        raise InvalidTypeError(f"{name} must be a str, got {type(prefix).__name__}")
    if prefix:
        _check_common(prefix, name)
    return prefix


def _check_common(value: str, name: str) -> None:
    if value.startswith("/"):
        raise InvalidArgumentError(f"{name} {value!r} must be relative (no leading '/')")
    if "\\" in value:
        raise InvalidArgumentError(f"{name} {value!r} must not contain a backslash")
    if "\x00" in value:
        raise InvalidArgumentError(f"{name} {value!r} must not contain a NUL character")
    if ".." in value.split("/"):
        raise InvalidArgumentError(f"{name} {value!r} must not contain a '..' component")


def as_bytes(data: object) -> bytes | bytearray | memoryview:
    """Accept any bytes-like payload; refuse str and friends with a clear error."""
    if isinstance(data, bytes | bytearray | memoryview):
        return data
    raise InvalidTypeError(f"data must be bytes-like, got {type(data).__name__}")


class LocalObjectStore(ObjectStore):
    """Objects as files below a root directory (safe across threads and processes)."""

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        """`fsync=False` skips every fsync: only for tests and benchmarks, never for real data."""
        self.root = os.path.abspath(os.fspath(root))
        self._fsync = fsync
        if not os.path.isdir(self.root):
            self._make_dirs(self.root)
        self.sweep_temp_files(STALE_TEMP_S)

    def __repr__(self) -> str:
        return f"LocalObjectStore({self.root!r})"

    # --- paths ---------------------------------------------------------------------------------

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def _make_dirs(self, path: str) -> None:
        """mkdir -p that fsyncs the parent of each directory it creates (so the name is durable)."""
        missing: list[str] = []
        cur = path
        while not os.path.isdir(cur):
            missing.append(cur)
            parent = os.path.dirname(cur)
            if parent == cur:
                break
            cur = parent
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                if not os.path.isdir(d):
                    raise
                continue  # a concurrent creator made it; it fsyncs the parent itself
            self._sync_dir(os.path.dirname(d))

    def _sync_dir(self, path: str) -> None:
        if not self._fsync:
            return
        fd = os.open(path, _DIR_FLAGS)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # --- contract ------------------------------------------------------------------------------

    def child(self, prefix: str) -> LocalObjectStore:
        """The subdirectory `prefix`, with the same fsync policy."""
        validate_key(prefix, name="prefix")
        return LocalObjectStore(self._path(prefix), fsync=self._fsync)

    def put(self, key: str, data: bytes, *, if_none_match: bool = False) -> bool:
        """Atomic, durable put; with `if_none_match` exactly one concurrent creator gets True.

        The write, sync and publish run in one native call (`_core.put_file`) that releases the
        GIL once: from Python, each of its ~9 system calls would wait to win the GIL back from
        any busy Python thread, up to 5 ms each.
        """
        validate_key(key)
        payload = as_bytes(data)
        final = self._path(key)
        head, tail = os.path.split(final)
        for _attempt in range(5):
            tmp = os.path.join(head, f"{TEMP_PREFIX}{tail}.{os.getpid()}.{next(_temp_seq)}")
            try:
                outcome = put_file(tmp, final, payload, exclusive=if_none_match, sync=self._fsync)
            except NotADirectoryError:
                raise InvalidArgumentError(f"key {key!r} lies below an existing object") from None
            except OSError as exc:
                self._raise_put_error(exc, key, final)
                raise
            if outcome == _PUBLISHED:
                return True
            if outcome == _EXISTS:
                if os.path.isdir(final):
                    raise InvalidArgumentError(f"key {key!r} names a directory of other objects")
                return False
            if outcome == _NO_DIRECTORY:  # first object here, or a delete_prefix removed it
                self._make_dirs(head)
            # _TEMP_TAKEN: a leftover of a crashed process that had our pid: pick another name
        raise OSError(errno.ENOENT, f"directory keeps vanishing (attempts={_attempt + 1})", head)

    def _raise_put_error(self, exc: OSError, key: str, final: str) -> None:
        """What a failed write of `key` means to the caller, raised; returns when `exc` is
        nothing more than itself (the caller raises it)."""
        if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST) and os.path.isdir(final):
            raise InvalidArgumentError(f"key {key!r} names a directory of other objects") from None
        if exc.errno in _FULL:  # retriable once space is freed, like an S3 outage
            raise StorageUnavailableError(
                f"object store {self.root}: cannot write {key!r}: {exc.strerror}; free space "
                "(woodpecker-idem truncate or drop-group, retention) or grow the disk"
            ) from exc

    def put_parts(self, key: str, parts: Iterable[bytes]) -> int:
        """Atomic, durable put of the parts end to end, written as they come: a temp file in
        the target directory, fsynced, renamed over `key`, then the directory fsynced (as `put`
        does in one native call; here the parts arrive between the writes). A failure part way
        removes the temp file and leaves `key` as it was."""
        validate_key(key)
        final = self._path(key)
        head, tail = os.path.split(final)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC
        for _attempt in range(5):
            tmp = os.path.join(head, f"{TEMP_PREFIX}{tail}.{os.getpid()}.{next(_temp_seq)}")
            try:
                fd = os.open(tmp, flags, 0o666)
            except FileExistsError:  # a crashed process's leftover with our pid
                continue
            except FileNotFoundError:  # first object here, or a delete_prefix removed it
                self._make_dirs(head)
                continue
            except NotADirectoryError:
                raise InvalidArgumentError(f"key {key!r} lies below an existing object") from None
            break
        else:
            raise OSError(
                errno.ENOENT, f"cannot create a temp file (attempts={_attempt + 1})", head
            )
        published = False
        try:
            try:
                written = 0
                for part in parts:
                    written += write_all(fd, as_bytes(part))
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
            published = True
            self._sync_dir(head)
        except OSError as exc:
            self._raise_put_error(exc, key, final)
            raise
        finally:
            if not published:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
        return written

    def get(self, key: str) -> bytes | None:
        """The file's bytes, or None; a directory is not an object."""
        validate_key(key)
        try:
            with open(self._path(key), "rb", buffering=0) as f:
                return f.readall()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def list(self, prefix: str) -> list[str]:
        """Keys starting with `prefix` (a string prefix), sorted; walks only below its directory."""
        validate_prefix(prefix)
        slash = prefix.rfind("/")
        base_rel, name_prefix = prefix[: slash + 1], prefix[slash + 1 :]
        keys: list[str] = []
        try:
            it = os.scandir(os.path.join(self.root, base_rel) if base_rel else self.root)
        except (FileNotFoundError, NotADirectoryError):
            return keys
        with it:
            top = [e for e in it if e.name.startswith(name_prefix)]
        for entry in top:
            keys.extend(_walk_entry(entry, base_rel))
        keys.sort()
        return keys

    def delete(self, key: str) -> None:
        """Unlink the file; absent is fine."""
        validate_key(key)
        path = self._path(key)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return
        except IsADirectoryError:
            return  # a directory of other objects is not an object
        except PermissionError:
            if os.path.isdir(path):  # macOS reports EPERM for unlink(dir)
                return
            raise
        self._sync_dir(os.path.dirname(path))

    def sweep_temp_files(self, max_age_s: float = STALE_TEMP_S) -> int:
        """Remove temp files older than `max_age_s` (left by processes killed mid-put); runs when
        the store opens.

        Judged by age, not by whether the creating PID is alive: the directory may be shared by
        hosts or containers whose PIDs this process cannot see, and PIDs are reused.
        """
        cutoff = time.time() - max_age_s
        removed = 0
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                if not name.startswith(TEMP_PREFIX):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    if os.stat(path).st_mtime < cutoff:
                        os.unlink(path)
                        removed += 1
                except FileNotFoundError:
                    continue
                except OSError as exc:  # e.g. a read-only directory: housekeeping only
                    logger.debug("could not remove stale temp file %s: %s", path, exc)
        if removed:
            logger.info("removed %d stale temp file(s) below %s", removed, self.root)
        return removed

    def delete_prefix(self, prefix: str) -> int:
        """Remove every key under `prefix` and prune the directories it emptied."""
        validate_prefix(prefix)
        keys = self.list(prefix)
        dirs: set[str] = set()
        for key in keys:
            path = self._path(key)
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            dirs.add(os.path.dirname(path))
        # Prune empty directories, deepest first; a concurrent put simply recreates them.
        pruned: set[str] = set()
        for d in sorted(dirs, key=len, reverse=True):
            while d != self.root and d.startswith(self.root + os.sep) and d not in pruned:
                try:
                    os.rmdir(d)
                except OSError:
                    break
                pruned.add(d)
                d = os.path.dirname(d)
            dirs.add(d)
        for d in dirs - pruned:
            if os.path.isdir(d):
                self._sync_dir(d)
        return len(keys)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> int:
    """Write all of `data` to `fd` (os.write may write less); returns its length."""
    view = memoryview(data)
    total = len(view)
    while view:
        view = view[os.write(fd, view) :]
    return total


def _walk_entry(entry: os.DirEntry[str], rel_dir: str) -> Iterator[str]:
    """Every object key at or below `entry` (iterative: no recursion limit on deep trees)."""
    stack: list[tuple[os.DirEntry[str], str]] = [(entry, rel_dir)]
    while stack:
        e, rel = stack.pop()
        if e.name.startswith(TEMP_PREFIX):
            continue
        if e.is_dir(follow_symlinks=False):
            sub = f"{rel}{e.name}/"
            try:
                with os.scandir(e.path) as it:
                    stack.extend((child, sub) for child in it)
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed while we walked
        elif e.is_file(follow_symlinks=False):
            yield rel + e.name
