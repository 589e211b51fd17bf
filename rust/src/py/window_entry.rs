//! `WindowEntry`: what a `DedupWindow` lookup returns about one key.

use pyo3::prelude::*;

use crate::args;
use crate::window::Record;

/// What the window knows about one key.
#[pyclass(
    frozen,
    eq,
    hash,
    module = "woodpecker_idem._core",
    name = "WindowEntry"
)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PyWindowEntry {
    #[pyo3(get)]
    segment_id: u32,
    #[pyo3(get)]
    entry_id: u32,
    #[pyo3(get)]
    timestamp_ms: i64,
    #[pyo3(get)]
    committed: bool,
}

impl PyWindowEntry {
    pub(super) fn from_record(r: &Record, committed: bool) -> Self {
        Self {
            segment_id: r.segment_id,
            entry_id: r.entry_id,
            timestamp_ms: r.timestamp_ms,
            committed,
        }
    }
}

#[pymethods]
impl PyWindowEntry {
    #[new]
    #[pyo3(signature = (segment_id, entry_id, timestamp_ms, committed))]
    fn new(
        segment_id: &Bound<'_, PyAny>,
        entry_id: &Bound<'_, PyAny>,
        timestamp_ms: &Bound<'_, PyAny>,
        committed: bool,
    ) -> PyResult<Self> {
        Ok(Self {
            segment_id: args::int_u32(segment_id, "segment_id")?,
            entry_id: args::int_u32(entry_id, "entry_id")?,
            timestamp_ms: args::int_i64(timestamp_ms, "timestamp_ms")?,
            committed,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "WindowEntry(segment_id={}, entry_id={}, timestamp_ms={}, committed={})",
            self.segment_id,
            self.entry_id,
            self.timestamp_ms,
            if self.committed { "True" } else { "False" }
        )
    }
}
