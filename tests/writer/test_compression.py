"""Batch compression (`append.compression`, issue 32 item 4): the writer compresses each run's
frame once, natively; nodes store it as sent (local segment files and block objects alike);
readers, the window rebuild, recovery and the history checker's raw read see plain entries.

Each test runs on both node layouts: `files` (the embedded default: append-only segment files)
and `blocks` (one object per batch, as on S3, here over a local directory)."""

from __future__ import annotations

import struct
import threading
from pathlib import Path

import pytest

import woodpecker_idem as wp
from woodpecker_idem import CorruptEntryError, explicit_key
from woodpecker_idem._core import (
    count_records,
    crc32c,
    decompress_frame,
    encode_frame,
    frame_codec,
)
from woodpecker_idem.errors import InvalidArgumentError, WoodpeckerError
from woodpecker_idem.logstore.blocks import (
    BLOCK_HEADER,
    BLOCK_VERSION_COMPRESSED,
    CODECS,
    decode_block_header,
    split_frame,
)
from woodpecker_idem.logstore.engine import LogStoreEngine
from woodpecker_idem.logstore.segment_files import BATCH, BATCH_HEADER_SIZE
from woodpecker_idem.logstore.storage import ObjectSegmentStorage
from woodpecker_idem.logstore.transport import InProcessTransport
from woodpecker_idem.objectstore.local import LocalObjectStore
from woodpecker_idem.testing.history import History

QUIET = {"idempotency.snapshot_interval_s": 3600, "idempotency.snapshot_threshold": 10**8}
WINDOW_S = 600.0
MAX_KEYS = 100_000
UNIT_HEADER = 24  # rust/src/codec.rs: mark, codec, count, raw_len, stored_len, crc32c


def row(i: int) -> bytes:
    """A compressible row shaped like a JSON order (what logs mostly carry)."""
    return (
        b'{"order_id":%d,"customer":"customer-%d","amount":"%d.00","status":"placed",'
        b'"shipping":"standard"}' % (i, i % 97, i % 1000)
    )


class Env:
    """A client on `layout` (files or blocks) under `path`; `reopen` makes a new client over the
    same directories (a restart)."""

    def __init__(self, path: Path, layout: str, **cfg: object):
        self.path = path
        self.layout = layout
        self.cfg = {"quorum.es": 1, "segment.max_entries": 120, **QUIET, **cfg}
        self.client = self._connect()

    def _connect(self) -> wp.WoodpeckerClient:
        transport = None
        if self.layout == "blocks":
            store = LocalObjectStore(self.path / "blocks", fsync=False)
            transport = InProcessTransport({"node-0": LogStoreEngine(store, "node-0")})
        return wp.connect(self.path / "data", self.cfg, transport=transport)

    def reopen(self, idempotent: bool = True) -> None:
        """A restart with the dedup snapshots gone (a writer's close leaves one): the next
        idempotent writer rebuilds its window from the stored frames alone."""
        self.client.close()
        snaps = [p for p in self.path.rglob("snapshot_*") if "dedup_snapshot" in str(p)]
        assert snaps or not idempotent, "the writer's close left no snapshot to drop"
        for p in snaps:
            p.unlink()
        self.client = self._connect()

    def stored_frames(self) -> list[tuple[Path, int, int, bytes]]:
        """(file, offset of the frame, codec in its header, frame bytes) of every data batch."""
        out = []
        if self.layout == "blocks":
            for blk in sorted((self.path / "blocks").rglob("*.blk")):
                data = blk.read_bytes()
                magic, version, kind, *_ = BLOCK_HEADER.unpack_from(data, 0)
                codec = kind >> 8 if version == BLOCK_VERSION_COMPRESSED else 0
                out.append((blk, BLOCK_HEADER.size + 4, codec, data[BLOCK_HEADER.size + 4 :]))
            return out
        for f in sorted((self.path / "data").rglob("data")):
            data = f.read_bytes()
            pos = 0
            while pos < len(data):
                _, _, flags, _, _, frame_len, _ = BATCH.unpack_from(data, pos)
                start = pos + BATCH_HEADER_SIZE
                out.append((f, start, flags & 0xFF, data[start : start + frame_len]))
                pos = start + frame_len
        return out

    def stored_bytes(self) -> int:
        return sum(len(frame) for *_, frame in self.stored_frames())

    def close(self) -> None:
        self.client.close()


@pytest.fixture(params=["files", "blocks"])
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def envs(tmp_path: Path):
    made: list[Env] = []

    def make(layout: str, **cfg: object) -> Env:
        e = Env(tmp_path / f"e{len(made)}", layout, **cfg)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def write_rows(w, first: int, n: int, chunk: int = 37) -> list:
    """`n` rows from `first` in write_many calls of `chunk` (many runs, several segments)."""
    results = []
    for at in range(first, first + n, chunk):
        ids = range(at, min(at + chunk, first + n))
        res = w.write_many([row(i) for i in ids], [f"id-{i}" for i in ids])
        results += [res.message_id(j) for j in range(len(ids))]
    return results


# --- the native codec --------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_a_compressed_frame_counts_and_decompresses_to_the_plain_frame(codec):
    payloads = [row(i) for i in range(200)]
    keys = b"".join(explicit_key(f"id-{i}") for i in range(200))
    plain, n = encode_frame(3, 10, 1_700_000_000_000, payloads, 0, 200, keys)
    unit, m = encode_frame(
        3, 10, 1_700_000_000_000, payloads, 0, 200, keys, None, None, CODECS[codec]
    )
    assert (n, m) == (200, 200)
    assert len(unit) * 3 < len(plain)
    assert frame_codec(unit) == CODECS[codec] and frame_codec(plain) == 0
    assert count_records(unit) == 200  # from the unit's header: nothing decompressed
    assert decompress_frame(unit, "t") == plain
    assert decompress_frame(plain, "t") is plain  # a plain frame is not copied
    # units concatenate (a sender joins runs): counted and split as their records
    assert count_records(unit + plain + unit) == 600
    assert [bytes(r) for r in split_frame(unit + plain, "t")] == [
        bytes(r) for r in split_frame(plain + plain, "t")
    ]


def test_an_unknown_codec_is_refused_by_name():
    with pytest.raises(InvalidArgumentError, match="unknown compression codec 7"):
        encode_frame(0, 0, 0, [b"x"], 0, 1, None, None, None, 7)
    unit, _ = encode_frame(0, 0, 0, [row(i) for i in range(10)], 0, 10, None, None, None, 2)
    odd = unit[:4] + b"\x09" + unit[5:]
    with pytest.raises(CorruptEntryError, match="unknown compression codec 9"):
        decompress_frame(odd, "batch 5")
    with pytest.raises(InvalidArgumentError, match="unknown compression codec 9"):
        count_records(odd)  # a node refuses the add
    with pytest.raises(wp.ConfigError, match="append.compression"):
        wp.connect(None, {"append.compression": "zsdt"})


# --- a compressed log, end to end --------------------------------------------------------------


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_a_compressed_log_reads_back_and_rebuilds_its_window(envs, layout, codec):
    """Written through rolls (segments of 120 entries) by a compressing writer: every stored
    batch carries its codec in its header and is compressed; a reader reads every row back in
    order; after a restart the window rebuilt from the stored frames answers retries as
    duplicates with the first write's ids."""
    env = envs(layout)
    log = env.client.create_log("c")
    w = log.open_writer(idempotent=True, compression=codec)
    ids = write_rows(w, 0, 500)
    w.close()
    frames = env.stored_frames()
    assert len({f for f, *_ in frames}) >= 4  # rolled: several segments
    assert frames and all(c == CODECS[codec] for _, _, c, _ in frames), [c for *_, c, _ in frames]
    assert all(frame_codec(fr) == CODECS[codec] for *_, fr in frames)
    plain = sum(len(decompress_frame(fr, "t")) for *_, fr in frames)
    assert env.stored_bytes() * 3 < plain * 2  # what the nodes store is smaller by a third
    env.reopen()
    log = env.client.open_log("c")
    got = [(m.payload, m.message_id) for m in log.open_reader()]
    assert got == [(row(i), ids[i]) for i in range(500)]
    w = log.open_writer(idempotent=True, compression=codec)  # the window rebuilt from the log
    again = w.write_many([row(i) for i in range(500)], [f"id-{i}" for i in range(500)])
    assert all(again.duplicate)
    assert [again.message_id(i) for i in range(500)] == ids
    w.close()


def test_a_plain_segment_then_a_zstd_writer_on_the_same_log(envs, layout):
    """Segments written uncompressed (as every earlier release wrote them) stay readable next to
    zstd segments of a later writer; the window rebuild reads both."""
    env = envs(layout, **{"segment.max_entries": 10_000})
    log = env.client.create_log("mixed")
    w = log.open_writer(idempotent=True)  # the config's default: none
    first = write_rows(w, 0, 100)
    w.close()
    w = log.open_writer(idempotent=True, compression="zstd")
    second = write_rows(w, 100, 100)
    w.close()
    codecs = [c for *_, c, _ in env.stored_frames()]
    assert 0 in codecs and CODECS["zstd"] in codecs
    env.reopen()
    log = env.client.open_log("mixed")
    assert [m.payload for m in log.open_reader()] == [row(i) for i in range(200)]
    w = log.open_writer(idempotent=True, compression="lz4")
    again = w.write_many([row(i) for i in range(200)], [f"id-{i}" for i in range(200)])
    assert all(again.duplicate)
    assert [again.message_id(i) for i in range(200)] == first + second
    w.close()


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x20
    path.write_bytes(bytes(data))


def test_a_damaged_compressed_frame_is_refused_not_returned(envs, layout):
    """A bit flipped inside a stored compressed frame fails the unit's CRC: the reader and the
    window rebuild raise `CorruptEntryError` instead of returning decompressed garbage."""
    env = envs(layout, **{"segment.max_entries": 10_000})
    log = env.client.create_log("d")
    w = log.open_writer(idempotent=True, compression="zstd")
    write_rows(w, 0, 200, chunk=200)
    w.close()
    path, offset, codec, frame = env.stored_frames()[0]
    assert codec == CODECS["zstd"]
    flip(path, offset + UNIT_HEADER + len(frame) // 3 - UNIT_HEADER // 3)
    env.reopen()
    log = env.client.open_log("d")
    with pytest.raises(CorruptEntryError, match="checksum mismatch"):
        list(log.open_reader())
    with pytest.raises(CorruptEntryError):
        log.open_writer(idempotent=True).close()


def test_an_unknown_codec_in_a_stored_header_is_refused_by_name(envs, layout):
    """A batch or block whose header names a codec this version does not know (a newer
    writer's) is refused with an error naming the codec."""
    env = envs(layout, **{"segment.max_entries": 10_000})
    log = env.client.create_log("u")
    w = log.open_writer(compression="lz4")
    w.write_many([row(i) for i in range(50)])
    w.close()
    path, offset, _, _ = env.stored_frames()[0]
    data = bytearray(path.read_bytes())
    if layout == "blocks":
        magic, version, kind, first, count, lac = BLOCK_HEADER.unpack_from(data, 0)
        BLOCK_HEADER.pack_into(data, 0, magic, version, (kind & 0xFF) | 9 << 8, first, count, lac)
        struct.pack_into("<I", data, BLOCK_HEADER.size, crc32c(bytes(data[: BLOCK_HEADER.size])))
        with pytest.raises(CorruptEntryError, match="unknown compression codec 9"):
            decode_block_header(bytes(data), "blk")
    else:
        start = offset - BATCH_HEADER_SIZE
        data[start + 6] = 9  # the flags' codec byte, header CRC made good again
        header_crc = crc32c(bytes(data[start : start + BATCH.size]))
        struct.pack_into("<I", data, start + BATCH.size, header_crc)
    path.write_bytes(bytes(data))
    env.reopen(idempotent=False)
    with pytest.raises(CorruptEntryError, match="unknown compression codec 9"):
        list(env.client.open_log("u").open_reader())


# --- concurrency -------------------------------------------------------------------------------


def test_threads_writing_small_compressed_batches_are_judged_by_the_history(envs, layout):
    """Four threads on one zstd writer, two with `write_many` and two with `write_async`, on
    small AddEntries batches (many frames joined and split by the sender), with repeated ids
    across threads: the history checker judges what the nodes store (read raw, decompressed by
    a fresh engine) and what a reader returns."""
    env = envs(layout, **{"append.max_batch_entries": 7, "segment.max_entries": 300})
    log = env.client.create_log("t")
    history = History()
    w = log.open_writer(
        idempotent=True, compression="zstd", window_duration_s=WINDOW_S, window_max_keys=MAX_KEYS
    )
    go = threading.Event()
    errors: list[BaseException] = []

    def many(t: int) -> None:
        go.wait(30)
        for at in range(0, 240, 12):
            ids = [f"k{(t * 97 + at + j) % 400}" for j in range(12)]
            payloads = [row(int(k[1:])) for k in ids]
            start = history.now()
            try:
                res = w.write_many(payloads, ids)
            except WoodpeckerError as exc:
                for k, p in zip(ids, payloads, strict=True):
                    history.failed(explicit_key(k), p, exc, start)
                continue
            for j, (k, p) in enumerate(zip(ids, payloads, strict=True)):
                history.ok(
                    explicit_key(k),
                    p,
                    wp.WriteResult(res.message_id(j), bool(res.duplicate[j])),
                    start,
                )

    def single(t: int) -> None:
        go.wait(30)
        futures = []
        for i in range(240):
            k = f"k{(t * 131 + i) % 400}"
            futures.append(
                history.call_async(
                    explicit_key(k),
                    row(int(k[1:])),
                    lambda k=k: w.write_async(row(int(k[1:])), idempotency_id=k),
                )
            )
        for f in futures:
            try:
                f.result(60)
            except WoodpeckerError:
                pass

    def run(fn, t: int) -> None:
        try:
            fn(t)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(fn, t), daemon=True)
        for t, fn in enumerate((many, many, single, single))
    ]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    w.close()
    assert any(c == CODECS["zstd"] for *_, c, _ in env.stored_frames())
    verdict = history.check_log(log, int(WINDOW_S * 1000), MAX_KEYS)
    assert verdict.ok, verdict.summary()
    assert verdict.keyed_entries == 400


def test_a_compressed_blocks_decompressed_records_count_against_the_block_cache(tmp_path):
    """The block cache holds a compressed block's decompressed records once they are split: their
    bytes count against `cache_limit` next to the block's stored bytes."""
    store = LocalObjectStore(tmp_path / "blocks", fsync=False)
    engine = LogStoreEngine(store, "node-0")
    payloads = [row(i) for i in range(200)]
    plain, _ = encode_frame(0, 0, 1_700_000_000_000, payloads, 0, 200)
    units, _ = encode_frame(0, 0, 1_700_000_000_000, payloads, 0, 200, None, None, None, 2)
    engine.add_entries(1, 0, 0, units)
    fresh = LogStoreEngine(store, "node-0")  # reads the block from the store
    assert len(fresh.read(1, 0, 0, 200)) == 200
    (blk,) = (tmp_path / "blocks").rglob("*.blk")
    cache = fresh.storage
    assert isinstance(cache, ObjectSegmentStorage)
    assert cache._cache_bytes == blk.stat().st_size + len(plain)


def test_verify_checks_a_compressed_log_and_names_its_damage(envs, capsys):
    """`woodpecker-idem verify` reads compressed segments like plain ones (every entry checked)
    and reports a damaged compressed frame as corrupt, naming the file and the damage."""
    from woodpecker_idem.cli import main

    env = envs("files", **{"segment.max_entries": 10_000})
    w = env.client.create_log("v").open_writer(idempotent=True, compression="zstd")
    write_rows(w, 0, 150, chunk=150)
    w.close()
    env.client.close()
    data_dir = str(env.path / "data")
    assert main(["verify", "--data-dir", data_dir]) == 0
    out = capsys.readouterr().out
    assert "150 entries" in out, out
    path, offset, _, frame = env.stored_frames()[0]
    flip(path, offset + UNIT_HEADER + len(frame) // 2)
    assert main(["verify", "--data-dir", data_dir]) == 1
    out = capsys.readouterr().out
    corrupt = [line for line in out.splitlines() if line.startswith("CORRUPT")]
    assert len(corrupt) == 1 and "checksum mismatch" in corrupt[0], out
    assert "/data@" in corrupt[0], out
    env.client = env._connect()  # the fixture closes it


def test_recovery_copies_compressed_entries_to_a_replica_that_missed_them(tmp_path):
    """es=3, aq=2: the second half of a zstd writer's rows reaches node-0 only (node-1's and
    node-2's adds hang); the writer is abandoned and another client takes the log over. Recovery
    keeps the entries it finds, read from node-0 (decompressed), and copies them to one more
    node to reach aq: node-1 then holds exactly node-0's entries."""
    import time

    from woodpecker_idem.testing import FaultInjectingTransport

    cfg = {"quorum.es": 3, "segment.max_entries": 10_000, **QUIET}
    old = wp.connect(tmp_path, cfg)
    faults = FaultInjectingTransport(old.transport)
    old.transport = faults
    stall, gate = threading.Event(), threading.Event()
    inner_add = faults.add_entries

    def add_entries(node_id, *args, **kwargs):
        # hang (a failing node would be dropped from the segment) until the test is over
        if node_id != "node-0" and stall.is_set():
            gate.wait(60)
        return inner_add(node_id, *args, **kwargs)

    faults.add_entries = add_entries  # type: ignore[method-assign]
    try:
        handle = old.create_log("r")
        w = handle.open_writer(idempotent=True, compression="zstd")
        write_rows(w, 0, 100)
        # acknowledged at aq=2: the third node's adds may still be on the way; let them land
        # before the stall, so every node holds the first 100 and only the next run is partial
        deadline = time.monotonic() + 60
        for node in ("node-0", "node-1", "node-2"):
            while len(faults.raw_read(node, handle.log_id, 0, 0, 1000)) < 100:
                assert time.monotonic() < deadline, f"{node} never held the first 100"
                time.sleep(0.05)
        stall.set()

        # one run, sent as one batch to every node at once, never acknowledged: on node-0 alone
        def unacknowledged() -> None:
            with pytest.raises(WoodpeckerError):  # fenced by the takeover
                write_rows(w, 100, 100, 100)

        late = threading.Thread(target=unacknowledged, daemon=True)
        late.start()
        new = wp.connect(tmp_path, cfg)
        try:
            log = new.open_log("r")
            seg = new.meta.list_segments(log.log_id)[0]

            def held(node: str) -> list[bytes]:
                return new.transport.raw_read(node, log.log_id, seg.segment_id, 0, 1000)

            deadline = time.monotonic() + 60
            while len(held("node-0")) < 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(held("node-0")) == 200
            assert len(held("node-1")) == 100
            log.open_writer(idempotent=True).close()  # fences, recovers segment 0
            assert held("node-1") == held("node-0")
            assert [m.payload for m in log.open_reader()] == [row(i) for i in range(200)]
        finally:
            new.close()
    finally:
        gate.set()
        try:
            old.close()
        except WoodpeckerError:
            pass  # its writer was fenced by the takeover
        late.join(60)  # its call ends with the writer (an exception in a thread of its own)
        assert not late.is_alive()


def test_a_compressed_log_on_staged_storage_reads_back_once_sealed_in_object_storage(tmp_path):
    """`storage.type: staged`: compressed segments on the nodes' disks are read (decompressed)
    for their upload, sealed in object storage, and read back from there once the local copies
    are gone."""
    import time

    from woodpecker_idem.types import SegmentState

    cfg = {
        "storage.type": "staged",
        "quorum.es": 3,
        "segment.max_entries": 120,
        "storage.fsync": "never",
        "storage.staged_grace_s": 0.2,
        **QUIET,
    }
    client = wp.connect(tmp_path / "data", cfg)
    try:
        log = client.open_log("staged", create=True)
        w = log.open_writer(idempotent=True, compression="zstd")
        ids = write_rows(w, 0, 400)
        w.close()
        deadline = time.monotonic() + 60
        while not all(s.state is SegmentState.SEALED for s in log.segments()):
            assert time.monotonic() < deadline, [s.state for s in log.segments()]
            time.sleep(0.02)
        while list((tmp_path / "data" / "staged").rglob("data")):
            assert time.monotonic() < deadline, "local copies still there"
            time.sleep(0.02)
        got = [(m.payload, m.message_id) for m in log.open_reader()]
        assert got == [(row(i), ids[i]) for i in range(400)]
    finally:
        client.close()
