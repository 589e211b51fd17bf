"""Byte layouts of the LogStore: entry records, batch frames, block objects and segment footers.

A record is `length u32 | crc32c u32 | LogEntry bytes`; a frame is records back to back. The writer
builds each record once (`_core.encode_entry`), so a resend is byte-identical and a node stores a
frame without parsing the entries in it. A block object is a 32-byte header and one frame.

With `append.compression` the writer sends a run's frame as compressed units (`rust/src/ codec.rs`:
each a header no record can start with, its entry count, and a CRC32C of the compressed bytes),
stored exactly as sent; `split_frame` decompresses (natively) whatever it splits, so every reader of
stored frames sees plain records. A block holding compressed units is version 2, its header's `kind`
field carrying the codec in its high byte; version 1 blocks (plain) stay readable.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .._core import concat, crc32c, decompress_frame, frame_codec
from .._proto.logstore_pb2 import BlockIndex, LogEntry, SegmentFooter
from ..errors import CorruptEntryError

RECORD_HEADER = struct.Struct("<II")
BLOCK_HEADER = struct.Struct("<4sHHqIq")  # magic, version, kind, first_entry_id, count, lac
BLOCK_HEADER_SIZE = BLOCK_HEADER.size + 4  # + header crc32c
BLOCK_MAGIC = b"WPBK"
BLOCK_VERSION = 1  # a plain frame
BLOCK_VERSION_COMPRESSED = 2  # kind = kind | codec << 8
CODECS = {"none": 0, "lz4": 1, "zstd": 2}  # append.compression, as unit and header numbers
FOOTER_MAGIC = b"WPFT"

KIND_DATA = 0
KIND_FENCE = 1
KIND_RECOVERY = 2


def encode_record(entry_bytes: bytes) -> bytes:
    """One record: the CRC covers the entry bytes so any flipped bit is caught on read."""
    return RECORD_HEADER.pack(len(entry_bytes), crc32c(entry_bytes)) + entry_bytes


UNIT_MARK = 0xFFFFFFFF  # a compressed unit's first four bytes: no record is that long


def split_frame(frame: bytes | memoryview, where: str) -> list[memoryview]:
    """The records of a frame (each with its header), checking lengths but not parsing entries.
    A frame holding a compressed unit is decompressed (natively, once) first; a damaged unit or
    an unknown codec raises `CorruptEntryError`. A plain frame is walked here without a copy."""
    view = memoryview(frame)
    records = []
    pos = 0
    end = len(view)
    while pos < end:
        if end - pos < RECORD_HEADER.size:
            raise CorruptEntryError(f"{where}: truncated record header at byte {pos}")
        length, _ = RECORD_HEADER.unpack_from(view, pos)
        if length == UNIT_MARK:
            return split_frame(decompress_frame(bytes(view), where), where)
        stop = pos + RECORD_HEADER.size + length
        if stop > end:
            raise CorruptEntryError(f"{where}: record at byte {pos} runs past the end ({length} B)")
        records.append(view[pos:stop])
        pos = stop
    return records


def record_entry(record: memoryview | bytes, where: str) -> bytes:
    """The entry bytes of a record, after checking its CRC."""
    length, crc = RECORD_HEADER.unpack_from(record, 0)
    data = bytes(record[RECORD_HEADER.size : RECORD_HEADER.size + length])
    if len(data) != length or crc32c(data) != crc:
        raise CorruptEntryError(f"{where}: checksum mismatch")
    return data


def decode_entry(data: bytes, where: str) -> LogEntry:
    try:
        return LogEntry.FromString(data)
    except Exception as exc:  # protobuf raises DecodeError, but be strict about anything
        raise CorruptEntryError(f"{where}: unparseable entry ({exc})") from exc


@dataclass(frozen=True, slots=True)
class BlockHeader:
    kind: int
    first_entry_id: int
    count: int
    lac: int
    codec: int = 0  # append.compression's number: 0 for a plain frame

    @property
    def last_entry_id(self) -> int:
        return self.first_entry_id + self.count - 1


def encode_block(kind: int, first_entry_id: int, count: int, lac: int, frame: bytes) -> bytes:
    codec = frame_codec(frame)
    version, kind = (
        (BLOCK_VERSION_COMPRESSED, kind | codec << 8) if codec else (BLOCK_VERSION, kind)
    )
    header = BLOCK_HEADER.pack(BLOCK_MAGIC, version, kind, first_entry_id, count, lac)
    return concat((header, struct.pack("<I", crc32c(header)), frame))


def decode_block_header(data: bytes, where: str) -> BlockHeader:
    if len(data) < BLOCK_HEADER_SIZE:
        raise CorruptEntryError(f"{where}: block shorter than its header ({len(data)} B)")
    magic, version, kind, first, count, lac = BLOCK_HEADER.unpack_from(data, 0)
    (crc,) = struct.unpack_from("<I", data, BLOCK_HEADER.size)
    if magic != BLOCK_MAGIC or crc32c(data[: BLOCK_HEADER.size]) != crc:
        raise CorruptEntryError(f"{where}: bad block header")
    codec = 0
    if version == BLOCK_VERSION_COMPRESSED:
        kind, codec = kind & 0xFF, kind >> 8
        if codec not in CODECS.values():
            raise CorruptEntryError(
                f"{where}: unknown compression codec {codec} in the block header (this version "
                "reads none, lz4, zstd)"
            )
    elif version != BLOCK_VERSION:
        raise CorruptEntryError(f"{where}: unsupported block version {version}")
    if kind not in (KIND_DATA, KIND_FENCE, KIND_RECOVERY):
        raise CorruptEntryError(f"{where}: unknown block kind {kind}")
    return BlockHeader(kind, first, count, lac, codec)


def block_records(data: bytes, header: BlockHeader, where: str) -> list[memoryview]:
    records = split_frame(memoryview(data)[BLOCK_HEADER_SIZE:], where)
    if len(records) != header.count:
        raise CorruptEntryError(
            f"{where}: header says {header.count} records, found {len(records)}"
        )
    return records


def encode_footer(last_entry_id: int, blocks: list[tuple[int, int, int]]) -> bytes:
    body = SegmentFooter(
        last_entry_id=last_entry_id,
        blocks=[BlockIndex(block=n, first_entry_id=f, last_entry_id=last) for n, f, last in blocks],
    ).SerializeToString()
    return FOOTER_MAGIC + struct.pack("<I", crc32c(body)) + body


def decode_footer(data: bytes, where: str) -> SegmentFooter:
    if len(data) < 8 or data[:4] != FOOTER_MAGIC:
        raise CorruptEntryError(f"{where}: bad footer")
    (crc,) = struct.unpack_from("<I", data, 4)
    body = data[8:]
    if crc32c(body) != crc:
        raise CorruptEntryError(f"{where}: footer checksum mismatch")
    return SegmentFooter.FromString(body)


# A pack: copies of consecutive small block objects of one segment in one object, written off the
# write path so a takeover reads a few packs instead of one object per block (issue 32). The
# blocks stay the record: a pack is only read by a node fencing the segment, and deleted once the
# segment is completed. `magic | version u16 | pad u16 | count u32 | crc32c(index) u32`, then
# `count` index items `(block number q, length I)`, then the blocks' bytes back to back (each
# block keeps its own header and record CRCs).
PACK_MAGIC = b"WPPK"
PACK_VERSION = 1
PACK_HEADER = struct.Struct("<4sHHII")
PACK_ITEM = struct.Struct("<qI")


def encode_pack(blocks: list[tuple[int, bytes]]) -> bytes:
    index = b"".join(PACK_ITEM.pack(n, len(data)) for n, data in blocks)
    header = PACK_HEADER.pack(PACK_MAGIC, PACK_VERSION, 0, len(blocks), crc32c(index))
    return concat([header, index, *(data for _, data in blocks)])


def decode_pack(data: bytes, where: str) -> list[tuple[int, bytes]]:
    """(block number, block bytes) of a pack; `CorruptEntryError` if its structure is damaged
    (a block's own damage is found when its header and records are checked)."""
    if len(data) < PACK_HEADER.size:
        raise CorruptEntryError(f"{where}: pack shorter than its header ({len(data)} B)")
    magic, version, _, count, crc = PACK_HEADER.unpack_from(data, 0)
    if magic != PACK_MAGIC or version != PACK_VERSION:
        raise CorruptEntryError(f"{where}: bad pack header")
    end = PACK_HEADER.size + count * PACK_ITEM.size
    if end > len(data) or crc32c(data[PACK_HEADER.size : end]) != crc:
        raise CorruptEntryError(f"{where}: pack index damaged")
    view = memoryview(data)
    out: list[tuple[int, bytes]] = []
    pos = end
    for i in range(count):
        n, length = PACK_ITEM.unpack_from(data, PACK_HEADER.size + i * PACK_ITEM.size)
        if pos + length > len(data):
            raise CorruptEntryError(f"{where}: block {n} runs past the end of the pack")
        out.append((n, bytes(view[pos : pos + length])))
        pos += length
    if pos != len(data):
        raise CorruptEntryError(f"{where}: {len(data) - pos} B after the last block of the pack")
    return out
