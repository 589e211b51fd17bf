"""Dedup snapshot codec: round trips, a decoder fuzz, snapshots taken under concurrent writes."""

from __future__ import annotations

import gc
import hashlib
import random
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from woodpecker_idem import _core
from woodpecker_idem.errors import SnapshotCorruptError

U32_MAX = 2**32 - 1
I64_MIN = -(2**63)
I64_MAX = 2**63 - 1
HEADER = struct.Struct("<4sHHII")  # magic, version, flags, body length, crc32c(body)

Entry = tuple[bytes, int, int, int]


def snapshot_state(s: Any) -> tuple[Any, ...]:
    """Everything a decoded snapshot exposes, for equality checks."""
    return (
        s.format_version,
        s.log_id,
        s.epoch,
        s.timestamp_ms,
        s.window_max_keys,
        s.window_ms,
        dict(s.watermarks),
        len(s),
        s.entries(),
        s.keys(),
    )


def check_consistent(s: Any) -> None:
    """A successful decode must be internally consistent, whatever the bytes were."""
    entries = s.entries()
    assert len(s) == len(entries)
    assert s.keys() == b"".join(e[0] for e in entries)
    for key, seg, ent, _ts in entries:
        assert len(key) == 16
        assert 0 <= seg <= U32_MAX and 0 <= ent <= U32_MAX


def build_window(
    entries: list[Entry], max_keys: int, window_ms: int, pending: list[Entry] | None = None
) -> Any:
    w = _core.DedupWindow(max_keys, window_ms)
    for key, seg, ent, ts in entries:
        w.add_committed(key, seg, ent, ts)
    for key, seg, ent, ts in pending or []:
        w.add_pending(key, seg, ent, ts)
    return w


def md5_key(i: int) -> bytes:
    return hashlib.md5(i.to_bytes(8, "little")).digest()


# --- round trips ------------------------------------------------------------------------------

u32 = st.integers(0, U32_MAX)
i64 = st.one_of(st.integers(I64_MIN, I64_MAX), st.sampled_from([I64_MIN, I64_MAX, 0, -1]))
u63 = st.integers(0, I64_MAX)


@st.composite
def windows(draw: st.DrawFn) -> tuple[Any, list[Entry], list[Entry]]:
    n = draw(st.integers(0, 60))
    keys = draw(st.lists(st.binary(min_size=16, max_size=16), min_size=n, max_size=n, unique=True))
    small_ids = draw(st.booleans())
    idv = st.integers(0, 40) if small_ids else u32
    rows = [(key, draw(idv), draw(idv), draw(i64)) for key in keys]
    n_pending = draw(st.integers(0, min(5, n)))
    committed, pending = rows[n_pending:], rows[:n_pending]
    max_keys = draw(st.integers(1, 80))
    window_ms = draw(st.integers(1, 2**40))
    return build_window(committed, max_keys, window_ms, pending), committed, pending


@given(
    win=windows(),
    log_id=u63,
    epoch=u63,
    ts=st.integers(0, I64_MAX),
    watermarks=st.dictionaries(u32, u32, max_size=6),
)
@settings(max_examples=250, deadline=None)
def test_round_trip(
    win: tuple[Any, list[Entry], list[Entry]],
    log_id: int,
    epoch: int,
    ts: int,
    watermarks: dict[int, int],
) -> None:
    w, committed, pending = win
    expected_entries = w.committed_entries()
    assert expected_entries == committed[-w.max_keys :]
    data = _core.encode_snapshot(w, log_id, epoch, ts, watermarks)
    assert data[:4] == b"WPDS"
    magic, version, flags, reserved, crc = HEADER.unpack_from(data)
    assert (version, flags, reserved) == (2, 0, 0)
    assert crc == _core.crc32c(data[:12])
    # the stream's parts end to end are the same bytes (one chunk per 16Ki entries)
    assert b"".join(_core.SnapshotStream(w, log_id, epoch, ts, watermarks)) == data

    s = _core.decode_snapshot(data)
    assert s.format_version == 2
    assert (s.log_id, s.epoch, s.timestamp_ms) == (log_id, epoch, ts)
    assert (s.window_max_keys, s.window_ms) == (w.max_keys, w.window_ms)
    assert dict(s.watermarks) == watermarks
    assert s.entries() == expected_entries
    assert len(s) == len(expected_entries)
    assert s.keys() == b"".join(e[0] for e in expected_entries)
    pending_keys = {p[0] for p in pending}
    assert not pending_keys & {e[0] for e in s.entries()}  # pending is never written

    assert snapshot_state(_core.decode_snapshot(bytearray(data))) == snapshot_state(s)
    assert snapshot_state(_core.decode_snapshot(memoryview(data))) == snapshot_state(s)

    w2 = s.to_window()
    assert (w2.max_keys, w2.window_ms) == (w.max_keys, w.window_ms)
    assert w2.committed_entries() == expected_entries
    assert w2.pending_count == 0

    w3 = _core.DedupWindow(w.max_keys, w.window_ms)
    assert s.load_into(w3) == len(expected_entries)
    assert w3.committed_entries() == expected_entries
    assert s.load_into(w3) == 0  # all present: add_committed keeps them

    # handed over instead of copied: the same window; the snapshot keeps all but its entries
    taken = _core.decode_snapshot(data)
    ends, shared = taken.segment_ends(), taken.shared_position()
    w5 = _core.DedupWindow(w.max_keys, w.window_ms)
    assert taken.take_into(w5) == len(expected_entries)
    assert w5.committed_entries() == expected_entries
    assert (len(taken), taken.entries(), taken.keys()) == (0, [], b"")
    assert (taken.segment_ends(), taken.shared_position()) == (ends, shared)
    assert snapshot_state(taken)[:7] == snapshot_state(s)[:7]
    assert taken.take_into(w5) == 0

    if expected_entries:
        m = max(1, len(expected_entries) // 2)
        w4 = s.to_window(max_keys=m, window_ms=7)
        assert (w4.max_keys, w4.window_ms) == (m, 7)
        assert w4.committed_entries() == expected_entries[-m:]

    # a committed-only copy encodes to the same bytes
    assert _core.encode_snapshot(w.clone_committed(), log_id, epoch, ts, watermarks) == data

    # the version 1 body of earlier releases decodes to the same snapshot
    old = snapshot_state(_core.decode_snapshot(to_v1(data)))
    assert old[0] == 1 and old[1:] == snapshot_state(s)[1:]


@pytest.fixture
def collector_switching_threads() -> Iterator[None]:
    """The cycle collector runs often, and lets other threads run each time (as a collection
    that runs finalizers or callbacks may): where a native call makes Python objects while it
    holds a lock, another thread then gets the GIL and can wait on that lock."""
    threshold = gc.get_threshold()
    gc.set_threshold(50)
    gc.callbacks.append(_yield_gil)
    try:
        yield
    finally:
        gc.callbacks.remove(_yield_gil)
        gc.set_threshold(*threshold)


def _yield_gil(phase: str, info: dict[str, int]) -> None:
    time.sleep(0)


@pytest.mark.usefixtures("collector_switching_threads")
def test_a_snapshot_is_handed_over_once_whatever_the_threads() -> None:
    """Threads handing one snapshot to windows of their own, while others read it: exactly one
    window gets every entry, the others none, and a reader sees all of them or none."""
    entries = [(md5_key(i), 1 + i // 500, i % 500, 1000 + i) for i in range(3_000)]
    data = _core.encode_snapshot(build_window(entries, 5_000, 10**9), 1, 2, 3, {})
    for _ in range(20):
        snap = _core.decode_snapshot(data)
        windows = [_core.DedupWindow(5_000, 10**9) for _ in range(4)]
        got, seen = _hand_over_while_reading(snap, windows, readers=2)
        assert sorted(got) == [0, 0, 0, len(entries)]
        assert sorted(len(w) for w in windows) == [0, 0, 0, len(entries)]
        full = next(w for w in windows if len(w))
        assert full.committed_entries() == [tuple(e) for e in entries]
        assert set(seen) <= {0, len(entries)} and len(snap) == 0


def _hand_over_while_reading(
    snap: Any, windows: list[Any], readers: int
) -> tuple[list[int], list[int]]:
    """`snap.take_into` each window, one thread each, beside `readers` threads reading
    `snap.entries()`, all let go at once; what the takes returned, and the lengths read."""
    got: list[int] = []
    seen: list[int] = []
    start = threading.Barrier(len(windows) + readers)

    def take(w: Any) -> None:
        start.wait()
        got.append(snap.take_into(w))

    def read() -> None:
        start.wait()
        for _ in range(20):
            seen.append(len(snap.entries()))

    threads = [threading.Thread(target=take, args=(w,)) for w in windows]
    threads += [threading.Thread(target=read) for _ in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got, seen


def test_load_into_keeps_pending_and_existing() -> None:
    entries = [(md5_key(i), 1, i, 1000 + i) for i in range(10)]
    s = _core.decode_snapshot(
        _core.encode_snapshot(build_window(entries, 100, 10), 1, 2, 3, {1: 9})
    )
    w = _core.DedupWindow(100, 10)
    w.add_pending(md5_key(3), 7, 7, 7)  # pending -> committed with the snapshot's ids
    w.add_committed(md5_key(5), 8, 8, 8)  # already committed: kept
    w.add_pending(md5_key(99), 9, 9, 9)
    assert s.load_into(w) == 9
    assert w.pending_count == 1
    got = dict((e[0], e[1:]) for e in w.committed_entries())
    assert got[md5_key(3)] == (1, 3, 1003)
    assert got[md5_key(5)] == (8, 8, 8)


def test_snapshot_size_target() -> None:
    """100,000 entries, 3 segments, consecutive entry ids, timestamps +0..12 ms: <= 19 B/entry."""
    rng = random.Random(7)
    w = _core.DedupWindow(100_000, 3_600_000)
    n = 100_000
    keys = rng.randbytes(16 * n)
    segs, ents, tss = [], [], []
    ts = 1_700_000_000_000
    for i in range(n):
        seg = i * 3 // n
        segs.append(10 + seg)
        ents.append(i - seg * (n // 3))
        ts += rng.randint(0, 12)
        tss.append(ts)
    w.add_committed_many(keys, *(struct.pack(f"<{n}q", *v) for v in (segs, ents, tss)))
    data = _core.encode_snapshot(w, 5, 1, ts, {10: 33_332, 11: 33_333, 12: 33_334})
    assert len(data) / n <= 19.0, len(data) / n
    assert _core.decode_snapshot(data).keys() == keys


def test_future_version_is_reported() -> None:
    data = bytearray(
        _core.encode_snapshot(build_window([(md5_key(1), 1, 1, 1)], 4, 4), 1, 1, 1, {})
    )
    struct.pack_into("<H", data, 4, 3)
    with pytest.raises(SnapshotCorruptError, match="(?i)version"):
        _core.decode_snapshot(bytes(data))


# --- decoder fuzz -----------------------------------------------------------------------------


def varint(v: int) -> bytes:
    out = bytearray()
    v &= (1 << 64) - 1
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


Field = tuple[int, int, Any]  # (field number, wire type, int value or bytes)


def parse_fields(body: bytes) -> list[Field]:
    """Top-level protobuf fields of a body (wire types 0 and 2 only, as the format uses)."""
    fields: list[Field] = []
    pos = 0
    while pos < len(body):
        tag, pos = read_varint(body, pos)
        num, wt = tag >> 3, tag & 7
        if wt == 0:
            v, pos = read_varint(body, pos)
            fields.append((num, 0, v))
        elif wt == 2:
            ln, pos = read_varint(body, pos)
            fields.append((num, 2, body[pos : pos + ln]))
            pos += ln
        else:  # pragma: no cover - the format has no other wire types
            raise AssertionError(f"unexpected wire type {wt}")
    return fields


def encode_fields(fields: list[Field]) -> bytes:
    out = bytearray()
    for num, wt, v in fields:
        out += varint(num << 3 | wt)
        out += varint(v) if wt == 0 else varint(len(v)) + v
    return bytes(out)


def frame(body: bytes, version: int = 1, flags: int = 0) -> bytes:
    return HEADER.pack(b"WPDS", version, flags, len(body), _core.crc32c(body)) + body


def decode_outcome(data: bytes) -> tuple[Any, ...] | None:
    """None for SnapshotCorruptError, else the decoded state; anything else propagates."""
    try:
        s = _core.decode_snapshot(data)
    except SnapshotCorruptError:
        return None
    check_consistent(s)
    return snapshot_state(s)


def v2_frames(data: bytes) -> list[list[Field]]:
    """The protobuf fields inside each frame of a version 2 snapshot (meta, chunks, trailer)."""
    pos, out = HEADER.size, []
    while pos < len(data):
        (length,) = struct.unpack_from("<I", data, pos)
        ((_, _, part),) = parse_fields(data[pos + 8 : pos + 8 + length])
        out.append(parse_fields(part))
        pos += 8 + length
    return out


def to_v1(data: bytes) -> bytes:
    """A version 2 snapshot of at most one chunk as the version 1 body earlier releases wrote:
    the metadata fields keep their numbers (format_version 1), the chunk's columns are fields
    8..12 (entry_count, keys, segment_runs, entry_id_deltas, timestamp_deltas)."""
    frames = v2_frames(data)
    meta, chunks = frames[0], frames[1:-1]
    assert len(chunks) <= 1
    fields = [(1, 0, 1) if num == 1 else (num, wt, v) for num, wt, v in meta]
    fields += [(num + 7, wt, v) for chunk in chunks for num, wt, v in chunk]
    return frame(encode_fields(fields))


def small_snapshot_v2(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    entries = [
        (rng.randbytes(16), rng.choice([1, 2, 900]), rng.randint(0, 3000), rng.randint(0, 10**13))
        for _ in range(n)
    ]
    return _core.encode_snapshot(
        build_window(entries, n + 37, 60_000), 4242, 77, 1_700_000_123_456, {1: 5, 2: 3000, 900: 12}
    )


def small_snapshot(n: int, seed: int) -> bytes:
    """`small_snapshot_v2` in version 1: the structural mutations below edit its one body."""
    return to_v1(small_snapshot_v2(n, seed))


def raw_mutations(orig: bytes, rng: random.Random) -> Iterator[bytes]:
    """Mutations that leave the CRC/header as they are (body changes must be caught)."""
    n = len(orig)
    for i in range(n):  # truncations at every length
        yield orig[:i]
    for i in range(n * 8):  # every single bit flip
        b = bytearray(orig)
        b[i // 8] ^= 1 << (i % 8)
        yield bytes(b)
    for _ in range(2500):  # multi bit flips
        b = bytearray(orig)
        for _j in range(rng.randint(2, 8)):
            b[rng.randrange(n)] ^= 1 << rng.randrange(8)
        yield bytes(b)
    for i in range(n + 1):  # byte insert / delete at every position
        yield orig[:i] + bytes([rng.randrange(256)]) + orig[i:]
        if i < n:
            yield orig[:i] + orig[i + 1 :]
    yield orig + b"\x00"
    yield orig + orig
    for _ in range(2000):  # random bytes, with and without a plausible header
        ln = rng.choice([0, 1, 4, 15, 16, 17, 40, 200, 1000])
        junk = rng.randbytes(ln)
        yield junk
        yield orig[: rng.randint(4, 16)] + junk
    for version in (0, 2, 3, 0xFFFF):  # header edits (CRC of the body still right)
        yield HEADER.pack(b"WPDS", version, 0, n - 16, _core.crc32c(orig[16:])) + orig[16:]
    for body_len in (0, n - 17, n - 15, 2**31, U32_MAX):
        yield orig[:8] + struct.pack("<I", body_len) + orig[12:]
    for magic in (b"WPDT", b"\x00PDS", b"wpds"):
        yield magic + orig[4:]
    yield orig[:12] + struct.pack("<I", 0) + orig[16:]


def structural_mutations(orig: bytes, rng: random.Random, n_entries: int) -> Iterator[bytes]:
    """Body edits re-framed with a correct CRC: the decoder must validate the layout itself."""
    body = orig[16:]
    fields = parse_fields(body)
    huge = [2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**64 - 1]
    count_fields = 0
    for idx, (num, wt, v) in enumerate(fields):
        if wt == 0:
            values = [0, 1, v + 1, max(v - 1, 0), *huge]
            for nv in values:
                yield frame(encode_fields(fields[:idx] + [(num, 0, nv)] + fields[idx + 1 :]))
            if v == n_entries:  # the declared entry count: huge counts must not allocate
                count_fields += 1
                for nv in huge:
                    mutated = fields[:idx] + [(num, 0, nv)] + fields[idx + 1 :]
                    assert decode_outcome(frame(encode_fields(mutated))) is None, nv
        else:
            for cut in {1, 2, 16, len(v)}:
                if cut <= len(v):
                    yield frame(
                        encode_fields(fields[:idx] + [(num, 2, v[:-cut])] + fields[idx + 1 :])
                    )
            for extra in (b"\x00", b"\x80", b"\xff" * 11, v):
                yield frame(encode_fields(fields[:idx] + [(num, 2, v + extra)] + fields[idx + 1 :]))
            # declared length past the end of the body
            raw = encode_fields(fields[:idx]) + varint(num << 3 | 2) + varint(2**40) + v
            yield frame(raw)
        yield frame(encode_fields(fields[:idx] + fields[idx + 1 :]))  # field dropped
        yield frame(encode_fields(fields + [fields[idx]]))  # field repeated
    assert count_fields == 1, "entry_count field not found in the body"
    yield frame(b"")
    yield frame(body, version=2)
    yield frame(body, flags=1)
    for _ in range(2500):  # random byte edits inside the body, CRC fixed up
        b = bytearray(body)
        for _j in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        yield frame(bytes(b))
    for _ in range(500):  # random varint-ish garbage as a body
        yield frame(rng.randbytes(rng.randint(1, 120)))


@pytest.mark.parametrize("n_entries", [5, 150])
def test_decoder_fuzz(n_entries: int) -> None:
    rng = random.Random(1234 + n_entries)
    orig = small_snapshot(n_entries, seed=n_entries)
    expected = decode_outcome(orig)
    assert expected is not None and expected[7] == n_entries
    cases = 0
    for data in raw_mutations(orig, rng):
        cases += 1
        got = decode_outcome(data)
        # only an edit that keeps the content (say, of the flags) may decode, to the original
        assert got is None or got == expected, f"raw mutation decoded differently: {data.hex()}"
    for data in structural_mutations(orig, rng, n_entries):
        cases += 1
        decode_outcome(data)  # corrupt or a consistent decode; never another error or a crash
    assert cases >= 10_000, cases


@pytest.mark.parametrize("n_entries", [0, 5, 150])
def test_decoder_fuzz_v2(n_entries: int) -> None:
    """Every raw mutation of a version 2 snapshot (truncations, bit flips, inserts, deletes,
    garbage, header edits) is refused or, for an edit that keeps the content, decodes the same."""
    rng = random.Random(4321 + n_entries)
    orig = small_snapshot_v2(n_entries, seed=n_entries)
    expected = decode_outcome(orig)
    assert expected is not None and expected[7] == n_entries
    old = decode_outcome(small_snapshot(n_entries, seed=n_entries))
    assert old is not None and old[1:] == expected[1:]
    for data in raw_mutations(orig, rng):
        got = decode_outcome(data)
        assert got is None or got == expected, f"raw mutation decoded differently: {data.hex()}"


@given(st.binary(max_size=300))
@settings(max_examples=300, deadline=None)
def test_decoder_random_bytes(data: bytes) -> None:
    assert decode_outcome(data) is None


@given(st.binary(max_size=200), st.binary(max_size=4))
@settings(max_examples=300, deadline=None)
def test_decoder_framed_random_bodies(body: bytes, suffix: bytes) -> None:
    # a correct header and CRC around arbitrary bytes: corrupt or consistent, never a crash
    decode_outcome(frame(body))
    decode_outcome(frame(small_snapshot(3, 1)[16:] + suffix))


def test_decoder_rejects_non_buffer() -> None:
    with pytest.raises(TypeError):
        _core.decode_snapshot("WPDS")  # type: ignore[arg-type]


# --- concurrent snapshots ---------------------------------------------------------------------


def run_concurrent(max_keys: int, n: int) -> tuple[list[Entry], list[list[Entry]]]:
    w = _core.DedupWindow(max_keys, 10**9)
    final: list[Entry] = []
    snaps: list[list[Entry]] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(n):
                key = md5_key(i)
                seg, ent, ts = i // 5000, i % 5000, 1_000_000 + i
                if i % 3:
                    w.add_pending(key, seg, ent, ts)
                    if i % 7 == 0:
                        w.add_pending(md5_key(n + i), 0, 0, 0)  # stays pending: never in snapshots
                    assert w.commit(key)
                else:
                    assert w.add_committed(key, seg, ent, ts)
                final.append((key, seg, ent, ts))
                if i % 400 == 0:
                    time.sleep(0)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            done.set()

    def reader() -> None:
        try:
            while not done.is_set():
                data = _core.encode_snapshot(w, 1, 1, 1, {})
                snaps.append(_core.decode_snapshot(data).entries())
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    snaps.append(_core.decode_snapshot(_core.encode_snapshot(w, 1, 1, 1, {})).entries())
    return final, snaps


@pytest.mark.parametrize(("max_keys", "n"), [(100_000, 30_000), (700, 30_000)])
def test_snapshots_under_concurrent_writes(max_keys: int, n: int) -> None:
    final, snaps = run_concurrent(max_keys, n)
    position = {e[0]: i for i, e in enumerate(final)}
    last_end = 0
    last_len = 0
    intermediate = 0
    for entries in snaps:
        if not entries:
            assert last_end == 0
            continue
        end = position[entries[-1][0]] + 1
        start = end - len(entries)
        # a contiguous run of the commit sequence, ending at the newest commit seen
        assert entries == final[start:end]
        assert len(entries) == min(end, max_keys)
        assert end >= last_end and len(entries) >= last_len
        last_end, last_len = end, len(entries)
        intermediate += 0 < end < n
    assert snaps[-1] == final[-max_keys:]
    assert intermediate >= 2, f"only {intermediate} snapshots overlapped the writes"
