//! Dedup snapshot codec. Every snapshot starts with a 16-byte header: magic, version, flags and
//! 8 version-specific bytes.
//!
//! Version 2 (written): the header (its last 4 bytes a CRC32C of the first 12) followed by
//! self-checking frames, each `length u32 | CRC32C u32 | protobuf SnapshotFrame`: first the
//! metadata (log, epoch, time, window config, watermarks), then chunks of entry columns, then a
//! trailer with the entry and chunk counts. Each frame's CRC runs on from the one before it (the
//! header's CRC seeds the first), so a frame dropped, repeated, reordered or taken from another
//! snapshot fails its check, and a snapshot cut at a frame boundary lacks its trailer. It is
//! written a chunk at a time ([`StreamEncoder`]): a snapshot of a large window never holds the
//! window, or its encoding, a second time in memory.
//!
//! Version 1 (read only; written by earlier releases): the header carries the body length and
//! its CRC32C, and one protobuf `DedupSnapshot` body holds every column.
//!
//! Both are described in `proto/dedup_snapshot.proto`; the entry columns are delta + varint
//! encoded the same way in both. Decoding is total: any input gives `Ok` or `Err`, never a
//! panic, and no allocation is larger than a small multiple of the input.

use prost::encoding::{decode_varint, encode_varint};

use crate::keys::{crc32c, KEY_LEN};
use crate::window::{Record, MAX_KEYS_LIMIT};

/// Header magic.
pub const MAGIC: &[u8; 4] = b"WPDS";
/// The format version this build writes.
pub const FORMAT_VERSION: u16 = 2;
/// The single-body format of earlier releases, still read.
pub const FORMAT_V1: u16 = 1;
/// Header length in bytes.
pub const HEADER_LEN: usize = 16;
/// Bytes before each frame's payload: its length and its CRC32C.
pub const FRAME_HEADER_LEN: usize = 8;
/// Largest frame payload a reader accepts (and a writer makes): a chunk of
/// [`CHUNK_RECORDS`] entries takes under 1 MiB (56 bytes an entry at most: key, two 10-byte
/// varints, a run of its own), and the metadata frame grows only with the segments in the
/// watermarks. A larger length is damage, not data.
pub const MAX_FRAME_LEN: usize = 64 << 20;
/// Entries per chunk frame: a snapshot's memory beyond the window is about one chunk's encoding
/// (~330 KB; with chunks of 64Ki entries a writer of 100k keys peaked at 1.85x its window's bytes
/// against 1.5x), and the window's lock is held for one chunk at a time (a fraction of a ms).
pub const CHUNK_RECORDS: usize = 16_384;

/// Version 2 frame (prost derive; mirrors `proto/dedup_snapshot.proto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotFrame {
    #[prost(oneof = "FramePart", tags = "1, 2, 3")]
    pub part: Option<FramePart>,
}

/// What a version 2 frame holds.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum FramePart {
    #[prost(message, tag = "1")]
    Meta(SnapshotMeta),
    #[prost(message, tag = "2")]
    Chunk(SnapshotChunk),
    #[prost(message, tag = "3")]
    Trailer(SnapshotTrailer),
}

/// Version 2 first frame: everything but the entries.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotMeta {
    #[prost(uint32, tag = "1")]
    pub format_version: u32,
    #[prost(uint64, tag = "2")]
    pub log_id: u64,
    #[prost(uint64, tag = "3")]
    pub epoch: u64,
    #[prost(int64, tag = "4")]
    pub timestamp_ms: i64,
    #[prost(uint64, tag = "5")]
    pub window_max_keys: u64,
    #[prost(int64, tag = "6")]
    pub window_ms: i64,
    #[prost(message, repeated, tag = "7")]
    pub watermarks: Vec<SegmentWatermark>,
}

/// Version 2 chunk frame: entries in commit order, columns as in version 1 (deltas start afresh
/// in each chunk, so a chunk decodes alone).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotChunk {
    #[prost(uint64, tag = "1")]
    pub entry_count: u64,
    #[prost(bytes = "vec", tag = "2")]
    pub keys: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    pub segment_runs: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    pub entry_id_deltas: Vec<u8>,
    #[prost(bytes = "vec", tag = "5")]
    pub timestamp_deltas: Vec<u8>,
}

/// Version 2 last frame: what the reader must have seen.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotTrailer {
    #[prost(uint64, tag = "1")]
    pub entry_count: u64,
    #[prost(uint64, tag = "2")]
    pub chunk_count: u64,
}

/// Version 1 body (prost derive; mirrors `proto/dedup_snapshot.proto`): read, no longer written.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DedupSnapshot {
    #[prost(uint32, tag = "1")]
    pub format_version: u32,
    #[prost(uint64, tag = "2")]
    pub log_id: u64,
    #[prost(uint64, tag = "3")]
    pub epoch: u64,
    #[prost(int64, tag = "4")]
    pub timestamp_ms: i64,
    #[prost(uint64, tag = "5")]
    pub window_max_keys: u64,
    #[prost(int64, tag = "6")]
    pub window_ms: i64,
    #[prost(message, repeated, tag = "7")]
    pub watermarks: Vec<SegmentWatermark>,
    #[prost(uint64, tag = "8")]
    pub entry_count: u64,
    #[prost(bytes = "vec", tag = "9")]
    pub keys: Vec<u8>,
    #[prost(bytes = "vec", tag = "10")]
    pub segment_runs: Vec<u8>,
    #[prost(bytes = "vec", tag = "11")]
    pub entry_id_deltas: Vec<u8>,
    #[prost(bytes = "vec", tag = "12")]
    pub timestamp_deltas: Vec<u8>,
}

/// Last confirmed entry of one segment at snapshot time.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SegmentWatermark {
    #[prost(uint32, tag = "1")]
    pub segment_id: u32,
    #[prost(int64, tag = "2")]
    pub last_entry_id: i64,
}

/// A decoded (or to-be-encoded) snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotData {
    pub format_version: u16,
    pub log_id: u64,
    pub epoch: u64,
    pub timestamp_ms: i64,
    pub window_max_keys: u64,
    pub window_ms: i64,
    /// Sorted by segment id, no duplicates.
    pub watermarks: Vec<(u32, i64)>,
    /// Committed entries in commit order, oldest first.
    pub entries: Vec<Record>,
}

impl SnapshotData {
    /// The highest entry id the entries name in each segment, sorted by segment id: recovery
    /// checks these against the metadata (a position past its segment's end, or in a segment
    /// the log does not have, was never written there).
    pub fn segment_ends(&self) -> Vec<(u32, u32)> {
        self.positions().ends
    }

    /// A position two entries claim, if any (the lowest): one entry of the log holds one key, so
    /// a snapshot that puts two keys at one place was crafted or mixed up, and one of them would
    /// be answered as a duplicate at an entry that holds the other.
    pub fn shared_position(&self) -> Option<(u32, u32)> {
        self.positions().shared
    }

    /// Both of the above in one pass over the entries, with no allocation beyond a map of the
    /// segments. A writer commits each segment's entries in entry order, and a snapshot lists
    /// them in commit order, so each segment's entry ids usually rise: then no two entries
    /// share a position, and the last id of a segment is its highest. Only where one does not
    /// rise (a crafted snapshot, or a commit order that is not the log's) are the positions
    /// sorted to find the lowest shared one, as a plain check would (a 10M-key snapshot's sort
    /// took longer than its decode).
    pub fn positions(&self) -> Positions {
        // segment -> the last entry id met in it; the current run of one segment kept apart
        let mut last: std::collections::BTreeMap<u32, u32> = std::collections::BTreeMap::new();
        let mut run: Option<(u32, u32)> = None;
        let mut rising = true;
        for r in &self.entries {
            match run {
                Some((seg, prev)) if seg == r.segment_id => {
                    rising &= r.entry_id > prev;
                }
                _ => {
                    if let Some((seg, prev)) = run {
                        last.insert(seg, prev);
                    }
                    if let Some(&prev) = last.get(&r.segment_id) {
                        rising &= r.entry_id > prev;
                    }
                }
            }
            if !rising {
                return self.positions_sorted();
            }
            run = Some((r.segment_id, r.entry_id));
        }
        if let Some((seg, prev)) = run {
            last.insert(seg, prev);
        }
        Positions {
            ends: last.into_iter().collect(),
            shared: None,
        }
    }

    /// [`SnapshotData::positions`] by sorting every position.
    fn positions_sorted(&self) -> Positions {
        let mut positions: Vec<(u32, u32)> = self
            .entries
            .iter()
            .map(|r| (r.segment_id, r.entry_id))
            .collect();
        positions.sort_unstable();
        let shared = positions.windows(2).find(|w| w[0] == w[1]).map(|w| w[0]);
        let mut ends: Vec<(u32, u32)> = Vec::new();
        for &(seg, entry) in &positions {
            match ends.last_mut() {
                Some(end) if end.0 == seg => end.1 = entry,
                _ => ends.push((seg, entry)),
            }
        }
        Positions { ends, shared }
    }
}

/// What [`SnapshotData::positions`] finds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Positions {
    /// The highest entry id named in each segment, sorted by segment id.
    pub ends: Vec<(u32, u32)>,
    /// The lowest position two entries claim, if any.
    pub shared: Option<(u32, u32)>,
}

/// Why a snapshot could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotError(pub String);

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn corrupt<T>(msg: impl Into<String>) -> Result<T, SnapshotError> {
    Err(SnapshotError(msg.into()))
}

/// Append `v` zigzag-mapped (protobuf's `sint64` mapping: small magnitudes of either sign give
/// short varints). prost applies the mapping inside its `sint64` field codec without exporting
/// it, and these columns are packed varints without field tags, so the mapping lives here.
fn put_svarint(out: &mut Vec<u8>, v: i64) {
    encode_varint(((v << 1) ^ (v >> 63)) as u64, out);
}

/// The next varint of column `name`, advancing `col`; an error names the column. Most of a
/// snapshot's varints (an entry id's delta, a timestamp's within a millisecond or two) are one
/// byte: those are read here, the rest by prost.
#[inline(always)]
fn next_uvarint(col: &mut &[u8], name: &str) -> Result<u64, SnapshotError> {
    if let Some((&b, rest)) = col.split_first() {
        if b < 0x80 {
            *col = rest;
            return Ok(u64::from(b));
        }
    }
    decode_varint(col).map_err(|_| {
        SnapshotError(format!(
            "{name} column: truncated varint, or one that overflows 64 bits"
        ))
    })
}

/// Inverse of [`put_svarint`].
#[inline(always)]
fn next_svarint(col: &mut &[u8], name: &str) -> Result<i64, SnapshotError> {
    let u = next_uvarint(col, name)?;
    Ok(((u >> 1) as i64) ^ -((u & 1) as i64))
}

/// The entry columns of a run of records (one version 1 body, one version 2 chunk).
#[derive(Default)]
struct Columns {
    count: u64,
    keys: Vec<u8>,
    runs: Vec<u8>,
    entry_deltas: Vec<u8>,
    ts_deltas: Vec<u8>,
    run: Option<(u32, u64)>,
    prev_entry: i64,
    prev_ts: i64,
}

impl Columns {
    fn push(&mut self, r: &Record) {
        self.count += 1;
        self.keys.extend_from_slice(&r.key);
        self.run = match self.run {
            Some((seg, len)) if seg == r.segment_id => Some((seg, len + 1)),
            other => {
                if let Some((seg, len)) = other {
                    encode_varint(u64::from(seg), &mut self.runs);
                    encode_varint(len, &mut self.runs);
                }
                self.prev_entry = 0;
                Some((r.segment_id, 1))
            }
        };
        let entry = i64::from(r.entry_id);
        put_svarint(&mut self.entry_deltas, entry - self.prev_entry);
        self.prev_entry = entry;
        put_svarint(
            &mut self.ts_deltas,
            r.timestamp_ms.wrapping_sub(self.prev_ts),
        );
        self.prev_ts = r.timestamp_ms;
    }

    /// Close the last run.
    fn close(&mut self) {
        if let Some((seg, len)) = self.run.take() {
            encode_varint(u64::from(seg), &mut self.runs);
            encode_varint(len, &mut self.runs);
        }
    }
}

fn sorted_marks(watermarks: &[(u32, i64)]) -> Vec<SegmentWatermark> {
    let mut marks: Vec<(u32, i64)> = watermarks.to_vec();
    marks.sort_unstable();
    marks.dedup_by_key(|m| m.0);
    marks
        .into_iter()
        .map(|(segment_id, last_entry_id)| SegmentWatermark {
            segment_id,
            last_entry_id,
        })
        .collect()
}

/// Encode a version 1 snapshot (the format of earlier releases, which [`decode`] still reads;
/// kept to test that). Fails only if the body would exceed the 4 GiB the header can frame.
#[cfg(test)]
pub fn encode_v1<'a>(
    log_id: u64,
    epoch: u64,
    timestamp_ms: i64,
    window_max_keys: u64,
    window_ms: i64,
    watermarks: &[(u32, i64)],
    entries: impl Iterator<Item = &'a Record>,
) -> Result<Vec<u8>, SnapshotError> {
    let mut cols = Columns::default();
    for r in entries {
        cols.push(r);
    }
    cols.close();
    let body = DedupSnapshot {
        format_version: u32::from(FORMAT_V1),
        log_id,
        epoch,
        timestamp_ms,
        window_max_keys,
        window_ms,
        watermarks: sorted_marks(watermarks),
        entry_count: cols.count,
        keys: cols.keys,
        segment_runs: cols.runs,
        entry_id_deltas: cols.entry_deltas,
        timestamp_deltas: cols.ts_deltas,
    };
    let len = prost::Message::encoded_len(&body);
    let Ok(body_len) = u32::try_from(len) else {
        return corrupt(format!(
            "snapshot body of {len} bytes exceeds the 4 GiB format limit"
        ));
    };
    let mut out = Vec::with_capacity(HEADER_LEN + len);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_V1.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&body_len.to_le_bytes());
    out.extend_from_slice(&[0u8; 4]); // the body's CRC, once it is there
    prost::Message::encode_raw(&body, &mut out);
    let crc = crc32c(0, out.get(HEADER_LEN..).unwrap_or_default());
    if let Some(field) = out.get_mut(HEADER_LEN - 4..HEADER_LEN) {
        field.copy_from_slice(&crc.to_le_bytes());
    }
    Ok(out)
}

/// The version 2 header: magic, version, flags 0, 4 reserved zero bytes, CRC32C of the 12 before.
fn header_v2() -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(MAGIC);
    h[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    let crc = crc32c(0, &h[..12]);
    h[12..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Writes a version 2 snapshot piece by piece: [`StreamEncoder::start`] gives the header and the
/// metadata frame, [`StreamEncoder::chunk`] one frame per run of entries, [`StreamEncoder::finish`]
/// the trailer. The pieces end to end are the snapshot.
pub struct StreamEncoder {
    /// CRC32C of everything written so far (each frame's check runs on from it).
    crc: u32,
    entries: u64,
    chunks: u64,
    finished: bool,
}

impl StreamEncoder {
    /// The encoder, and the header plus metadata frame. `watermarks` need not be sorted.
    pub fn start(
        log_id: u64,
        epoch: u64,
        timestamp_ms: i64,
        window_max_keys: u64,
        window_ms: i64,
        watermarks: &[(u32, i64)],
    ) -> Result<(Self, Vec<u8>), SnapshotError> {
        let header = header_v2();
        let mut enc = Self {
            crc: crc32c(0, &header),
            entries: 0,
            chunks: 0,
            finished: false,
        };
        let mut out = header.to_vec();
        let meta = SnapshotMeta {
            format_version: u32::from(FORMAT_VERSION),
            log_id,
            epoch,
            timestamp_ms,
            window_max_keys,
            window_ms,
            watermarks: sorted_marks(watermarks),
        };
        enc.frame(FramePart::Meta(meta), &mut out)?;
        Ok((enc, out))
    }

    fn frame(&mut self, part: FramePart, out: &mut Vec<u8>) -> Result<(), SnapshotError> {
        let msg = SnapshotFrame { part: Some(part) };
        let len = prost::Message::encoded_len(&msg);
        if len > MAX_FRAME_LEN {
            return corrupt(format!(
                "snapshot frame of {len} bytes exceeds the {MAX_FRAME_LEN}-byte frame limit"
            ));
        }
        let at = out.len();
        out.reserve(FRAME_HEADER_LEN + len);
        // len <= MAX_FRAME_LEN, which fits u32
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.extend_from_slice(&[0u8; 4]); // the CRC, once the payload is there
        prost::Message::encode_raw(&msg, out);
        let mut crc = crc32c(self.crc, out.get(at..at + 4).unwrap_or_default());
        crc = crc32c(crc, out.get(at + FRAME_HEADER_LEN..).unwrap_or_default());
        if let Some(field) = out.get_mut(at + 4..at + FRAME_HEADER_LEN) {
            field.copy_from_slice(&crc.to_le_bytes());
        }
        self.crc = crc;
        Ok(())
    }

    /// Append one chunk frame of `entries` (commit order) to `out`; nothing for no entries.
    /// Returns how many entries it holds.
    pub fn chunk<'a>(
        &mut self,
        entries: impl Iterator<Item = &'a Record>,
        out: &mut Vec<u8>,
    ) -> Result<u64, SnapshotError> {
        let chunk = Self::columns(entries, 0);
        self.push_chunk(chunk, out)
    }

    /// The columns of a chunk of `entries` (room reserved for `expect` of them): the part of
    /// [`StreamEncoder::chunk`] that reads the entries, so a caller can hold the window's lock
    /// for it alone.
    pub fn columns<'a>(entries: impl Iterator<Item = &'a Record>, expect: usize) -> SnapshotChunk {
        let mut cols = Columns {
            keys: Vec::with_capacity(expect * KEY_LEN),
            entry_deltas: Vec::with_capacity(expect + expect / 4),
            ts_deltas: Vec::with_capacity(expect + expect / 4),
            ..Columns::default()
        };
        for r in entries {
            cols.push(r);
        }
        cols.close();
        SnapshotChunk {
            entry_count: cols.count,
            keys: cols.keys,
            segment_runs: cols.runs,
            entry_id_deltas: cols.entry_deltas,
            timestamp_deltas: cols.ts_deltas,
        }
    }

    /// Append the frame of `chunk` (from [`StreamEncoder::columns`]) to `out`; nothing for an
    /// empty one. Returns how many entries it holds.
    pub fn push_chunk(
        &mut self,
        chunk: SnapshotChunk,
        out: &mut Vec<u8>,
    ) -> Result<u64, SnapshotError> {
        let n = chunk.entry_count;
        if n == 0 {
            return Ok(0);
        }
        self.frame(FramePart::Chunk(chunk), out)?;
        self.entries += n;
        self.chunks += 1;
        Ok(n)
    }

    /// Append the trailer frame (once; later calls append nothing).
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), SnapshotError> {
        if self.finished {
            return Ok(());
        }
        let trailer = SnapshotTrailer {
            entry_count: self.entries,
            chunk_count: self.chunks,
        };
        self.frame(FramePart::Trailer(trailer), out)?;
        self.finished = true;
        Ok(())
    }

    /// Entries written so far.
    pub fn entries(&self) -> u64 {
        self.entries
    }
}

/// Encode a whole (version 2) snapshot of metadata plus `entries` (commit order), in chunks of
/// [`CHUNK_RECORDS`]: the same bytes a streamed snapshot of those entries gives.
pub fn encode<'a>(
    log_id: u64,
    epoch: u64,
    timestamp_ms: i64,
    window_max_keys: u64,
    window_ms: i64,
    watermarks: &[(u32, i64)],
    entries: impl Iterator<Item = &'a Record>,
) -> Result<Vec<u8>, SnapshotError> {
    let (mut enc, mut out) = StreamEncoder::start(
        log_id,
        epoch,
        timestamp_ms,
        window_max_keys,
        window_ms,
        watermarks,
    )?;
    let mut entries = entries.peekable();
    while entries.peek().is_some() {
        enc.chunk(entries.by_ref().take(CHUNK_RECORDS), &mut out)?;
    }
    enc.finish(&mut out)?;
    Ok(out)
}

fn le_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Decode and fully validate a snapshot of either version.
pub fn decode(data: &[u8]) -> Result<SnapshotData, SnapshotError> {
    if data.len() < HEADER_LEN {
        return corrupt(format!(
            "snapshot is {} bytes, shorter than its {HEADER_LEN}-byte header",
            data.len()
        ));
    }
    if data.get(..4) != Some(&MAGIC[..]) {
        return corrupt("bad snapshot magic (expected b\"WPDS\")");
    }
    let (Some(version), Some(flags)) = (le_u16(data, 4), le_u16(data, 6)) else {
        return corrupt("truncated snapshot header");
    };
    if version != FORMAT_VERSION && version != FORMAT_V1 {
        return corrupt(format!(
            "unsupported snapshot format version {version} (this build reads versions \
             {FORMAT_V1} and {FORMAT_VERSION})"
        ));
    }
    if flags != 0 {
        return corrupt(format!("unknown snapshot flags {flags:#06x}"));
    }
    if version == FORMAT_V1 {
        decode_v1(data)
    } else {
        decode_v2(data)
    }
}

fn decode_v1(data: &[u8]) -> Result<SnapshotData, SnapshotError> {
    let (Some(body_len), Some(crc)) = (le_u32(data, 8), le_u32(data, 12)) else {
        return corrupt("truncated snapshot header");
    };
    let body = data.get(HEADER_LEN..).unwrap_or_default();
    if u64::from(body_len) != body.len() as u64 {
        return corrupt(format!(
            "snapshot body length mismatch: header says {body_len}, {} bytes follow",
            body.len()
        ));
    }
    let actual = crc32c(0, body);
    if actual != crc {
        return corrupt(format!(
            "snapshot CRC32C mismatch: header {crc:#010x}, body {actual:#010x}"
        ));
    }
    let msg: DedupSnapshot = prost::Message::decode(body)
        .map_err(|e| SnapshotError(format!("snapshot body is not a valid DedupSnapshot: {e}")))?;
    decode_body(msg)
}

/// The metadata checks both versions make.
fn check_meta(
    format_version: u32,
    header_version: u16,
    window_max_keys: u64,
    window_ms: i64,
    marks: &[SegmentWatermark],
) -> Result<Vec<(u32, i64)>, SnapshotError> {
    if format_version != u32::from(header_version) {
        return corrupt(format!(
            "body format_version {format_version} does not match header version {header_version}"
        ));
    }
    if !(1..=MAX_KEYS_LIMIT).contains(&window_max_keys) {
        return corrupt(format!("window_max_keys {window_max_keys} out of range"));
    }
    if window_ms < 1 {
        return corrupt(format!("window_ms {window_ms} out of range"));
    }
    let mut watermarks: Vec<(u32, i64)> = marks
        .iter()
        .map(|w| (w.segment_id, w.last_entry_id))
        .collect();
    watermarks.sort_unstable();
    if watermarks.windows(2).any(|w| w[0].0 == w[1].0) {
        return corrupt("duplicate segment in watermarks");
    }
    Ok(watermarks)
}

/// The entry count a version 2 snapshot's trailer states, found by hopping over the frame
/// headers (nothing checked here: the decode checks everything), and at most what `data` could
/// hold (an entry takes 18 bytes at least: its key and a byte in each id column). The decode
/// reserves that many records at once: grown by doubling, a 10M-key snapshot's records were
/// copied and touched twice over.
fn stated_entries(data: &[u8]) -> usize {
    let mut pos = HEADER_LEN;
    let mut last: Option<&[u8]> = None;
    while pos < data.len() {
        let Some(len) = le_u32(data, pos) else {
            return 0;
        };
        let start = pos + FRAME_HEADER_LEN;
        let Some(payload) = data.get(start..start + len as usize) else {
            return 0;
        };
        last = Some(payload);
        pos = start + payload.len();
    }
    let Some(Ok(SnapshotFrame {
        part: Some(FramePart::Trailer(t)),
    })) = last.map(<SnapshotFrame as prost::Message>::decode)
    else {
        return 0;
    };
    let most = data.len() / (KEY_LEN + 2);
    usize::try_from(t.entry_count).map_or(most, |n| n.min(most))
}

fn decode_v2(data: &[u8]) -> Result<SnapshotData, SnapshotError> {
    let header = data.get(..HEADER_LEN).unwrap_or_default();
    if le_u32(data, 8) != Some(0) {
        return corrupt("snapshot header: reserved bytes are not zero");
    }
    let stored = le_u32(data, 12);
    let mut crc = crc32c(0, header.get(..12).unwrap_or_default());
    if stored != Some(crc) {
        return corrupt("snapshot header CRC32C mismatch");
    }
    crc = crc32c(crc, header.get(12..).unwrap_or_default());
    let mut pos = HEADER_LEN;
    let mut meta: Option<SnapshotData> = None;
    let mut chunks = 0u64;
    loop {
        let frame_no = chunks + u64::from(meta.is_some());
        if pos == data.len() {
            return corrupt(format!(
                "snapshot ends after frame {frame_no} without its trailer (truncated)"
            ));
        }
        let (Some(len), Some(stored)) = (le_u32(data, pos), le_u32(data, pos + 4)) else {
            return corrupt(format!("snapshot frame {frame_no}: truncated frame header"));
        };
        let len = len as usize;
        if len > MAX_FRAME_LEN {
            return corrupt(format!(
                "snapshot frame {frame_no}: length {len} exceeds the {MAX_FRAME_LEN}-byte limit"
            ));
        }
        let start = pos + FRAME_HEADER_LEN;
        let Some(payload) = data.get(start..start + len) else {
            return corrupt(format!(
                "snapshot frame {frame_no}: {len} bytes announced, {} follow (truncated)",
                data.len() - start
            ));
        };
        let mut next = crc32c(crc, data.get(pos..pos + 4).unwrap_or_default());
        next = crc32c(next, payload);
        if next != stored {
            return corrupt(format!(
                "snapshot frame {frame_no}: CRC32C mismatch (damaged, or not in its place)"
            ));
        }
        crc = next;
        pos = start + len;
        let frame: SnapshotFrame = prost::Message::decode(payload).map_err(|e| {
            SnapshotError(format!(
                "snapshot frame {frame_no} is not a valid SnapshotFrame: {e}"
            ))
        })?;
        match (frame.part, meta.as_mut()) {
            (Some(FramePart::Meta(m)), None) => {
                let watermarks = check_meta(
                    m.format_version,
                    FORMAT_VERSION,
                    m.window_max_keys,
                    m.window_ms,
                    &m.watermarks,
                )?;
                let entries = Vec::with_capacity(stated_entries(data));
                meta = Some(SnapshotData {
                    format_version: FORMAT_VERSION,
                    log_id: m.log_id,
                    epoch: m.epoch,
                    timestamp_ms: m.timestamp_ms,
                    window_max_keys: m.window_max_keys,
                    window_ms: m.window_ms,
                    watermarks,
                    entries,
                });
            }
            (Some(FramePart::Chunk(c)), Some(snap)) => {
                if c.entry_count == 0 {
                    return corrupt(format!("snapshot frame {frame_no}: empty chunk"));
                }
                decode_columns(
                    c.entry_count,
                    &c.keys,
                    &c.segment_runs,
                    &c.entry_id_deltas,
                    &c.timestamp_deltas,
                    &mut snap.entries,
                )?;
                chunks += 1;
            }
            (Some(FramePart::Trailer(t)), Some(snap)) => {
                let n = snap.entries.len() as u64;
                if t.entry_count != n || t.chunk_count != chunks {
                    return corrupt(format!(
                        "snapshot trailer counts {} entries in {} chunks, {n} in {chunks} were read",
                        t.entry_count, t.chunk_count
                    ));
                }
                if pos != data.len() {
                    return corrupt(format!(
                        "snapshot has {} bytes after its trailer",
                        data.len() - pos
                    ));
                }
                break;
            }
            (Some(FramePart::Meta(_)), Some(_)) => {
                return corrupt(format!(
                    "snapshot frame {frame_no}: a second metadata frame"
                ))
            }
            (Some(_), None) => {
                return corrupt("snapshot's first frame is not its metadata");
            }
            (None, _) => return corrupt(format!("snapshot frame {frame_no} is empty")),
        }
    }
    meta.ok_or_else(|| SnapshotError("snapshot has no metadata frame".into()))
}

fn decode_body(msg: DedupSnapshot) -> Result<SnapshotData, SnapshotError> {
    let watermarks = check_meta(
        msg.format_version,
        FORMAT_V1,
        msg.window_max_keys,
        msg.window_ms,
        &msg.watermarks,
    )?;
    let mut entries = Vec::new();
    decode_columns(
        msg.entry_count,
        &msg.keys,
        &msg.segment_runs,
        &msg.entry_id_deltas,
        &msg.timestamp_deltas,
        &mut entries,
    )?;
    Ok(SnapshotData {
        format_version: FORMAT_V1,
        log_id: msg.log_id,
        epoch: msg.epoch,
        timestamp_ms: msg.timestamp_ms,
        window_max_keys: msg.window_max_keys,
        window_ms: msg.window_ms,
        watermarks,
        entries,
    })
}

/// Decode `count` entries from the columns onto `entries`, checking every column is used up.
fn decode_columns(
    count: u64,
    keys: &[u8],
    runs: &[u8],
    ids: &[u8],
    tss: &[u8],
    entries: &mut Vec<Record>,
) -> Result<(), SnapshotError> {
    if Some(keys.len() as u64) != count.checked_mul(KEY_LEN as u64) {
        return corrupt(format!(
            "keys column is {} bytes, expected 16 * entry_count ({count})",
            keys.len()
        ));
    }
    // Now count <= keys.len() / 16, so it is bounded by the input size; each varint column
    // needs at least one byte per entry, which bounds it again before anything is allocated.
    let n = keys.len() / KEY_LEN;
    for (name, col) in [("entry_id_deltas", ids), ("timestamp_deltas", tss)] {
        if col.len() < n {
            return corrupt(format!("{name} column too short for {n} entries"));
        }
    }
    entries.reserve(n);
    let target = entries.len() + n;
    let mut runs: &[u8] = runs;
    let mut ids: &[u8] = ids;
    let mut tss: &[u8] = tss;
    let mut keys = keys.chunks_exact(KEY_LEN);
    let mut prev_ts = 0i64;
    while entries.len() < target {
        let seg = next_uvarint(&mut runs, "segment_runs")?;
        let len = next_uvarint(&mut runs, "segment_runs")?;
        let Ok(segment_id) = u32::try_from(seg) else {
            return corrupt(format!("segment id {seg} does not fit u32"));
        };
        let remaining = (target - entries.len()) as u64;
        if len == 0 || len > remaining {
            return corrupt(format!(
                "segment run length {len} invalid ({remaining} entries remain)"
            ));
        }
        let mut prev_entry = 0i64;
        for _ in 0..len {
            let delta = next_svarint(&mut ids, "entry_id_deltas")?;
            let entry = prev_entry
                .checked_add(delta)
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| {
                    SnapshotError(format!("entry id out of u32 range in segment {segment_id}"))
                })?;
            prev_entry = i64::from(entry);
            let dts = next_svarint(&mut tss, "timestamp_deltas")?;
            prev_ts = prev_ts.wrapping_add(dts);
            let Some(key) = keys.next().and_then(|k| <[u8; KEY_LEN]>::try_from(k).ok()) else {
                return corrupt("keys column shorter than entry_count");
            };
            entries.push(Record {
                key,
                segment_id,
                entry_id: entry,
                timestamp_ms: prev_ts,
            });
        }
    }
    for (name, rest) in [
        ("segment_runs", runs.is_empty()),
        ("entry_id_deltas", ids.is_empty()),
        ("timestamp_deltas", tss.is_empty()),
    ] {
        if !rest {
            return corrupt(format!("{name} column has bytes left after {n} entries"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::content_key;

    /// Tiny deterministic PRNG (xorshift64*), so the fuzz loops need no extra crates.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    fn sample(n: usize) -> Vec<Record> {
        let mut ts = 1_700_000_000_000i64;
        (0..n)
            .map(|i| {
                ts += (i % 13) as i64;
                Record {
                    key: content_key(&(i as u64).to_le_bytes()),
                    segment_id: (i * 3 / n.max(1)) as u32 + 7,
                    entry_id: (i % (n / 3 + 1)) as u32,
                    timestamp_ms: ts,
                }
            })
            .collect()
    }

    fn enc(entries: &[Record]) -> Vec<u8> {
        encode(9, 4, 123, 1000, 60_000, &[(8, 17), (7, 5)], entries.iter()).unwrap()
    }

    fn enc_v1(entries: &[Record]) -> Vec<u8> {
        encode_v1(9, 4, 123, 1000, 60_000, &[(8, 17), (7, 5)], entries.iter()).unwrap()
    }

    /// The exact bytes of a snapshot reaching every varint width the format uses (10-byte
    /// uvarints, negative zigzag deltas, int64 extremes); `tests/core/test_core_golden.py` pins the
    /// same bytes through Python.
    const GOLDEN_HEX: &str = concat!(
        "5750445301000000db00000025ddfb9d080110ffffffffffffffffff01180320fbd095ffbc3128e80730e0d403",
        "3a07108080808080203a0d080710ffffffffffffffffff013a040808101140064a600cc175b9c0f1b6a831c399",
        "e26977266192eb5ffee6ae2fec3ad71c777531578f4a8a08f09d37b73795649038408b5f338277e0910d750195",
        "b448797616e091ade1671797c52e15f763380b45e841ec328fa14cdd754f91cc6554c9e71929cce7520a0703ff",
        "ffffff0f0200015a0f0002d604feffffff1ffdffffff1f0a621d80a0abfef9620a1d94e0d481869dffffff0101",
        "ffffffffffffffffff01",
    );

    fn golden_row(tag: &[u8], segment_id: u32, entry_id: u32, timestamp_ms: i64) -> Record {
        Record {
            key: content_key(tag),
            segment_id,
            entry_id,
            timestamp_ms,
        }
    }

    /// The rows and watermarks both golden snapshots hold: ids and times at their extremes.
    fn golden_rows() -> (Vec<Record>, [(u32, i64); 3]) {
        let row = golden_row;
        let entries = vec![
            row(b"a", 7, 0, 1_700_000_000_000),
            row(b"b", 7, 1, 1_700_000_000_005),
            row(b"c", 7, 300, 1_699_999_999_990),
            row(b"d", u32::MAX, u32::MAX, i64::MIN),
            row(b"e", u32::MAX, 0, i64::MAX),
            row(b"f", 0, 5, -1),
        ];
        (entries, [(8, 17), (7, -1), (0, 1 << 40)])
    }

    fn snapshot_of(entries: Vec<Record>) -> SnapshotData {
        SnapshotData {
            format_version: FORMAT_VERSION,
            log_id: 1,
            epoch: 1,
            timestamp_ms: 0,
            window_max_keys: 1000,
            window_ms: 1,
            watermarks: Vec::new(),
            entries,
        }
    }

    #[test]
    fn positions_found_in_one_pass_are_those_a_sort_finds() {
        let mut rng = Rng(0x9e37_79b9);
        for case in 0..400 {
            // a few segments committed interleaved, each in rising entry order, then (in most
            // cases) one position moved or repeated: a crafted or mixed-up snapshot
            let mut next = [0u32; 4];
            let mut entries: Vec<Record> = (0..rng.below(60) + 1)
                .map(|i| {
                    let seg = rng.below(4);
                    next[seg] += 1 + rng.below(3) as u32;
                    Record {
                        key: content_key(&[case as u8, i as u8]),
                        segment_id: seg as u32 * 5,
                        entry_id: next[seg],
                        timestamp_ms: 0,
                    }
                })
                .collect();
            if case % 4 != 0 {
                let (from, to) = (rng.below(entries.len()), rng.below(entries.len()));
                let src = entries[from];
                let dst = &mut entries[to];
                (dst.segment_id, dst.entry_id) = match case % 4 {
                    1 => (src.segment_id, src.entry_id),                   // shared
                    2 => (src.segment_id, src.entry_id.saturating_sub(1)), // falls
                    _ => (dst.segment_id, dst.entry_id + rng.below(3) as u32), // may rise
                };
            }
            let snap = snapshot_of(entries);
            assert_eq!(snap.positions(), snap.positions_sorted(), "case {case}");
        }
        let rising = |ids: &[(u32, u32)]| {
            let recs = ids
                .iter()
                .map(|&(s, e)| golden_row(b"k", s, e, 0))
                .collect();
            snapshot_of(recs).positions()
        };
        let found = rising(&[(1, 1), (2, 5), (1, 2), (2, 6), (1, 3)]);
        assert_eq!(found.ends, vec![(1, 3), (2, 6)]);
        assert_eq!(found.shared, None);
        assert_eq!(rising(&[(1, 1), (2, 5), (1, 1)]).shared, Some((1, 1)));
        assert_eq!(rising(&[(1, 4), (1, 4)]).shared, Some((1, 4)));
        assert_eq!(rising(&[(2, 9), (2, 3), (2, 3)]).ends, vec![(2, 9)]);
    }

    #[test]
    fn records_are_reserved_once_and_never_beyond_what_the_bytes_can_hold() {
        let entries = sample(40_000); // three chunks
        let data = enc(&entries);
        assert_eq!(stated_entries(&data), entries.len());
        let decoded = decode(&data).unwrap();
        assert_eq!(decoded.entries, entries);
        assert_eq!(decoded.entries.capacity(), entries.len());
        // a trailer stating more entries than the bytes could hold: reserved up to what they can
        let mut enc = StreamEncoder::start(9, 4, 123, 1000, 60_000, &[]).unwrap();
        let mut crafted = enc.1;
        enc.0.chunk(entries.iter().take(10), &mut crafted).unwrap();
        let lie = SnapshotFrame {
            part: Some(FramePart::Trailer(SnapshotTrailer {
                entry_count: 1 << 40,
                chunk_count: 1,
            })),
        };
        enc.0.frame(lie.part.unwrap(), &mut crafted).unwrap();
        assert_eq!(stated_entries(&crafted), crafted.len() / (KEY_LEN + 2));
        assert!(decode(&crafted).is_err()); // the trailer's count is checked as before
        for cut in [0, HEADER_LEN + 3, crafted.len() - 1] {
            assert_eq!(stated_entries(&crafted[..cut]), 0);
        }
    }

    #[test]
    fn golden_bytes() {
        let (entries, marks) = golden_rows();
        let bytes = encode_v1(
            u64::MAX,
            3,
            1_700_000_000_123,
            1000,
            60_000,
            &marks,
            entries.iter(),
        );
        let hex: String = bytes.unwrap().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, GOLDEN_HEX);
        let decoded = decode(&hex_bytes(GOLDEN_HEX)).unwrap();
        assert_eq!(decoded.entries, entries);
        assert_eq!(decoded.watermarks, vec![(0, 1 << 40), (7, -1), (8, 17)]);
        // rows d and e share a segment: its end is the higher entry id, whatever the order
        let ends = vec![(0, 5), (7, 300), (u32::MAX, u32::MAX)];
        assert_eq!(decoded.segment_ends(), ends);
        assert_eq!(decoded.shared_position(), None);
        let mut twice = decoded.clone();
        twice.entries.push(golden_row(b"g", 7, 1, 0));
        assert_eq!(twice.shared_position(), Some((7, 1)));
    }

    /// The same rows in version 2 (what this build writes); pinned through Python too.
    const GOLDEN_V2_HEX: &str = concat!(
        "5750445302000000000000008e83f9df3d00000039ff1cb00a3b080210ffffffffffffffffff01180320fbd095",
        "ffbc3128e80730e0d4033a07108080808080203a0d080710ffffffffffffffffff013a0408081011a30000000b",
        "57f35b12a001080612600cc175b9c0f1b6a831c399e26977266192eb5ffee6ae2fec3ad71c777531578f4a8a08",
        "f09d37b73795649038408b5f338277e0910d750195b448797616e091ade1671797c52e15f763380b45e841ec32",
        "8fa14cdd754f91cc6554c9e71929cce71a0a0703ffffffff0f020001220f0002d604feffffff1ffdffffff1f0a",
        "2a1d80a0abfef9620a1d94e0d481869dffffff0101ffffffffffffffffff0106000000eb63fa331a0408061001",
    );

    #[test]
    fn golden_v2_bytes() {
        let (entries, marks) = golden_rows();
        let bytes = encode(
            u64::MAX,
            3,
            1_700_000_000_123,
            1000,
            60_000,
            &marks,
            entries.iter(),
        );
        let hex: String = bytes.unwrap().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, GOLDEN_V2_HEX);
        let v2 = decode(&hex_bytes(GOLDEN_V2_HEX)).unwrap();
        let v1 = decode(&hex_bytes(GOLDEN_HEX)).unwrap();
        assert_eq!((v2.entries, v2.watermarks), (v1.entries, v1.watermarks));
    }

    fn hex_bytes(hex: &str) -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn column_varints_round_trip_and_reject_overflow() {
        let values = [
            0i64,
            1,
            -1,
            63,
            -64,
            64,
            i64::MAX,
            i64::MIN,
            1 << 40,
            -(1 << 40),
        ];
        let mut buf = Vec::new();
        for &v in &values {
            put_svarint(&mut buf, v);
        }
        let mut col: &[u8] = &buf;
        for &v in &values {
            assert_eq!(next_svarint(&mut col, "c").unwrap(), v);
        }
        assert!(col.is_empty());
        assert!(next_uvarint(&mut col, "c").is_err());
        // What the format relies on from prost: 11 bytes, a tenth byte above 1 and a truncated
        // varint are refused; the 10-byte maximum is read.
        assert!(next_uvarint(&mut &[0xff; 11][..], "c").is_err());
        let mut over = vec![0xff; 9];
        over.push(0x02);
        assert!(next_uvarint(&mut &over[..], "c").is_err());
        let mut max = vec![0xff; 9];
        max.push(0x01);
        assert_eq!(next_uvarint(&mut &max[..], "c").unwrap(), u64::MAX);
        let e = next_uvarint(&mut &[0x80][..], "segment_runs").unwrap_err();
        assert!(e.0.starts_with("segment_runs column"), "{e}");
    }

    #[test]
    fn round_trip() {
        for n in [0usize, 1, 2, 5, 1000] {
            let entries = sample(n);
            let data = decode(&enc(&entries)).unwrap();
            assert_eq!(data.entries, entries);
            assert_eq!(data.watermarks, vec![(7, 5), (8, 17)]);
            assert_eq!(
                (
                    data.log_id,
                    data.epoch,
                    data.timestamp_ms,
                    data.window_max_keys,
                    data.window_ms
                ),
                (9, 4, 123, 1000, 60_000)
            );
        }
    }

    #[test]
    fn round_trip_extremes() {
        let entries = vec![
            Record {
                key: [0; 16],
                segment_id: u32::MAX,
                entry_id: u32::MAX,
                timestamp_ms: i64::MIN,
            },
            Record {
                key: [1; 16],
                segment_id: u32::MAX,
                entry_id: 0,
                timestamp_ms: i64::MAX,
            },
            Record {
                key: [2; 16],
                segment_id: 0,
                entry_id: u32::MAX,
                timestamp_ms: -1,
            },
            Record {
                key: [3; 16],
                segment_id: u32::MAX,
                entry_id: 3,
                timestamp_ms: 0,
            },
        ];
        assert_eq!(decode(&enc(&entries)).unwrap().entries, entries);
    }

    #[test]
    fn compact_for_consecutive_ids() {
        let n = 100_000;
        let mut ts = 1_700_000_000_000i64;
        let entries: Vec<Record> = (0..n)
            .map(|i| {
                ts += (i * 7 % 13) as i64;
                Record {
                    key: content_key(&(i as u64).to_le_bytes()),
                    segment_id: (i / 34_000) as u32,
                    entry_id: (i % 34_000) as u32,
                    timestamp_ms: ts,
                }
            })
            .collect();
        let bytes = enc(&entries);
        let per = bytes.len() as f64 / n as f64;
        assert!(per <= 19.0, "{per} bytes per entry");
    }

    #[test]
    fn header_checks() {
        let good = enc(&sample(10));
        let mut v3 = good.clone();
        v3[4] = 3;
        let e = decode(&v3).unwrap_err();
        assert!(e.0.contains("unsupported"), "{e}");
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(decode(&trailing).is_err());
        let mut flags = good.clone();
        flags[6] = 1;
        assert!(decode(&flags).is_err());
        assert!(decode(b"").is_err());
        assert!(decode(b"WPDS").is_err());
    }

    /// Build a body by hand (valid CRC) to reach the column checks behind the CRC.
    fn framed(msg: &DedupSnapshot) -> Vec<u8> {
        let body = prost::Message::encode_to_vec(msg);
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32c(0, &body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn column_checks_behind_a_valid_crc() {
        let good_bytes = enc_v1(&sample(30));
        let good: DedupSnapshot = prost::Message::decode(&good_bytes[HEADER_LEN..]).unwrap();
        assert!(decode(&framed(&good)).is_ok());
        type Mutation = Box<dyn Fn(&mut DedupSnapshot)>;
        let cases: Vec<Mutation> = vec![
            Box::new(|m| m.entry_count += 1),
            Box::new(|m| m.entry_count = u64::MAX),
            Box::new(|m| m.entry_count = u64::MAX / 8),
            Box::new(|m| m.keys.pop().map(|_| ()).unwrap_or(())),
            Box::new(|m| m.segment_runs.push(0)),
            Box::new(|m| m.entry_id_deltas.push(0)),
            Box::new(|m| m.timestamp_deltas.push(0)),
            Box::new(|m| {
                m.timestamp_deltas.pop();
            }),
            Box::new(|m| m.segment_runs.clear()),
            Box::new(|m| m.format_version = 2),
            Box::new(|m| m.format_version = 3),
            Box::new(|m| m.window_max_keys = 0),
            Box::new(|m| m.window_ms = 0),
            Box::new(|m| {
                m.watermarks.push(SegmentWatermark {
                    segment_id: 7,
                    last_entry_id: 1,
                })
            }),
            // One run claiming more entries than exist.
            Box::new(|m| {
                m.segment_runs.clear();
                encode_varint(1, &mut m.segment_runs);
                encode_varint(31, &mut m.segment_runs);
            }),
            // A zero-length run.
            Box::new(|m| {
                let mut runs = Vec::new();
                encode_varint(1, &mut runs);
                encode_varint(0, &mut runs);
                runs.extend_from_slice(&m.segment_runs);
                m.segment_runs = runs;
            }),
            // Segment id beyond u32.
            Box::new(|m| {
                m.segment_runs.clear();
                encode_varint(1 << 40, &mut m.segment_runs);
                encode_varint(30, &mut m.segment_runs);
            }),
            // Entry id driven negative.
            Box::new(|m| {
                m.entry_id_deltas.clear();
                for _ in 0..30 {
                    put_svarint(&mut m.entry_id_deltas, -1);
                }
            }),
            // Entry id beyond u32.
            Box::new(|m| {
                m.entry_id_deltas.clear();
                put_svarint(&mut m.entry_id_deltas, 1 << 33);
                for _ in 1..30 {
                    put_svarint(&mut m.entry_id_deltas, 0);
                }
            }),
        ];
        for (i, mutate) in cases.iter().enumerate() {
            let mut m = good.clone();
            mutate(&mut m);
            assert!(decode(&framed(&m)).is_err(), "case {i} decoded");
        }
    }

    #[test]
    fn mutations_never_panic() {
        let good = enc(&sample(200));
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut accepted = 0;
        for round in 0..5_000 {
            let mut d = good.clone();
            match round % 5 {
                0 => d.truncate(rng.below(d.len())),
                1 => {
                    let i = rng.below(d.len());
                    d[i] ^= 1 << rng.below(8);
                }
                2 => {
                    for _ in 0..1 + rng.below(8) {
                        let i = rng.below(d.len());
                        d[i] = rng.next() as u8;
                    }
                }
                3 => {
                    let i = rng.below(d.len());
                    d.insert(i, rng.next() as u8);
                }
                _ => {
                    d = (0..rng.below(300)).map(|_| rng.next() as u8).collect();
                    if round % 10 == 4 {
                        d.splice(0..d.len().min(4), MAGIC.iter().copied());
                    }
                }
            }
            if decode(&d).is_ok() {
                accepted += 1;
            }
        }
        // CRC32C catches every single-bit flip and truncation; random data cannot pass it.
        assert_eq!(accepted, 0);
    }

    #[test]
    fn body_mutations_behind_valid_crc_never_panic() {
        let good = enc_v1(&sample(50));
        let body = &good[HEADER_LEN..];
        let mut rng = Rng(42);
        for _ in 0..5_000 {
            let mut b = body.to_vec();
            for _ in 0..1 + rng.below(4) {
                match rng.below(3) {
                    0 if !b.is_empty() => {
                        let i = rng.below(b.len());
                        b[i] = rng.next() as u8;
                    }
                    1 => b.truncate(rng.below(b.len() + 1)),
                    _ => {
                        let i = rng.below(b.len() + 1);
                        b.insert(i, rng.next() as u8);
                    }
                }
            }
            let mut out = MAGIC.to_vec();
            out.extend_from_slice(&1u16.to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(&crc32c(0, &b).to_le_bytes());
            out.extend_from_slice(&b);
            if let Ok(s) = decode(&out) {
                assert!(s.entries.len() <= b.len() / KEY_LEN);
            }
        }
    }

    /// A version 2 snapshot from parts, each frame's CRC chained as the encoder does: the
    /// checks behind the CRCs are reached with any sequence of frames.
    fn v2_of(parts: Vec<FramePart>) -> Vec<u8> {
        let header = header_v2();
        let mut enc = StreamEncoder {
            crc: crc32c(0, &header),
            entries: 0,
            chunks: 0,
            finished: false,
        };
        let mut out = header.to_vec();
        for part in parts {
            enc.frame(part, &mut out).unwrap();
        }
        out
    }

    /// The frames of a version 2 snapshot: (offset, total length) of each.
    fn frames_of(data: &[u8]) -> Vec<(usize, usize)> {
        let mut pos = HEADER_LEN;
        let mut out = Vec::new();
        while pos < data.len() {
            let len = le_u32(data, pos).unwrap() as usize + FRAME_HEADER_LEN;
            out.push((pos, len));
            pos += len;
        }
        out
    }

    fn parts_of(data: &[u8]) -> Vec<FramePart> {
        frames_of(data)
            .into_iter()
            .map(|(at, len)| {
                let f: SnapshotFrame =
                    prost::Message::decode(&data[at + FRAME_HEADER_LEN..at + len]).unwrap();
                f.part.unwrap()
            })
            .collect()
    }

    #[test]
    fn v2_round_trips_across_chunks_and_matches_v1() {
        for n in [
            0usize,
            1,
            CHUNK_RECORDS,
            CHUNK_RECORDS + 1,
            2 * CHUNK_RECORDS + 7,
        ] {
            let entries = sample(n);
            let data = enc(&entries);
            assert_eq!(&data[4..6], &2u16.to_le_bytes());
            let chunks = frames_of(&data).len() - 2;
            assert_eq!(chunks, n.div_ceil(CHUNK_RECORDS), "{n}");
            let v2 = decode(&data).unwrap();
            let v1 = decode(&enc_v1(&entries)).unwrap();
            assert_eq!(v2.entries, entries);
            assert_eq!(v2.format_version, 2);
            assert_eq!(v1.format_version, 1);
            assert_eq!(
                (v2.watermarks.clone(), v2.log_id),
                (v1.watermarks, v1.log_id)
            );
            assert_eq!(v1.entries, entries);
        }
    }

    #[test]
    fn streamed_pieces_are_the_whole_encoding() {
        let entries = sample(1000);
        let (mut e, mut out) =
            StreamEncoder::start(9, 4, 123, 1000, 60_000, &[(8, 17), (7, 5)]).unwrap();
        for part in entries.chunks(300) {
            let mut piece = Vec::new();
            assert_eq!(e.chunk(part.iter(), &mut piece).unwrap(), part.len() as u64);
            out.extend_from_slice(&piece);
        }
        assert_eq!(e.chunk([].iter(), &mut out).unwrap(), 0); // nothing: no empty frame
        e.finish(&mut out).unwrap();
        let len = out.len();
        e.finish(&mut out).unwrap(); // once
        assert_eq!(out.len(), len);
        assert_eq!(e.entries(), 1000);
        assert_eq!(decode(&out).unwrap().entries, entries);
    }

    #[test]
    fn v2_corruptions_are_errors() {
        let good = enc(&sample(3 * 100));
        let other = encode(
            9,
            4,
            124,
            1000,
            60_000,
            &[(8, 17), (7, 5)],
            sample(300).iter(),
        )
        .unwrap();
        let frames = frames_of(&good);
        let (meta_at, meta_len) = frames[0];
        let (chunk_at, chunk_len) = frames[1];
        let (trailer_at, _) = *frames.last().unwrap();
        let expect = |data: &[u8], what: &str| {
            let Err(e) = decode(data) else {
                panic!("{what}: decoded")
            };
            assert!(e.0.contains(what), "{what}: {e}");
        };
        // truncated: inside a frame, inside a frame header, at a frame boundary (no trailer)
        expect(&good[..chunk_at + 20], "truncated");
        expect(&good[..chunk_at + 3], "truncated frame header");
        expect(&good[..trailer_at], "without its trailer");
        expect(&good[..HEADER_LEN], "without its trailer");
        // a bit flipped in a frame's payload, in its CRC, in its length
        for at in [chunk_at + 40, chunk_at + 5, meta_at + meta_len - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            expect(&bad, "CRC32C mismatch");
        }
        let mut bad = good.clone();
        bad[chunk_at] ^= 0x01; // length one off: CRC, or truncated
        assert!(decode(&bad).is_err());
        // a frame too large to be one
        let mut bad = good.clone();
        bad[chunk_at..chunk_at + 4].copy_from_slice(&((MAX_FRAME_LEN + 1) as u32).to_le_bytes());
        expect(&bad, "exceeds");
        // garbage after the trailer, and a second snapshot after the first
        let mut bad = good.clone();
        bad.push(0);
        expect(&bad, "after its trailer");
        let mut twice = good.clone();
        twice.extend_from_slice(&good[HEADER_LEN..]);
        expect(&twice, "after its trailer");
        // spliced: a chunk of another snapshot (valid by itself) in place of ours
        let (o_at, o_len) = frames_of(&other)[1];
        let mut spliced = good[..chunk_at].to_vec();
        spliced.extend_from_slice(&other[o_at..o_at + o_len]);
        spliced.extend_from_slice(&good[chunk_at + chunk_len..]);
        expect(&spliced, "CRC32C mismatch");
        // a frame dropped (the CRC chain breaks even if the counts were fixed)
        let mut dropped = good[..chunk_at].to_vec();
        dropped.extend_from_slice(&good[chunk_at + chunk_len..]);
        expect(&dropped, "CRC32C mismatch");
        // header damage
        let mut bad = good.clone();
        bad[9] = 1;
        expect(&bad, "reserved");
        let mut bad = good.clone();
        bad[13] ^= 1;
        expect(&bad, "header CRC32C");
    }

    #[test]
    fn v2_frame_sequence_checks_behind_valid_crcs() {
        let good = enc(&sample(300));
        let parts = parts_of(&good);
        assert!(decode(&v2_of(parts.clone())).is_ok());
        let meta = parts[0].clone();
        let chunk = parts[1].clone();
        let trailer = parts.last().unwrap().clone();
        let FramePart::Trailer(t) = trailer.clone() else {
            panic!("no trailer")
        };
        let count = |entry_count, chunk_count| {
            FramePart::Trailer(SnapshotTrailer {
                entry_count,
                chunk_count,
            })
        };
        let cases: Vec<(Vec<FramePart>, &str)> = vec![
            (
                vec![meta.clone(), chunk.clone(), count(t.entry_count, 2)],
                "trailer counts",
            ),
            (
                vec![meta.clone(), chunk.clone(), count(299, t.chunk_count)],
                "trailer counts",
            ),
            (
                vec![meta.clone(), chunk.clone(), chunk.clone(), trailer.clone()],
                "trailer counts",
            ),
            (vec![meta.clone()], "without its trailer"),
            (vec![chunk.clone(), trailer.clone()], "first frame"),
            (vec![trailer.clone()], "first frame"),
            (
                vec![meta.clone(), meta.clone(), trailer.clone()],
                "second metadata",
            ),
            (
                vec![
                    meta.clone(),
                    FramePart::Chunk(SnapshotChunk::default()),
                    count(0, 1),
                ],
                "empty chunk",
            ),
            (
                vec![
                    FramePart::Meta(SnapshotMeta {
                        format_version: 1,
                        ..match meta.clone() {
                            FramePart::Meta(m) => m,
                            _ => unreachable!(),
                        }
                    }),
                    count(0, 0),
                ],
                "format_version",
            ),
        ];
        for (i, (parts, what)) in cases.into_iter().enumerate() {
            let Err(e) = decode(&v2_of(parts)) else {
                panic!("case {i} decoded")
            };
            assert!(e.0.contains(what), "case {i}: {e}");
        }
        // a frame with no part (its CRC runs on from the frame before it)
        let mut data = v2_of(vec![meta.clone()]);
        let before = le_u32(&data, frames_of(&data)[0].0 + 4).unwrap();
        data.extend_from_slice(&0u32.to_le_bytes());
        let crc = crc32c(before, &0u32.to_le_bytes());
        data.extend_from_slice(&crc.to_le_bytes());
        let e = decode(&data).unwrap_err();
        assert!(e.0.contains("is empty"), "{e}");
    }

    #[test]
    fn v2_column_damage_behind_valid_crcs() {
        let good = enc(&sample(30));
        let parts = parts_of(&good);
        let FramePart::Chunk(chunk) = parts[1].clone() else {
            panic!("no chunk")
        };
        type Mutation = Box<dyn Fn(&mut SnapshotChunk)>;
        let cases: Vec<Mutation> = vec![
            Box::new(|c| c.entry_count += 1),
            Box::new(|c| c.entry_count = u64::MAX),
            Box::new(|c| {
                c.keys.pop();
            }),
            Box::new(|c| c.segment_runs.push(0)),
            Box::new(|c| c.entry_id_deltas.push(0)),
            Box::new(|c| {
                c.timestamp_deltas.pop();
            }),
            Box::new(|c| c.segment_runs.clear()),
        ];
        for (i, mutate) in cases.iter().enumerate() {
            let mut c = chunk.clone();
            mutate(&mut c);
            let mut p = parts.clone();
            p[1] = FramePart::Chunk(c);
            assert!(decode(&v2_of(p)).is_err(), "case {i} decoded");
        }
    }
}
