//! Python face of `entry`: encoding a record on the write path and counting a frame's records.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};

use crate::args;
use crate::entry::{self, EntryFields};
use crate::errors::{invalid_argument, invalid_type, type_name};

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
    let mut owned: Vec<(Bound<'py, PyString>, Bound<'py, PyString>)> = Vec::new();
    if let Some(props) = properties.filter(|p| !p.is_none()) {
        let dict = props.cast::<PyDict>().map_err(|_| {
            invalid_type(
                py,
                format!(
                    "properties must be a dict[str, str], not {}",
                    type_name(props)
                ),
            )
        })?;
        for (k, v) in dict.iter() {
            match (k.cast_into::<PyString>(), v.cast_into::<PyString>()) {
                (Ok(k), Ok(v)) => owned.push((k, v)),
                _ => return Err(invalid_type(py, "properties must map str to str")),
            }
        }
    }
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

/// Number of records in a frame; the lengths must tile it exactly.
#[pyfunction]
pub fn count_records(py: Python<'_>, frame: &Bound<'_, PyAny>) -> PyResult<usize> {
    let data = args::bytes_like(frame, "frame")?;
    entry::count_records(data.as_slice()).map_err(|pos| {
        invalid_argument(
            py,
            format!("frame: record at byte {pos} is truncated or runs past the end"),
        )
    })
}
