//! Idempotency keys: MD5 content keys, domain-separated explicit keys, CRC32C, and the batch
//! hashing driver that spreads large batches over the available cores (content keys of a batch
//! go through [`crate::md5x`], several payloads per pass).

use std::ops::Range;
use std::sync::OnceLock;

use md5::{Digest, Md5};

/// Every idempotency key is exactly this many bytes (an MD5 digest).
pub const KEY_LEN: usize = 16;

/// A 16-byte idempotency key.
pub type Key = [u8; KEY_LEN];

/// Domain tag hashed before an explicit id, so an id can never equal the content key of a payload.
pub const EXPLICIT_DOMAIN: &[u8] = b"woodpecker-idem/explicit-id/v1\x00";

/// Longest explicit idempotency id, in bytes.
pub const MAX_ID_LEN: usize = 1024;

/// What one item costs to hash beyond its bytes, in payload bytes: ~40 ns of padding, lane
/// set-up and transposing against ~0.3 ns per byte of the multi-buffer kernel.
pub const ITEM_WORK_BYTES: usize = 128;

/// Batches whose work (bytes, plus [`ITEM_WORK_BYTES`] per item) reaches this are split over
/// several threads (when more than one core exists): ~0.6 ms of hashing, several times what
/// the threads cost. Below it a split costs more CPU than it saves wall time (10,000 short ids:
/// ~70 ns of CPU per key split against ~44 alone, and no faster), and where every core is busy
/// already (a Spark task) the CPU is all that counts.
pub const PARALLEL_MIN_WORK: usize = 2 << 20;

/// Key of a payload without an explicit id: MD5 of the payload bytes.
pub fn content_key(payload: &[u8]) -> Key {
    Md5::digest(payload).into()
}

/// Content keys of `payloads` into `out`, 16 bytes each (`out.len()` must be 16 per payload).
pub fn content_keys_into(payloads: &[&[u8]], out: &mut [u8]) {
    let (keys, rest) = out.as_chunks_mut::<KEY_LEN>();
    assert!(rest.is_empty(), "content_keys_into: 16 bytes per key");
    crate::md5x::digest_many(payloads, keys);
}

/// `f` of every item into `out`, 16 bytes each: for keys that gain nothing from batching.
pub fn each_key_into<T>(items: &[T], out: &mut [u8], f: impl Fn(&T) -> Key) {
    for (item, dst) in items.iter().zip(out.chunks_exact_mut(KEY_LEN)) {
        dst.copy_from_slice(&f(item));
    }
}

/// Key of an explicit idempotency id: MD5 over [`EXPLICIT_DOMAIN`] followed by the id bytes.
pub fn explicit_key(id: &[u8]) -> Key {
    let mut h = Md5::new();
    h.update(EXPLICIT_DOMAIN);
    h.update(id);
    h.finalize().into()
}

/// Why an explicit id is rejected (`None` when it is acceptable).
pub fn explicit_id_problem(id: &[u8]) -> Option<&'static str> {
    if id.is_empty() {
        Some("must not be empty")
    } else if id.len() > MAX_ID_LEN {
        Some("must be at most 1024 bytes")
    } else {
        None
    }
}

/// CRC32C (Castagnoli), continuing from the running value `crc` (0 to start).
pub fn crc32c(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

/// Number of worker threads for batch work (cached: the std lookup reads cgroup files).
pub fn parallelism() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .clamp(1, 8)
    })
}

/// Whether hashing `items` holding `total_bytes` is worth more than one thread.
pub fn worth_splitting(items: usize, total_bytes: usize) -> bool {
    items >= 2
        && total_bytes.saturating_add(items.saturating_mul(ITEM_WORK_BYTES)) >= PARALLEL_MIN_WORK
}

/// Keys of every item in one buffer (N*16 bytes): `fill` writes the keys of a run of items. Large
/// batches are split over several threads: at least two items whose work reaches
/// [`PARALLEL_MIN_WORK`] (`total_bytes` of input, plus [`ITEM_WORK_BYTES`] per item).
pub fn hash_batch<T: Sync>(
    items: &[T],
    total_bytes: usize,
    fill: impl Fn(&[T], &mut [u8]) + Sync,
) -> Vec<u8> {
    let mut out = vec![0u8; items.len() * KEY_LEN];
    let threads = parallelism().min(items.len());
    if threads < 2 || !worth_splitting(items.len(), total_bytes) {
        fill(items, &mut out);
        return out;
    }
    let per = items.len().div_ceil(threads);
    let fill = &fill;
    std::thread::scope(|s| {
        let mut chunks = items.chunks(per).zip(out.chunks_mut(per * KEY_LEN));
        // The calling thread takes the first chunk itself rather than idling.
        let first = chunks.next();
        for (part, dst) in chunks {
            s.spawn(move || fill(part, dst));
        }
        if let Some((part, dst)) = first {
            fill(part, dst);
        }
    });
    out
}

/// Parse and validate an Arrow offsets buffer (N+1 little-endian int32, or int64 when `large`)
/// against a data buffer of `data_len` bytes, returning the N byte ranges.
///
/// Offsets must be non-negative, non-decreasing and within the data. An empty offsets buffer is an
/// empty column (some Arrow writers emit no offsets for a zero-length array).
pub fn arrow_ranges(
    offsets: &[u8],
    data_len: usize,
    large: bool,
) -> Result<Vec<Range<usize>>, String> {
    let width = if large { 8 } else { 4 };
    if !offsets.len().is_multiple_of(width) {
        return Err(format!(
            "offsets must hold whole int{} values; got {} bytes",
            width * 8,
            offsets.len()
        ));
    }
    // chunks_exact yields exactly `width` bytes, so the conversions below never take the fallback.
    let values = offsets.chunks_exact(width).map(|c| {
        if large {
            <[u8; 8]>::try_from(c).map_or(0, i64::from_le_bytes)
        } else {
            <[u8; 4]>::try_from(c).map_or(0, |b| i64::from(i32::from_le_bytes(b)))
        }
    });
    let mut ranges = Vec::with_capacity((offsets.len() / width).saturating_sub(1));
    let mut prev: Option<usize> = None;
    for (i, v) in values.enumerate() {
        let cur = usize::try_from(v)
            .ok()
            .filter(|&c| c <= data_len)
            .ok_or_else(|| {
                format!("offsets[{i}] = {v} is outside the data buffer of {data_len} bytes")
            })?;
        if let Some(p) = prev {
            if cur < p {
                return Err(format!(
                    "offsets must be non-decreasing; offsets[{i}] = {cur} < offsets[{}] = {p}",
                    i - 1
                ));
            }
            ranges.push(p..cur);
        }
        prev = Some(cur);
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(k: &[u8]) -> String {
        k.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn md5_known_vectors() {
        assert_eq!(hex(&content_key(b"")), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(
            hex(&content_key(b"abc")),
            "900150983cd24fb0d6963f7d28e17f72"
        );
    }

    #[test]
    fn explicit_keys_live_in_their_own_domain() {
        assert_ne!(explicit_key(b"abc"), content_key(b"abc"));
        let mut tagged = EXPLICIT_DOMAIN.to_vec();
        tagged.extend_from_slice(b"abc");
        assert_eq!(explicit_key(b"abc"), content_key(&tagged));
        assert_ne!(explicit_key(b"abc"), explicit_key(b"abd"));
    }

    #[test]
    fn explicit_id_bounds() {
        assert!(explicit_id_problem(b"").is_some());
        assert!(explicit_id_problem(&[b'x'; 1024]).is_none());
        assert!(explicit_id_problem(&[b'x'; 1025]).is_some());
    }

    #[test]
    fn crc32c_known_vector() {
        assert_eq!(crc32c(0, b"123456789"), 0xE306_9283);
        let running = crc32c(crc32c(0, b"1234"), b"56789");
        assert_eq!(running, 0xE306_9283);
    }

    #[test]
    fn a_batch_is_split_only_for_work_worth_a_thread() {
        // a Spark batch of 10,000 short ids is hashed on the calling thread
        assert!(!worth_splitting(10_000, 10_000 * 37));
        assert!(worth_splitting(20_000, 20_000 * 37));
        assert!(worth_splitting(2, 2 << 20));
        assert!(worth_splitting(10_000, 10_000 * 1024));
        assert!(!worth_splitting(1, usize::MAX));
    }

    #[test]
    fn batch_matches_single_and_parallel() {
        let payloads: Vec<Vec<u8>> = (0..20_000u32)
            .map(|i| i.to_le_bytes().repeat((i % 7) as usize))
            .collect();
        let slices: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        let out = hash_batch(&slices, 0, content_keys_into);
        assert_eq!(out.len(), payloads.len() * KEY_LEN);
        for (p, k) in payloads.iter().zip(out.chunks_exact(KEY_LEN)) {
            assert_eq!(k, content_key(p));
        }
        let small = hash_batch(&slices[..3], 1 << 30, content_keys_into);
        assert_eq!(small, out[..3 * KEY_LEN]);
        assert!(hash_batch::<&[u8]>(&[], 1 << 30, content_keys_into).is_empty());
        let one = hash_batch(&slices[..1], 1 << 30, content_keys_into);
        assert_eq!(one, out[..KEY_LEN]);
        let ids = hash_batch(&slices, 0, |part, dst| {
            each_key_into(part, dst, |p| explicit_key(p))
        });
        for (p, k) in slices.iter().zip(ids.chunks_exact(KEY_LEN)) {
            assert_eq!(k, explicit_key(p));
        }
    }

    #[test]
    fn arrow_offsets() {
        let offs: Vec<u8> = [0i32, 3, 3, 5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            arrow_ranges(&offs, 5, false).unwrap(),
            vec![0..3, 3..3, 3..5]
        );
        assert!(arrow_ranges(&offs, 4, false).is_err());
        let large: Vec<u8> = [2i64, 4].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(arrow_ranges(&large, 4, true).unwrap(), vec![2..4]);
        let back: Vec<u8> = [0i32, 3, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert!(arrow_ranges(&back, 9, false).is_err());
        let neg: Vec<u8> = [-1i32, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert!(arrow_ranges(&neg, 9, false).is_err());
        assert!(arrow_ranges(&[0, 0, 0], 9, false).is_err());
        assert!(arrow_ranges(&[], 0, false).unwrap().is_empty());
        assert!(arrow_ranges(&0i32.to_le_bytes(), 0, false)
            .unwrap()
            .is_empty());
    }
}
