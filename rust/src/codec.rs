//! Batch compression (`append.compression`): a run's frame compressed once, by the writer, into
//! *compressed units* (of up to `UNIT_MAX_RECORDS` records each) that travel and are stored
//! exactly as sent.
//!
//! A frame is a sequence of units laid end to end: a plain record (`length u32 | crc32c u32 |
//! LogEntry`, `entry.rs`) or a compressed unit
//! `0xFFFFFFFF | codec u8 | 0 u8 x3 | count u32 | raw_len u32 | stored_len u32 | crc32c u32 |
//! compressed bytes` (all little-endian; the CRC covers the compressed bytes, so damage is
//! refused before anything is decompressed). A record length of `u32::MAX` cannot occur (entries
//! are limited to 256 MiB), so the mark tells a unit from a record. Units concatenate: a sender
//! joining several runs' frames into one add, and a node counting a frame's entries, need no
//! decompression (the count is in the unit's header).

use std::borrow::Cow;

/// The first four bytes of a compressed unit (a record length no entry can have).
pub const UNIT_MARK: u32 = u32::MAX;
/// Bytes of a compressed unit's header.
pub const UNIT_HEADER_LEN: usize = 24;
const RECORD_HEADER_LEN: usize = 8;

/// The codecs, by their number in unit headers, batch flags and block headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None = 0,
    Lz4 = 1,
    Zstd = 2,
}

/// zstd level 3 (its default): most of level 19's ratio on log rows at a fraction of the time.
const ZSTD_LEVEL: i32 = 3;

thread_local! {
    // One zstd context per thread, kept: a run is compressed and read as units of ~64 KiB, and a
    // context made per unit (what `zstd::bulk::compress` does) is set up and freed per 64 KiB.
    static ZSTD_CCTX: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::RefCell::new(None) };
    static ZSTD_DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

impl Codec {
    pub fn from_u8(v: u8) -> Result<Self, String> {
        match v {
            0 => Ok(Codec::None),
            1 => Ok(Codec::Lz4),
            2 => Ok(Codec::Zstd),
            n => Err(format!(
                "unknown compression codec {n} (this version reads 0 none, 1 lz4, 2 zstd)"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The most records, and about the most raw bytes, one compressed unit holds: a reader taking a
/// few hundred entries out of a run of 10,000 decompresses only the units holding them (the
/// others are skipped by their header's count), at little cost in ratio.
pub const UNIT_MAX_RECORDS: u32 = 256;
pub const UNIT_MAX_RAW: usize = 64 << 10;

/// The compressed units of `raw` (a frame of plain records), each of up to `UNIT_MAX_RECORDS`
/// records and about `UNIT_MAX_RAW` bytes, end to end; or `raw` itself with `Codec::None`.
pub fn compress(codec: Codec, raw: &[u8]) -> Result<Vec<u8>, String> {
    if codec == Codec::None {
        return Ok(raw.to_vec());
    }
    let mut out = Vec::with_capacity(raw.len() / 2 + UNIT_HEADER_LEN);
    let (mut start, mut pos, mut count) = (0usize, 0usize, 0u32);
    while pos < raw.len() {
        let len = raw
            .get(pos..pos + RECORD_HEADER_LEN)
            .map(|h| le_u32(h) as usize)
            .filter(|&len| pos + RECORD_HEADER_LEN + len <= raw.len())
            .ok_or_else(|| format!("record at byte {pos} is truncated"))?;
        pos += RECORD_HEADER_LEN + len;
        count += 1;
        if count == UNIT_MAX_RECORDS || pos - start >= UNIT_MAX_RAW || pos == raw.len() {
            compress_unit(codec, &raw[start..pos], count, &mut out)?;
            (start, count) = (pos, 0);
        }
    }
    Ok(out)
}

/// Append the compressed unit of `raw` (`count` plain records) to `out`.
fn compress_unit(codec: Codec, raw: &[u8], count: u32, out: &mut Vec<u8>) -> Result<(), String> {
    let body = match codec {
        Codec::None => return Err("codec none has no unit".into()),
        Codec::Lz4 => lz4_flex::block::compress(raw),
        Codec::Zstd => ZSTD_CCTX
            .with(|c| {
                let mut c = c.borrow_mut();
                if c.is_none() {
                    *c = Some(zstd::bulk::Compressor::new(ZSTD_LEVEL)?);
                }
                c.as_mut().map_or(Ok(Vec::new()), |c| c.compress(raw))
            })
            .map_err(|e| format!("zstd: {e}"))?,
    };
    let raw_len = u32::try_from(raw.len()).map_err(|_| "frame over 4 GiB".to_string())?;
    out.extend_from_slice(&UNIT_MARK.to_le_bytes());
    out.extend_from_slice(&[codec as u8, 0, 0, 0]);
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&raw_len.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(())
}

/// A compressed unit's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitHeader {
    pub codec: Codec,
    pub count: u32,
    pub raw_len: u32,
    pub stored_len: u32,
    pub crc: u32,
}

fn is_unit(frame: &[u8], pos: usize) -> bool {
    frame.len() - pos >= 4 && le_u32(&frame[pos..]) == UNIT_MARK
}

/// The header of the compressed unit at `pos` (whose mark was seen), checking that its body is
/// within `frame`.
fn unit_header(frame: &[u8], pos: usize) -> Result<UnitHeader, String> {
    let h = frame
        .get(pos..pos + UNIT_HEADER_LEN)
        .ok_or_else(|| format!("compressed unit at byte {pos} has a truncated header"))?;
    let codec = Codec::from_u8(h[4])?;
    if codec == Codec::None || h[5..8] != [0, 0, 0] {
        return Err(format!("compressed unit at byte {pos} has a bad header"));
    }
    let u = UnitHeader {
        codec,
        count: le_u32(&h[8..]),
        raw_len: le_u32(&h[12..]),
        stored_len: le_u32(&h[16..]),
        crc: le_u32(&h[20..]),
    };
    if frame.len() - pos - UNIT_HEADER_LEN < u.stored_len as usize {
        return Err(format!("compressed unit at byte {pos} runs past the end"));
    }
    Ok(u)
}

/// Number of entries in a frame of records and compressed units, checking that the units tile it
/// exactly and each compressed unit's CRC (nothing is decompressed).
pub fn count_entries(frame: &[u8]) -> Result<usize, String> {
    let mut pos = 0usize;
    let mut count = 0usize;
    while pos < frame.len() {
        if is_unit(frame, pos) {
            let u = unit_header(frame, pos)?;
            let body = pos + UNIT_HEADER_LEN;
            let end = body + u.stored_len as usize;
            if crc32c::crc32c(&frame[body..end]) != u.crc {
                return Err(format!(
                    "compressed unit at byte {pos}: checksum mismatch (damaged)"
                ));
            }
            count += u.count as usize;
            pos = end;
            continue;
        }
        let header = frame
            .get(pos..pos + RECORD_HEADER_LEN)
            .ok_or_else(|| format!("record at byte {pos} is truncated or runs past the end"))?;
        let len = le_u32(header) as usize;
        pos = pos
            .checked_add(RECORD_HEADER_LEN + len)
            .filter(|&end| end <= frame.len())
            .ok_or_else(|| format!("record at byte {pos} is truncated or runs past the end"))?;
        count += 1;
    }
    Ok(count)
}

/// Whether the frame holds a compressed unit (its first unit is one: a writer uses one codec),
/// and which codec; an unknown codec is an error naming it.
pub fn frame_codec(frame: &[u8]) -> Result<Codec, String> {
    match frame.get(4) {
        Some(&c) if is_unit(frame, 0) => Codec::from_u8(c),
        _ => Ok(Codec::None),
    }
}

/// Where the unit or record at `pos` ends and how many entries it holds, from its header alone
/// (nothing checked beyond its bounds).
pub fn next_unit(frame: &[u8], pos: usize) -> Result<(usize, u32), String> {
    if is_unit(frame, pos) {
        let u = unit_header(frame, pos)?;
        return Ok((pos + UNIT_HEADER_LEN + u.stored_len as usize, u.count));
    }
    let len = frame
        .get(pos..pos + RECORD_HEADER_LEN)
        .map(|h| le_u32(h) as usize)
        .ok_or_else(|| format!("record at byte {pos} is truncated"))?;
    let end = pos
        .checked_add(RECORD_HEADER_LEN + len)
        .filter(|&e| e <= frame.len())
        .ok_or_else(|| format!("record at byte {pos} runs past the end"))?;
    Ok((end, 1))
}

/// Whether a unit (not a plain record) starts at `pos`.
pub fn unit_at(frame: &[u8], pos: usize) -> bool {
    is_unit(frame, pos)
}

/// Append the records of the compressed unit at `pos` to `out`: its CRC checked first, then
/// decompressed, then its output checked to be exactly its header's `count` records. Returns
/// where the unit ends.
pub fn decompress_unit(frame: &[u8], pos: usize, out: &mut Vec<u8>) -> Result<usize, String> {
    let u = unit_header(frame, pos)?;
    let body = &frame[pos + UNIT_HEADER_LEN..pos + UNIT_HEADER_LEN + u.stored_len as usize];
    if crc32c::crc32c(body) != u.crc {
        return Err(format!(
            "compressed unit at byte {pos}: checksum mismatch (damaged)"
        ));
    }
    let at = out.len();
    let raw_len = u.raw_len as usize;
    let name = u.codec.name();
    out.resize(at + raw_len, 0);
    let n = match u.codec {
        Codec::Lz4 => lz4_flex::block::decompress_into(body, &mut out[at..])
            .map_err(|e| format!("compressed unit at byte {pos} ({name}): {e}"))?,
        Codec::Zstd => ZSTD_DCTX
            .with(|d| {
                let mut d = d.borrow_mut();
                if d.is_none() {
                    *d = Some(zstd::bulk::Decompressor::new()?);
                }
                d.as_mut()
                    .map_or(Ok(0), |d| d.decompress_to_buffer(body, &mut out[at..]))
            })
            .map_err(|e| format!("compressed unit at byte {pos} ({name}): {e}"))?,
        Codec::None => unreachable!("unit_header refuses codec 0"),
    };
    if n != raw_len {
        return Err(format!(
            "compressed unit at byte {pos} ({name}): {n} bytes, header says {raw_len}"
        ));
    }
    match crate::entry::count_records(&out[at..]) {
        Ok(n) if n == u.count as usize => Ok(pos + UNIT_HEADER_LEN + u.stored_len as usize),
        _ => Err(format!(
            "compressed unit at byte {pos} ({name}) does not hold its {} records",
            u.count
        )),
    }
}

/// The plain records of a frame: borrowed when it holds no compressed unit, else every unit
/// decompressed in place of itself. A unit whose CRC fails, that does not decompress, or whose
/// output is not its header's `raw_len` bytes of exactly `count` records is refused (an error
/// naming the byte and why), never returned as garbage.
pub fn decompress_frame(frame: &[u8]) -> Result<Cow<'_, [u8]>, String> {
    let mut pos = 0usize;
    let mut out: Option<Vec<u8>> = None;
    while pos < frame.len() {
        if !is_unit(frame, pos) {
            let (end, _) = next_unit(frame, pos)?;
            if let Some(out) = out.as_mut() {
                out.extend_from_slice(&frame[pos..end]);
            }
            pos = end;
            continue;
        }
        let out = out.get_or_insert_with(|| {
            let mut v = Vec::with_capacity(frame.len() * 4);
            v.extend_from_slice(&frame[..pos]);
            v
        });
        pos = decompress_unit(frame, pos, out)?;
    }
    Ok(match out {
        Some(v) => Cow::Owned(v),
        None => Cow::Borrowed(frame),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{encode_record_into, EntryFields};

    fn frame(n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..n {
            let payload = format!("row {i} of a compressible log, the same words again");
            encode_record_into(
                &mut out,
                &EntryFields {
                    segment_id: 1,
                    entry_id: i as i64,
                    timestamp_ms: 1_700_000_000_000,
                    payload: payload.as_bytes(),
                    properties: &[],
                    idempotency_key: &[],
                },
            );
        }
        out
    }

    #[test]
    fn round_trip_each_codec_and_concatenated_units() {
        let raw = frame(50);
        for codec in [Codec::Lz4, Codec::Zstd] {
            let unit = compress(codec, &raw).unwrap();
            assert!(unit.len() < raw.len() / 2, "{codec:?}: {} B", unit.len());
            assert_eq!(frame_codec(&unit), Ok(codec));
            assert_eq!(count_entries(&unit), Ok(50));
            assert_eq!(&*decompress_frame(&unit).unwrap(), &raw[..]);
            // a unit, then plain records, then a unit: what a sender joining runs sends
            let mut joined = unit.clone();
            joined.extend_from_slice(&raw);
            joined.extend_from_slice(&unit);
            assert_eq!(count_entries(&joined), Ok(150));
            assert_eq!(&*decompress_frame(&joined).unwrap(), &raw.repeat(3)[..]);
        }
        assert!(matches!(decompress_frame(&raw), Ok(Cow::Borrowed(_))));
        assert_eq!(frame_codec(&raw), Ok(Codec::None));
    }

    /// A long run becomes several units, each of at most `UNIT_MAX_RECORDS` records, counted
    /// and decompressed as the whole frame.
    #[test]
    fn long_runs_split_into_units() {
        let raw = frame(1000);
        let units = compress(Codec::Zstd, &raw).unwrap();
        let (mut pos, mut counts) = (0, Vec::new());
        while pos < units.len() {
            let (end, n) = next_unit(&units, pos).unwrap();
            assert!(unit_at(&units, pos));
            counts.push(n);
            pos = end;
        }
        assert_eq!(counts, vec![256, 256, 256, 232]);
        assert_eq!(count_entries(&units), Ok(1000));
        assert_eq!(&*decompress_frame(&units).unwrap(), &raw[..]);
    }

    #[test]
    fn damage_and_unknown_codecs_are_refused() {
        let raw = frame(20);
        let mut unit = compress(Codec::Zstd, &raw).unwrap();
        let last = unit.len() - 3;
        unit[last] ^= 0x40;
        assert!(decompress_frame(&unit)
            .unwrap_err()
            .contains("checksum mismatch"));
        assert!(count_entries(&unit)
            .unwrap_err()
            .contains("checksum mismatch"));
        let mut odd = compress(Codec::Lz4, &raw).unwrap();
        odd[4] = 9;
        let err = decompress_frame(&odd).unwrap_err();
        assert!(err.contains("unknown compression codec 9"), "{err}");
        // a unit whose count lies is refused after decompression
        let mut liar = compress(Codec::Lz4, &raw).unwrap();
        liar[8] = 21; // the header's count, one more than the unit holds
        assert!(decompress_frame(&liar).unwrap_err().contains("21 records"));
        liar.truncate(30);
        assert!(count_entries(&liar)
            .unwrap_err()
            .contains("runs past the end"));
    }
}
