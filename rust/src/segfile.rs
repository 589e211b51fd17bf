//! Local segment files (`logstore/segment_files.py`): walking batches and reading entries with
//! buffered sequential I/O, and the appender's write and sync, each as one call without the GIL.
//!
//! A batch is a 36-byte header `magic "WPSB" | version u16 | flags u16 | first i64 | count u32 |
//! frame_len u32 | lac i64 | crc32c u32` (over the first 32 bytes) followed by `count` records
//! `length u32 | crc32c u32 | LogEntry bytes`, or by the writer's compressed unit(s) of them
//! (`codec.rs`) as it sent them: the flags' low byte is then the codec (0 none, 1 lz4, 2 zstd).
//! Why native: a segment of 100,000 one-entry batches took ~10 µs per batch to walk from Python;
//! here it is a sequential read of the file.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;

pub const BATCH_HEADER_LEN: usize = 36;
pub const MAGIC: &[u8; 4] = b"WPSB";
pub const VERSION: u16 = 1;
const RECORD_HEADER_LEN: usize = 8;

/// A parsed batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub codec: u8,
    pub first: i64,
    pub count: u32,
    pub frame_len: u32,
    pub lac: i64,
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_i64(b: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    i64::from_le_bytes(a)
}

/// The header, or None if its magic, version or CRC is wrong.
pub fn decode_header(b: &[u8; BATCH_HEADER_LEN]) -> Option<BatchHeader> {
    if &b[0..4] != MAGIC || u16::from_le_bytes([b[4], b[5]]) != VERSION {
        return None;
    }
    if crc32c::crc32c(&b[..32]) != le_u32(&b[32..36]) {
        return None;
    }
    Some(BatchHeader {
        codec: b[6],
        first: le_i64(&b[8..16]),
        count: le_u32(&b[16..20]),
        frame_len: le_u32(&b[20..24]),
        lac: le_i64(&b[24..32]),
    })
}

/// Whether `frame` is exactly `count` records with valid CRCs.
/// Where the first record of a frame that fails its length or CRC starts, and where it ends (the
/// frame's end when its length cannot be trusted); None when every record is whole.
fn first_bad_record(frame: &[u8], count: u32) -> Option<(usize, usize)> {
    let mut pos = 0usize;
    for _ in 0..count {
        if frame.len() - pos < RECORD_HEADER_LEN {
            return Some((pos, frame.len()));
        }
        let len = le_u32(&frame[pos..]) as usize;
        let crc = le_u32(&frame[pos + 4..]);
        let body = pos + RECORD_HEADER_LEN;
        if frame.len() - body < len {
            return Some((pos, frame.len()));
        }
        if crc32c::crc32c(&frame[body..body + len]) != crc {
            return Some((pos, body + len));
        }
        pos = body + len;
    }
    (pos != frame.len()).then_some((pos, frame.len()))
}

/// A final batch whose records fail is a torn write (the tail) only when what fails is zeros to
/// the end: a crash (power loss) before the batch's fdatasync leaves pages never written as
/// zeros. Other damage cannot be a tear, since an acknowledged batch was synced before its ack:
/// it is corruption, to be reported, never silently cut off.
fn torn_frame(frame: &[u8], bad: (usize, usize)) -> bool {
    let zeros_from = frame.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    zeros_from < bad.1
}

/// What a scan found: runs of consecutive entries in consecutive batches, `(first, last, offset
/// of the run's first batch)`, the highest LAC, where the whole batches end, and the offset of a
/// corrupt header if the scan stopped at one.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    pub runs: Vec<(i64, i64, u64)>,
    pub lac: i64,
    pub end: u64,
    pub corrupt_at: Option<u64>,
}

/// `scan` walks whole files: big reads, fewer calls.
const SCAN_BUFFER: usize = 1 << 20;
/// `read` serves a reader's batches (often ~0.5 MiB): a buffer this size wastes little past the
/// last batch read, and the data copied through it is still in the CPU cache when parsed.
const READ_BUFFER: usize = 128 << 10;

fn open_at(path: &Path, offset: u64, buffer: usize) -> io::Result<Option<BufReader<File>>> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    file.seek(SeekFrom::Start(offset))?;
    Ok(Some(BufReader::with_capacity(buffer, file)))
}

/// Walk the whole batches of `path` in `[start, limit)`. The tail ends the walk without error: a
/// header cut short, a frame past `limit`, a zero-filled rest, or (unless `completed`: the footer
/// vouches for every entry) a final batch whose records fail their CRC where zeros run to the end
/// (`torn_frame`). A bad header, or a final batch damaged otherwise, is corruption (`corrupt_at`).
pub fn scan(path: &Path, start: u64, limit: u64, completed: bool) -> io::Result<Scan> {
    let mut out = Scan {
        lac: -1,
        end: start,
        ..Scan::default()
    };
    let Some(mut r) = open_at(path, start, SCAN_BUFFER)? else {
        return Ok(out);
    };
    let mut pos = start;
    let mut header = [0u8; BATCH_HEADER_LEN];
    let mut frame = Vec::new();
    while limit.saturating_sub(pos) >= BATCH_HEADER_LEN as u64 {
        r.read_exact(&mut header)?;
        let Some(h) = decode_header(&header) else {
            if rest_is_zero(&mut r, &header, limit - pos)? {
                break;
            }
            out.corrupt_at = Some(pos);
            break;
        };
        let stop = pos + BATCH_HEADER_LEN as u64 + u64::from(h.frame_len);
        if stop > limit {
            break;
        }
        if stop == limit && !completed {
            frame.resize(h.frame_len as usize, 0);
            r.read_exact(&mut frame)?;
            let bad = match crate::codec::decompress_frame(&frame) {
                Ok(raw) => first_bad_record(&raw, h.count),
                Err(_) => Some((0, frame.len())), // a torn unit is zeros to its end
            };
            if let Some(bad) = bad {
                if !torn_frame(&frame, bad) {
                    out.corrupt_at = Some(pos);
                }
                break;
            }
        } else {
            r.seek_relative(i64::from(h.frame_len))?;
        }
        if h.count > 0 {
            let last = h.first + i64::from(h.count) - 1;
            match out.runs.last_mut() {
                Some(run) if run.1 + 1 == h.first && out.end == pos => run.1 = last,
                _ => out.runs.push((h.first, last, pos)),
            }
        }
        out.lac = out.lac.max(h.lac);
        pos = stop;
        out.end = pos;
    }
    Ok(out)
}

fn rest_is_zero(r: &mut impl Read, header: &[u8], left: u64) -> io::Result<bool> {
    if header.iter().any(|&b| b != 0) {
        return Ok(false);
    }
    let mut rest = r.take(left - header.len() as u64);
    let mut buf = [0u8; 8192];
    loop {
        let n = rest.read(&mut buf)?;
        if n == 0 {
            return Ok(true);
        }
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
    }
}

/// Where a read failed: the offset of the batch, the entry id, and why.
#[derive(Debug, PartialEq, Eq)]
pub struct Bad {
    pub offset: u64,
    pub entry_id: i64,
    pub why: String,
}

/// One read request: starting at the batch at `offset` whose first entry is `first`, the entries
/// `lo..=hi` (consecutive batches follow each other in the file).
pub type Span = (u64, i64, i64, i64);

/// Entries read: their bytes back to back, and where each ends (one allocation for all).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Entries {
    pub data: Vec<u8>,
    pub ends: Vec<usize>,
}

impl Entries {
    /// The entries as slices, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(self.ends.iter()).map(|(a, &b)| &self.data[a..b])
    }

    fn push(&mut self, entry: &[u8]) {
        self.data.extend_from_slice(entry);
        self.ends.push(self.data.len());
    }
}

/// The entries read, and the resume point `(batch offset, its first entry)`.
pub type ReadOk = (Entries, u64, i64);

/// Entries (LogEntry bytes, CRC-checked) of every span in order, and where entry `hi + 1` of the
/// last span can be resumed: `(offset of its batch, first entry of that batch)`.
pub fn read(path: &Path, spans: &[Span]) -> io::Result<Result<ReadOk, Bad>> {
    let mut out = Entries::default();
    let Some(first_span) = spans.first() else {
        return Ok(Ok((out, 0, 0)));
    };
    let Some(mut r) = open_at(path, first_span.0, READ_BUFFER)? else {
        return Ok(Err(Bad {
            offset: first_span.0,
            entry_id: first_span.2,
            why: "file missing".into(),
        }));
    };
    let mut at = first_span.0; // the reader's position
    let mut resume = (0u64, 0i64);
    let mut header = [0u8; BATCH_HEADER_LEN];
    let mut frame = Vec::new();
    for &(offset, first, lo, hi) in spans {
        if at != offset {
            r.seek_relative(offset as i64 - at as i64)?;
        }
        let (mut batch_at, mut batch_first) = (offset, first);
        let eid = lo;
        loop {
            let bad = |why: &str, entry_id| Bad {
                offset: batch_at,
                entry_id,
                why: why.to_owned(),
            };
            if let Err(e) = r.read_exact(&mut header) {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    return Ok(Err(bad("truncated", eid)));
                }
                return Err(e);
            }
            let Some(h) = decode_header(&header) else {
                return Ok(Err(bad("bad batch header", eid)));
            };
            let next = batch_at + (BATCH_HEADER_LEN as u64) + u64::from(h.frame_len);
            if h.count == 0 {
                r.seek_relative(i64::from(h.frame_len))?; // a LAC-only update inside a run
                batch_at = next;
                continue;
            }
            if h.first != batch_first {
                return Ok(Err(bad("batch out of place", eid)));
            }
            let end = h.first + i64::from(h.count); // one past the batch's last entry
            if end <= eid {
                r.seek_relative(i64::from(h.frame_len))?; // wholly before the span: skip it
            } else {
                frame.resize(h.frame_len as usize, 0);
                if let Err(e) = r.read_exact(&mut frame) {
                    if e.kind() == io::ErrorKind::UnexpectedEof {
                        return Ok(Err(bad("truncated", eid)));
                    }
                    return Err(e);
                }
                if let Err(why) = crate::codec::Codec::from_u8(h.codec) {
                    return Ok(Err(bad(&why, eid))); // a newer writer's codec: refused by name
                }
                if let Err((id, why)) = take_records(&frame, h.first, end, eid, hi, &mut out) {
                    return Ok(Err(bad(&why, id)));
                }
            }
            at = next;
            if hi + 1 < end {
                resume = (batch_at, batch_first); // hi + 1 is in this batch
                break;
            }
            batch_at = next;
            batch_first = end;
            resume = (batch_at, batch_first);
            if end > hi {
                break;
            }
        }
    }
    Ok(Ok((out, resume.0, resume.1)))
}

/// Append the entries `lo..=hi` of a batch's frame (entries `first..end`) to `out`, CRC-checked;
/// on failure the entry id and why. A compressed unit (`codec.rs`) holding none of them is
/// skipped by its header's count; one holding some is decompressed (its CRC checked first).
fn take_records(
    frame: &[u8],
    first: i64,
    end: i64,
    lo: i64,
    hi: i64,
    out: &mut Entries,
) -> Result<(), (i64, String)> {
    let mut pos = 0usize;
    let mut id = first;
    let mut raw = Vec::new();
    while id <= hi && id < end {
        if crate::codec::unit_at(frame, pos) {
            let (next, count) = crate::codec::next_unit(frame, pos).map_err(|why| (id, why))?;
            let count = i64::from(count);
            if id + count > lo {
                raw.clear();
                crate::codec::decompress_unit(frame, pos, &mut raw).map_err(|why| (id, why))?;
                take_records(&raw, id, id + count, lo, hi, out)?; // plain records now
            }
            id += count;
            pos = next;
            continue;
        }
        if frame.len() - pos < RECORD_HEADER_LEN {
            return Err((id, "truncated".into()));
        }
        let len = le_u32(&frame[pos..]) as usize;
        let crc = le_u32(&frame[pos + 4..]);
        pos += RECORD_HEADER_LEN;
        if frame.len() - pos < len {
            return Err((id, "truncated".into()));
        }
        if id >= lo {
            let data = &frame[pos..pos + len];
            if crc32c::crc32c(data) != crc {
                return Err((id, "checksum mismatch".into()));
            }
            out.push(data);
        }
        pos += len;
        id += 1;
    }
    Ok(())
}

/// An append-only file of this process: one `write` per batch (O_APPEND places it whole at the
/// end, even with other appenders), `fdatasync` and the fence check as separate calls so a
/// caller can share one sync between batches (group commit).
pub struct Appender {
    file: File,
}

impl Appender {
    pub fn open(path: &Path) -> io::Result<Self> {
        let mut options = OpenOptions::new();
        options.append(true).create(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o666);
        Ok(Self {
            file: options.open(path)?,
        })
    }

    /// Append `header` then `frame` in one write; returns the batch's offset. A short write is
    /// an error (the caller stops appending: the partial batch must stay the tail).
    pub fn append(&self, header: &[u8], frame: &[u8]) -> io::Result<u64> {
        let mut buf = Vec::with_capacity(header.len() + frame.len());
        buf.extend_from_slice(header);
        buf.extend_from_slice(frame);
        let n = (&self.file).write(&buf)?;
        if n != buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {n} of {} bytes", buf.len()),
            ));
        }
        Ok((&self.file).stream_position()? - buf.len() as u64)
    }

    /// `append`, then `sync`: the whole add of a batch as one call.
    pub fn append_sync(
        &self,
        header: &[u8],
        frame: &[u8],
        sync: bool,
        fence: Option<&Path>,
    ) -> io::Result<(u64, bool)> {
        let offset = self.append(header, frame)?;
        Ok((offset, self.sync(sync, fence)?))
    }

    /// `fdatasync` (when `sync`), THEN whether `fence` exists: the order fencing relies on.
    pub fn sync(&self, sync: bool, fence: Option<&Path>) -> io::Result<bool> {
        if sync {
            self.file.sync_data()?;
        }
        Ok(fence.is_some_and(Path::exists))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// The header as `logstore/segment_files.py` writes it.
    fn encode_header(h: &BatchHeader) -> [u8; BATCH_HEADER_LEN] {
        let mut out = [0u8; BATCH_HEADER_LEN];
        out[0..4].copy_from_slice(MAGIC);
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[6] = h.codec;
        out[8..16].copy_from_slice(&h.first.to_le_bytes());
        out[16..20].copy_from_slice(&h.count.to_le_bytes());
        out[20..24].copy_from_slice(&h.frame_len.to_le_bytes());
        out[24..32].copy_from_slice(&h.lac.to_le_bytes());
        let crc = crc32c::crc32c(&out[..32]);
        out[32..36].copy_from_slice(&crc.to_le_bytes());
        out
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wp-segfile-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("data")
    }

    fn record(payload: &[u8]) -> Vec<u8> {
        let mut r = (payload.len() as u32).to_le_bytes().to_vec();
        r.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
        r.extend_from_slice(payload);
        r
    }

    fn batch(first: i64, payloads: &[&[u8]]) -> (Vec<u8>, Vec<u8>) {
        let frame: Vec<u8> = payloads.iter().flat_map(|p| record(p)).collect();
        let h = BatchHeader {
            codec: 0,
            first,
            count: payloads.len() as u32,
            frame_len: frame.len() as u32,
            lac: first - 1,
        };
        (encode_header(&h).to_vec(), frame)
    }

    #[test]
    fn append_scan_read_and_resume() {
        let path = scratch("rw");
        let a = Appender::open(&path).unwrap();
        let (h0, f0) = batch(0, &[b"a", b"b"]);
        let (h1, f1) = batch(2, &[b"c"]);
        let (hl, fl) = batch(2, &[]); // a LAC-only update between two batches of one run
        assert_eq!(a.append(&h0, &f0).unwrap(), 0);
        a.append(&hl, &fl).unwrap();
        let off1 = a.append(&h1, &f1).unwrap();
        assert_eq!(off1, (h0.len() + f0.len() + hl.len()) as u64);
        assert!(!a.sync(true, Some(&path.with_file_name("fence"))).unwrap());
        let size = std::fs::metadata(&path).unwrap().len();
        let s = scan(&path, 0, size, false).unwrap();
        assert_eq!(s.runs, vec![(0, 2, 0)]);
        assert_eq!((s.lac, s.end, s.corrupt_at), (1, size, None));
        let (got, at, first) = read(&path, &[(0, 0, 1, 1)]).unwrap().unwrap();
        assert_eq!(got.iter().collect::<Vec<_>>(), vec![b"b"]);
        // entry 2 starts the batch after the LAC-only update; resuming there skips that update
        assert_eq!((at, first), ((h0.len() + f0.len()) as u64, 2));
        let (got, _, _) = read(&path, &[(at, first, 2, 2)]).unwrap().unwrap();
        assert_eq!(got.iter().collect::<Vec<_>>(), vec![b"c"]);
        assert!(off1 > at);
        let (got, at, first) = read(&path, &[(0, 0, 0, 0)]).unwrap().unwrap();
        assert_eq!(got.iter().collect::<Vec<_>>(), vec![b"a"]);
        assert_eq!((at, first), (0, 0)); // entry 1 is in this batch
        let (got, at, first) = read(&path, &[(0, 0, 0, 2)]).unwrap().unwrap();
        assert_eq!(got.ends.len(), 3);
        assert_eq!((at, first), (size, 3));
    }

    #[test]
    fn reads_past_the_read_buffer() {
        // 600 one-entry batches of 1 KiB (batches straddle the buffer's refills), then one
        // batch larger than the buffer: read whole, in pieces, and resumed
        let path = scratch("big");
        let a = Appender::open(&path).unwrap();
        let payload = |i: i64| vec![(i % 251) as u8; 1024 + (i % 7) as usize];
        for i in 0..600 {
            let (h, f) = batch(i, &[&payload(i)]);
            a.append(&h, &f).unwrap();
        }
        let big: Vec<Vec<u8>> = (600..800).map(payload).collect();
        let refs: Vec<&[u8]> = big.iter().map(|p| p.as_slice()).collect();
        let (h, f) = batch(600, &refs);
        assert!(f.len() > READ_BUFFER);
        let big_at = a.append(&h, &f).unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        assert_eq!(scan(&path, 0, size, true).unwrap().runs, vec![(0, 799, 0)]);
        let (got, at, first) = read(&path, &[(0, 0, 0, 799)]).unwrap().unwrap();
        let want: Vec<Vec<u8>> = (0..800).map(payload).collect();
        assert_eq!(got.iter().map(<[u8]>::to_vec).collect::<Vec<_>>(), want);
        assert_eq!((at, first), (size, 800));
        let (mut at, mut first, mut next) = (0u64, 0i64, 0i64);
        while next < 800 {
            let hi = (next + 499).min(799);
            let (got, a2, f2) = read(&path, &[(at, first, next, hi)]).unwrap().unwrap();
            assert_eq!(
                got.iter().map(<[u8]>::to_vec).collect::<Vec<_>>(),
                want[next as usize..=hi as usize]
            );
            (at, first, next) = (a2, f2, hi + 1);
        }
        assert_eq!((at, first), (size, 800));
        let (got, _, _) = read(&path, &[(big_at, 600, 790, 799)]).unwrap().unwrap();
        assert_eq!(got.ends.len(), 10);
    }

    #[test]
    fn torn_tail_and_corruption() {
        let path = scratch("torn");
        let a = Appender::open(&path).unwrap();
        let (h0, f0) = batch(0, &[b"aaaa"]);
        let (h1, f1) = batch(1, &[b"bbbb"]);
        a.append(&h0, &f0).unwrap();
        a.append(&h1, &f1).unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        let one = (h0.len() + f0.len()) as u64;
        // cut inside the second batch: the tail
        assert_eq!(
            scan(&path, 0, size - 2, false).unwrap().runs,
            vec![(0, 0, 0)]
        );
        // the final batch's record zeroed from inside it to the end (pages a crash before the
        // fdatasync never wrote): torn
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        let mut zeroed = bytes.clone();
        zeroed[last - 2..].fill(0);
        std::fs::write(&path, &zeroed).unwrap();
        let s = scan(&path, 0, size, false).unwrap();
        assert_eq!((s.end, s.corrupt_at), (one, None));
        // a bit flipped in the final batch's record: corruption at that batch (an acknowledged
        // batch was synced), unless the segment is completed (then reads report it)
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let s = scan(&path, 0, size, false).unwrap();
        assert_eq!((s.end, s.corrupt_at), (one, Some(one)));
        assert_eq!(scan(&path, 0, size, true).unwrap().end, size);
        let bad = read(&path, &[(one, 1, 1, 1)]).unwrap().unwrap_err();
        assert_eq!(
            (bad.offset, bad.entry_id, bad.why.as_str()),
            (one, 1, "checksum mismatch")
        );
        // a bad header in the middle: corruption
        bytes[last] ^= 1;
        bytes[10] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(scan(&path, 0, size, false).unwrap().corrupt_at, Some(0));
        // zeros after the first batch: the tail
        bytes[10] ^= 1;
        bytes.truncate(one as usize);
        bytes.extend(std::iter::repeat_n(0, 100));
        std::fs::write(&path, &bytes).unwrap();
        let s = scan(&path, 0, bytes.len() as u64, false).unwrap();
        assert_eq!((s.end, s.corrupt_at), (one, None));
    }

    /// A batch holding a compressed unit reads back as its records; a flipped bit in the stored
    /// (compressed) bytes is refused as damage, never returned as garbage.
    #[test]
    fn compressed_batches() {
        use crate::codec::{compress, Codec};
        let path = scratch("compressed");
        let a = Appender::open(&path).unwrap();
        let rows: Vec<Vec<u8>> = (0..600)
            .map(|i| format!("row {i} row row row").into_bytes())
            .collect();
        let raw: Vec<u8> = rows.iter().flat_map(|p| record(p)).collect();
        let unit = compress(Codec::Zstd, &raw).unwrap(); // 3 units: 256, 256, 88 rows
        let (h0, f0) = batch(0, &[b"plain"]);
        a.append(&h0, &f0).unwrap();
        let h = BatchHeader {
            codec: Codec::Zstd as u8,
            first: 1,
            count: 600,
            frame_len: unit.len() as u32,
            lac: 0,
        };
        let at = a.append(&encode_header(&h), &unit).unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        let s = scan(&path, 0, size, false).unwrap();
        assert_eq!(
            (s.runs, s.end, s.corrupt_at),
            (vec![(0, 600, 0)], size, None)
        );
        let (got, _, _) = read(&path, &[(0, 0, 0, 600)]).unwrap().unwrap();
        let got: Vec<&[u8]> = got.iter().collect();
        assert_eq!(got[0], b"plain");
        assert_eq!(
            got[1..].to_vec(),
            rows.iter().map(|r| &r[..]).collect::<Vec<_>>()
        );
        let mut bytes = std::fs::read(&path).unwrap();
        let mid = at as usize + BATCH_HEADER_LEN + 30;
        bytes[mid] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let bad = read(&path, &[(at, 1, 5, 6)]).unwrap().unwrap_err();
        assert!(bad.why.contains("checksum mismatch"), "{}", bad.why);
        // entries of the undamaged units are still read: their unit is found by the counts in
        // the headers before it, and only it is decompressed
        let (got, _, _) = read(&path, &[(at, 1, 300, 310)]).unwrap().unwrap();
        assert_eq!(got.iter().next(), Some(&rows[299][..]));
        assert_eq!(scan(&path, 0, size, false).unwrap().corrupt_at, Some(at));
    }
}
