//! `decode_entries`: the read path's parser. Readers and recovery decode every entry they read;
//! doing it here (one call per read, a small frozen object per entry) instead of through
//! protobuf's Python objects is most of a reader's speed.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::entry::decode_entry;

/// One entry read back from a LogStore: `payload`, `properties` (a new dict each access),
/// `timestamp_ms`, `idempotency_key` (b"" when the entry has none), `segment_id`, `entry_id`.
#[pyclass(frozen, module = "woodpecker_idem._core", name = "StoredEntry")]
pub struct PyStoredEntry {
    #[pyo3(get)]
    segment_id: i64,
    #[pyo3(get)]
    entry_id: i64,
    #[pyo3(get)]
    timestamp_ms: i64,
    #[pyo3(get)]
    payload: Py<PyBytes>,
    #[pyo3(get)]
    idempotency_key: Py<PyBytes>,
    props: Vec<(String, String)>,
}

#[pymethods]
impl PyStoredEntry {
    #[getter]
    fn properties<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.props {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "StoredEntry({}:{}, {} payload bytes)",
            self.segment_id,
            self.entry_id,
            Python::attach(|py| self.payload.bind(py).as_bytes().len())
        )
    }
}

/// The entries decoded, and where and why decoding stopped early.
type Decoded = (Vec<Py<PyStoredEntry>>, Option<(usize, String)>);

/// The entries `raw` (LogEntry bytes of consecutive ids from `first_entry_id` of `segment_id`)
/// as `(entries, bad)`: `bad` is `(index, why)` for the first that does not parse or says it is
/// another entry, and `entries` then holds the ones before it.
#[pyfunction]
pub fn decode_entries<'py>(
    py: Python<'py>,
    raw: &Bound<'py, PyList>,
    segment_id: i64,
    first_entry_id: i64,
) -> PyResult<Decoded> {
    let mut out = Vec::with_capacity(raw.len());
    for (i, item) in raw.iter().enumerate() {
        let data = item.cast::<PyBytes>().map_err(|_| {
            crate::errors::InvalidTypeError::new_err(format!(
                "raw[{i}] must be bytes, not {}",
                crate::errors::type_name(&item)
            ))
        })?;
        let want = first_entry_id + i as i64;
        let e = match decode_entry(data.as_bytes()) {
            Ok(e) => e,
            Err(why) => return Ok((out, Some((i, format!("unparseable entry ({why})"))))),
        };
        if e.segment_id != segment_id || e.entry_id != want {
            let why = format!("stored entry says {}:{}", e.segment_id, e.entry_id);
            return Ok((out, Some((i, why))));
        }
        let entry = PyStoredEntry {
            segment_id,
            entry_id: want,
            timestamp_ms: e.timestamp_ms,
            payload: PyBytes::new(py, e.payload).unbind(),
            idempotency_key: PyBytes::new(py, e.idempotency_key).unbind(),
            props: e
                .properties
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        out.push(Py::new(py, entry)?);
    }
    Ok((out, None))
}

/// Adds this module's function and class to `_core` (one line in lib.rs).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(decode_entries, m)?)?;
    m.add_class::<PyStoredEntry>()
}
