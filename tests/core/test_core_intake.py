"""The core's intake pieces: `KeyPipe` (content keys hashed on a Rust thread, in push order) and
`DedupWindow.reserve_many` (a batch of writes judged in one window pass)."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from woodpecker_idem import InvalidArgumentError, InvalidTypeError
from woodpecker_idem._core import DedupWindow, KeyPipe, content_key, content_keys

# --- KeyPipe ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.binary(max_size=3000), max_size=150),  # pushed in one go
            st.integers(min_value=0, max_value=400),  # then take this many (capped)
        ),
        max_size=12,
    )
)
def test_keypipe_returns_content_keys_in_push_order(steps):
    pipe = KeyPipe()
    pushed: list[bytes] = []
    got = b""
    for payloads, take in steps:
        for p in payloads:
            pipe.push(p)
        pushed.extend(payloads)
        n = min(take, len(pipe))
        assert 0 <= pipe.ready_count() <= len(pipe)
        got += pipe.take(n)
    got += pipe.take(len(pipe))
    assert got == content_keys(pushed)
    assert len(pipe) == 0


def test_keypipe_hashes_full_chunks_in_the_background():
    pipe = KeyPipe()
    payloads = [b"%06d" % i * 170 for i in range(64 * 5 + 3)]  # ~1 KiB each
    for p in payloads:
        pipe.push(p)
    # five full chunks went to the worker; the last three payloads wait in the open chunk
    import time

    deadline = time.monotonic() + 10
    while pipe.ready_count() < 64 * 5 and time.monotonic() < deadline:
        time.sleep(0.002)
    assert pipe.ready_count() == 64 * 5
    assert pipe.take(100) == content_keys(payloads[:100])
    assert pipe.ready_count() == 64 * 5 - 100
    assert pipe.take(len(pipe)) == content_keys(payloads[100:])


def test_keypipe_mixes_payloads_ids_and_computed_keys_in_order():
    from woodpecker_idem._core import explicit_key

    pipe = KeyPipe()
    pipe.push(b"payload")
    pipe.push_id("order-1")
    pipe.push_key(b"k" * 16)
    with pytest.raises(InvalidArgumentError):
        pipe.push_id("")  # refused, nothing queued
    with pytest.raises(InvalidArgumentError):
        pipe.push_key(b"short")
    assert len(pipe) == 3
    assert pipe.take(3) == content_key(b"payload") + explicit_key("order-1") + b"k" * 16


def test_keypipe_accepts_bytes_likes_and_refuses_the_rest():
    pipe = KeyPipe()
    pipe.push(bytearray(b"abc"))
    pipe.push(memoryview(b"xyz"))
    assert pipe.take(2) == content_key(b"abc") + content_key(b"xyz")
    with pytest.raises(InvalidTypeError, match="payload"):
        pipe.push("a str")
    with pytest.raises(InvalidArgumentError, match=r"take\(1\) but only 0"):
        pipe.take(1)


def test_keypipe_holds_bytes_without_copying_and_releases_them_when_taken():
    """A bytes payload is held by reference until it is hashed (no copy per write): small
    chunks (under 32 KiB) are hashed, and let go of, as they fill; a larger chunk's payloads go
    to the worker and are let go of when their keys are taken. A mutable buffer is copied, so
    changing it afterwards cannot change its key."""
    import sys

    payload = b"held" * 64  # 256 B: a chunk of 64 is 16 KiB
    before = sys.getrefcount(payload)
    pipe = KeyPipe()
    for _ in range(200):  # three chunks of 64 hashed at once, 8 stay open
        pipe.push(payload)
    assert sys.getrefcount(payload) == before + 8
    assert pipe.take(200) == content_key(payload) * 200
    assert sys.getrefcount(payload) == before
    kib = b"K" * 1024  # a chunk of 64 is 64 KiB: hashed by the worker, held until taken
    kib_before = sys.getrefcount(kib)
    for _ in range(130):
        pipe.push(kib)
    assert sys.getrefcount(kib) == kib_before + 130
    assert pipe.take(130) == content_key(kib) * 130
    assert sys.getrefcount(kib) == kib_before
    big = b"B" * (100 * 1024)
    big_before = sys.getrefcount(big)
    for _ in range(7):  # two chunks of 300 KiB go to the worker, one payload stays open
        pipe.push(big)
    assert sys.getrefcount(big) == big_before + 7
    assert pipe.take(7) == content_key(big) * 7
    assert sys.getrefcount(big) == big_before
    for _ in range(10):
        pipe.push(payload)
    pipe.clear()  # the open chunk: released at once
    assert sys.getrefcount(payload) == before
    buf = bytearray(b"mutable")
    pipe.push(buf)
    buf[0:1] = b"M"
    assert pipe.take(1) == content_key(b"mutable")


def test_keypipe_clear_forgets_queued_payloads():
    pipe = KeyPipe()
    for i in range(200):
        pipe.push(b"p%d" % i)
    pipe.take(5)
    pipe.clear()
    assert len(pipe) == 0 and pipe.ready_count() == 0
    pipe.push(b"after")
    assert pipe.take(1) == content_key(b"after")


# --- reserve_many ----------------------------------------------------------------------------


def K(i: int) -> bytes:
    return i.to_bytes(16, "big")


def _ids(col: bytes) -> list[int]:
    out = array("q")
    out.frombytes(col)
    return list(out)


def test_reserve_many_equals_get_then_add_pending_row_by_row():
    """Committed (some expired as of their row's time), pending, new, and repeats in the batch."""
    one, many = DedupWindow(1000, 100), DedupWindow(1000, 100)
    for w in (one, many):
        for i in range(50):
            w.add_committed(K(i), 0, i, i * 2)
        w.add_pending(K(500), 0, 50, 90)
    rows = [0, 10, 49, 500, 600, 601, 600, 5, 601, 700, 0]
    stamps = [95 + 3 * n for n in range(len(rows))]
    status, segs, ents = many.reserve_many(b"".join(map(K, rows)), array("q", stamps), 9, 40)
    nxt = 40
    want = []
    for i, ts in zip(rows, stamps, strict=True):
        hit = one.get(K(i), ts)
        if hit is None:
            one.add_pending(K(i), 9, nxt, ts)
            want.append((0, 9, nxt))
            nxt += 1
        else:
            want.append((2 if hit.committed else 1, hit.segment_id, hit.entry_id))
    assert list(zip(status, _ids(segs), _ids(ents), strict=True)) == want
    assert [s for s, _, _ in want].count(0) == 5  # 600, 601, 5 (expired), 700, 0 (expired)
    assert (many.pending_count, many.hits, many.misses) == (one.pending_count, one.hits, one.misses)
    for i in rows:
        assert many.get(K(i)) == one.get(K(i))


def test_reserve_many_bad_arguments():
    w = DedupWindow(10, 100)
    with pytest.raises(InvalidArgumentError, match="timestamps_ms holds 1 values but keys holds 2"):
        w.reserve_many(K(1) + K(2), array("q", [1]), 0, 0)
    with pytest.raises(InvalidArgumentError, match="exceeds the uint32 entry id range"):
        w.reserve_many(K(1) + K(2), array("q", [1, 2]), 0, 2**32 - 1)
    with pytest.raises(InvalidArgumentError, match="multiple of 16"):
        w.reserve_many(b"short", array("q", [1]), 0, 0)
    assert w.pending_count == 0  # a refused call reserves nothing


# --- encode_frame with each row's timestamp and properties (the admission's encoding) --------


def test_encode_frame_of_the_new_rows_equals_encode_entry_row_by_row():
    from woodpecker_idem._core import encode_entry, encode_frame

    status = bytes([2, 0, 1, 0])  # rows 1..4 of the range; row 0 is outside it
    stamps = array("q", [9, 10, 11, 12, 13])
    payloads = [b"outside", b"dup", b"a", b"joins", b"c" * 3000]
    props = [None, None, None, None, {"k": "v", "x": "y"}]
    keys = b"".join(K(i) for i in range(5))
    frame, count = encode_frame(7, 40, stamps, payloads, 1, 5, keys, status, props)
    assert count == 2
    assert frame == encode_entry(7, 40, 11, b"a", None, K(2)) + encode_entry(
        7, 41, 13, b"c" * 3000, {"k": "v", "x": "y"}, K(4)
    )
    plain, n = encode_frame(0, 5, stamps, payloads, 0, 2, properties=props)  # no keys
    assert n == 2 and plain == encode_entry(0, 5, 9, b"outside") + encode_entry(0, 6, 10, b"dup")
    with pytest.raises(InvalidArgumentError, match="timestamp_ms holds 4 values"):
        encode_frame(7, 40, stamps[:4], payloads, 1, 5, keys, status, props)
    with pytest.raises(InvalidArgumentError, match="properties holds 4 rows"):
        encode_frame(7, 40, stamps, payloads, 1, 5, keys, status, props[:4])
    with pytest.raises(InvalidTypeError, match=r"payloads\[2\] must be bytes"):
        encode_frame(7, 40, stamps, [*payloads[:2], "a", *payloads[3:]], 1, 5, keys, status, props)
    with pytest.raises(InvalidTypeError, match=r"properties\[2\]: properties must"):
        encode_frame(
            7, 40, stamps, payloads, 1, 5, keys, status, [None, None, {"k": 1}, None, None]
        )
    with pytest.raises(InvalidTypeError, match="properties must be a list"):
        encode_frame(7, 40, stamps, payloads, 1, 5, keys, status, {"k": "v"})
