//! Conversions shared by `DedupWindow` and `Snapshot`: window records to and from Python, and the
//! window configuration arguments.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::args;
use crate::errors::InvalidArgumentError;
use crate::window::{Record, MAX_KEYS_LIMIT};

pub(super) fn record(
    key: &Bound<'_, PyAny>,
    segment_id: &Bound<'_, PyAny>,
    entry_id: &Bound<'_, PyAny>,
    timestamp_ms: &Bound<'_, PyAny>,
) -> PyResult<Record> {
    Ok(Record {
        key: args::key(key, "key")?,
        segment_id: args::int_u32(segment_id, "segment_id")?,
        entry_id: args::int_u32(entry_id, "entry_id")?,
        timestamp_ms: args::int_i64(timestamp_ms, "timestamp_ms")?,
    })
}

pub(super) fn entry_tuple<'py>(py: Python<'py>, r: &Record) -> PyResult<Bound<'py, PyTuple>> {
    (
        PyBytes::new(py, &r.key),
        r.segment_id,
        r.entry_id,
        r.timestamp_ms,
    )
        .into_pyobject(py)
}

pub(super) fn entries_list<'py>(py: Python<'py>, recs: &[Record]) -> PyResult<Bound<'py, PyList>> {
    let items = recs
        .iter()
        .map(|r| entry_tuple(py, r))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

pub(super) fn parse_max_keys(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    let v = args::int_i64(obj, "max_keys").map_err(|e| {
        if obj.is_instance_of::<pyo3::types::PyInt>() {
            InvalidArgumentError::new_err(format!(
                "max_keys = {obj} is out of range 1..={MAX_KEYS_LIMIT}"
            ))
        } else {
            e
        }
    })?;
    usize::try_from(v)
        .ok()
        .filter(|&v| v >= 1 && v as u64 <= MAX_KEYS_LIMIT)
        .ok_or_else(|| {
            InvalidArgumentError::new_err(format!(
                "max_keys = {v} is out of range 1..={MAX_KEYS_LIMIT}"
            ))
        })
}

pub(super) fn parse_window_ms(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    let v = args::int_i64(obj, "window_ms")?;
    if v < 1 {
        return Err(InvalidArgumentError::new_err(format!(
            "window_ms = {v} must be >= 1"
        )));
    }
    Ok(v)
}
