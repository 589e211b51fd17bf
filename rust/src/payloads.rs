//! A batch of payloads as one buffer and its offsets (Arrow's binary layout): row `i` is
//! `data[offsets[i]..offsets[i + 1]]`. Made without a copy from an Arrow binary or string column
//! (its buffers are shared, not copied), or in one pass from a list of byte strings; the bytes of
//! any range of rows, and where a run of rows fits a byte limit, come from the offsets alone,
//! without touching the rows. Immutable once made, so it is read without any lock.

use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};

/// The offsets, as the Arrow column had them (`i32` for binary and string, `i64` for the large
/// types) or as a batch built here has them (`i64`).
#[derive(Clone, Debug)]
enum Offsets {
    Small(OffsetBuffer<i32>),
    Large(OffsetBuffer<i64>),
}

/// The payloads of a batch; see the module documentation.
#[derive(Clone, Debug)]
pub struct Payloads {
    data: Buffer,
    offsets: Offsets,
    longest: usize,
}

/// Why offsets from elsewhere cannot be rows of their data.
#[derive(Debug, PartialEq, Eq)]
pub struct BadOffsets(pub String);

impl Payloads {
    /// The rows laid end to end in one new buffer, in one pass.
    pub fn from_rows<'a>(rows: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let rows = rows.into_iter();
        let mut data = Vec::new();
        let mut offsets = Vec::with_capacity(rows.size_hint().0 + 1);
        offsets.push(0i64);
        let mut longest = 0;
        for row in rows {
            data.extend_from_slice(row);
            longest = longest.max(row.len());
            // a Vec never holds more than isize::MAX bytes, so its length fits i64
            offsets.push(data.len() as i64);
        }
        Self::owned(data, offsets, longest)
    }

    /// Rows already laid end to end: `ends[i]` is where row `i` ends in `data` (the first
    /// starts at 0), each at or after the one before, the last at most `data.len()`.
    pub fn from_ends(data: Vec<u8>, ends: &[usize]) -> Result<Self, BadOffsets> {
        let mut offsets = Vec::with_capacity(ends.len() + 1);
        offsets.push(0i64);
        let mut longest = 0;
        let mut at = 0;
        for (i, &end) in ends.iter().enumerate() {
            if end < at || end > data.len() {
                return Err(BadOffsets(format!(
                    "row {i} ends at {end}, before its start {at} or past the {} bytes",
                    data.len()
                )));
            }
            longest = longest.max(end - at);
            at = end;
            offsets.push(end as i64);
        }
        Ok(Self::owned(data, offsets, longest))
    }

    fn owned(data: Vec<u8>, offsets: Vec<i64>, longest: usize) -> Self {
        Payloads {
            data: Buffer::from_vec(data),
            // from_rows and from_ends make them start at 0 and never decrease
            offsets: Offsets::Large(OffsetBuffer::new(ScalarBuffer::from(offsets))),
            longest,
        }
    }

    /// The rows of an Arrow binary or string column: `data` (the values buffer) and `offsets`
    /// shared, not copied. The offsets are checked to lie within `data` (Arrow promises it; a
    /// producer that broke the promise gets an error, not a bad read).
    pub fn from_arrow_i32(data: Buffer, offsets: OffsetBuffer<i32>) -> Result<Self, BadOffsets> {
        let longest = check(offsets.iter().map(|&o| o as i64), data.len())?;
        Ok(Payloads {
            data,
            offsets: Offsets::Small(offsets),
            longest,
        })
    }

    /// [`Payloads::from_arrow_i32`] for the large types (int64 offsets).
    pub fn from_arrow_i64(data: Buffer, offsets: OffsetBuffer<i64>) -> Result<Self, BadOffsets> {
        let longest = check(offsets.iter().copied(), data.len())?;
        Ok(Payloads {
            data,
            offsets: Offsets::Large(offsets),
            longest,
        })
    }

    /// Number of rows.
    #[inline]
    pub fn len(&self) -> usize {
        match &self.offsets {
            Offsets::Small(o) => o.len() - 1,
            Offsets::Large(o) => o.len() - 1,
        }
    }

    /// The byte offset in `data` where row `i` starts (`i == len()`: where the last one ends).
    #[inline]
    fn offset(&self, i: usize) -> usize {
        // checked when made: every offset is within 0..=data.len()
        match &self.offsets {
            Offsets::Small(o) => o[i] as usize,
            Offsets::Large(o) => o[i] as usize,
        }
    }

    /// Row `i` (`i < len()`).
    #[inline]
    pub fn row(&self, i: usize) -> &[u8] {
        &self.data[self.offset(i)..self.offset(i + 1)]
    }

    /// The rows `start..end` (within `len()`), each as its bytes.
    pub fn rows(&self, start: usize, end: usize) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (start..end).map(|i| self.row(i))
    }

    /// Bytes of the rows `start..end` (`start <= end <= len()`), from two offsets.
    #[inline]
    pub fn nbytes(&self, start: usize, end: usize) -> usize {
        self.offset(end) - self.offset(start)
    }

    /// The length of the longest row.
    pub fn longest(&self) -> usize {
        self.longest
    }

    /// The first row longer than `max_bytes`, if any (no row is read when none is).
    pub fn first_longer(&self, max_bytes: usize) -> Option<usize> {
        if self.longest <= max_bytes {
            return None;
        }
        (0..self.len()).find(|&i| self.nbytes(i, i + 1) > max_bytes)
    }

    /// `(bytes, end)`: the rows from `start` (before `end`) whose bytes, `overhead` more each,
    /// fit `limit` (at least one row), and what they count. The count grows with each row, so
    /// the end is found by bisection over the offsets.
    pub fn fit(&self, start: usize, end: usize, limit: usize, overhead: usize) -> (usize, usize) {
        let cost = |stop: usize| self.nbytes(start, stop) + overhead * (stop - start);
        if start >= end || cost(end) <= limit {
            return (cost(end.max(start)), end.max(start));
        }
        // the largest stop in start+1..end with cost(stop) <= limit, or start+1
        let (mut lo, mut hi) = (start + 1, end);
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if cost(mid) <= limit {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (cost(lo), lo)
    }

    /// The rows `start..end` (within `len()`), sharing this batch's buffers.
    pub fn slice(&self, start: usize, end: usize) -> Self {
        let offsets = match &self.offsets {
            Offsets::Small(o) => Offsets::Small(o.slice(start, end - start)),
            Offsets::Large(o) => Offsets::Large(o.slice(start, end - start)),
        };
        let longest = if start == 0 && end == self.len() {
            self.longest
        } else {
            (start..end)
                .map(|i| self.nbytes(i, i + 1))
                .max()
                .unwrap_or(0)
        };
        Payloads {
            data: self.data.clone(),
            offsets,
            longest,
        }
    }

    /// The given rows (each `< len()`), in the order given, copied into a new batch.
    pub fn take(&self, rows: impl IntoIterator<Item = usize>) -> Self {
        Self::from_rows(rows.into_iter().map(|i| self.row(i)))
    }

    /// The buffers as Arrow has them: values, and offsets of `i32` (`Ok`) or `i64` (`Err`).
    pub fn arrow_parts(&self) -> (&Buffer, Result<&OffsetBuffer<i32>, &OffsetBuffer<i64>>) {
        match &self.offsets {
            Offsets::Small(o) => (&self.data, Ok(o)),
            Offsets::Large(o) => (&self.data, Err(o)),
        }
    }
}

impl PartialEq for Payloads {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && (0..self.len()).all(|i| self.row(i) == other.row(i))
    }
}

/// The longest row of `offsets` over `len` bytes of data, checking that they never decrease
/// and stay within the data (an `OffsetBuffer` starts at or after 0 and never decreases, but a
/// slice of a larger column may start past 0: only the end is checked against `len`).
fn check(offsets: impl Iterator<Item = i64>, len: usize) -> Result<usize, BadOffsets> {
    let mut longest = 0usize;
    let mut prev: Option<i64> = None;
    for (i, o) in offsets.enumerate() {
        if o < 0 || o as u64 > len as u64 {
            return Err(BadOffsets(format!(
                "offset {i} is {o}, outside the {len} bytes of the values"
            )));
        }
        if let Some(p) = prev {
            if o < p {
                return Err(BadOffsets(format!("offset {i} ({o}) is before offset {p}")));
            }
            longest = longest.max((o - p) as usize);
        }
        prev = Some(o);
    }
    Ok(longest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(p: &Payloads) -> Vec<Vec<u8>> {
        (0..p.len()).map(|i| p.row(i).to_vec()).collect()
    }

    #[test]
    fn built_from_rows_or_ends_or_arrow_buffers_alike() {
        let want: Vec<&[u8]> = vec![b"a", b"", b"ccc", b"dd"];
        let built = Payloads::from_rows(want.iter().copied());
        assert_eq!(rows(&built), want);
        assert_eq!(built.longest(), 3);
        let ends = Payloads::from_ends(b"acccdd".to_vec(), &[1, 1, 4, 6]).unwrap();
        assert_eq!(ends, built);
        let small = Payloads::from_arrow_i32(
            Buffer::from_vec(b"acccdd".to_vec()),
            OffsetBuffer::new(ScalarBuffer::from(vec![0i32, 1, 1, 4, 6])),
        )
        .unwrap();
        assert_eq!(small, built);
        assert!(Payloads::from_ends(b"ab".to_vec(), &[1, 3]).is_err());
        assert!(Payloads::from_ends(b"ab".to_vec(), &[2, 1]).is_err());
        let past = Payloads::from_arrow_i32(
            Buffer::from_vec(b"ab".to_vec()),
            OffsetBuffer::new(ScalarBuffer::from(vec![0i32, 3])),
        );
        assert!(past.is_err());
    }

    #[test]
    fn byte_ranges_and_limits_from_the_offsets() {
        let p = Payloads::from_rows([&b"aaaa"[..], b"bb", b"", b"cccccc"]);
        assert_eq!(p.nbytes(0, 4), 12);
        assert_eq!(p.nbytes(1, 3), 2);
        assert_eq!(p.first_longer(6), None);
        assert_eq!(p.first_longer(3), Some(0));
        assert_eq!(p.first_longer(4), Some(3));
        // with 10 bytes of overhead per row: 14, 26, 36, 52 cumulated
        assert_eq!(p.fit(0, 4, 100, 10), (52, 4));
        assert_eq!(p.fit(0, 4, 36, 10), (36, 3));
        assert_eq!(p.fit(0, 4, 35, 10), (26, 2));
        assert_eq!(p.fit(0, 4, 1, 10), (14, 1)); // at least one row
        assert_eq!(p.fit(2, 4, 10, 10), (10, 3));
        assert_eq!(p.fit(4, 4, 10, 10), (0, 4));
        for limit in 0..60 {
            for start in 0..4 {
                let (bytes, end) = p.fit(start, 4, limit, 10);
                let mut want = start + 1;
                while want < 4 && p.nbytes(start, want + 1) + 10 * (want + 1 - start) <= limit {
                    want += 1;
                }
                assert_eq!(end, want, "limit {limit} start {start}");
                assert_eq!(bytes, p.nbytes(start, end) + 10 * (end - start));
            }
        }
    }

    #[test]
    fn slices_share_and_takes_copy() {
        let p = Payloads::from_rows([&b"aaaa"[..], b"bb", b"", b"cccccc"]);
        let s = p.slice(1, 3);
        assert_eq!(rows(&s), vec![b"bb".to_vec(), vec![]]);
        assert_eq!(s.longest(), 2);
        assert_eq!(s.nbytes(0, 2), 2);
        assert_eq!(s.arrow_parts().0.as_ptr(), p.arrow_parts().0.as_ptr());
        let t = p.take([3, 0, 3]);
        assert_eq!(
            rows(&t),
            vec![b"cccccc".to_vec(), b"aaaa".to_vec(), b"cccccc".to_vec()]
        );
        assert_eq!(p.take([]).len(), 0);
    }
}
