"""Finding an entry's bytes in a local segment file, for tests that damage them on disk."""

from __future__ import annotations

from pathlib import Path

from woodpecker_idem.logstore.blocks import RECORD_HEADER
from woodpecker_idem.logstore.segment_files import BATCH_HEADER_SIZE, decode_batch_header


def batches(path: Path) -> list[tuple[int, int, int]]:
    """(offset, first entry id, count) of every whole batch in a segment file."""
    data = path.read_bytes()
    out = []
    pos = 0
    while len(data) - pos >= BATCH_HEADER_SIZE:
        header = decode_batch_header(data, pos)
        assert header is not None, f"{path}: bad batch header at {pos}"
        first, count, frame_len, _ = header
        out.append((pos, first, count))
        pos += BATCH_HEADER_SIZE + frame_len
    return out


def locate(seg_dir: Path, entry_id: int) -> tuple[Path, int, int, int]:
    """(file, batch offset, record offset, entry length) of `entry_id` in the segment's files."""
    for name in ("data", "recovery"):
        path = seg_dir / name
        if not path.exists():
            continue
        data = path.read_bytes()
        for offset, first, count in batches(path):
            if first <= entry_id < first + count:
                pos = offset + BATCH_HEADER_SIZE
                for _ in range(first, entry_id):
                    pos += RECORD_HEADER.size + RECORD_HEADER.unpack_from(data, pos)[0]
                return path, offset, pos, RECORD_HEADER.unpack_from(data, pos)[0]
    raise AssertionError(f"entry {entry_id} not in {seg_dir}")


def flip(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x40
    path.write_bytes(bytes(data))


def flip_entry_byte(seg_dir: Path, entry_id: int, in_header: bool = False) -> tuple[Path, int]:
    """Flip one payload byte of `entry_id` (with `in_header`, a byte of its batch's header);
    returns the file and the batch offset."""
    path, offset, pos, length = locate(seg_dir, entry_id)
    flip(path, offset + 8 if in_header else pos + RECORD_HEADER.size + length - 2)
    return path, offset
