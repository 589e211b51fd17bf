//! Dedup snapshot codec: a 16-byte header (magic, version, flags, body length, CRC32C of the body)
//! followed by a protobuf `DedupSnapshot` body whose entry columns are delta + varint encoded.
//! See `proto/dedup_snapshot.proto`. Decoding is total: any input gives `Ok` or `Err`, never a
//! panic, and no allocation is larger than a small multiple of the input.

use prost::encoding::{decode_varint, encode_varint};

use crate::keys::{crc32c, KEY_LEN};
use crate::window::{Record, MAX_KEYS_LIMIT};

/// Header magic.
pub const MAGIC: &[u8; 4] = b"WPDS";
/// The only format version this build reads and writes.
pub const FORMAT_VERSION: u16 = 1;
/// Header length in bytes.
pub const HEADER_LEN: usize = 16;

/// Protobuf body (prost derive; mirrors `proto/dedup_snapshot.proto`).
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
        let mut ends: std::collections::BTreeMap<u32, u32> = std::collections::BTreeMap::new();
        for r in &self.entries {
            let end = ends.entry(r.segment_id).or_insert(r.entry_id);
            *end = (*end).max(r.entry_id);
        }
        ends.into_iter().collect()
    }

    /// A position two entries claim, if any (the lowest): one entry of the log holds one key, so
    /// a snapshot that puts two keys at one place was crafted or mixed up, and one of them would
    /// be answered as a duplicate at an entry that holds the other.
    pub fn shared_position(&self) -> Option<(u32, u32)> {
        let mut positions: Vec<(u32, u32)> = self
            .entries
            .iter()
            .map(|r| (r.segment_id, r.entry_id))
            .collect();
        positions.sort_unstable();
        positions.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
    }
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

/// The next varint of column `name`, advancing `col`; an error names the column.
fn next_uvarint(col: &mut &[u8], name: &str) -> Result<u64, SnapshotError> {
    decode_varint(col).map_err(|_| {
        SnapshotError(format!(
            "{name} column: truncated varint, or one that overflows 64 bits"
        ))
    })
}

/// Inverse of [`put_svarint`].
fn next_svarint(col: &mut &[u8], name: &str) -> Result<i64, SnapshotError> {
    let u = next_uvarint(col, name)?;
    Ok(((u >> 1) as i64) ^ -((u & 1) as i64))
}

/// Encode snapshot metadata plus `entries` (commit order). `watermarks` need not be sorted.
/// Fails only if the body would exceed the 4 GiB the header can frame.
pub fn encode<'a>(
    log_id: u64,
    epoch: u64,
    timestamp_ms: i64,
    window_max_keys: u64,
    window_ms: i64,
    watermarks: &[(u32, i64)],
    entries: impl Iterator<Item = &'a Record>,
) -> Result<Vec<u8>, SnapshotError> {
    let n = entries.size_hint().0;
    let mut keys = Vec::with_capacity(n * KEY_LEN);
    let mut runs = Vec::new();
    let mut entry_deltas = Vec::with_capacity(n + n / 8);
    let mut ts_deltas = Vec::with_capacity(n + n / 8);
    let mut run: Option<(u32, u64)> = None;
    let mut prev_entry = 0i64;
    let mut prev_ts = 0i64;
    let mut count = 0u64;
    for r in entries {
        count += 1;
        keys.extend_from_slice(&r.key);
        run = match run {
            Some((seg, len)) if seg == r.segment_id => Some((seg, len + 1)),
            other => {
                if let Some((seg, len)) = other {
                    encode_varint(u64::from(seg), &mut runs);
                    encode_varint(len, &mut runs);
                }
                prev_entry = 0;
                Some((r.segment_id, 1))
            }
        };
        let entry = i64::from(r.entry_id);
        put_svarint(&mut entry_deltas, entry - prev_entry);
        prev_entry = entry;
        put_svarint(&mut ts_deltas, r.timestamp_ms.wrapping_sub(prev_ts));
        prev_ts = r.timestamp_ms;
    }
    if let Some((seg, len)) = run {
        encode_varint(u64::from(seg), &mut runs);
        encode_varint(len, &mut runs);
    }
    let mut marks: Vec<(u32, i64)> = watermarks.to_vec();
    marks.sort_unstable();
    marks.dedup_by_key(|m| m.0);
    let body = DedupSnapshot {
        format_version: u32::from(FORMAT_VERSION),
        log_id,
        epoch,
        timestamp_ms,
        window_max_keys,
        window_ms,
        watermarks: marks
            .into_iter()
            .map(|(segment_id, last_entry_id)| SegmentWatermark {
                segment_id,
                last_entry_id,
            })
            .collect(),
        entry_count: count,
        keys,
        segment_runs: runs,
        entry_id_deltas: entry_deltas,
        timestamp_deltas: ts_deltas,
    };
    // The body is encoded straight after the header in the one output buffer, and the columns
    // are freed before returning: an encoded body and a copy of it next to the columns made a
    // snapshot of a full window peak at ~55 bytes per key on top of the window and its copy.
    let len = prost::Message::encoded_len(&body);
    let Ok(body_len) = u32::try_from(len) else {
        return corrupt(format!(
            "snapshot body of {len} bytes exceeds the 4 GiB format limit"
        ));
    };
    let mut out = Vec::with_capacity(HEADER_LEN + len);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&body_len.to_le_bytes());
    out.extend_from_slice(&[0u8; 4]); // the body's CRC, once it is there
    prost::Message::encode_raw(&body, &mut out);
    drop(body);
    let crc = crc32c(0, out.get(HEADER_LEN..).unwrap_or_default());
    if let Some(field) = out.get_mut(HEADER_LEN - 4..HEADER_LEN) {
        field.copy_from_slice(&crc.to_le_bytes());
    }
    Ok(out)
}

fn le_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Decode and fully validate a snapshot.
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
    let (Some(version), Some(flags), Some(body_len), Some(crc)) = (
        le_u16(data, 4),
        le_u16(data, 6),
        le_u32(data, 8),
        le_u32(data, 12),
    ) else {
        return corrupt("truncated snapshot header");
    };
    if version != FORMAT_VERSION {
        return corrupt(format!(
            "unsupported snapshot format version {version} (this build reads version {FORMAT_VERSION})"
        ));
    }
    if flags != 0 {
        return corrupt(format!("unknown snapshot flags {flags:#06x}"));
    }
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

fn decode_body(msg: DedupSnapshot) -> Result<SnapshotData, SnapshotError> {
    if msg.format_version != u32::from(FORMAT_VERSION) {
        return corrupt(format!(
            "body format_version {} does not match header version {FORMAT_VERSION}",
            msg.format_version
        ));
    }
    if !(1..=MAX_KEYS_LIMIT).contains(&msg.window_max_keys) {
        return corrupt(format!(
            "window_max_keys {} out of range",
            msg.window_max_keys
        ));
    }
    if msg.window_ms < 1 {
        return corrupt(format!("window_ms {} out of range", msg.window_ms));
    }
    let n = msg.entry_count;
    if Some(msg.keys.len() as u64) != n.checked_mul(KEY_LEN as u64) {
        return corrupt(format!(
            "keys column is {} bytes, expected 16 * entry_count ({n})",
            msg.keys.len()
        ));
    }
    // Now n <= keys.len() / 16, so n is bounded by the input size; each varint column needs at
    // least one byte per entry, which bounds it again before anything is allocated.
    let n = msg.keys.len() / KEY_LEN;
    for (name, col) in [
        ("entry_id_deltas", &msg.entry_id_deltas),
        ("timestamp_deltas", &msg.timestamp_deltas),
    ] {
        if col.len() < n {
            return corrupt(format!("{name} column too short for {n} entries"));
        }
    }

    let mut watermarks: Vec<(u32, i64)> = msg
        .watermarks
        .iter()
        .map(|w| (w.segment_id, w.last_entry_id))
        .collect();
    watermarks.sort_unstable();
    if watermarks.windows(2).any(|w| w[0].0 == w[1].0) {
        return corrupt("duplicate segment in watermarks");
    }

    let mut entries: Vec<Record> = Vec::with_capacity(n);
    let mut runs: &[u8] = &msg.segment_runs;
    let mut ids: &[u8] = &msg.entry_id_deltas;
    let mut tss: &[u8] = &msg.timestamp_deltas;
    let mut keys = msg.keys.chunks_exact(KEY_LEN);
    let mut prev_ts = 0i64;
    while entries.len() < n {
        let seg = next_uvarint(&mut runs, "segment_runs")?;
        let len = next_uvarint(&mut runs, "segment_runs")?;
        let Ok(segment_id) = u32::try_from(seg) else {
            return corrupt(format!("segment id {seg} does not fit u32"));
        };
        let remaining = (n - entries.len()) as u64;
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
    Ok(SnapshotData {
        format_version: FORMAT_VERSION,
        log_id: msg.log_id,
        epoch: msg.epoch,
        timestamp_ms: msg.timestamp_ms,
        window_max_keys: msg.window_max_keys,
        window_ms: msg.window_ms,
        watermarks,
        entries,
    })
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

    #[test]
    fn golden_bytes() {
        let row = |tag: &[u8], segment_id, entry_id, timestamp_ms| Record {
            key: content_key(tag),
            segment_id,
            entry_id,
            timestamp_ms,
        };
        let entries = vec![
            row(b"a", 7, 0, 1_700_000_000_000),
            row(b"b", 7, 1, 1_700_000_000_005),
            row(b"c", 7, 300, 1_699_999_999_990),
            row(b"d", u32::MAX, u32::MAX, i64::MIN),
            row(b"e", u32::MAX, 0, i64::MAX),
            row(b"f", 0, 5, -1),
        ];
        let marks = [(8, 17), (7, -1), (0, 1 << 40)];
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
        assert_eq!(hex, GOLDEN_HEX);
        let decoded = decode(&hex_bytes(GOLDEN_HEX)).unwrap();
        assert_eq!(decoded.entries, entries);
        assert_eq!(decoded.watermarks, vec![(0, 1 << 40), (7, -1), (8, 17)]);
        // rows d and e share a segment: its end is the higher entry id, whatever the order
        let ends = vec![(0, 5), (7, 300), (u32::MAX, u32::MAX)];
        assert_eq!(decoded.segment_ends(), ends);
        assert_eq!(decoded.shared_position(), None);
        let mut twice = decoded.clone();
        twice.entries.push(row(b"g", 7, 1, 0));
        assert_eq!(twice.shared_position(), Some((7, 1)));
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
        let mut v2 = good.clone();
        v2[4] = 2;
        let e = decode(&v2).unwrap_err();
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
        let good_bytes = enc(&sample(30));
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
        let good = enc(&sample(50));
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
}
