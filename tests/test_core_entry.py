"""`_core.encode_entry` must produce exactly the LogEntry protobuf says, behind a valid header."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from woodpecker_idem import InvalidArgumentError, InvalidTypeError, crc32c
from woodpecker_idem._core import concat, count_records, decode_entries, encode_entry
from woodpecker_idem._proto.logstore_pb2 import LogEntry

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


def _other_thread_ran_during(call) -> list[int]:
    """How far a spinning thread got during each of 5 calls (it also gets the GIL at the
    interpreter's forced switches, so never quite 0)."""
    import threading

    counter = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counter[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    deltas = []
    try:
        for _ in range(5):
            before = counter[0]
            call()
            deltas.append(counter[0] - before)
    finally:
        stop.set()
        t.join()
    return deltas


def test_concat_keeps_the_gil_where_bytes_join_lets_go() -> None:
    """bytes.join releases the GIL for results of 1 MiB or more; winning it back from a busy
    thread costs up to 5 ms per frame or block. concat copies with the GIL held."""
    parts = [bytes(1 << 20)] * 48  # 48 MiB: a copy of several milliseconds
    held = _other_thread_ran_during(lambda: concat(parts))
    released = _other_thread_ran_during(lambda: b"".join(parts))
    # the spinner runs only at forced switches around concat, but all through join's copy
    assert 2 * sorted(held)[2] < sorted(released)[2], (held, released)


@given(**ENTRY, unknown=st.booleans())
def test_decode_entries_reads_what_protobuf_wrote(
    seg, entry, ts, payload, props, key, unknown
) -> None:
    """The read path's Rust parser agrees with protobuf on every field (also with a field this
    version does not know, which a newer writer may add)."""
    body = LogEntry(
        segment_id=seg,
        entry_id=entry,
        timestamp_ms=ts,
        payload=payload,
        properties=props,
        idempotency_key=key or b"",
    ).SerializeToString()
    if unknown:
        body += b"\x38\x05"  # field 7, varint 5
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
