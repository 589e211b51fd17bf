//! LogStore records: a `LogEntry` protobuf message behind `length u32 | crc32c u32`
//! (`proto/logstore.proto`). The writer encodes each entry once, here, so resends are
//! byte-identical; nodes count and split frames without parsing the entries.

use prost::bytes::BufMut;
use prost::encoding::{
    decode_key, decode_varint, encode_key, encode_varint, encoded_len_varint, key_len, WireType,
};

/// Record header: entry length and CRC32C of the entry bytes, both little-endian u32.
pub const RECORD_HEADER_LEN: usize = 8;

/// The fields of one entry, borrowed from the caller.
pub struct EntryFields<'a> {
    pub segment_id: i64,
    pub entry_id: i64,
    pub timestamp_ms: i64,
    pub payload: &'a [u8],
    pub properties: &'a [(&'a [u8], &'a [u8])],
    pub idempotency_key: &'a [u8],
}

fn put_int64(out: &mut impl BufMut, field: u32, v: i64) {
    if v != 0 {
        encode_key(field, WireType::Varint, out);
        encode_varint(v as u64, out); // proto3 int64: two's complement as a 64-bit varint
    }
}

fn int64_len(field: u32, v: i64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(field) + encoded_len_varint(v as u64)
    }
}

/// A length-delimited field from a borrowed slice (prost's `bytes::encode` wants an owned
/// `BytesAdapter`, which would copy every payload once more).
fn put_bytes(out: &mut impl BufMut, field: u32, v: &[u8]) {
    encode_key(field, WireType::LengthDelimited, out);
    encode_varint(v.len() as u64, out);
    out.put_slice(v);
}

fn bytes_len(field: u32, len: usize) -> usize {
    key_len(field) + encoded_len_varint(len as u64) + len
}

/// The `LogEntry` fields of `e` in field order, proto3 defaults omitted (exactly what
/// protobuf's own serializer emits for these fields).
fn put_entry(out: &mut impl BufMut, e: &EntryFields<'_>) {
    put_int64(out, 1, e.segment_id);
    put_int64(out, 2, e.entry_id);
    put_int64(out, 3, e.timestamp_ms);
    if !e.payload.is_empty() {
        put_bytes(out, 4, e.payload);
    }
    for (k, v) in e.properties {
        // map entry: message { string key = 1; string value = 2; } (both always written, as
        // protobuf's serializer writes map entries)
        encode_key(5, WireType::LengthDelimited, out);
        encode_varint(map_entry_len(k, v) as u64, out);
        put_bytes(out, 1, k);
        put_bytes(out, 2, v);
    }
    if !e.idempotency_key.is_empty() {
        put_bytes(out, 6, e.idempotency_key);
    }
}

fn map_entry_len(k: &[u8], v: &[u8]) -> usize {
    bytes_len(1, k.len()) + bytes_len(2, v.len())
}

/// Bytes of the `LogEntry` of `e` (what [`put_entry`] writes).
fn entry_len(e: &EntryFields<'_>) -> usize {
    let mut n =
        int64_len(1, e.segment_id) + int64_len(2, e.entry_id) + int64_len(3, e.timestamp_ms);
    if !e.payload.is_empty() {
        n += bytes_len(4, e.payload.len());
    }
    for (k, v) in e.properties {
        n += bytes_len(5, map_entry_len(k, v));
    }
    if !e.idempotency_key.is_empty() {
        n += bytes_len(6, e.idempotency_key.len());
    }
    n
}

/// Encode a record: header, then the `LogEntry`.
pub fn encode_record(e: &EntryFields<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(record_len(e));
    encode_record_into(&mut out, e);
    out
}

/// Bytes the record of `e` takes, exactly.
pub fn record_len(e: &EntryFields<'_>) -> usize {
    RECORD_HEADER_LEN + entry_len(e)
}

/// Append the record of `e` to `out` (a frame is records end to end, `count_records`).
pub fn encode_record_into(out: &mut Vec<u8>, e: &EntryFields<'_>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; RECORD_HEADER_LEN]);
    put_entry(out, e);
    seal(&mut out[start..]);
}

/// Write the record of `e` at the start of `out`, which holds at least [`record_len`] bytes;
/// returns how many it wrote. The writer fills a frame's `bytes` in place with it.
pub fn encode_record_at(out: &mut [u8], e: &EntryFields<'_>) -> usize {
    let len = record_len(e);
    let (record, _) = out.split_at_mut(len);
    let mut body = &mut record[RECORD_HEADER_LEN..];
    put_entry(&mut body, e);
    debug_assert!(body.is_empty(), "record_len and put_entry disagree");
    seal(record);
    len
}

/// Fill in the header of `record` (its length and the CRC of the entry after the header).
fn seal(record: &mut [u8]) {
    let (header, body) = record.split_at_mut(RECORD_HEADER_LEN);
    header[..4].copy_from_slice(&(body.len() as u32).to_le_bytes());
    header[4..].copy_from_slice(&crc32c::crc32c(body).to_le_bytes());
}

/// Number of records in a frame, checking that the lengths tile it exactly.
/// Returns the byte offset of the first bad record on failure.
pub fn count_records(frame: &[u8]) -> Result<usize, usize> {
    let mut pos = 0usize;
    let mut count = 0usize;
    while pos < frame.len() {
        let header = frame.get(pos..pos + RECORD_HEADER_LEN).ok_or(pos)?;
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let end = pos
            .checked_add(RECORD_HEADER_LEN + len)
            .filter(|&end| end <= frame.len())
            .ok_or(pos)?;
        pos = end;
        count += 1;
    }
    Ok(count)
}

/// The fields of one stored entry, borrowed from its bytes (the `LogEntry` of a record, without
/// the record header, whose CRC the store checked).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DecodedEntry<'a> {
    pub segment_id: i64,
    pub entry_id: i64,
    pub timestamp_ms: i64,
    pub payload: &'a [u8],
    pub properties: Vec<(&'a str, &'a str)>,
    pub idempotency_key: &'a [u8],
}

fn take_varint(buf: &mut &[u8]) -> Result<u64, String> {
    decode_varint(buf).map_err(|e| format!("bad varint ({e})"))
}

fn take_bytes<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], String> {
    let len = take_varint(buf)?;
    let len = usize::try_from(len).map_err(|_| format!("length {len} too large"))?;
    if len > buf.len() {
        return Err(format!(
            "length {len} runs past the end ({} bytes left)",
            buf.len()
        ));
    }
    let (head, tail) = buf.split_at(len);
    *buf = tail;
    Ok(head)
}

fn take_str<'a>(buf: &mut &'a [u8], what: &str) -> Result<&'a str, String> {
    std::str::from_utf8(take_bytes(buf)?).map_err(|_| format!("{what} is not UTF-8"))
}

/// Skip a field this version does not know (proto3: newer writers may add fields).
fn skip(buf: &mut &[u8], wire: WireType) -> Result<(), String> {
    let n = match wire {
        WireType::Varint => return take_varint(buf).map(|_| ()),
        WireType::LengthDelimited => return take_bytes(buf).map(|_| ()),
        WireType::SixtyFourBit => 8,
        WireType::ThirtyTwoBit => 4,
        WireType::StartGroup | WireType::EndGroup => return Err("group fields".into()),
    };
    if buf.len() < n {
        return Err("fixed field runs past the end".into());
    }
    *buf = &buf[n..];
    Ok(())
}

fn map_entry(mut buf: &[u8]) -> Result<(&str, &str), String> {
    let (mut k, mut v) = ("", "");
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf).map_err(|e| format!("bad key ({e})"))?;
        match (tag, wire) {
            (1, WireType::LengthDelimited) => k = take_str(&mut buf, "property name")?,
            (2, WireType::LengthDelimited) => v = take_str(&mut buf, "property value")?,
            _ => skip(&mut buf, wire)?,
        }
    }
    Ok((k, v))
}

/// Parse a `LogEntry` (what protobuf's parser accepts for it: fields in any order, the last of
/// a repeated scalar wins, unknown fields skipped); an error says what is wrong.
pub fn decode_entry(mut buf: &[u8]) -> Result<DecodedEntry<'_>, String> {
    let mut e = DecodedEntry::default();
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf).map_err(|err| format!("bad key ({err})"))?;
        match (tag, wire) {
            (1, WireType::Varint) => e.segment_id = take_varint(&mut buf)? as i64,
            (2, WireType::Varint) => e.entry_id = take_varint(&mut buf)? as i64,
            (3, WireType::Varint) => e.timestamp_ms = take_varint(&mut buf)? as i64,
            (4, WireType::LengthDelimited) => e.payload = take_bytes(&mut buf)?,
            (5, WireType::LengthDelimited) => e.properties.push(map_entry(take_bytes(&mut buf)?)?),
            (6, WireType::LengthDelimited) => e.idempotency_key = take_bytes(&mut buf)?,
            (1..=6, _) => return Err(format!("field {tag} has wire type {wire:?}")),
            _ => skip(&mut buf, wire)?,
        }
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_header_and_count() {
        let props: [(&[u8], &[u8]); 1] = [(b"k", b"v")];
        let r = encode_record(&EntryFields {
            segment_id: 3,
            entry_id: 0,
            timestamp_ms: 1_700_000_000_000,
            payload: b"hello",
            properties: &props,
            idempotency_key: &[7u8; 16],
        });
        let len = u32::from_le_bytes(r[0..4].try_into().unwrap()) as usize;
        assert_eq!(len, r.len() - RECORD_HEADER_LEN);
        let crc = u32::from_le_bytes(r[4..8].try_into().unwrap());
        assert_eq!(crc, crc32c::crc32c(&r[8..]));
        // segment_id=3 first, entry_id=0 omitted, then the timestamp tag
        assert_eq!(&r[8..10], &[0x08, 3]);
        assert_eq!(r[10], 0x18);
        let mut frame = r.clone();
        frame.extend_from_slice(&r);
        assert_eq!(count_records(&frame), Ok(2));
        assert_eq!(count_records(&frame[..frame.len() - 1]), Err(r.len()));
        assert_eq!(count_records(&[1, 2, 3]), Err(0));
        assert_eq!(count_records(&[]), Ok(0));
        let mut into = vec![9u8];
        encode_record_into(
            &mut into,
            &EntryFields {
                entry_id: 1,
                ..fields(&props)
            },
        );
        encode_record_into(
            &mut into,
            &EntryFields {
                entry_id: 2,
                ..fields(&props)
            },
        );
        let one = encode_record(&EntryFields {
            entry_id: 1,
            ..fields(&props)
        });
        let two = encode_record(&EntryFields {
            entry_id: 2,
            ..fields(&props)
        });
        assert_eq!(into, [&[9u8][..], &one, &two].concat());
    }

    /// `record_len` is exact and `encode_record_at` writes what `encode_record` makes, across
    /// varint widths (0, 1, 5, 10 bytes), empty and long payloads, properties and keys.
    #[test]
    fn records_written_in_place_are_the_records() {
        let long = vec![b'p'; 300];
        let props: [(&[u8], &[u8]); 2] = [(b"k", b"v"), (&long, b"")];
        for ids in [0i64, 1, 127, 128, 1 << 35, -1] {
            for payload in [&b""[..], b"x", &long] {
                for (properties, key) in [(&props[..], &[3u8; 16][..]), (&[][..], &[][..])] {
                    let e = EntryFields {
                        segment_id: ids,
                        entry_id: ids / 2,
                        timestamp_ms: ids,
                        payload,
                        properties,
                        idempotency_key: key,
                    };
                    let want = encode_record(&e);
                    assert_eq!(record_len(&e), want.len());
                    let mut at = vec![0xAAu8; want.len() + 3];
                    assert_eq!(encode_record_at(&mut at, &e), want.len());
                    assert_eq!(&at[..want.len()], &want[..]);
                    assert_eq!(&at[want.len()..], &[0xAA; 3]);
                }
            }
        }
    }

    fn fields<'a>(props: &'a [(&'a [u8], &'a [u8])]) -> EntryFields<'a> {
        EntryFields {
            segment_id: 3,
            entry_id: 0,
            timestamp_ms: 1_700_000_000_000,
            payload: b"hello",
            properties: props,
            idempotency_key: &[7u8; 16],
        }
    }

    /// The exact bytes of a record reaching a 10-byte varint (a negative int64), a 6-byte one
    /// and a two-byte length prefix; `tests/core/test_core_golden.py` pins the same bytes.
    #[test]
    fn golden_bytes() {
        let long_key = [b'x'; 200];
        let props: [(&[u8], &[u8]); 2] = [(b"k", b"v"), (&long_key, b"")];
        let key = crate::keys::content_key(b"a");
        let r = encode_record(&EntryFields {
            segment_id: -1,
            entry_id: 1 << 40,
            timestamp_ms: 1_700_000_000_000,
            payload: b"payload",
            properties: &props,
            idempotency_key: &key,
        });
        let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
        let expected = [
            "0c01000074b87efa08ffffffffffffffffff01108080808080201880d095ffbc3122077061796c6f61642a",
            "060a016b1201762acd010ac801",
            &"78".repeat(200),
            "120032100cc175b9c0f1b6a831c399e269772661",
        ]
        .concat();
        assert_eq!(hex, expected);
    }

    #[test]
    fn decode_reads_what_encode_wrote() {
        let props: [(&[u8], &[u8]); 2] = [(b"a", b"1"), (b"b", b"")];
        let r = encode_record(&EntryFields {
            segment_id: 7,
            entry_id: 0,
            timestamp_ms: -5,
            payload: b"hello",
            properties: &props,
            idempotency_key: &[9u8; 16],
        });
        let e = decode_entry(&r[RECORD_HEADER_LEN..]).unwrap();
        assert_eq!((e.segment_id, e.entry_id, e.timestamp_ms), (7, 0, -5));
        assert_eq!(e.payload, b"hello");
        assert_eq!(e.properties, vec![("a", "1"), ("b", "")]);
        assert_eq!(e.idempotency_key, &[9u8; 16]);
        // an empty message is all defaults; a cut payload, a bad wire type and bad UTF-8 fail
        assert_eq!(decode_entry(b"").unwrap(), DecodedEntry::default());
        assert!(decode_entry(&r[RECORD_HEADER_LEN..r.len() - 20]).is_err());
        assert!(decode_entry(&[0x22, 0x05, b'x']).is_err());
        assert!(decode_entry(&[0x0a, 0x00]).is_err()); // field 1 as bytes
        assert!(decode_entry(&[0x2a, 0x04, 0x0a, 0x02, 0xff, 0xfe]).is_err());
        // unknown fields are skipped
        assert_eq!(
            decode_entry(&[0x38, 0x01, 0x08, 0x02]).unwrap().segment_id,
            2
        );
    }
}
