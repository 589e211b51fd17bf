"""How a streaming task finds the Python worker on its host that holds a log's writer, and what
the two say to each other (holder.py serves, remote.py asks).

Where: a directory of this user's on the host (`<tmp>/woodpecker-kept-<uid>`, mode 0700, so
only this user's processes can reach the sockets in it). The worker holding a log's writer kept
after a micro-batch listens on `<pid>.sock` there and names itself in an entry per (metadata
store, log id): the store's identity, as log ids are only unique within one store.

What: messages of a JSON header and an optional body (one Arrow IPC stream of a record batch:
`payload` binary, `key` 16-byte keys, as the task computed them).

    open   {log, log_id, kept_key, batch: [app_id, version], writer}  -> {ok} or {ok: false, why}
    write  + rows                                                     -> {duplicates}
    report                                                            -> {early_evictions, ...}
    close  {keep}                                                     -> {}

Any request can be answered {error, message}: the holder's error, raised in the task as the same
class.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import stat
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from .. import errors
from .._core import Payloads
from ..errors import HandoffError, WoodpeckerError

log = logging.getLogger(__name__)

_HEAD = struct.Struct(">IQ")  # header bytes, body bytes


# --- where the holders are -----------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    """The worker process holding a log's writer, and the socket it serves on."""

    pid: int
    socket: str


def registry_dir() -> Path | None:
    """This user's directory of holders on this host; None (no handoff, with a warning) when it
    is not a private directory of this user."""
    path = Path(tempfile.gettempdir()) / f"woodpecker-kept-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
    except OSError as exc:
        log.warning("no writer handoff between Python workers: %s", exc)
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        log.warning(
            "no writer handoff between Python workers: %s is not a directory private to uid %d",
            path,
            os.getuid(),
        )
        return None
    return path


def _entry(directory: Path, store_id: str, log_id: int) -> Path:
    name = hashlib.sha256(f"{store_id}/{log_id}".encode()).hexdigest()[:32]
    return directory / f"{name}.holder"


def publish(directory: Path, store_id: str, log_id: int, holder: Holder) -> None:
    """Name `holder` as the one holding the log's writer (replacing any earlier one whole)."""
    entry = _entry(directory, store_id, log_id)
    tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pid": holder.pid, "socket": holder.socket}))
    os.replace(tmp, entry)


def lookup(directory: Path, store_id: str, log_id: int) -> Holder | None:
    return _read_entry(_entry(directory, store_id, log_id))


def _read_entry(path: Path) -> Holder | None:
    try:
        data = json.loads(path.read_text())
        return Holder(int(data["pid"]), str(data["socket"]))
    except (OSError, ValueError, KeyError, TypeError):  # gone, or half a crash's write
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: not one of ours
        return False
    return True


def sweep(directory: Path) -> None:
    """Remove the sockets, entries and half-written entries of processes that are gone (a
    Python worker ends with os._exit, cleaning nothing up). An entry another worker publishes
    between the read and the unlink here is lost: that log's next task elsewhere takes the log
    over (a new segment), as with no holder named."""
    for path in directory.iterdir():
        pid: int | None = None
        if path.suffix == ".sock" and path.stem.isdigit():
            pid = int(path.stem)
        elif path.suffix == ".tmp" and path.stem.rsplit(".", 1)[-1].isdigit():
            pid = int(path.stem.rsplit(".", 1)[-1])
        elif path.suffix == ".holder":
            found = _read_entry(path)
            pid = found.pid if found is not None else None
        if pid is not None and not alive(pid):
            with contextlib.suppress(OSError):
                path.unlink()


# --- the messages ----------------------------------------------------------------------------


def send(sock: socket.socket, header: dict[str, Any], body: Any = None) -> None:
    data = json.dumps(header).encode()
    size = 0 if body is None else len(body)
    sock.sendall(_HEAD.pack(len(data), size) + data)
    if size:
        sock.sendall(body)


def receive(sock: socket.socket) -> tuple[dict[str, Any], bytearray] | None:
    """The next message; None when the other side closed the connection between messages."""
    head = _read(sock, _HEAD.size, eof_ok=True)
    if head is None:
        return None
    header_size, body_size = _HEAD.unpack(head)
    header = _read(sock, header_size)
    assert header is not None
    body = _read(sock, body_size) if body_size else bytearray()
    assert body is not None
    return json.loads(header), body


def _read(sock: socket.socket, n: int, eof_ok: bool = False) -> bytearray | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            if got == 0 and eof_ok:
                return None
            raise ConnectionError("the connection closed in the middle of a message")
        got += k
    return buf


def encode_rows(payloads: Payloads, keys: bytes) -> pa.Buffer:
    n = len(payloads)
    key_array = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), n, [None, pa.py_buffer(keys)])
    # the payloads' buffers as they are (Arrow's C data interface), no object per row
    batch = pa.record_batch([pa.array(payloads), key_array], names=["payload", "key"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def decode_rows(body: bytearray) -> tuple[Payloads, bytes]:
    batch = pa.ipc.open_stream(pa.py_buffer(body)).read_next_batch()
    payloads = Payloads.from_arrow(batch.column(0))  # over the message's buffer, no copy
    key_array = batch.column(1)
    keys = key_array.buffers()[1].to_pybytes()
    start = key_array.offset * 16
    return payloads, keys[start : start + 16 * len(key_array)]


def error_reply(exc: BaseException) -> dict[str, Any]:
    return {"error": type(exc).__name__, "message": str(exc)}


def raise_reply(reply: dict[str, Any], holder: Holder) -> dict[str, Any]:
    """The reply, or the holder's error raised as its own class when it is one of ours."""
    name = reply.get("error")
    if name is None:
        return reply
    message = f"{reply.get('message', '')} (in the Python worker {holder.pid} holding the writer)"
    cls = getattr(errors, str(name), None)
    if isinstance(cls, type) and issubclass(cls, WoodpeckerError):
        raise cls(message)
    raise HandoffError(f"{name}: {message}")
