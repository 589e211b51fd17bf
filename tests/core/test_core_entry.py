"""`_core.encode_entry` must produce exactly the LogEntry protobuf says, behind a valid header."""

from __future__ import annotations

import gc
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from woodpecker_idem import CorruptEntryError, InvalidArgumentError, InvalidTypeError
from woodpecker_idem._core import (
    check_entries,
    chunk_end,
    concat,
    count_records,
    crc32c,
    decode_entries,
    decode_messages,
    encode_entry,
)
from woodpecker_idem._proto.logstore_pb2 import LogEntry
from woodpecker_idem.types import LogMessage, LogMessageId

int64 = st.integers(-(2**63), 2**63 - 1)
ENTRY = {  # every field of a LogEntry
    "seg": int64,
    "entry": int64,
    "ts": int64,
    "payload": st.binary(max_size=300),
    "props": st.dictionaries(st.text(max_size=20), st.text(max_size=200), max_size=4),
    "key": st.one_of(st.none(), st.binary(min_size=16, max_size=16)),
}


@given(**ENTRY)
def test_record_parses_as_the_protobuf_entry(seg, entry, ts, payload, props, key) -> None:
    record = encode_entry(seg, entry, ts, payload, props or None, key)
    length, crc = struct.unpack_from("<II", record)
    body = record[8:]
    assert length == len(body) and crc == crc32c(body)
    parsed = LogEntry.FromString(body)
    assert (parsed.segment_id, parsed.entry_id, parsed.timestamp_ms) == (seg, entry, ts)
    assert parsed.payload == payload
    assert dict(parsed.properties) == props
    assert parsed.idempotency_key == (key or b"")
    # byte-identical to protobuf's own serializer when there is at most one property
    if len(props) <= 1:
        expected = LogEntry(
            segment_id=seg,
            entry_id=entry,
            timestamp_ms=ts,
            payload=payload,
            properties=props,
            idempotency_key=key or b"",
        )
        assert body == expected.SerializeToString()


def test_count_records_checks_the_tiling() -> None:
    one = encode_entry(1, 2, 3, b"abc")
    assert count_records(b"") == 0
    assert count_records(one * 5) == 5
    with pytest.raises(InvalidArgumentError, match="frame"):
        count_records(one * 2 + one[:-1])
    with pytest.raises(InvalidArgumentError, match="frame"):
        count_records(b"\x01\x02")


def test_bad_arguments_are_named() -> None:
    with pytest.raises(InvalidTypeError, match="payload"):
        encode_entry(1, 2, 3, "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="properties"):
        encode_entry(1, 2, 3, b"x", {"a": 1})  # type: ignore[dict-item]
    with pytest.raises(InvalidTypeError, match="properties"):
        encode_entry(1, 2, 3, b"x", [("a", "b")])  # type: ignore[arg-type]


@given(st.lists(st.binary(max_size=300), max_size=20))
def test_concat_equals_bytes_join(parts: list[bytes]) -> None:
    assert concat(parts) == b"".join(parts)
    assert concat(tuple(parts)) == b"".join(parts)


def test_concat_accepts_buffers_and_names_bad_parts() -> None:
    assert concat([b"a", bytearray(b"b"), memoryview(b"cd")]) == b"abcd"
    with pytest.raises(InvalidTypeError, match=r"parts\[1\]"):
        concat([b"a", "b"])
    with pytest.raises(InvalidTypeError, match="list or tuple"):
        concat(b"ab")


def _protobuf_entry(seg, entry, ts, payload, props, key, unknown) -> bytes:
    """A LogEntry as protobuf serializes it, with a field this version does not know if
    `unknown` (a newer writer may add one)."""
    body = LogEntry(
        segment_id=seg,
        entry_id=entry,
        timestamp_ms=ts,
        payload=payload,
        properties=props,
        idempotency_key=key or b"",
    ).SerializeToString()
    return body + b"\x38\x05" if unknown else body  # field 7, varint 5


@given(**ENTRY, unknown=st.booleans())
def test_decode_entries_reads_what_protobuf_wrote(
    seg, entry, ts, payload, props, key, unknown
) -> None:
    """The read path's Rust parser agrees with protobuf on every field (also with a field this
    version does not know, which a newer writer may add)."""
    body = _protobuf_entry(seg, entry, ts, payload, props, key, unknown)
    (got,), bad = decode_entries([body], seg, entry)
    assert bad is None
    assert (got.segment_id, got.entry_id, got.timestamp_ms) == (seg, entry, ts)
    assert (got.payload, got.properties, got.idempotency_key) == (payload, props, key or b"")


def test_decode_entries_stops_at_a_bad_entry_and_says_why() -> None:
    good = [encode_entry(3, i, 0, b"p")[8:] for i in range(3)]
    entries, bad = decode_entries([good[0], good[1], b"\x22\x09abc"], 3, 0)
    assert [e.entry_id for e in entries] == [0, 1]
    assert bad is not None and bad[0] == 2 and "unparseable entry" in bad[1]
    entries, bad = decode_entries([good[0], good[2]], 3, 0)  # entry 2 stored where 1 belongs
    assert len(entries) == 1 and bad == (1, "stored entry says 3:2")
    entries, bad = decode_entries(good, 4, 0)
    assert entries == [] and bad == (0, "stored entry says 3:0")
    with pytest.raises(InvalidTypeError, match=r"raw\[1\] must be bytes, not str"):
        decode_entries([good[0], "x"], 3, 0)  # type: ignore[list-item]


@given(**ENTRY, unknown=st.booleans())
def test_decode_messages_builds_what_a_reader_returned(
    seg, entry, ts, payload, props, key, unknown
) -> None:
    """The reader's one-call decoder gives the LogMessage the reader built from protobuf's parse:
    same fields, same types, a new properties dict per message, None for no key."""
    body = _protobuf_entry(seg, entry, ts, payload, props, key, unknown)
    (got,) = decode_messages([body], seg, entry, LogMessage, LogMessageId)
    assert type(got) is LogMessage and type(got.message_id) is LogMessageId
    assert got == LogMessage(LogMessageId(seg, entry), payload, props, ts, key)
    assert type(got.payload) is bytes and type(got.properties) is dict


def test_decode_messages_many_in_order_each_with_its_own_dict() -> None:
    raw = [encode_entry(2, 5 + i, 10 + i, b"p%d" % i, {"i": str(i)})[8:] for i in range(600)]
    got = decode_messages(raw, 2, 5, LogMessage, LogMessageId)
    assert [m.message_id for m in got] == [LogMessageId(2, 5 + i) for i in range(600)]
    assert [m.timestamp_ms for m in got] == list(range(10, 610))
    assert got[7].payload == b"p7" and got[7].properties == {"i": "7"}
    got[0].properties["x"] = "y"  # the messages share nothing mutable
    assert got[1].properties == {"i": "1"}
    assert got[0].message_id < got[1].message_id and hash(got[0].message_id) == hash((2, 5))
    assert decode_messages([], 2, 5, LogMessage, LogMessageId) == []
    # a LogMessageId (two ints, no __dict__) is left out of the cycle collector; a message (its
    # dict could come to hold it) and an id type with a __dict__ are not
    assert not gc.is_tracked(got[0].message_id) and gc.is_tracked(got[0])

    class WithDict(tuple):
        pass

    (own,) = decode_messages(raw[:1], 2, 5, LogMessage, WithDict)
    assert type(own.message_id) is WithDict and own.message_id == (2, 5)
    assert gc.is_tracked(own.message_id)


def test_decode_messages_raises_corrupt_entry_naming_the_position() -> None:
    good = [encode_entry(3, i, 0, b"payload")[8:] for i in range(3)]
    broken = bytearray(good[2])
    broken[broken.index(b"payload") - 1] = 0x7F  # the payload's length runs past the end
    with pytest.raises(CorruptEntryError, match=r"^entry 3:2: unparseable entry \(") as exc:
        decode_messages([good[0], good[1], bytes(broken)], 3, 0, LogMessage, LogMessageId)
    assert exc.value.code == "CORRUPT_ENTRY"
    with pytest.raises(CorruptEntryError, match=r"^entry 3:1: stored entry says 3:2$"):
        decode_messages([good[0], good[2]], 3, 0, LogMessage, LogMessageId)
    with pytest.raises(CorruptEntryError, match=r"^entry 4:0: stored entry says 3:0$"):
        decode_messages(good, 4, 0, LogMessage, LogMessageId)
    with pytest.raises(InvalidTypeError, match=r"raw\[1\] must be bytes, not str"):
        decode_messages([good[0], "x"], 3, 0, LogMessage, LogMessageId)  # type: ignore[list-item]
    with pytest.raises(InvalidTypeError, match=r"message_type must be a tuple subclass, not dict"):
        decode_messages(good, 3, 0, dict, LogMessageId)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match=r"id_type must be a tuple subclass, not list"):
        decode_messages(good, 3, 0, LogMessage, list)  # type: ignore[arg-type]


def test_check_entries_passes_what_decodes_and_names_the_first_bad_entry() -> None:
    good = [encode_entry(3, i, 0, b"payload", {"k": "v"}, b"K" * 16)[8:] for i in range(3)]
    assert check_entries(good, 3, 0) is None
    assert check_entries([], 3, 0) is None
    # cut inside the payload, a field of the wrong wire type, a varint that never ends
    for bad in (good[1][:10], good[1][:4] + b"\x20\x01", good[1][:4] + b"\x18\xff"):
        with pytest.raises(CorruptEntryError, match=r"^entry 3:1: unparseable entry \("):
            check_entries([good[0], bad, good[2]], 3, 0)
    with pytest.raises(CorruptEntryError, match=r"^entry 3:1: stored entry says 3:2$"):
        check_entries([good[0], good[2]], 3, 0)
    with pytest.raises(CorruptEntryError, match=r"^entry 7:5: stored entry says 3:0$"):
        check_entries(good, 7, 5)
    with pytest.raises(InvalidTypeError, match=r"raw\[2\] must be bytes, not bytearray"):
        check_entries([good[0], good[1], bytearray(good[2])], 3, 0)  # type: ignore[list-item]


@given(st.lists(st.binary(max_size=40), max_size=30), st.data())
def test_chunk_end_counts_a_range_with_its_overhead(payloads, data):
    start = data.draw(st.integers(0, len(payloads)))
    end = data.draw(st.integers(start, len(payloads)))
    want = sum(len(p) for p in payloads[start:end]) + 64 * (end - start)
    assert chunk_end(payloads, start, end, 2**40, 64) == (want, end)


def test_chunk_end_refuses_a_bad_range_or_row():
    with pytest.raises(InvalidArgumentError, match=r"rows 1\.\.3 are not within the 2 payloads"):
        chunk_end([b"a", b"b"], 1, 3, 100, 0)
    with pytest.raises(InvalidTypeError, match=r"payloads\[1\] must be bytes, not str"):
        chunk_end([b"a", "b"], 0, 2, 100, 0)
