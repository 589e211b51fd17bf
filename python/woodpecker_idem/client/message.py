"""A write's payload and properties, checked before anything is queued (both writers use this)."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidTypeError, PayloadTooLargeError, WoodpeckerError
from ..types import WriteMessage


def coerce_message(
    message: WriteMessage | bytes | bytearray | memoryview,
    properties: dict[str, str] | None,
    max_bytes: int,
) -> tuple[bytes, dict | None]:
    """Validate a payload and its properties; bad input fails here, before anything is queued."""
    if type(message) is bytes and properties is None and len(message) <= max_bytes:
        return message, None  # the common case, valid by construction
    payload: bytes | bytearray | memoryview
    if isinstance(message, WriteMessage):
        payload, props = message.payload, message.properties or None
    else:
        payload, props = message, None
    if properties is not None and not isinstance(properties, dict):
        raise InvalidTypeError(
            f"properties must be a dict[str, str], not {type(properties).__name__}"
        )
    if properties:
        if props is not None and not isinstance(props, dict):
            raise InvalidTypeError(
                f"WriteMessage.properties must be a dict[str, str], not {type(props).__name__}"
            )
        props = {**(props or {}), **properties}
    if isinstance(payload, (bytearray, memoryview)):
        payload = bytes(payload)
    elif not isinstance(payload, bytes):
        raise InvalidTypeError(
            f"payload must be bytes, bytearray or memoryview, not {type(payload).__name__}"
            + (" (encode str first)" if isinstance(payload, str) else "")
        )
    if len(payload) > max_bytes:
        raise PayloadTooLargeError(
            f"payload is {len(payload)} bytes; append.max_entry_bytes allows {max_bytes}"
        )
    if props is not None:
        if not isinstance(props, dict):
            raise InvalidTypeError(
                f"properties must be a dict[str, str], not {type(props).__name__}"
            )
        for k, v in props.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidTypeError(f"properties must map str to str; got {k!r}: {v!r}")
    return payload, props


def checked_payloads(payloads: Sequence[bytes], max_bytes: int) -> list[bytes]:
    """A batch's payloads as bytes, every row checked (type, size) before any is queued: a bad
    row refuses the whole batch, naming it."""
    if not (hasattr(payloads, "__len__") and hasattr(payloads, "__getitem__")):
        raise InvalidTypeError(
            f"payloads must be a sequence (a list or tuple), not {type(payloads).__name__}"
        )
    return [  # plain bytes within the limit need nothing more (the common case)
        p if isinstance(p, bytes) and len(p) <= max_bytes else _checked_row(p, i, max_bytes)
        for i, p in enumerate(payloads)
    ]


def _checked_row(row: object, i: int, max_bytes: int) -> bytes:
    try:
        payload, _ = coerce_message(row, None, max_bytes)  # type: ignore[arg-type]
    except WoodpeckerError as exc:
        raise type(exc)(f"payloads[{i}]: {exc}") from None
    return payload
