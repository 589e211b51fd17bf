//! Python face of `entry`: encoding a record on the write path and counting a frame's records.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyInt, PyList, PyString, PyTuple};

use super::payloads::PayloadRows;
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

/// `(bytes, end)`: the rows of `payloads` (a list of bytes or a `Payloads`) from `start` (before
/// `end`) whose bytes, `overhead` more each, fit `limit` (at least one row), and what they
/// count: where a run of one AddEntries batch ends. A `Payloads` answers from its offsets.
#[pyfunction]
pub fn chunk_end(
    payloads: &Bound<'_, PyAny>,
    start: usize,
    end: usize,
    limit: usize,
    overhead: usize,
) -> PyResult<(usize, usize)> {
    let rows = PayloadRows::of(payloads)?;
    let n = rows.len();
    if start > end || end > n {
        return Err(InvalidArgumentError::new_err(format!(
            "rows {start}..{end} are not within the {n} payloads"
        )));
    }
    let list = match rows {
        PayloadRows::Batch(p) => return Ok(p.get().inner.fit(start, end, limit, overhead)),
        PayloadRows::List(list) => list,
    };
    let mut total = 0usize;
    for i in start..end {
        let item = list.get_item(i)?;
        let bytes = item.cast::<PyBytes>().map_err(|_| {
            InvalidTypeError::new_err(format!(
                "payloads[{i}] must be bytes, not {}",
                type_name(&item)
            ))
        })?;
        let size = bytes.as_bytes().len() + overhead;
        if i > start && total + size > limit {
            return Ok((total, i));
        }
        total += size;
    }
    Ok((total, end))
}

/// Each row's timestamp: one for all, or a column with one per row of the whole list.
pub(super) enum Stamps<'py> {
    One(i64),
    Column(args::I64Column<'py>),
}

impl<'py> Stamps<'py> {
    pub(super) fn of(obj: &Bound<'py, PyAny>, n: usize) -> PyResult<Self> {
        if obj.is_instance_of::<PyInt>() {
            return Ok(Stamps::One(args::int_i64(obj, "timestamp_ms")?));
        }
        let col = args::i64_column(obj, "timestamp_ms")?;
        if col.len() != n {
            return Err(InvalidArgumentError::new_err(format!(
                "timestamp_ms holds {} values but payloads {n} rows",
                col.len()
            )));
        }
        Ok(Stamps::Column(col))
    }

    /// The timestamps of rows `start..end`, each checked to fit int64.
    pub(super) fn range(&self, py: Python<'_>, start: usize, end: usize) -> PyResult<Vec<i64>> {
        match self {
            Stamps::One(t) => Ok(vec![*t; end - start]),
            Stamps::Column(col) => {
                let view = col.view(py);
                (start..end)
                    .map(|i| match view.get(i).map(i64::try_from) {
                        Some(Ok(t)) => Ok(t),
                        v => Err(InvalidArgumentError::new_err(format!(
                            "timestamp_ms[{i}] = {v:?} does not fit int64"
                        ))),
                    })
                    .collect()
            }
        }
    }
}

/// The rows `start..end` of a frame to be, every argument checked (payload types, keys,
/// properties, timestamps), before anything is reserved or encoded: once made, encoding it
/// cannot fail, so a run whose keys were reserved is always encoded.
pub(super) struct Run<'a, 'py> {
    segment_id: i64,
    first_entry_id: i64,
    start: usize,
    stamps: Vec<i64>,
    payloads: Vec<&'a [u8]>,
    keys: Option<&'a [u8]>,
    properties: Vec<Vec<(&'a [u8], &'a [u8])>>,
    codec: Codec,
    _py: Python<'py>,
}

/// What a `Run` borrows its rows from: the payload objects and property strings, kept alive.
#[derive(Default)]
pub(super) struct Held<'py> {
    rows: Vec<Bound<'py, PyBytes>>,
    props: Vec<Vec<(Bound<'py, PyString>, Bound<'py, PyString>)>>,
}

impl<'py> Held<'py> {
    /// Checks the rows `start..end` of `payloads` (a list must hold `bytes`) and of
    /// `properties` (a list of N dicts or None), holding what a `Run` borrows.
    pub(super) fn new(
        py: Python<'py>,
        payloads: &PayloadRows<'py>,
        start: usize,
        end: usize,
        properties: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Self> {
        let n = payloads.len();
        if start > end || end > n {
            return Err(InvalidArgumentError::new_err(format!(
                "rows {start}..{end} are not within the {n} payloads"
            )));
        }
        let mut held = Held::default();
        if let PayloadRows::List(list) = payloads {
            held.rows.reserve(end - start);
            for i in start..end {
                let item = list.get_item(i)?;
                held.rows.push(item.cast_into::<PyBytes>().map_err(|e| {
                    InvalidTypeError::new_err(format!(
                        "payloads[{i}] must be bytes, not {}",
                        type_name(e.into_inner().as_any())
                    ))
                })?);
            }
        }
        if let Some(p) = properties.filter(|p| !p.is_none()) {
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
            held.props.reserve(end - start);
            for i in start..end {
                held.props
                    .push(property_strings(Some(&list.get_item(i)?)).map_err(|e| {
                        InvalidTypeError::new_err(format!("properties[{i}]: {}", e.value(py)))
                    })?);
            }
        }
        Ok(held)
    }
}

impl<'a, 'py> Run<'a, 'py> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        py: Python<'py>,
        segment_id: i64,
        first_entry_id: i64,
        stamps: Vec<i64>,
        payloads: &'a PayloadRows<'py>,
        held: &'a Held<'py>,
        start: usize,
        keys: Option<&'a [u8]>,
        codec: Codec,
    ) -> PyResult<Self> {
        let count = stamps.len();
        let rows: Vec<&'a [u8]> = match payloads {
            PayloadRows::List(_) => held.rows.iter().map(|b| b.as_bytes()).collect(),
            PayloadRows::Batch(p) => p.get().inner.rows(start, start + count).collect(),
        };
        if let Some(k) = keys {
            let n = payloads.len();
            if k.len() != n * 16 {
                return Err(InvalidArgumentError::new_err(format!(
                    "keys holds {} keys but payloads {n} rows",
                    k.len() / 16
                )));
            }
        }
        let mut properties = Vec::with_capacity(held.props.len());
        for row in &held.props {
            let mut pairs = Vec::with_capacity(row.len());
            for (k, v) in row {
                pairs.push((k.to_str()?.as_bytes(), v.to_str()?.as_bytes()));
            }
            properties.push(pairs);
        }
        Ok(Run {
            segment_id,
            first_entry_id,
            start,
            stamps,
            payloads: rows,
            keys,
            properties,
            codec,
            _py: py,
        })
    }

    /// Each row's timestamp, in order.
    pub(super) fn stamps(&self) -> &[i64] {
        &self.stamps
    }

    fn fields(&self, k: usize, entry_id: i64) -> EntryFields<'_> {
        let i = self.start + k;
        EntryFields {
            segment_id: self.segment_id,
            entry_id,
            timestamp_ms: self.stamps[k],
            payload: self.payloads[k],
            properties: self.properties.get(k).map_or(&[], |p| p.as_slice()),
            idempotency_key: self
                .keys
                .and_then(|keys| keys.get(i * 16..i * 16 + 16))
                .unwrap_or_default(),
        }
    }

    /// The frame of the rows whose `status` byte is 0 (all of them without one), entry ids
    /// counting up from `first_entry_id`, and how many records it holds. Written in place into
    /// the `bytes` returned (no second copy); compressed in the same call when the run's codec
    /// says so, without the GIL.
    pub(super) fn encode(
        &self,
        py: Python<'py>,
        status: Option<&[u8]>,
    ) -> PyResult<(Bound<'py, PyBytes>, usize)> {
        let picked: Vec<usize> = (0..self.stamps.len())
            .filter(|&k| status.is_none_or(|s| s[k] == 0))
            .collect();
        let ids = self.first_entry_id..;
        let count = picked.len();
        if self.codec == Codec::None || picked.is_empty() {
            let total = picked
                .iter()
                .zip(ids.clone())
                .map(|(&k, id)| entry::record_len(&self.fields(k, id)))
                .sum();
            let frame = PyBytes::new_with(py, total, |buf| {
                let mut at = 0;
                for (&k, id) in picked.iter().zip(ids) {
                    at += entry::encode_record_at(&mut buf[at..], &self.fields(k, id));
                }
                Ok(())
            })?;
            return Ok((frame, count));
        }
        let mut frame = Vec::new();
        for (&k, id) in picked.iter().zip(ids) {
            entry::encode_record_into(&mut frame, &self.fields(k, id));
        }
        let codec = self.codec;
        let units = py
            .detach(|| codec::compress(codec, &frame))
            .map_err(InvalidArgumentError::new_err)?;
        Ok((PyBytes::new(py, &units), count))
    }
}

/// One frame (records end to end, entry ids counting up from `first_entry_id`) of the rows
/// `start..end` of `payloads` (a list of bytes, or a `Payloads`), skipping rows whose `status`
/// byte (one per row of the range, as `DedupWindow.reserve_many` gives) is not 0.
/// `timestamp_ms` is one int for every row or an int64 column (one per row of the whole list:
/// each write's queueing time); `keys` (N*16 bytes for the whole list) gives each row its
/// idempotency key, `properties` (a list of N dicts or None) its properties. Returns `(frame,
/// records)`: every writer's encoding, one call and one `bytes` per run of entries instead of
/// one per row. `compression` (0 none, 1 lz4, 2 zstd: `append.compression`) compresses the
/// whole frame in the same call, without the GIL (`codec.rs`).
#[pyfunction]
#[pyo3(signature = (segment_id, first_entry_id, timestamp_ms, payloads, start, end, keys=None, status=None, properties=None, compression=0))]
#[allow(clippy::too_many_arguments)]
pub fn encode_frame<'py>(
    py: Python<'py>,
    segment_id: i64,
    first_entry_id: i64,
    timestamp_ms: &Bound<'py, PyAny>,
    payloads: &Bound<'py, PyAny>,
    start: usize,
    end: usize,
    keys: Option<&Bound<'py, PyAny>>,
    status: Option<&Bound<'py, PyAny>>,
    properties: Option<&Bound<'py, PyAny>>,
    compression: u8,
) -> PyResult<(Bound<'py, PyBytes>, usize)> {
    let codec = Codec::from_u8(compression).map_err(InvalidArgumentError::new_err)?;
    let rows = PayloadRows::of(payloads)?;
    let n = rows.len();
    let held = Held::new(py, &rows, start, end, properties)?;
    let stamps = Stamps::of(timestamp_ms, n)?.range(py, start, end)?;
    let keys = keys
        .filter(|k| !k.is_none())
        .map(|k| args::key_buffer(k, "keys"))
        .transpose()?;
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
    let keys = keys.as_ref().map(|k| k.as_slice());
    let run = Run::new(
        py,
        segment_id,
        first_entry_id,
        stamps,
        &rows,
        &held,
        start,
        keys,
        codec,
    )?;
    run.encode(py, status)
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
