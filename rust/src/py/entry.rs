//! Python face of `entry`: encoding a record on the write path and counting a frame's records.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyInt, PyList, PyString, PyTuple};

use crate::args;
use crate::codec::{self, Codec};
use crate::entry::{self, EntryFields};
use crate::errors::{type_name, CorruptEntryError, InvalidArgumentError, InvalidTypeError};

/// Encode one LogEntry as a record (`length | crc32c | entry`); see `proto/logstore.proto`.
#[pyfunction]
#[pyo3(signature = (segment_id, entry_id, timestamp_ms, payload, properties=None, idempotency_key=None))]
pub fn encode_entry<'py>(
    py: Python<'py>,
    segment_id: i64,
    entry_id: i64,
    timestamp_ms: i64,
    payload: &Bound<'py, PyAny>,
    properties: Option<&Bound<'py, PyAny>>,
    idempotency_key: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let payload = args::bytes_like(payload, "payload")?;
    let key = match idempotency_key {
        Some(k) if !k.is_none() => Some(args::bytes_like(k, "idempotency_key")?),
        _ => None,
    };
    let owned = property_strings(properties)?;
    let mut pairs: Vec<(&[u8], &[u8])> = Vec::with_capacity(owned.len());
    for (k, v) in &owned {
        pairs.push((k.to_str()?.as_bytes(), v.to_str()?.as_bytes()));
    }
    let record = entry::encode_record(&EntryFields {
        segment_id,
        entry_id,
        timestamp_ms,
        payload: payload.as_slice(),
        properties: &pairs,
        idempotency_key: key.as_ref().map(|k| k.as_slice()).unwrap_or_default(),
    });
    Ok(PyBytes::new(py, &record))
}

/// The (key, value) strings of an optional `dict[str, str]`.
fn property_strings<'py>(
    properties: Option<&Bound<'py, PyAny>>,
) -> PyResult<Vec<(Bound<'py, PyString>, Bound<'py, PyString>)>> {
    let mut owned = Vec::new();
    if let Some(props) = properties.filter(|p| !p.is_none()) {
        let dict = props.cast::<PyDict>().map_err(|_| {
            InvalidTypeError::new_err(format!(
                "properties must be a dict[str, str], not {}",
                type_name(props)
            ))
        })?;
        for (k, v) in dict.iter() {
            match (k.cast_into::<PyString>(), v.cast_into::<PyString>()) {
                (Ok(k), Ok(v)) => owned.push((k, v)),
                _ => return Err(InvalidTypeError::new_err("properties must map str to str")),
            }
        }
    }
    Ok(owned)
}

/// Bytes of the payloads `start..end` of `payloads` (a list of bytes, as the batch lane keeps
/// them), with `overhead` more per row: what a chunk of rows counts against the batch limits.
#[pyfunction]
pub fn payload_bytes(
    payloads: &Bound<'_, PyList>,
    start: usize,
    end: usize,
    overhead: usize,
) -> PyResult<usize> {
    let n = payloads.len();
    if start > end || end > n {
        return Err(InvalidArgumentError::new_err(format!(
            "rows {start}..{end} are not within the {n} payloads"
        )));
    }
    let mut total = overhead * (end - start);
    for i in start..end {
        let item = payloads.get_item(i)?;
        let bytes = item.cast::<PyBytes>().map_err(|_| {
            InvalidTypeError::new_err(format!(
                "payloads[{i}] must be bytes, not {}",
                type_name(&item)
            ))
        })?;
        total += bytes.as_bytes().len();
    }
    Ok(total)
}

/// The first row of `payloads` (a list) that is not `bytes`, and the first one longer than
/// `max_bytes`: (None, None) when every row is bytes within the limit. One pass, for a batch
/// checked whole before any of it is written.
#[pyfunction]
pub fn first_bad_payloads(
    payloads: &Bound<'_, PyList>,
    max_bytes: usize,
) -> (Option<usize>, Option<usize>) {
    let mut too_large = None;
    for (i, item) in payloads.iter().enumerate() {
        // exactly bytes, as the Python check (`type(p) is bytes`) had it
        match item.cast_exact::<PyBytes>() {
            Ok(b) => {
                if too_large.is_none() && b.as_bytes().len() > max_bytes {
                    too_large = Some(i);
                }
            }
            _ => return (Some(i), too_large),
        }
    }
    (None, too_large)
}

/// One frame (records end to end, entry ids counting up from `first_entry_id`) of the rows
/// `start..end` of `payloads` (a list of bytes), skipping rows whose `status` byte (one per row of
/// the range, as `DedupWindow.reserve_many` gives) is not 0. `timestamp_ms` is one int for every
/// row or an int64 column (one per row of the whole list: each write's queueing time); `keys`
/// (N*16 bytes for the whole list) gives each row its idempotency key, `properties` (a list of
/// N dicts or None) its properties. Returns `(frame, records)`: every writer's encoding, one call
/// and one `bytes` per run of entries instead of one per row. `compression` (0 none, 1 lz4,
/// 2 zstd: `append.compression`) compresses the whole frame into one compressed unit in the same
/// call, without the GIL (`codec.rs`).
#[pyfunction]
#[pyo3(signature = (segment_id, first_entry_id, timestamp_ms, payloads, start, end, keys=None, status=None, properties=None, compression=0))]
#[allow(clippy::too_many_arguments)]
pub fn encode_frame<'py>(
    py: Python<'py>,
    segment_id: i64,
    first_entry_id: i64,
    timestamp_ms: &Bound<'py, PyAny>,
    payloads: &Bound<'py, PyList>,
    start: usize,
    end: usize,
    keys: Option<&Bound<'py, PyAny>>,
    status: Option<&Bound<'py, PyAny>>,
    properties: Option<&Bound<'py, PyAny>>,
    compression: u8,
) -> PyResult<(Bound<'py, PyBytes>, usize)> {
    let codec = Codec::from_u8(compression).map_err(InvalidArgumentError::new_err)?;
    let n = payloads.len();
    if start > end || end > n {
        return Err(InvalidArgumentError::new_err(format!(
            "rows {start}..{end} are not within the {n} payloads"
        )));
    }
    let one_stamp = if timestamp_ms.is_instance_of::<PyInt>() {
        Some(args::int_i64(timestamp_ms, "timestamp_ms")?)
    } else {
        None
    };
    let stamps = match one_stamp {
        Some(_) => None,
        None => Some(args::i64_column(timestamp_ms, "timestamp_ms")?),
    };
    if let Some(col) = &stamps {
        if col.len() != n {
            return Err(InvalidArgumentError::new_err(format!(
                "timestamp_ms holds {} values but payloads {n} rows",
                col.len()
            )));
        }
    }
    let stamps = stamps.as_ref().map(|c| c.view(py));
    let keys = keys
        .filter(|k| !k.is_none())
        .map(|k| args::key_buffer(k, "keys"))
        .transpose()?;
    let keys = keys.as_ref().map(|k| k.as_slice());
    if let Some(k) = keys {
        if k.len() != n * 16 {
            return Err(InvalidArgumentError::new_err(format!(
                "keys holds {} keys but payloads {n} rows",
                k.len() / 16
            )));
        }
    }
    let status = status
        .filter(|s| !s.is_none())
        .map(|s| args::bytes_like(s, "status"))
        .transpose()?;
    let status = status.as_ref().map(|s| s.as_slice());
    if let Some(s) = status {
        if s.len() != end - start {
            return Err(InvalidArgumentError::new_err(format!(
                "status holds {} rows but the range {start}..{end} {}",
                s.len(),
                end - start
            )));
        }
    }
    let properties = match properties.filter(|p| !p.is_none()) {
        None => None,
        Some(p) => {
            let list = p.cast::<PyList>().map_err(|_| {
                InvalidTypeError::new_err(format!(
                    "properties must be a list (one dict or None per row), not {}",
                    type_name(p)
                ))
            })?;
            if list.len() != n {
                return Err(InvalidArgumentError::new_err(format!(
                    "properties holds {} rows but payloads {n}",
                    list.len()
                )));
            }
            Some(list)
        }
    };
    let mut rows: Vec<(usize, Bound<'py, PyBytes>)> = Vec::with_capacity(end - start);
    let mut total = 0usize;
    for i in start..end {
        if status.is_some_and(|s| s[i - start] != 0) {
            continue;
        }
        let item = payloads.get_item(i)?;
        let payload = item.cast_into::<PyBytes>().map_err(|e| {
            InvalidTypeError::new_err(format!(
                "payloads[{i}] must be bytes, not {}",
                type_name(e.into_inner().as_any())
            ))
        })?;
        total += payload.as_bytes().len() + 64;
        rows.push((i, payload));
    }
    let mut frame = Vec::with_capacity(total);
    for (entry_id, (i, payload)) in (first_entry_id..).zip(rows.iter()) {
        let i = *i;
        let timestamp_ms = match (&stamps, one_stamp) {
            (Some(col), _) => match col.get(i).map(i64::try_from) {
                Some(Ok(t)) => t,
                v => {
                    return Err(InvalidArgumentError::new_err(format!(
                        "timestamp_ms[{i}] = {v:?} does not fit int64"
                    )))
                }
            },
            (None, one) => one.unwrap_or_default(),
        };
        let owned = match properties {
            Some(list) => property_strings(Some(&list.get_item(i)?)).map_err(|e| {
                InvalidTypeError::new_err(format!("properties[{i}]: {}", e.value(py)))
            })?,
            None => Vec::new(),
        };
        let mut pairs: Vec<(&[u8], &[u8])> = Vec::with_capacity(owned.len());
        for (k, v) in &owned {
            pairs.push((k.to_str()?.as_bytes(), v.to_str()?.as_bytes()));
        }
        entry::encode_record_into(
            &mut frame,
            &EntryFields {
                segment_id,
                entry_id,
                timestamp_ms,
                payload: payload.as_bytes(),
                properties: &pairs,
                idempotency_key: keys
                    .and_then(|k| k.get(i * 16..i * 16 + 16))
                    .unwrap_or_default(),
            },
        );
    }
    if codec == Codec::None || rows.is_empty() {
        return Ok((PyBytes::new(py, &frame), rows.len()));
    }
    let count = rows.len();
    drop(rows); // the payloads are in the frame; the compression runs without the GIL
    let units = py
        .detach(|| codec::compress(codec, &frame))
        .map_err(InvalidArgumentError::new_err)?;
    Ok((PyBytes::new(py, &units), count))
}

/// Number of entries in a frame (plain records and compressed units); the lengths must tile it
/// exactly and each compressed unit pass its CRC. Nothing is decompressed: a node counts what
/// it stores as sent.
#[pyfunction]
pub fn count_records(frame: &Bound<'_, PyAny>) -> PyResult<usize> {
    let data = args::bytes_like(frame, "frame")?;
    codec::count_entries(data.as_slice())
        .map_err(|why| InvalidArgumentError::new_err(format!("frame: {why}")))
}

/// The plain records of a stored frame: `frame` itself when it holds no compressed unit, else a
/// new `bytes` with every unit decompressed (without the GIL). A damaged unit (CRC), an unknown
/// codec or a unit that does not decompress to its records raises `CorruptEntryError` naming
/// `where`, the byte and why.
#[pyfunction]
pub fn decompress_frame<'py>(
    py: Python<'py>,
    frame: &Bound<'py, PyAny>,
    r#where: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let data = args::bytes_like(frame, "frame")?;
    let slice = data.as_slice();
    match py.detach(|| codec::decompress_frame(slice)) {
        Ok(std::borrow::Cow::Borrowed(_)) => Ok(frame.clone()), // no unit: nothing to copy
        Ok(std::borrow::Cow::Owned(raw)) => Ok(PyBytes::new(py, &raw).into_any()),
        Err(why) => Err(CorruptEntryError::new_err(format!("{where}: {why}"))),
    }
}

/// The codec number of a frame's first unit (0 when it starts with a plain record): what a
/// batch or block header records for it.
#[pyfunction]
pub fn frame_codec(frame: &Bound<'_, PyAny>) -> PyResult<u8> {
    let data = args::bytes_like(frame, "frame")?;
    codec::frame_codec(data.as_slice())
        .map(|c| c as u8)
        .map_err(CorruptEntryError::new_err)
}

/// The parts (a list or tuple of bytes-likes) laid end to end in one new `bytes`, copied with the
/// GIL held: `bytes.join` lets go of the GIL for results of 1 MiB or more, and winning it back
/// from a busy producer thread costs up to a switch interval (5 ms) per frame or block.
#[pyfunction]
pub fn concat<'py>(py: Python<'py>, parts: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let items: Vec<Bound<'py, PyAny>> = if let Ok(list) = parts.cast::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = parts.cast::<PyTuple>() {
        tuple.iter().collect()
    } else {
        return Err(InvalidTypeError::new_err(format!(
            "parts must be a list or tuple, not {}",
            type_name(parts)
        )));
    };
    let mut args = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        args.push(crate::args::bytes_like(item, &format!("parts[{i}]"))?);
    }
    let total: usize = args.iter().map(|a| a.as_slice().len()).sum();
    PyBytes::new_with(py, total, |buf| {
        let mut at = 0;
        for a in &args {
            let part = a.as_slice();
            buf[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        Ok(())
    })
}
