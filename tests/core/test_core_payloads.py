"""`_core.Payloads`: a batch's payloads as one buffer and its offsets, made from a list of bytes in
one pass or from an Arrow column without a copy; byte ranges and run ends from the offsets; the
frame encoder and the window's one call per run (`reserve_frame`) read it as they read a list."""

from __future__ import annotations

from array import array

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from woodpecker_idem import InvalidArgumentError, InvalidTypeError
from woodpecker_idem._core import (
    DedupWindow,
    Payloads,
    arrow_rows,
    chunk_end,
    encode_frame,
    explicit_key,
)

ROWS = [b"first", b"", b"x" * 300, "é".encode(), b"\x00\x7f" * 7]  # UTF-8 too
BINARY_TYPES = [pa.binary(), pa.large_binary(), pa.string(), pa.large_string()]


def values_buffer_address(payloads: Payloads) -> int:
    """Where the rows' bytes are: the values buffer of the Arrow array the batch exports."""
    return pa.array(payloads).buffers()[2].address


# --- made two ways, equal ------------------------------------------------------------------------


@pytest.mark.parametrize("arrow_type", BINARY_TYPES, ids=str)
def test_built_from_a_list_or_an_arrow_column_alike(arrow_type):
    rows = [r.decode() if arrow_type in (pa.string(), pa.large_string()) else r for r in ROWS]
    column = pa.array(rows, arrow_type)
    from_arrow = Payloads.from_arrow(column)
    from_list = Payloads(ROWS)
    assert from_arrow == from_list
    assert from_list == ROWS and from_arrow == ROWS  # equal to the list of the same bytes
    assert from_list.to_list() == ROWS
    assert [from_arrow[i] for i in range(len(ROWS))] == ROWS
    assert list(from_arrow) == ROWS  # iterates as a sequence
    assert from_arrow[-1] == ROWS[-1]
    assert len(from_arrow) == len(ROWS)
    assert from_arrow.nbytes == sum(map(len, ROWS))
    assert from_arrow.longest == 300
    assert from_list != ROWS[:-1] and from_list != [*ROWS[:-1], b"other"]
    assert Payloads([bytearray(b"ab"), memoryview(b"cd")]) == [b"ab", b"cd"]


def test_an_arrow_column_is_shared_not_copied():
    """One chunk of a binary column: the batch reads the column's own values buffer (exported
    back to Arrow, its address is the column's); a list is copied into a buffer of its own."""
    column = pa.array(ROWS, pa.binary())
    shared = Payloads.from_arrow(column)
    assert values_buffer_address(shared) == column.buffers()[2].address
    sliced = column.slice(1, 3)  # offsets that do not start at 0
    part = Payloads.from_arrow(sliced)
    assert part == ROWS[1:4]
    assert values_buffer_address(part) == column.buffers()[2].address
    # a slice of a batch shares its buffer too
    assert values_buffer_address(shared[1:3]) == column.buffers()[2].address
    assert shared[1:3] == ROWS[1:3] and shared[3:1] == []


def test_other_byte_columns_and_several_chunks_are_copied_once():
    chunked = pa.chunked_array([pa.array(ROWS[:2]), pa.array(ROWS[2:])])
    assert Payloads.from_arrow(chunked) == ROWS
    fixed = pa.array([b"ab", b"cd"], pa.binary(2))
    assert Payloads.from_arrow(fixed) == [b"ab", b"cd"]
    table_rows, _ = arrow_rows(
        pa.table({"p": pa.chunked_array([[b"a"], [b"b", b"c"]])}), payload="p"
    )
    assert table_rows == [b"a", b"b", b"c"]


def test_arrow_rows_give_payloads_and_pyarrow_takes_them_back():
    batch = pa.record_batch({"id": [1, 2], "body": [b"p1", b"p2"]})
    payloads, keys = arrow_rows(batch, key="id", payload="body")
    assert type(payloads) is Payloads and payloads == [b"p1", b"p2"]
    assert pa.array(payloads).to_pylist() == [b"p1", b"p2"]
    assert keys == explicit_key("1") + explicit_key("2")
    json, _ = arrow_rows(batch)  # canonical JSON, one buffer
    assert json == [b'{"body":"cDE=","id":1}', b'{"body":"cDI=","id":2}']


# --- byte ranges, limits, rows taken ------------------------------------------------------------


@given(st.lists(st.binary(max_size=40), max_size=30), st.data())
def test_byte_ranges_and_run_ends_from_the_offsets(rows, data):
    payloads = Payloads(rows)
    start = data.draw(st.integers(0, len(rows)))
    end = data.draw(st.integers(start, len(rows)))
    limit = data.draw(st.integers(0, 2000))
    overhead = data.draw(st.integers(0, 100))
    assert payloads.range_bytes(start, end, overhead) == sum(
        len(p) + overhead for p in rows[start:end]
    )
    # where a run of one batch ends: the rows that fit the limit, at least one
    want_end, total = end, 0
    for i in range(start, end):
        size = len(rows[i]) + overhead
        if i > start and total + size > limit:
            want_end = i
            break
        total += size
    assert payloads.fit(start, end, limit, overhead) == (total, want_end)
    assert chunk_end(payloads, start, end, limit, overhead) == (total, want_end)
    assert chunk_end(rows, start, end, limit, overhead) == (total, want_end)
    longest = max(map(len, rows), default=0)
    assert payloads.longest == longest
    for max_bytes in (0, max(0, longest - 1), longest):
        over = [i for i, p in enumerate(rows) if len(p) > max_bytes]
        assert payloads.first_longer(max_bytes) == (over[0] if over else None)


def test_rows_taken_in_any_order():
    payloads = Payloads(ROWS)
    assert payloads.take([4, 0, 4]) == [ROWS[4], ROWS[0], ROWS[4]]
    assert payloads.take(array("q", [2])) == [ROWS[2]]
    assert payloads.take([]) == []


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([b"a", b"b", "text"], r"payloads\[2\] must be bytes, bytearray or memoryview, not str"),
        ([b"a", None], r"payloads\[1\] must be bytes.*not NoneType"),
        ([b"a", 7], r"payloads\[1\] must be bytes.*not int"),
        ([b"a", array("q", [1])], r"payloads\[1\] must be bytes.*not array"),
        (b"ab", "payloads must be a sequence of bytes"),
        ("ab", "payloads must be a sequence of bytes"),
        (iter([b"a"]), "payloads must be a sequence of bytes"),
        (5, "payloads must be a sequence of bytes"),
        (None, "payloads must be a sequence of bytes"),
    ],
)
def test_a_row_that_is_not_bytes_is_refused_by_index(rows, match):
    with pytest.raises(InvalidTypeError, match=match):
        Payloads(rows)


def test_bad_arrow_columns_and_bad_arguments_are_refused():
    with pytest.raises(InvalidArgumentError, match="null at row 1"):
        Payloads.from_arrow(pa.array([b"a", None]))
    with pytest.raises(InvalidTypeError, match="must be binary or string"):
        Payloads.from_arrow(pa.array([1, 2]))
    with pytest.raises(InvalidTypeError, match="must be Arrow data"):
        Payloads.from_arrow([b"a"])
    payloads = Payloads(ROWS)
    with pytest.raises(InvalidArgumentError, match=r"rows 2\.\.9 are not within the 5"):
        payloads.range_bytes(2, 9)
    with pytest.raises(InvalidArgumentError, match=r"rows 3\.\.2 are not within"):
        payloads.fit(3, 2, 100)
    with pytest.raises(InvalidArgumentError, match=r"rows\[1\] = 5 is not a row"):
        payloads.take([0, 5])
    with pytest.raises(InvalidArgumentError, match=r"rows\[0\] = -1 is not a row"):
        payloads.take([-1])
    with pytest.raises(IndexError):
        payloads[5]
    with pytest.raises(InvalidArgumentError, match="step 1"):
        payloads[::2]
    with pytest.raises(InvalidTypeError, match="a Payloads or a list of bytes"):
        encode_frame(0, 0, 1, (b"a",), 0, 1)


# --- the frame encoder and the window's one call per run ------------------------------------------


def K(i: int) -> bytes:
    return explicit_key(f"k{i}")


@pytest.mark.parametrize("compression", [0, 1, 2], ids=["none", "lz4", "zstd"])
def test_a_frame_of_payloads_is_the_frame_of_the_list(compression):
    rows = [b"p%d" % i * (i + 1) for i in range(40)]
    keys = b"".join(K(i) for i in range(40))
    stamps = array("q", range(1000, 1040))
    status = bytes([0, 2, 0, 1] * 5)
    from_list = encode_frame(3, 7, stamps, rows, 10, 30, keys, status, None, compression)
    column = Payloads.from_arrow(pa.array(rows, pa.large_binary()))
    assert encode_frame(3, 7, stamps, column, 10, 30, keys, status, None, compression) == (
        from_list
    )
    assert from_list[1] == 10


def test_reserve_frame_is_reserve_many_then_encode_frame():
    """The window's one call per run judges the rows as `reserve_many` does and encodes the
    new ones as `encode_frame` does; a refused call reserves nothing."""
    rows = [b"row%d" % i for i in range(12)]
    keys = b"".join(K(i % 9) for i in range(12))  # rows 9..11 repeat rows 0..2
    stamps = array("q", range(5000, 5012))
    props = [None] * 11 + [{"a": "b"}]
    one, two = DedupWindow(100, 10**9), DedupWindow(100, 10**9)
    for w in (one, two):
        w.add_committed(K(4), 1, 0, 4000)  # row 4 is committed already
    got = one.reserve_frame(keys, 2, 12, stamps, 2, 30, Payloads(rows), props, 0)
    status, segs, ents = two.reserve_many(keys[32:], stamps[2:], 2, 30)
    frame, count = encode_frame(2, 30, stamps, rows, 2, 12, keys, status, props)
    assert got == (status, segs, ents, frame, count)
    assert count == 8 and one.pending_count == two.pending_count == 8  # row 11 repeats row 2
    # one int as every row's time
    w = DedupWindow(100, 10**9)
    assert (
        w.reserve_frame(keys, 0, 2, 77, 0, 0, rows)[3]
        == encode_frame(0, 0, 77, rows, 0, 2, keys)[0]
    )
    bad = [
        ((keys, 0, 12, stamps, 0, 0, [*rows[:5], "x", *rows[6:]]), InvalidTypeError),
        ((keys, 0, 12, stamps, 0, 0, rows, [{"k": 1}] * 12), InvalidTypeError),
        ((keys, 0, 12, stamps[:3], 0, 0, rows), InvalidArgumentError),
        ((keys[:32], 0, 2, stamps, 0, 0, rows), InvalidArgumentError),
        ((keys, 0, 13, stamps, 0, 0, rows), InvalidArgumentError),
        ((keys, 0, 12, stamps, 0, 2**32 - 5, rows), InvalidArgumentError),
        ((keys, 0, 12, stamps, 0, 0, rows, None, 9), InvalidArgumentError),
    ]
    fresh = DedupWindow(100, 10**9)
    for args, error in bad:
        with pytest.raises(error):
            fresh.reserve_frame(*args)
        assert fresh.pending_count == 0 and len(fresh) == 0
