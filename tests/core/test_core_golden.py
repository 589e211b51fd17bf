"""Golden bytes: the dedup snapshot and the LogStore record formats, pinned byte for byte.

Snapshots and records outlive the build that wrote them, so an encoder change that round-trips
but moves a byte (a varint library swap, a field order change) must fail here, not in the field.
The inputs reach every varint width the formats use: 10-byte uvarints, negative zigzag deltas,
int64 extremes and a multi-byte length prefix.
"""

from __future__ import annotations

import hashlib

from woodpecker_idem import _core

# Version 1 (earlier releases): read, no longer written.
SNAPSHOT_V1_HEX = (
    "5750445301000000db00000025ddfb9d080110ffffffffffffffffff01180320fbd095ffbc3128e80730e0d403"
    "3a07108080808080203a0d080710ffffffffffffffffff013a040808101140064a600cc175b9c0f1b6a831c399"
    "e26977266192eb5ffee6ae2fec3ad71c777531578f4a8a08f09d37b73795649038408b5f338277e0910d750195"
    "b448797616e091ade1671797c52e15f763380b45e841ec328fa14cdd754f91cc6554c9e71929cce7520a0703ff"
    "ffffff0f0200015a0f0002d604feffffff1ffdffffff1f0a621d80a0abfef9620a1d94e0d481869dffffff0101"
    "ffffffffffffffffff01"
)

# Version 2: what this build writes.
SNAPSHOT_HEX = (
    "5750445302000000000000008e83f9df3d00000039ff1cb00a3b080210ffffffffffffffffff01180320fbd095"
    "ffbc3128e80730e0d4033a07108080808080203a0d080710ffffffffffffffffff013a0408081011a30000000b"
    "57f35b12a001080612600cc175b9c0f1b6a831c399e26977266192eb5ffee6ae2fec3ad71c777531578f4a8a08"
    "f09d37b73795649038408b5f338277e0910d750195b448797616e091ade1671797c52e15f763380b45e841ec32"
    "8fa14cdd754f91cc6554c9e71929cce71a0a0703ffffffff0f020001220f0002d604feffffff1ffdffffff1f0a"
    "2a1d80a0abfef9620a1d94e0d481869dffffff0101ffffffffffffffffff0106000000eb63fa331a0408061001"
)

RECORD_HEX = (
    "0c01000074b87efa08ffffffffffffffffff01108080808080201880d095ffbc3122077061796c6f61642a060a"
    "016b1201762acd010ac801" + "78" * 200 + "120032100cc175b9c0f1b6a831c399e269772661"
)


def key(tag: bytes) -> bytes:
    return hashlib.md5(tag).digest()


ROWS = [
    (key(b"a"), 7, 0, 1_700_000_000_000),
    (key(b"b"), 7, 1, 1_700_000_000_005),
    (key(b"c"), 7, 300, 1_699_999_999_990),
    (key(b"d"), 2**32 - 1, 2**32 - 1, -(2**63)),
    (key(b"e"), 2**32 - 1, 0, 2**63 - 1),
    (key(b"f"), 0, 5, -1),
]


def test_snapshot_bytes_are_pinned() -> None:
    window = _core.DedupWindow(1000, 60_000)
    for row in ROWS:
        window.add_committed(*row)
    marks = {8: 17, 7: -1, 0: 2**40}
    data = _core.encode_snapshot(window, 2**64 - 1, 3, 1_700_000_000_123, marks)
    assert data.hex() == SNAPSHOT_HEX
    snap = _core.decode_snapshot(bytes.fromhex(SNAPSHOT_HEX))
    assert snap.entries() == ROWS
    assert (snap.log_id, snap.epoch, snap.timestamp_ms) == (2**64 - 1, 3, 1_700_000_000_123)
    assert snap.watermarks == marks
    assert snap.format_version == 2
    old = _core.decode_snapshot(bytes.fromhex(SNAPSHOT_V1_HEX))  # what earlier releases wrote
    assert old.format_version == 1 and old.entries() == ROWS and old.watermarks == marks
    assert (old.log_id, old.epoch, old.timestamp_ms) == (2**64 - 1, 3, 1_700_000_000_123)


def test_record_bytes_are_pinned() -> None:
    props = {"k": "v", "x" * 200: ""}
    record = _core.encode_entry(-1, 2**40, 1_700_000_000_000, b"payload", props, key(b"a"))
    assert record.hex() == RECORD_HEX
