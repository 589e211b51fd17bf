//! `Snapshot` and the snapshot functions: a window's committed keys to bytes and back
//! (`crate::snapshot` is the codec).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use super::convert::{entries_list, parse_max_keys, parse_window_ms};
use super::window::PyDedupWindow;
use crate::args;
use crate::errors::{type_name, InvalidArgumentError, InvalidTypeError, SnapshotCorruptError};
use crate::keys::KEY_LEN;
use crate::snapshot::{self, SnapshotData};

/// A decoded dedup snapshot.
#[pyclass(frozen, module = "woodpecker_idem._core", name = "Snapshot")]
pub struct PySnapshot {
    data: SnapshotData,
}

fn window_arg<'a, 'py>(obj: &'a Bound<'py, PyAny>) -> PyResult<&'a Bound<'py, PyDedupWindow>> {
    obj.cast::<PyDedupWindow>().map_err(|_| {
        InvalidTypeError::new_err(format!(
            "window must be a DedupWindow, not {}",
            type_name(obj)
        ))
    })
}

#[pymethods]
impl PySnapshot {
    #[getter]
    fn format_version(&self) -> u16 {
        self.data.format_version
    }
    #[getter]
    fn log_id(&self) -> u64 {
        self.data.log_id
    }
    #[getter]
    fn epoch(&self) -> u64 {
        self.data.epoch
    }
    #[getter]
    fn timestamp_ms(&self) -> i64 {
        self.data.timestamp_ms
    }
    #[getter]
    fn window_max_keys(&self) -> u64 {
        self.data.window_max_keys
    }
    #[getter]
    fn window_ms(&self) -> i64 {
        self.data.window_ms
    }
    #[getter]
    fn watermarks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for &(seg, last) in &self.data.watermarks {
            d.set_item(seg, last)?;
        }
        Ok(d)
    }

    fn __len__(&self) -> usize {
        self.data.entries.len()
    }

    fn shared_position(&self) -> Option<(u32, u32)> {
        self.data.shared_position()
    }

    fn segment_ends<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (seg, last) in self.data.segment_ends() {
            d.set_item(seg, last)?;
        }
        Ok(d)
    }

    fn entries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        entries_list(py, &self.data.entries)
    }

    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let n = self.data.entries.len() * KEY_LEN;
        PyBytes::new_with(py, n, |buf| {
            for (dst, r) in buf.chunks_exact_mut(KEY_LEN).zip(&self.data.entries) {
                dst.copy_from_slice(&r.key);
            }
            Ok(())
        })
    }

    fn load_into(&self, py: Python<'_>, window: &Bound<'_, PyAny>) -> PyResult<usize> {
        let window = window_arg(window)?.get();
        let entries = &self.data.entries;
        Ok(py.detach(|| {
            window
                .inner
                .lock()
                .add_committed_many(entries.iter().copied())
        }))
    }

    #[pyo3(signature = (max_keys = None, window_ms = None))]
    fn to_window(
        &self,
        py: Python<'_>,
        max_keys: Option<&Bound<'_, PyAny>>,
        window_ms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyDedupWindow> {
        let max_keys = match max_keys {
            Some(m) if !m.is_none() => parse_max_keys(m)?,
            // Validated at decode time: 1..=MAX_KEYS_LIMIT.
            _ => self.data.window_max_keys as usize,
        };
        let window_ms = match window_ms {
            Some(w) if !w.is_none() => parse_window_ms(w)?,
            _ => self.data.window_ms,
        };
        let mut w = PyDedupWindow::new_window(py, max_keys, window_ms)?;
        // Replaying everything into a smaller window would end with exactly the newest
        // `max_keys` entries; load only those, so the new window starts with zero evictions.
        let all = &self.data.entries;
        let entries = all
            .get(all.len().saturating_sub(max_keys)..)
            .unwrap_or_default();
        py.detach(|| w.add_committed_many(entries.iter().copied()));
        Ok(PyDedupWindow::wrap(w))
    }

    fn __repr__(&self) -> String {
        format!(
            "Snapshot(log_id={}, epoch={}, timestamp_ms={}, entries={}, window_max_keys={}, window_ms={})",
            self.data.log_id,
            self.data.epoch,
            self.data.timestamp_ms,
            self.data.entries.len(),
            self.data.window_max_keys,
            self.data.window_ms
        )
    }
}

/// Encode the committed entries of `window` (commit order) with the snapshot metadata.
#[pyfunction]
pub fn encode_snapshot<'py>(
    py: Python<'py>,
    window: &Bound<'py, PyAny>,
    log_id: &Bound<'py, PyAny>,
    epoch: &Bound<'py, PyAny>,
    timestamp_ms: &Bound<'py, PyAny>,
    watermarks: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let window = window_arg(window)?.get();
    let log_id = args::int_u64(log_id, "log_id")?;
    let epoch = args::int_u64(epoch, "epoch")?;
    let timestamp_ms = args::int_i64(timestamp_ms, "timestamp_ms")?;
    let marks = watermarks.cast::<PyDict>().map_err(|_| {
        InvalidTypeError::new_err(format!(
            "watermarks must be a dict[int, int], not {}",
            type_name(watermarks)
        ))
    })?;
    let marks = marks
        .iter()
        .map(|(k, v)| {
            Ok((
                args::int_u32(&k, "watermarks key")?,
                args::int_i64(&v, "watermarks value")?,
            ))
        })
        .collect::<PyResult<Vec<(u32, i64)>>>()?;
    let out = py.detach(|| {
        let w = window.inner.lock();
        snapshot::encode(
            log_id,
            epoch,
            timestamp_ms,
            w.max_keys() as u64,
            w.window_ms(),
            &marks,
            w.committed_iter(),
        )
    });
    let out = out
        .map_err(|e| InvalidArgumentError::new_err(format!("window cannot be snapshotted: {e}")))?;
    Ok(PyBytes::new(py, &out))
}

/// Decode and validate a snapshot.
#[pyfunction]
pub fn decode_snapshot(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<PySnapshot> {
    let data = args::bytes_like(data, "data")?;
    let s = data.as_slice();
    py.detach(|| snapshot::decode(s))
        .map(|data| PySnapshot { data })
        .map_err(|e| SnapshotCorruptError::new_err(e.0))
}
