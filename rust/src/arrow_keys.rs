//! Idempotency keys, canonical-JSON payloads and routes over Arrow columns (no Python here).
//!
//! - Explicit keys of a key column: string -> its UTF-8 bytes, binary -> as is, integer -> its
//!   canonical decimal text (`-12`, `7`), each hashed like `keys::explicit_key` (same domain).
//! - Content keys of a payload column (binary or string): MD5 of the value bytes.
//! - Canonical JSON of a row (see [`json_rows`] for the format), the payload of a row
//!   written without a payload column; its key is the content key of those bytes.
//! - `route(key, P)`: the first 8 key bytes as a big-endian u64, modulo P. Spark computes the same
//!   thing natively (`conv(substr(hex(md5), 1, 16), 16, 10) % P`), and the writer recomputes it.
//!
//! A null key or payload, an empty or oversized id, or a type without a defined form is an error
//! naming the column and the row (counted across chunks): nothing is keyed by accident.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, StructArray};
use arrow_schema::{DataType, TimeUnit};

use crate::keys::{self, Key, KEY_LEN};
use crate::payloads::{BadOffsets, Payloads};

/// Why a column cannot be keyed: a wrong type, or a bad value (null, empty id, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArrowKeyError {
    Type(String),
    Value(String),
}

pub type Result<T> = std::result::Result<T, ArrowKeyError>;

fn type_err<T>(msg: String) -> Result<T> {
    Err(ArrowKeyError::Type(msg))
}

fn value_err<T>(msg: String) -> Result<T> {
    Err(ArrowKeyError::Value(msg))
}

/// Route of a key among `partitions` logs: first 8 bytes big-endian, modulo `partitions` (>= 1).
pub fn route(key: &Key, partitions: u32) -> u32 {
    let mut head = [0u8; 8];
    head.copy_from_slice(&key[..8]);
    // The remainder is below `partitions`, a u32, so the cast is lossless.
    (u64::from_be_bytes(head) % u64::from(partitions.max(1))) as u32
}

/// Routes of N*16 key bytes.
pub fn routes(keys: &[u8], partitions: u32) -> Vec<u32> {
    keys.as_chunks::<KEY_LEN>()
        .0
        .iter()
        .map(|k| route(k, partitions))
        .collect()
}

/// Byte views of the string and binary types.
enum ByteCol<'a> {
    Utf8(&'a arrow_array::StringArray),
    LargeUtf8(&'a arrow_array::LargeStringArray),
    Utf8View(&'a arrow_array::StringViewArray),
    Binary(&'a arrow_array::BinaryArray),
    LargeBinary(&'a arrow_array::LargeBinaryArray),
    BinaryView(&'a arrow_array::BinaryViewArray),
    Fixed(&'a arrow_array::FixedSizeBinaryArray),
}

impl<'a> ByteCol<'a> {
    fn of(arr: &'a dyn Array) -> Option<Self> {
        Some(match arr.data_type() {
            DataType::Utf8 => Self::Utf8(arr.as_string::<i32>()),
            DataType::LargeUtf8 => Self::LargeUtf8(arr.as_string::<i64>()),
            DataType::Utf8View => Self::Utf8View(arr.as_string_view()),
            DataType::Binary => Self::Binary(arr.as_binary::<i32>()),
            DataType::LargeBinary => Self::LargeBinary(arr.as_binary::<i64>()),
            DataType::BinaryView => Self::BinaryView(arr.as_binary_view()),
            DataType::FixedSizeBinary(_) => Self::Fixed(arr.as_fixed_size_binary()),
            _ => return None,
        })
    }

    fn value(&self, i: usize) -> &'a [u8] {
        match self {
            Self::Utf8(a) => a.value(i).as_bytes(),
            Self::LargeUtf8(a) => a.value(i).as_bytes(),
            Self::Utf8View(a) => a.value(i).as_bytes(),
            Self::Binary(a) => a.value(i),
            Self::LargeBinary(a) => a.value(i),
            Self::BinaryView(a) => a.value(i),
            Self::Fixed(a) => a.value(i),
        }
    }

    fn is_text(&self) -> bool {
        matches!(self, Self::Utf8(_) | Self::LargeUtf8(_) | Self::Utf8View(_))
    }
}

fn is_integer(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
    )
}

/// Value `i` of an integer column as i128 (wide enough for every Arrow integer type).
fn int_value(arr: &dyn Array, i: usize) -> i128 {
    match arr.data_type() {
        DataType::Int8 => arr.as_primitive::<Int8Type>().value(i).into(),
        DataType::Int16 => arr.as_primitive::<Int16Type>().value(i).into(),
        DataType::Int32 => arr.as_primitive::<Int32Type>().value(i).into(),
        DataType::Int64 => arr.as_primitive::<Int64Type>().value(i).into(),
        DataType::UInt8 => arr.as_primitive::<UInt8Type>().value(i).into(),
        DataType::UInt16 => arr.as_primitive::<UInt16Type>().value(i).into(),
        DataType::UInt32 => arr.as_primitive::<UInt32Type>().value(i).into(),
        DataType::UInt64 => arr.as_primitive::<UInt64Type>().value(i).into(),
        _ => 0,
    }
}

/// Fails on the first null of `arr`, naming it as row `base + i` of `what`.
fn no_nulls(arr: &dyn Array, base: usize, what: &str) -> Result<()> {
    if arr.null_count() == 0 {
        return Ok(());
    }
    let i = (0..arr.len()).find(|&i| arr.is_null(i)).unwrap_or(0);
    value_err(format!(
        "{what} is null at row {}: every row needs a value",
        base + i
    ))
}

/// Explicit keys of a key column (string, binary or integer), N*16 bytes. Each id is hashed like
/// `keys::explicit_key` (MD5 of the domain tag and the id): the tagged ids are laid end to end
/// and hashed many at a time (`md5x`, several lanes per core), not one scalar MD5 per row.
pub fn explicit_keys(chunks: &[ArrayRef], what: &str) -> Result<Vec<u8>> {
    let rows: usize = chunks.iter().map(|c| c.len()).sum();
    let mut tagged = Vec::with_capacity(rows * (keys::EXPLICIT_DOMAIN.len() + 12));
    let mut ends = Vec::with_capacity(rows);
    let mut base = 0;
    for chunk in chunks {
        let arr = chunk.as_ref();
        no_nulls(arr, base, what)?;
        if let Some(col) = ByteCol::of(arr) {
            for i in 0..arr.len() {
                let id = col.value(i);
                if let Some(problem) = keys::explicit_id_problem(id) {
                    return value_err(format!("{what} at row {}: the id {problem}", base + i));
                }
                tagged.extend_from_slice(keys::EXPLICIT_DOMAIN);
                tagged.extend_from_slice(id);
                ends.push(tagged.len());
            }
        } else if is_integer(arr.data_type()) {
            for i in 0..arr.len() {
                tagged.extend_from_slice(keys::EXPLICIT_DOMAIN);
                push_decimal(&mut tagged, int_value(arr, i));
                ends.push(tagged.len());
            }
        } else {
            return type_err(format!(
                "{what} has type {}; a key column must be string, binary or integer",
                arr.data_type()
            ));
        }
        base += arr.len();
    }
    let mut msgs: Vec<&[u8]> = Vec::with_capacity(ends.len());
    let mut start = 0;
    for &end in &ends {
        msgs.push(tagged.get(start..end).unwrap_or_default());
        start = end;
    }
    Ok(keys::hash_batch(
        &msgs,
        tagged.len(),
        keys::content_keys_into,
    ))
}

/// The canonical decimal text of `v` (`-12`, `7`: what `format!("{v}")` gives), appended.
fn push_decimal(out: &mut Vec<u8>, v: i128) {
    if v < 0 {
        out.push(b'-');
    }
    let mut m = v.unsigned_abs();
    let mut digits = [0u8; 40];
    let mut at = digits.len();
    loop {
        at -= 1;
        // u64 arithmetic (a multiply, not a 128-bit division) for every value an Arrow integer
        // column below 2^64 holds.
        let (q, r) = match u64::try_from(m) {
            Ok(small) => (u128::from(small / 10), (small % 10) as u8),
            Err(_) => (m / 10, (m % 10) as u8),
        };
        digits[at] = b'0' + r;
        m = q;
        if m == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// `v` scaled by 10^-`scale` (`scale` > 0) as Arrow's `value_as_string` writes it, `-1.50`,
/// `0.05`: its digits written in place, then the point (and leading zeros) put in.
fn push_scaled(out: &mut Vec<u8>, v: i128, scale: usize) {
    let start = out.len() + usize::from(v < 0);
    push_decimal(out, v);
    let digits = out.len() - start;
    if digits <= scale {
        let zeros = scale - digits;
        out.splice(
            start..start,
            b"0."
                .iter()
                .copied()
                .chain(std::iter::repeat_n(b'0', zeros)),
        );
    } else {
        out.insert(out.len() - scale, b'.');
    }
}

/// Values of a payload column (binary or string), each as its bytes, in order.
pub fn payload_values<'a>(chunks: &'a [ArrayRef], what: &str) -> Result<Vec<&'a [u8]>> {
    let mut out = Vec::with_capacity(chunks.iter().map(|c| c.len()).sum());
    let mut base = 0;
    for chunk in chunks {
        let arr = chunk.as_ref();
        let Some(col) = ByteCol::of(arr) else {
            return type_err(format!(
                "{what} has type {}; a payload column must be binary or string",
                arr.data_type()
            ));
        };
        no_nulls(arr, base, what)?;
        out.extend((0..arr.len()).map(|i| col.value(i)));
        base += arr.len();
    }
    Ok(out)
}

/// Content keys (MD5) of byte strings, N*16 bytes; large batches use several cores.
pub fn content_keys(values: &[&[u8]]) -> Vec<u8> {
    let total = values.iter().map(|v| v.len()).sum();
    keys::hash_batch(values, total, keys::content_keys_into)
}

/// The payloads of a payload column (binary or string): its buffers shared, not copied, when it
/// is one chunk of a binary or string type with 32- or 64-bit offsets; otherwise (several
/// chunks, views, fixed-size binary) the values copied into one buffer, in one pass.
pub fn payload_column(chunks: &[ArrayRef], what: &str) -> Result<Payloads> {
    let shared = |p: std::result::Result<Payloads, BadOffsets>| {
        p.map_err(|BadOffsets(why)| ArrowKeyError::Value(format!("{what}: {why}")))
    };
    if let [chunk] = chunks {
        let arr = chunk.as_ref();
        no_nulls(arr, 0, what)?;
        match arr.data_type() {
            DataType::Binary => {
                let a = arr.as_binary::<i32>();
                return shared(Payloads::from_arrow_i32(
                    a.values().clone(),
                    a.offsets().clone(),
                ));
            }
            DataType::Utf8 => {
                let a = arr.as_string::<i32>();
                return shared(Payloads::from_arrow_i32(
                    a.values().clone(),
                    a.offsets().clone(),
                ));
            }
            DataType::LargeBinary => {
                let a = arr.as_binary::<i64>();
                return shared(Payloads::from_arrow_i64(
                    a.values().clone(),
                    a.offsets().clone(),
                ));
            }
            DataType::LargeUtf8 => {
                let a = arr.as_string::<i64>();
                return shared(Payloads::from_arrow_i64(
                    a.values().clone(),
                    a.offsets().clone(),
                ));
            }
            _ => {}
        }
    }
    Ok(Payloads::from_rows(payload_values(chunks, what)?))
}

/// The top-level columns of a batch chunk (a struct array), with their names.
pub fn struct_of<'a>(chunk: &'a ArrayRef, what: &str) -> Result<&'a StructArray> {
    match chunk.data_type() {
        DataType::Struct(_) => Ok(chunk.as_struct()),
        dt => type_err(format!(
            "{what} must be a record batch or table (a struct of columns), not {dt}"
        )),
    }
}

/// Canonical JSON of every row of `chunks` (struct arrays: record batches), leaving out the
/// top-level columns named in `exclude`; the format every process must agree on:
/// - objects (rows, structs): fields sorted by the UTF-8 bytes of their names, `{"a":1,"b":2}`,
///   no whitespace, null fields written as `null`;
/// - strings: UTF-8 as is, escaping only `"`, `\` and control characters (`\b \f \n \r \t`, other
///   ones as `\u00XX` with lowercase hex), like Python's `json.dumps(..., ensure_ascii=False)`;
/// - integers: decimal; decimal128: its exact text with its scale (`1.50`);
/// - floats: ECMAScript's shortest round-trip form (RFC 8785): `1`, `0.1`, `1e+21`, `1.5e-7`;
///   float32 values use their own shortest digits (float32 0.1 -> `0.1`); NaN and infinities are
///   refused;
/// - binary: standard padded base64 in a string;
/// - date: `"YYYY-MM-DD"`; timestamp: the instant in UTC, `"YYYY-MM-DDTHH:MM:SS[.fff]Z"` with 0, 3,
///   6 or 9 fraction digits (the fewest that are exact, whatever the unit);
/// - lists: `[v,...]`.
///
/// Each column is made ready once per chunk ([`Col`]), then its values are written row by row.
pub fn json_rows(chunks: &[ArrayRef], exclude: &[String]) -> Result<Payloads> {
    let mut data = Vec::new();
    let mut ends = Vec::with_capacity(chunks.iter().map(|c| c.len()).sum());
    let mut base = 0;
    for chunk in chunks {
        let batch = struct_of(chunk, "the batch")?;
        let fields = sorted_fields(batch, &|name| !exclude.iter().any(|e| e == name))?;
        data.reserve(batch.len() * 64);
        for i in 0..batch.len() {
            write_object(&fields, i, &mut data).map_err(|e| at_row(e, base + i))?;
            ends.push(data.len());
        }
        base += batch.len();
    }
    // the ends were taken as the rows were written: in order, within the data
    Payloads::from_ends(data, &ends).map_err(|BadOffsets(why)| ArrowKeyError::Value(why))
}

fn at_row(e: ArrowKeyError, row: usize) -> ArrowKeyError {
    match e {
        ArrowKeyError::Value(m) => ArrowKeyError::Value(format!("row {row}: {m}")),
        t => t,
    }
}

/// A column of an object (a row, or a struct column's value): its pre-encoded `"name":` and the
/// column made ready for writing, both once for the whole batch.
struct Field<'a> {
    key: Vec<u8>,
    col: Col<'a>,
}

/// The fields of an object in byte order of their names.
type Fields<'a> = Vec<Field<'a>>;

fn sorted_fields<'a>(s: &'a StructArray, keep: &dyn Fn(&str) -> bool) -> Result<Fields<'a>> {
    let DataType::Struct(defs) = s.data_type() else {
        return Ok(Vec::new());
    };
    let mut named: Vec<(&str, &dyn Array)> = defs
        .iter()
        .zip(s.columns())
        .filter(|(f, _)| keep(f.name()))
        .map(|(f, c)| (f.name().as_str(), c.as_ref()))
        .collect();
    named.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    if let Some(w) = named.windows(2).find(|w| w[0].0 == w[1].0) {
        return value_err(format!(
            "two columns are named '{}': canonical JSON needs unique names",
            w[0].0
        ));
    }
    let mut fields = Vec::with_capacity(named.len());
    for (name, col) in &named {
        // every column's type is checked before any is made ready: the first unsupported one
        // is the error, as it names the column
        check_json_type(col.data_type(), name)?;
    }
    for (name, col) in named {
        let mut key = Vec::with_capacity(name.len() + 3);
        write_json_string(name.as_bytes(), &mut key);
        key.push(b':');
        fields.push(Field {
            key,
            col: Col::of(col)?,
        });
    }
    Ok(fields)
}

fn write_object(fields: &Fields<'_>, i: usize, out: &mut Vec<u8>) -> Result<()> {
    out.push(b'{');
    for (n, field) in fields.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&field.key);
        field.col.write(i, out)?;
    }
    out.push(b'}');
    Ok(())
}

/// Fails unless canonical JSON defines a form for `dt` (checked once per column, up front).
fn check_json_type(dt: &DataType, name: &str) -> Result<()> {
    match dt {
        DataType::Null
        | DataType::Boolean
        | DataType::Float32
        | DataType::Float64
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_)
        | DataType::Date32
        | DataType::Date64
        | DataType::Timestamp(_, _)
        | DataType::Decimal128(_, _) => Ok(()),
        d if is_integer(d) => Ok(()),
        DataType::List(f) | DataType::LargeList(f) => check_json_type(f.data_type(), name),
        DataType::Struct(fs) => fs
            .iter()
            .try_for_each(|f| check_json_type(f.data_type(), name)),
        other => type_err(format!(
            "column '{name}' has type {other}, which canonical JSON does not cover (null, bool, \
             integers, floats, decimal128, strings, binary, dates, timestamps, lists, structs): \
             cast it, or write a payload column"
        )),
    }
}

/// The values of an integer column, of its own width.
enum Ints<'a> {
    I8(&'a [i8]),
    I16(&'a [i16]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    U8(&'a [u8]),
    U16(&'a [u16]),
    U32(&'a [u32]),
    U64(&'a [u64]),
}

impl Ints<'_> {
    fn get(&self, i: usize) -> i128 {
        match self {
            Self::I8(v) => v[i].into(),
            Self::I16(v) => v[i].into(),
            Self::I32(v) => v[i].into(),
            Self::I64(v) => v[i].into(),
            Self::U8(v) => v[i].into(),
            Self::U16(v) => v[i].into(),
            Self::U32(v) => v[i].into(),
            Self::U64(v) => v[i].into(),
        }
    }
}

/// A list column's offsets (they index its values directly: no slice of the values per row).
enum Offsets<'a> {
    Small(&'a [i32]),
    Large(&'a [i64]),
}

/// How a column's values are written, resolved once per batch (a value then costs one match;
/// resolving the type through `dyn Array` for every value cost more than writing most values).
enum Kind<'a> {
    Null,
    Bool(&'a arrow_array::BooleanArray),
    Int(Ints<'a>),
    F32(&'a [f32]),
    F64(&'a [f64]),
    /// Values and scale > 0, written in place
    Scaled(&'a [i128], usize),
    /// Scale <= 0: as Arrow writes it
    Decimal(&'a arrow_array::Decimal128Array),
    Text(ByteCol<'a>),
    Bytes(ByteCol<'a>),
    Date32(&'a [i32]),
    Date64(&'a [i64]),
    /// Values and how many of them make a second
    Timestamp(&'a [i64], i64),
    List(Offsets<'a>, Box<Col<'a>>),
    Struct(Fields<'a>),
}

/// A column ready for canonical JSON: its null bits and how its values are written.
struct Col<'a> {
    nulls: Option<&'a arrow_buffer::NullBuffer>,
    kind: Kind<'a>,
}

impl<'a> Col<'a> {
    /// `arr` made ready; its type must pass `check_json_type`.
    fn of(arr: &'a dyn Array) -> Result<Self> {
        let kind = if let Some(col) = ByteCol::of(arr) {
            if col.is_text() {
                Kind::Text(col)
            } else {
                Kind::Bytes(col)
            }
        } else {
            match arr.data_type() {
                DataType::Null => Kind::Null,
                DataType::Boolean => Kind::Bool(arr.as_boolean()),
                DataType::Int8 => Kind::Int(Ints::I8(arr.as_primitive::<Int8Type>().values())),
                DataType::Int16 => Kind::Int(Ints::I16(arr.as_primitive::<Int16Type>().values())),
                DataType::Int32 => Kind::Int(Ints::I32(arr.as_primitive::<Int32Type>().values())),
                DataType::Int64 => Kind::Int(Ints::I64(arr.as_primitive::<Int64Type>().values())),
                DataType::UInt8 => Kind::Int(Ints::U8(arr.as_primitive::<UInt8Type>().values())),
                DataType::UInt16 => Kind::Int(Ints::U16(arr.as_primitive::<UInt16Type>().values())),
                DataType::UInt32 => Kind::Int(Ints::U32(arr.as_primitive::<UInt32Type>().values())),
                DataType::UInt64 => Kind::Int(Ints::U64(arr.as_primitive::<UInt64Type>().values())),
                DataType::Float32 => Kind::F32(arr.as_primitive::<Float32Type>().values()),
                DataType::Float64 => Kind::F64(arr.as_primitive::<Float64Type>().values()),
                DataType::Decimal128(_, scale) if *scale > 0 => Kind::Scaled(
                    arr.as_primitive::<arrow_array::types::Decimal128Type>()
                        .values(),
                    usize::from(scale.unsigned_abs()),
                ),
                DataType::Decimal128(_, _) => {
                    Kind::Decimal(arr.as_primitive::<arrow_array::types::Decimal128Type>())
                }
                DataType::Date32 => Kind::Date32(arr.as_primitive::<Date32Type>().values()),
                DataType::Date64 => Kind::Date64(arr.as_primitive::<Date64Type>().values()),
                DataType::Timestamp(unit, _) => match unit {
                    TimeUnit::Second => {
                        Kind::Timestamp(arr.as_primitive::<TimestampSecondType>().values(), 1)
                    }
                    TimeUnit::Millisecond => Kind::Timestamp(
                        arr.as_primitive::<TimestampMillisecondType>().values(),
                        1_000,
                    ),
                    TimeUnit::Microsecond => Kind::Timestamp(
                        arr.as_primitive::<TimestampMicrosecondType>().values(),
                        1_000_000,
                    ),
                    TimeUnit::Nanosecond => Kind::Timestamp(
                        arr.as_primitive::<TimestampNanosecondType>().values(),
                        1_000_000_000,
                    ),
                },
                DataType::List(_) => {
                    let list = arr.as_list::<i32>();
                    let items = Col::of(list.values().as_ref())?;
                    Kind::List(Offsets::Small(list.value_offsets()), Box::new(items))
                }
                DataType::LargeList(_) => {
                    let list = arr.as_list::<i64>();
                    let items = Col::of(list.values().as_ref())?;
                    Kind::List(Offsets::Large(list.value_offsets()), Box::new(items))
                }
                // A struct column's children are indexed as the column is (arrow slices them
                // with it), so its fields serve every row of this batch.
                DataType::Struct(_) => Kind::Struct(sorted_fields(arr.as_struct(), &|_| true)?),
                other => return type_err(format!("canonical JSON does not cover type {other}")),
            }
        };
        Ok(Self {
            nulls: arr.nulls(),
            kind,
        })
    }

    /// Canonical JSON of value `i` (see [`write_json_value`] for the format).
    fn write(&self, i: usize, out: &mut Vec<u8>) -> Result<()> {
        if self.nulls.is_some_and(|n| n.is_null(i)) {
            out.extend_from_slice(b"null");
            return Ok(());
        }
        match &self.kind {
            Kind::Null => out.extend_from_slice(b"null"),
            Kind::Bool(a) => out.extend_from_slice(if a.value(i) { b"true" } else { b"false" }),
            Kind::Int(v) => push_decimal(out, v.get(i)),
            Kind::F32(v) => write_es_number_f32(v[i], out)?,
            Kind::F64(v) => write_es_number(v[i], out)?,
            Kind::Scaled(v, scale) => push_scaled(out, v[i], *scale),
            Kind::Decimal(a) => out.extend_from_slice(a.value_as_string(i).as_bytes()),
            Kind::Text(col) => write_json_string(col.value(i), out),
            Kind::Bytes(col) => {
                out.push(b'"');
                base64(col.value(i), out);
                out.push(b'"');
            }
            Kind::Date32(v) => {
                out.push(b'"');
                write_date(i64::from(v[i]), out);
                out.push(b'"');
            }
            Kind::Date64(v) => {
                out.push(b'"');
                write_date(v[i].div_euclid(86_400_000), out);
                out.push(b'"');
            }
            Kind::Timestamp(v, per_sec) => {
                let secs = v[i].div_euclid(*per_sec);
                let nanos = v[i].rem_euclid(*per_sec) * (1_000_000_000 / per_sec);
                out.push(b'"');
                write_timestamp(secs, nanos, out);
                out.push(b'"');
            }
            Kind::List(offsets, items) => {
                let (from, to) = match offsets {
                    Offsets::Small(o) => (o[i] as usize, o[i + 1] as usize),
                    Offsets::Large(o) => (o[i] as usize, o[i + 1] as usize),
                };
                out.push(b'[');
                for j in from..to {
                    if j > from {
                        out.push(b',');
                    }
                    items.write(j, out)?;
                }
                out.push(b']');
            }
            Kind::Struct(fields) => write_object(fields, i, out)?,
        }
        Ok(())
    }
}

/// Canonical JSON of value `i` of `arr` (the format: [`json_rows`]).
#[cfg(test)]
pub fn write_json_value(arr: &dyn Array, i: usize, out: &mut Vec<u8>) -> Result<()> {
    Col::of(arr)?.write(i, out)
}

/// A JSON string of UTF-8 bytes (valid UTF-8: Arrow string columns are validated on import).
pub fn write_json_string(s: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    // Most strings need no escape: one pass that only looks, then one copy.
    if !s.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\') {
        out.extend_from_slice(s);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (i, &b) in s.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&s[start..i]);
        if esc.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 15)]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&s[start..]);
    out.push(b'"');
}

/// ECMAScript Number::toString of the shortest round-trip digits in `sci` (Rust's `{:e}`).
fn write_es_digits(negative: bool, sci: &str, out: &mut Vec<u8>) {
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci, "0"));
    let digits: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).collect();
    let k = digits.len() as i64;
    let n = exp.parse::<i64>().unwrap_or(0) + 1; // value = 0.d1d2..dk * 10^n
    if negative {
        out.push(b'-');
    }
    if k <= n && n <= 21 {
        out.extend_from_slice(&digits);
        out.extend(std::iter::repeat_n(b'0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.extend_from_slice(&digits[..n as usize]);
        out.push(b'.');
        out.extend_from_slice(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.extend_from_slice(b"0.");
        out.extend(std::iter::repeat_n(b'0', (-n) as usize));
        out.extend_from_slice(&digits);
    } else {
        out.push(digits[0]);
        if k > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        let e = n - 1;
        let _ = std::io::Write::write_fmt(
            out,
            format_args!("e{}{}", if e > 0 { "+" } else { "-" }, e.abs()),
        );
    }
}

fn not_finite(v: f64) -> Result<()> {
    value_err(format!(
        "{v} has no JSON form; replace NaN and infinities before writing"
    ))
}

/// A float64 in ECMAScript form (RFC 8785).
pub fn write_es_number(v: f64, out: &mut Vec<u8>) -> Result<()> {
    if !v.is_finite() {
        return not_finite(v);
    }
    if v == 0.0 {
        out.push(b'0');
        return Ok(());
    }
    write_es_digits(v < 0.0, &format!("{:e}", v.abs()), out);
    Ok(())
}

/// A float32 in ECMAScript form, from its own shortest digits.
pub fn write_es_number_f32(v: f32, out: &mut Vec<u8>) -> Result<()> {
    if !v.is_finite() {
        return not_finite(f64::from(v));
    }
    if v == 0.0 {
        out.push(b'0');
        return Ok(());
    }
    write_es_digits(v < 0.0, &format!("{:e}", v.abs()), out);
    Ok(())
}

/// Standard base64 with padding.
pub fn base64(data: &[u8], out: &mut Vec<u8>) {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for j in 0..4 {
            if j <= chunk.len() {
                out.push(ABC[((n >> (18 - 6 * j)) & 63) as usize]);
            } else {
                out.push(b'=');
            }
        }
    }
}

/// (year, month, day) of a day count since 1970-01-01 (proleptic Gregorian; H. Hinnant's
/// civil_from_days).
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `v` (0 <= v < 10^width) in exactly `width` digits.
fn push_digits(out: &mut Vec<u8>, mut v: i64, width: usize) {
    let at = out.len();
    out.resize(at + width, b'0');
    for d in out[at..].iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

fn write_date(days: i64, out: &mut Vec<u8>) {
    let (y, m, d) = civil(days);
    if (0..10_000).contains(&y) {
        push_digits(out, y, 4);
    } else {
        // what `{y:04}` writes: a sign, and at least four characters in all
        let _ = std::io::Write::write_fmt(out, format_args!("{y:04}"));
    }
    out.push(b'-');
    push_digits(out, m, 2);
    out.push(b'-');
    push_digits(out, d, 2);
}

fn write_timestamp(secs: i64, nanos: i64, out: &mut Vec<u8>) {
    write_date(secs.div_euclid(86_400), out);
    let s = secs.rem_euclid(86_400);
    out.push(b'T');
    push_digits(out, s / 3600, 2);
    out.push(b':');
    push_digits(out, s / 60 % 60, 2);
    out.push(b':');
    push_digits(out, s % 60, 2);
    if nanos != 0 {
        out.push(b'.');
        if nanos % 1_000_000 == 0 {
            push_digits(out, nanos / 1_000_000, 3);
        } else if nanos % 1_000 == 0 {
            push_digits(out, nanos / 1_000, 6);
        } else {
            push_digits(out, nanos, 9);
        }
    }
    out.push(b'Z');
}

/// First row whose route column disagrees with the route of its key: (row, found, expected);
/// `found` is None for a null route.
pub fn first_misrouted(
    keys: &[u8],
    partitions: u32,
    chunks: &[ArrayRef],
) -> Result<Option<(usize, Option<i128>, u32)>> {
    let expected = routes(keys, partitions);
    let mut base = 0;
    for chunk in chunks {
        let arr = chunk.as_ref();
        if !is_integer(arr.data_type()) {
            return type_err(format!(
                "the route column has type {}; prepare() makes it an integer column",
                arr.data_type()
            ));
        }
        for i in 0..arr.len() {
            let want = expected.get(base + i).copied().unwrap_or(u32::MAX);
            if arr.is_null(i) {
                return Ok(Some((base + i, None, want)));
            }
            let found = int_value(arr, i);
            if found != i128::from(want) {
                return Ok(Some((base + i, Some(found), want)));
            }
        }
        base += arr.len();
    }
    if base != expected.len() {
        return value_err(format!(
            "the route column has {base} rows but there are {} keys",
            expected.len()
        ));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use arrow_array::{
        BinaryArray, Float32Array, Float64Array, Int32Array, Int64Array, LargeStringArray,
        StringArray, TimestampMicrosecondArray, TimestampMillisecondArray, UInt64Array, UInt8Array,
    };
    use arrow_schema::{Field, Fields as SchemaFields};

    fn es(v: f64) -> String {
        let mut out = Vec::new();
        write_es_number(v, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn ecmascript_numbers() {
        for (v, s) in [
            (1.0, "1"),
            (-1.5, "-1.5"),
            (0.1, "0.1"),
            (100.0, "100"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1.5e-7, "1.5e-7"),
            (0.000001, "0.000001"),
            (123456789.125, "123456789.125"),
            (-0.0, "0"),
            (5e-324, "5e-324"),
        ] {
            assert_eq!(es(v), s, "{v}");
        }
        let mut out = Vec::new();
        write_es_number_f32(0.1f32, &mut out).unwrap();
        assert_eq!(out, b"0.1");
        assert!(write_es_number(f64::NAN, &mut out).is_err());
    }

    #[test]
    fn scaled_decimals_are_written_as_arrow_writes_them() {
        use arrow_array::Decimal128Array;
        let values: Vec<i128> = vec![
            0,
            1,
            -1,
            5,
            -5,
            9,
            10,
            99,
            100,
            101,
            -150,
            12345,
            -12345,
            1_000_000,
            i128::from(i64::MAX),
            i128::from(i64::MIN),
            10i128.pow(37) - 1,
            -(10i128.pow(37) - 1),
        ];
        for scale in [1i8, 2, 3, 6, 10, 20] {
            let arr = Decimal128Array::from(values.clone())
                .with_precision_and_scale(38, scale)
                .unwrap();
            for (i, v) in values.iter().enumerate() {
                let mut out = Vec::new();
                push_scaled(&mut out, *v, scale.unsigned_abs().into());
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    arr.value_as_string(i),
                    "{v} {scale}"
                );
            }
        }
    }

    #[test]
    fn dates_and_times_are_written_as_the_formatter_writes_them() {
        // years before 0 and after 9999 too (they take the formatter's own path)
        for days in [
            -800_000i64,
            -719_529,
            -719_528,
            -1,
            0,
            1,
            19_723,
            2_932_896,
            2_932_897,
        ] {
            for (secs_of_day, nanos) in
                [(0i64, 0i64), (86_399, 5_000_000), (3_723, 120_000), (1, 7)]
            {
                let secs = days * 86_400 + secs_of_day;
                let mut got = Vec::new();
                write_timestamp(secs, nanos, &mut got);
                let (y, m, d) = civil(secs.div_euclid(86_400));
                let s = secs.rem_euclid(86_400);
                let frac = if nanos == 0 {
                    String::new()
                } else if nanos % 1_000_000 == 0 {
                    format!(".{:03}", nanos / 1_000_000)
                } else if nanos % 1_000 == 0 {
                    format!(".{:06}", nanos / 1_000)
                } else {
                    format!(".{nanos:09}")
                };
                let want = format!(
                    "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{frac}Z",
                    s / 3600,
                    s / 60 % 60,
                    s % 60
                );
                assert_eq!(String::from_utf8(got).unwrap(), want);
            }
        }
    }

    #[test]
    fn strings_dates_base64() {
        let mut out = Vec::new();
        write_json_string("a\"\\\n\x01é/".as_bytes(), &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), "\"a\\\"\\\\\\n\\u0001é/\"");
        let mut b = Vec::new();
        base64(b"any carnal pleas", &mut b);
        assert_eq!(b, b"YW55IGNhcm5hbCBwbGVhcw==");
        b.clear();
        base64(b"ab", &mut b);
        assert_eq!(b, b"YWI=");
        let mut d = Vec::new();
        write_date(0, &mut d);
        write_date(19_723, &mut d); // 2024-01-01
        write_date(-1, &mut d);
        assert_eq!(d, b"1970-01-012024-01-011969-12-31");
    }

    #[test]
    fn rows_are_sorted_json_whatever_the_types() {
        let a: ArrayRef = Arc::new(Int32Array::from(vec![1, -2]));
        let b: ArrayRef = Arc::new(StringArray::from(vec![Some("x"), None]));
        let f: ArrayRef = Arc::new(Float64Array::from(vec![0.5, 2.0]));
        let s1 = StructArray::new(
            SchemaFields::from(vec![
                Field::new("b", DataType::Utf8, true),
                Field::new("a", DataType::Int32, false),
                Field::new("f", DataType::Float64, false),
            ]),
            vec![b, a, f],
            None,
        );
        let rows = json_rows(&[Arc::new(s1) as ArrayRef], &[]).unwrap();
        assert_eq!(rows.row(0), br#"{"a":1,"b":"x","f":0.5}"#);
        assert_eq!(rows.row(1), br#"{"a":-2,"b":null,"f":2}"#);
        // the same rows with wider types give the same bytes
        let a: ArrayRef = Arc::new(Int64Array::from(vec![1, -2]));
        let b: ArrayRef = Arc::new(LargeStringArray::from(vec![Some("x"), None]));
        let f: ArrayRef = Arc::new(Float32Array::from(vec![0.5, 2.0]));
        let s2 = StructArray::new(
            SchemaFields::from(vec![
                Field::new("f", DataType::Float32, false),
                Field::new("b", DataType::LargeUtf8, true),
                Field::new("a", DataType::Int64, false),
                Field::new("route", DataType::Int64, false),
            ]),
            vec![f, b, a.clone(), a],
            None,
        );
        let rows2 = json_rows(&[Arc::new(s2) as ArrayRef], &["route".to_owned()]).unwrap();
        assert_eq!(rows, rows2);
    }

    #[test]
    fn timestamps_print_the_same_instant_the_same_way() {
        let us: ArrayRef = Arc::new(TimestampMicrosecondArray::from(vec![1_500_000, 1_000_000]));
        let ms: ArrayRef = Arc::new(TimestampMillisecondArray::from(vec![1_500, 1_000]));
        let mut a = Vec::new();
        let mut b = Vec::new();
        for i in 0..2 {
            write_json_value(us.as_ref(), i, &mut a).unwrap();
            write_json_value(ms.as_ref(), i, &mut b).unwrap();
        }
        assert_eq!(a, b);
        assert_eq!(a, br#""1970-01-01T00:00:01.500Z""1970-01-01T00:00:01Z""#);
    }

    #[test]
    fn explicit_keys_of_types_and_nulls() {
        let s: ArrayRef = Arc::new(StringArray::from(vec!["12", "x"]));
        let i: ArrayRef = Arc::new(Int64Array::from(vec![12]));
        let u: ArrayRef = Arc::new(UInt8Array::from(vec![12]));
        let b: ArrayRef = Arc::new(BinaryArray::from(vec![b"12".as_ref()]));
        let ks = explicit_keys(&[s], "k").unwrap();
        assert_eq!(&ks[..16], &keys::explicit_key(b"12"));
        for col in [i, u, b] {
            assert_eq!(explicit_keys(&[col], "k").unwrap(), ks[..16]);
        }
        let n: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None]));
        let first: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "c"]));
        let err = explicit_keys(&[first, n], "key column 'k'").unwrap_err();
        assert_eq!(
            err,
            ArrowKeyError::Value("key column 'k' is null at row 4: every row needs a value".into())
        );
        let e: ArrayRef = Arc::new(StringArray::from(vec![""]));
        assert!(matches!(
            explicit_keys(&[e], "k"),
            Err(ArrowKeyError::Value(_))
        ));
        let f: ArrayRef = Arc::new(Float64Array::from(vec![1.0]));
        assert!(matches!(
            explicit_keys(&[f], "k"),
            Err(ArrowKeyError::Type(_))
        ));
    }

    #[test]
    fn batched_explicit_keys_match_one_at_a_time() {
        let ints = [
            0i64,
            7,
            -12,
            9,
            10,
            99,
            100,
            i64::MAX,
            i64::MIN,
            -1,
            1_234_567_890,
        ];
        let i: ArrayRef = Arc::new(Int64Array::from(ints.to_vec()));
        let got = explicit_keys(&[i], "k").unwrap();
        for (n, v) in ints.iter().enumerate() {
            let want = keys::explicit_key(v.to_string().as_bytes());
            assert_eq!(&got[16 * n..16 * n + 16], &want, "{v}");
        }
        let u: ArrayRef = Arc::new(UInt64Array::from(vec![u64::MAX, 0, 18]));
        let got = explicit_keys(&[u], "k").unwrap();
        assert_eq!(
            &got[..16],
            &keys::explicit_key(u64::MAX.to_string().as_bytes())
        );
        // many ids of mixed lengths (the multi-lane hashing and the threads of a large batch)
        let ids: Vec<String> = (0..5000)
            .map(|n| "x".repeat(n % 97 + 1) + &n.to_string())
            .collect();
        let s: ArrayRef = Arc::new(StringArray::from(ids.clone()));
        let got = explicit_keys(&[s], "k").unwrap();
        for (n, id) in ids.iter().enumerate() {
            assert_eq!(
                &got[16 * n..16 * n + 16],
                &keys::explicit_key(id.as_bytes())
            );
        }
    }

    #[test]
    fn routes_and_misrouted_rows() {
        let mut key = [0u8; 16];
        key[7] = 7;
        assert_eq!(route(&key, 4), 3);
        key[0] = 0xff;
        let big = u64::from_be_bytes(key[..8].try_into().unwrap());
        assert_eq!(u64::from(route(&key, 1000)), big % 1000);
        let keys: Vec<u8> = [[0u8; 16], key].concat();
        let good: ArrayRef = Arc::new(Int32Array::from(vec![0, route(&key, 1000) as i32]));
        assert_eq!(first_misrouted(&keys, 1000, &[good]).unwrap(), None);
        let bad: ArrayRef = Arc::new(Int32Array::from(vec![Some(0), None]));
        let hit = first_misrouted(&keys, 1000, &[bad]).unwrap().unwrap();
        assert_eq!((hit.0, hit.1), (1, None));
    }
}
