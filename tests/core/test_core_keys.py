"""Idempotency keys and CRC32C of the Rust core against hashlib and the contract."""

from __future__ import annotations

import hashlib
import struct
import threading
import time
from array import array
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from woodpecker_idem import _core
from woodpecker_idem.errors import InvalidArgumentError, InvalidTypeError, WoodpeckerError

DOMAIN = b"woodpecker-idem/explicit-id/v1\x00"


def ref_explicit(idem_id: str | bytes) -> bytes:
    raw = idem_id.encode("utf-8") if isinstance(idem_id, str) else idem_id
    return hashlib.md5(DOMAIN + raw).digest()


def arrow_column(payloads: list[bytes], large: bool, base: int = 0) -> tuple[bytes, bytes]:
    """(offsets, data) of an Arrow binary column; `base` shifts the offsets (a sliced array)."""
    offs = [base]
    for p in payloads:
        offs.append(offs[-1] + len(p))
    fmt = "q" if large else "i"
    return struct.pack(f"<{len(offs)}{fmt}", *offs), b"\x00" * base + b"".join(payloads)


def assert_arg_error(exc: BaseException, base: type[Exception], name: str) -> None:
    assert isinstance(exc, WoodpeckerError), type(exc)
    assert isinstance(exc, base), type(exc)
    assert name in str(exc), f"{name!r} not named in {exc!r}"


# --- single forms -----------------------------------------------------------------------------


@pytest.mark.parametrize("payload", [b"", b"a", b"abc", bytes(range(256)) * 40])
def test_content_key_is_md5(payload: bytes) -> None:
    assert _core.content_key(payload) == hashlib.md5(payload).digest()
    assert _core.content_key(bytearray(payload)) == hashlib.md5(payload).digest()
    assert _core.content_key(memoryview(payload)) == hashlib.md5(payload).digest()


def test_content_key_noncontiguous_or_multibyte_view() -> None:
    data = array("I", range(100))
    assert _core.content_key(data) == hashlib.md5(data.tobytes()).digest()


def test_explicit_key_domain() -> None:
    assert _core.explicit_key("abc") == ref_explicit("abc")
    assert _core.explicit_key("abc") != _core.content_key(b"abc")
    assert _core.explicit_key("abc") != hashlib.md5(b"abc").digest()
    assert _core.explicit_key("abc") == _core.explicit_key(b"abc")
    assert _core.explicit_key("h\u00e9llo \u2603") == _core.explicit_key(
        "h\u00e9llo \u2603".encode()
    )
    assert _core.explicit_key("a") != _core.explicit_key("b")
    assert len(_core.explicit_key("x")) == 16


@given(st.binary(max_size=64))
@settings(max_examples=200, deadline=None)
def test_content_vs_explicit_never_equal(data: bytes) -> None:
    assert _core.content_key(data) == hashlib.md5(data).digest()
    if data:
        assert _core.explicit_key(data) == ref_explicit(data)
        assert _core.explicit_key(data) != _core.content_key(data)


def test_explicit_id_length_limits() -> None:
    assert _core.explicit_key("x") == ref_explicit("x")
    assert _core.explicit_key(b"y" * 1024) == ref_explicit(b"y" * 1024)
    assert _core.explicit_key("\u00e9" * 512) == ref_explicit("\u00e9" * 512)  # 1024 bytes
    for bad in ("", b"", "z" * 1025, b"z" * 1025, "\u00e9" * 513):
        with pytest.raises(InvalidArgumentError) as info:
            _core.explicit_key(bad)
        assert_arg_error(info.value, ValueError, "idempotency_id")
        with pytest.raises(InvalidArgumentError) as info:
            _core.explicit_keys(["ok", bad])
        assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("bad", [None, 5, 1.5, ["a"], object()])
def test_wrong_types(bad: Any) -> None:
    with pytest.raises(InvalidTypeError) as info:
        _core.explicit_key(bad)
    assert_arg_error(info.value, TypeError, "idempotency_id")
    with pytest.raises(InvalidTypeError) as info:
        _core.content_key(bad if bad is not None else "str")
    assert isinstance(info.value, TypeError)
    with pytest.raises(TypeError):
        _core.content_keys([b"ok", bad])
    with pytest.raises(TypeError):
        _core.explicit_keys([b"ok", bad])


def test_content_key_rejects_str() -> None:
    with pytest.raises(InvalidTypeError) as info:
        _core.content_key("abc")
    assert_arg_error(info.value, TypeError, "payload")


# --- batch forms ------------------------------------------------------------------------------


@given(st.lists(st.binary(max_size=300), max_size=40))
@settings(max_examples=150, deadline=None)
def test_content_keys_equal_single(payloads: list[bytes]) -> None:
    expected = b"".join(hashlib.md5(p).digest() for p in payloads)
    assert _core.content_keys(payloads) == expected
    assert _core.content_keys(tuple(bytearray(p) for p in payloads)) == expected
    for large in (False, True):
        offs, data = arrow_column(payloads, large)
        assert _core.content_keys_arrow(offs, data, large=large) == expected
        offs, data = arrow_column(payloads, large, base=7)  # sliced column: offsets start at 7
        assert _core.content_keys_arrow(offs, data, large=large) == expected


@given(st.lists(st.one_of(st.text(min_size=1, max_size=40), st.binary(min_size=1, max_size=40))))
@settings(max_examples=150, deadline=None)
def test_explicit_keys_equal_single(ids: list[str | bytes]) -> None:
    expected = b"".join(_core.explicit_key(i) for i in ids)
    assert expected == b"".join(ref_explicit(i) for i in ids)
    assert _core.explicit_keys(ids) == expected


def test_content_keys_large_batch_equals_hashlib() -> None:
    # big enough that an implementation may split it over threads
    payloads = [i.to_bytes(4, "little") * (i % 97) for i in range(20_000)]
    expected = b"".join(hashlib.md5(p).digest() for p in payloads)
    assert _core.content_keys(payloads) == expected
    offs, data = arrow_column(payloads, large=False)
    assert _core.content_keys_arrow(offs, data) == expected
    assert _core.content_keys_arrow(memoryview(offs), bytearray(data)) == expected
    ids: list[str | bytes] = [f"order-{i}" if i % 2 else f"id-{i}".encode() for i in range(20_000)]
    assert _core.explicit_keys(ids) == b"".join(ref_explicit(i) for i in ids)


def test_arrow_from_array_module() -> None:
    payloads = [b"a", b"", b"hello", b"x" * 1000]
    expected = b"".join(hashlib.md5(p).digest() for p in payloads)
    offs32 = array("i", [0, 1, 1, 6, 1006])
    offs64 = array("q", [0, 1, 1, 6, 1006])
    data = b"".join(payloads)
    assert _core.content_keys_arrow(offs32, data) == expected
    assert _core.content_keys_arrow(offs64, data, large=True) == expected
    assert _core.content_keys_arrow(array("i", [3]), data) == b""  # one offset: zero rows


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize(
    "offsets",
    [
        [0, 5, 3],  # decreasing
        [0, 3, 11],  # beyond data (len 10)
        [11, 11],  # start beyond data
        [-1, 3],  # negative
        [0, -2],
        [0, 2**31 - 1],
    ],
)
def test_arrow_bad_offsets(large: bool, offsets: list[int]) -> None:
    fmt = "q" if large else "i"
    with pytest.raises(InvalidArgumentError) as info:
        _core.content_keys_arrow(
            struct.pack(f"<{len(offsets)}{fmt}", *offsets), b"x" * 10, large=large
        )
    assert_arg_error(info.value, ValueError, "offsets")


def test_arrow_bad_offsets_buffer_length() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        _core.content_keys_arrow(b"\x00\x00\x00\x00\x00", b"")  # 5 bytes, not a multiple of 4
    assert_arg_error(info.value, ValueError, "offsets")
    with pytest.raises(InvalidArgumentError):
        _core.content_keys_arrow(struct.pack("<3i", 0, 0, 0), b"", large=True)  # 12 bytes / 8
    # int64 offsets read as int32 must not pass silently when they go past the data
    with pytest.raises(InvalidArgumentError):
        _core.content_keys_arrow(struct.pack("<2q", 0, 2**32 + 1), b"x" * 4, large=True)
    with pytest.raises(TypeError):
        _core.content_keys_arrow([0, 1], b"x")


# --- CRC32C -----------------------------------------------------------------------------------


def test_crc32c_known_vectors() -> None:
    assert _core.crc32c(b"") == 0
    assert _core.crc32c(b"123456789") == 0xE3069283
    assert _core.crc32c(b"\x00" * 32) == 0x8A9136AA
    assert _core.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert _core.crc32c(b"12345", 0) == _core.crc32c(b"12345")
    assert _core.crc32c(b"6789", _core.crc32c(b"12345")) == 0xE3069283


# --- GIL release ------------------------------------------------------------------------------


def _gil_probe(fn: Any) -> tuple[float, float]:
    """Run fn in a thread; return (call duration, largest main-thread gap inside the call)."""
    started = threading.Event()
    window: list[float] = []

    def worker() -> None:
        started.set()
        t0 = time.perf_counter()
        fn()
        window.extend((t0, time.perf_counter()))

    ticks: list[float] = []
    th = threading.Thread(target=worker)
    th.start()
    started.wait()
    while th.is_alive():
        ticks.append(time.perf_counter())
    th.join()
    t0, t1 = window
    inside = [t0] + [t for t in ticks if t0 < t < t1] + [t1]
    gap = max(b - a for a, b in zip(inside, inside[1:], strict=False))
    return t1 - t0, gap


def test_content_keys_releases_gil() -> None:
    big = b"\xab" * (1 << 20)
    payloads = [big] * 1024  # 1 GiB through MD5 (one object, many references): ~100-300 ms
    expected_first = hashlib.md5(big).digest()
    out: list[bytes] = []

    def hash_batch() -> None:
        out.append(_core.content_keys(payloads))

    results = []
    for _attempt in range(3):
        duration, gap = _gil_probe(hash_batch)
        results.append((duration, gap))
        assert len(out[-1]) == 16 * len(payloads) and out[-1][:16] == expected_first
        # GIL held for the whole call -> one gap as long as the call; released -> small gaps
        if duration > 0.05 and gap < 0.5 * duration:
            return
    pytest.fail(f"main thread starved while hashing (duration, largest gap): {results}")
