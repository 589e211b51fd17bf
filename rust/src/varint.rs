//! LEB128 varints and zigzag, the column encoding of the dedup snapshot. The reader is total: every
//! input either decodes or yields an error, never a panic.

/// Append `v` as an unsigned LEB128 varint (1..=10 bytes).
pub fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Zigzag-map a signed value so small magnitudes of either sign give short varints.
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Inverse of [`zigzag`].
pub fn unzigzag(u: u64) -> i64 {
    ((u >> 1) as i64) ^ -((u & 1) as i64)
}

/// Append `v` zigzag-encoded.
pub fn put_svarint(out: &mut Vec<u8>, v: i64) {
    put_uvarint(out, zigzag(v));
}

/// A cursor over one varint column.
pub struct VarintReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> VarintReader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// True when every byte has been consumed.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// Next unsigned varint; `Err` on truncation or a value that does not fit 64 bits.
    pub fn uvarint(&mut self) -> Result<u64, &'static str> {
        let mut value = 0u64;
        for i in 0..10u32 {
            let byte = *self.buf.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            // The tenth byte may only carry the single remaining bit of a u64.
            if i == 9 && byte > 1 {
                return Err("varint overflows 64 bits");
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint longer than 10 bytes")
    }

    /// Next zigzag varint.
    pub fn svarint(&mut self) -> Result<i64, &'static str> {
        self.uvarint().map(unzigzag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_edges() {
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
        let mut r = VarintReader::new(&buf);
        for &v in &values {
            assert_eq!(r.svarint().unwrap(), v);
        }
        assert!(r.is_empty());
        assert!(r.uvarint().is_err());
    }

    #[test]
    fn sizes() {
        let mut b = Vec::new();
        put_uvarint(&mut b, u64::MAX);
        assert_eq!(b.len(), 10);
        b.clear();
        put_svarint(&mut b, 12);
        assert_eq!(b, [24]);
    }

    #[test]
    fn rejects_overlong_and_overflow() {
        assert!(VarintReader::new(&[0xff; 11]).uvarint().is_err());
        let mut over = vec![0xff; 9];
        over.push(0x02);
        assert!(VarintReader::new(&over).uvarint().is_err());
        let mut max = vec![0xff; 9];
        max.push(0x01);
        assert_eq!(VarintReader::new(&max).uvarint().unwrap(), u64::MAX);
        assert!(VarintReader::new(&[0x80]).uvarint().is_err());
    }
}
