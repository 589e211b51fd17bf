"""Smoke test of every function of `woodpecker_idem._core` (property tests live elsewhere)."""

from __future__ import annotations

import array
import hashlib

import pytest

from woodpecker_idem import _core
from woodpecker_idem.errors import InvalidArgumentError, InvalidTypeError, SnapshotCorruptError

DOMAIN = b"woodpecker-idem/explicit-id/v1\x00"


def key(i: int) -> bytes:
    return hashlib.md5(i.to_bytes(8, "little")).digest()


def i64s(values: list[int]) -> bytes:
    return array.array("q", values).tobytes()


def test_content_and_explicit_keys() -> None:
    assert _core.content_key(b"") == hashlib.md5(b"").digest()
    for payload in (b"abc", bytearray(b"abc"), memoryview(b"abc"), array.array("B", b"abc")):
        assert _core.content_key(payload) == hashlib.md5(b"abc").digest()
    assert _core.explicit_key("abc") == hashlib.md5(DOMAIN + b"abc").digest()
    assert _core.explicit_key(b"abc") == _core.explicit_key("abc")
    assert _core.explicit_key("abc") != _core.content_key(b"abc")
    with pytest.raises(InvalidArgumentError, match="idempotency_id"):
        _core.explicit_key("")
    with pytest.raises(InvalidArgumentError, match="idempotency_id"):
        _core.explicit_key("x" * 1025)
    with pytest.raises(InvalidTypeError, match="idempotency_id"):
        _core.explicit_key(5)
    with pytest.raises(InvalidTypeError, match="payload"):
        _core.content_key("text")


def test_batch_keys() -> None:
    payloads = [bytes([i % 251]) * (i % 300) for i in range(5000)]
    out = _core.content_keys(payloads)
    assert out == b"".join(hashlib.md5(p).digest() for p in payloads)
    assert _core.content_keys([]) == b""
    ids = ["a", b"b", "ü"]
    assert _core.explicit_keys(ids) == b"".join(_core.explicit_key(i) for i in ids)
    with pytest.raises(InvalidTypeError, match=r"payloads\[1\]"):
        _core.content_keys([b"a", 3])
    with pytest.raises(InvalidArgumentError, match=r"ids\[0\]"):
        _core.explicit_keys([""])


def test_content_keys_arrow() -> None:
    values = [b"ab", b"", b"cde"]
    data = b"".join(values)
    offsets = array.array("i", [0, 2, 2, 5]).tobytes()
    want = b"".join(hashlib.md5(v).digest() for v in values)
    assert _core.content_keys_arrow(offsets, data) == want
    large = array.array("q", [0, 2, 2, 5])
    assert _core.content_keys_arrow(large, data, large=True) == want
    with pytest.raises(InvalidArgumentError, match="offsets"):
        _core.content_keys_arrow(array.array("i", [0, 3, 2]).tobytes(), data)
    with pytest.raises(InvalidArgumentError, match="offsets"):
        _core.content_keys_arrow(array.array("i", [0, 9]).tobytes(), data)


def test_crc32c() -> None:
    assert _core.crc32c(b"123456789") == 0xE3069283
    assert _core.crc32c(b"56789", _core.crc32c(b"1234")) == 0xE3069283
    with pytest.raises(InvalidArgumentError, match="value"):
        _core.crc32c(b"", -1)


def test_window_single_ops() -> None:
    w = _core.DedupWindow(max_keys=2, window_ms=100)
    assert (w.max_keys, w.window_ms, len(w)) == (2, 100, 0)
    assert w.get(key(1)) is None
    w.add_pending(key(1), 3, 4, 1000)
    assert w.get(key(1)) == _core.WindowEntry(3, 4, 1000, False)
    with pytest.raises(InvalidArgumentError, match="key"):
        w.add_pending(key(1), 3, 5, 1000)
    assert w.commit(key(1)) and not w.commit(key(1))
    entry = w.get(key(1))
    assert entry is not None and entry.committed and entry.entry_id == 4
    assert "WindowEntry(" in repr(entry)
    assert w.get(key(1), now_ms=1100) is None  # expired by time
    w.add_pending(key(2), 3, 6, 1010)
    assert w.drop_pending(key(2)) and not w.drop_pending(key(2))
    assert w.add_committed(key(3), 3, 7, 1020)
    assert not w.add_committed(key(3), 3, 6, 1020)  # an earlier position never replaces
    assert w.add_committed(key(4), 3, 8, 1030)  # evicts key(1), 30 ms old: early
    assert (w.evictions, w.early_evictions, w.committed_count, w.pending_count) == (1, 1, 2, 0)
    assert [e[2] for e in w.committed_entries()] == [7, 8]
    assert w.evict(1125) == 1
    assert (w.hits, w.misses) == (2, 2)
    stats = w.stats()
    assert stats["evictions"] == 2 and stats["memory_bytes"] == w.memory_bytes() > 0
    with pytest.raises(InvalidArgumentError, match="key"):
        w.get(b"short")
    with pytest.raises(InvalidArgumentError, match="segment_id"):
        w.add_committed(key(9), 2**32, 0, 0)
    with pytest.raises(InvalidTypeError, match="entry_id"):
        w.add_committed(key(9), 0, "0", 0)
    with pytest.raises(InvalidArgumentError, match="max_keys"):
        _core.DedupWindow(0, 100)
    with pytest.raises(InvalidArgumentError, match="window_ms"):
        _core.DedupWindow(10, 0)


def test_window_batch_ops() -> None:
    w = _core.DedupWindow(1000, 60_000)
    keys = b"".join(key(i) for i in range(10))
    inserted = w.add_committed_many(
        keys, array.array("q", [1] * 10), i64s(list(range(10))), i64s([5] * 10)
    )
    assert inserted == 10
    w.add_pending(key(20), 2, 0, 5)
    probe = memoryview(key(3) + key(20) + key(99))
    status, segs, ents = w.get_many(probe)
    assert status == bytes([2, 1, 0])
    assert array.array("q", segs).tolist() == [1, 2, -1]
    assert array.array("q", ents).tolist() == [3, 0, -1]
    status, _, _ = w.get_many(bytearray(key(3)), now_ms=60_005)
    assert status == b"\x00"
    with pytest.raises(InvalidArgumentError, match="keys"):
        w.get_many(b"x" * 17)
    with pytest.raises(InvalidArgumentError, match="entry_ids"):
        w.add_committed_many(key(50), i64s([0]), i64s([-1]), i64s([0]))
    with pytest.raises(InvalidArgumentError, match="timestamps_ms"):
        w.add_committed_many(key(50), i64s([0]), i64s([0]), i64s([]))
    clone = w.clone_committed()
    assert clone.committed_entries() == w.committed_entries()
    assert (clone.pending_count, clone.hits) == (0, 0)


def test_snapshot_round_trip() -> None:
    w = _core.DedupWindow(100, 5000)
    for i in range(30):
        w.add_committed(key(i), i // 10, i % 10, 1000 + i)
    w.add_pending(key(99), 9, 9, 9)  # pending entries are not snapshotted
    data = _core.encode_snapshot(w, 7, 3, 123456, {0: 9, 2: 9})
    assert data[:4] == b"WPDS"
    snap = _core.decode_snapshot(data)
    assert (snap.format_version, snap.log_id, snap.epoch, snap.timestamp_ms) == (2, 7, 3, 123456)
    assert (snap.window_max_keys, snap.window_ms, snap.watermarks) == (100, 5000, {0: 9, 2: 9})
    assert len(snap) == 30
    assert snap.entries() == w.committed_entries()
    assert snap.keys() == b"".join(key(i) for i in range(30))
    restored = snap.to_window()
    assert restored.committed_entries() == w.committed_entries()
    assert snap.to_window(max_keys=10).committed_count == 10
    target = _core.DedupWindow(100, 5000)
    target.add_committed(key(0), 0, 0, 1000)
    assert snap.load_into(target) == 29
    with pytest.raises(InvalidTypeError, match="window"):
        snap.load_into(object())


def test_snapshot_decode_errors() -> None:
    w = _core.DedupWindow(10, 10)
    w.add_committed(key(1), 1, 1, 1)
    good = _core.encode_snapshot(w, 1, 1, 1, {})
    for bad in (b"", good[:-1], good + b"\x00", b"XXXX" + good[4:]):
        with pytest.raises(SnapshotCorruptError):
            _core.decode_snapshot(bad)
    flipped = bytearray(good)
    flipped[-1] ^= 0x01
    with pytest.raises(SnapshotCorruptError, match="CRC"):
        _core.decode_snapshot(flipped)
    future = bytearray(good)
    future[4] = 3
    with pytest.raises(SnapshotCorruptError, match="unsupported"):
        _core.decode_snapshot(bytes(future))


def test_snapshot_decode_mutations_raise_cleanly() -> None:
    w = _core.DedupWindow(64, 1000)
    for i in range(40):
        w.add_committed(key(i), i // 16, i, 5 * i)
    good = _core.encode_snapshot(w, 1, 2, 3, {0: 15, 1: 31, 2: 39})
    rng = __import__("random").Random(7)
    for _ in range(300):
        bad = bytearray(good)
        choice = rng.randrange(3)
        if choice == 0:
            del bad[rng.randrange(len(bad)) :]
        elif choice == 1:
            bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        else:
            bad = bytearray(rng.randbytes(rng.randrange(64)))
        with pytest.raises(SnapshotCorruptError):
            _core.decode_snapshot(bytes(bad))


def test_window_rewrite_replaces_the_old_record() -> None:
    w = _core.DedupWindow(4, 100)
    assert w.add_committed(key(1), 0, 1, 1000)
    assert w.add_committed(key(1), 0, 5, 1200)  # a later position of the key (a rewrite)
    assert w.committed_entries() == [(key(1), 0, 5, 1200)] and w.committed_count == 1
    w2 = _core.DedupWindow(4, 100)
    w2.add_committed(key(2), 0, 0, 1000)
    with pytest.raises(InvalidArgumentError, match="key"):
        w2.add_pending(key(2), 0, 1, 1099)  # still in the window
    w2.add_pending(key(2), 0, 1, 1100)  # its window expired: a new write replaces it
    assert w2.commit(key(2)) and w2.committed_entries() == [(key(2), 0, 1, 1100)]
