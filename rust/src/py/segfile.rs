//! Python face of `segfile`: the local segment files' scan, read and appender, each call
//! releasing the GIL once.

use std::path::PathBuf;

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::args;
use crate::segfile::{self, Appender};

fn os_error(e: std::io::Error, path: &std::path::Path) -> PyErr {
    let path = path.to_string_lossy().into_owned();
    match e.raw_os_error() {
        Some(code) => PyOSError::new_err((code, e.to_string(), path)),
        None => PyOSError::new_err(format!("{path}: {e}")),
    }
}

type ScanResult = (Vec<(i64, i64, u64)>, i64, u64, Option<u64>);

/// Walk the whole batches of `path` in `[start, limit)`: returns `(runs, lac, end, corrupt_at)`,
/// runs being `(first, last, offset)` of consecutive entries in consecutive batches.
#[pyfunction]
#[pyo3(signature = (path, start, limit, *, completed))]
pub fn segfile_scan(
    py: Python<'_>,
    path: PathBuf,
    start: u64,
    limit: u64,
    completed: bool,
) -> PyResult<ScanResult> {
    let s = py
        .detach(|| segfile::scan(&path, start, limit, completed))
        .map_err(|e| os_error(e, &path))?;
    Ok((s.runs, s.lac, s.end, s.corrupt_at))
}

type ReadResult<'py> = (
    Vec<Bound<'py, PyBytes>>,
    u64,
    i64,
    Option<(u64, i64, String)>,
);

/// Entries of `spans` (`(offset, first, lo, hi)`) in order: `(entries, resume_offset,
/// resume_first, bad)`, `bad` being `(batch offset, entry id, why)` when a read failed.
#[pyfunction]
pub fn segfile_read<'py>(
    py: Python<'py>,
    path: PathBuf,
    spans: Vec<segfile::Span>,
) -> PyResult<ReadResult<'py>> {
    let got = py
        .detach(|| segfile::read(&path, &spans))
        .map_err(|e| os_error(e, &path))?;
    Ok(match got {
        Ok((entries, at, first)) => (
            entries.iter().map(|e| PyBytes::new(py, e)).collect(),
            at,
            first,
            None,
        ),
        Err(bad) => (Vec::new(), 0, 0, Some((bad.offset, bad.entry_id, bad.why))),
    })
}

/// An append-only segment file: `append(header, frame) -> offset` (one write), `sync(sync,
/// fence) -> fenced` (fdatasync, then whether `fence` exists), and both as `append_sync`.
/// Closed when dropped.
#[pyclass(name = "SegmentAppender", module = "woodpecker_idem._core", frozen)]
pub struct PySegmentAppender {
    inner: Appender,
    path: PathBuf,
}

#[pymethods]
impl PySegmentAppender {
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let inner = py
            .detach(|| Appender::open(&path))
            .map_err(|e| os_error(e, &path))?;
        Ok(Self { inner, path })
    }

    fn append(
        &self,
        py: Python<'_>,
        header: &Bound<'_, PyAny>,
        frame: &Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        let header = args::bytes_like(header, "header")?;
        let frame = args::bytes_like(frame, "frame")?;
        let (h, f) = (header.as_slice(), frame.as_slice());
        py.detach(|| self.inner.append(h, f))
            .map_err(|e| os_error(e, &self.path))
    }

    /// Append, fdatasync (when `sync`), then look for `fence`: `(offset, fenced)`.
    #[pyo3(signature = (header, frame, sync, fence))]
    fn append_sync(
        &self,
        py: Python<'_>,
        header: &Bound<'_, PyAny>,
        frame: &Bound<'_, PyAny>,
        sync: bool,
        fence: Option<PathBuf>,
    ) -> PyResult<(u64, bool)> {
        let header = args::bytes_like(header, "header")?;
        let frame = args::bytes_like(frame, "frame")?;
        let (h, f) = (header.as_slice(), frame.as_slice());
        py.detach(|| self.inner.append_sync(h, f, sync, fence.as_deref()))
            .map_err(|e| os_error(e, &self.path))
    }

    #[pyo3(signature = (sync, fence))]
    fn sync(&self, py: Python<'_>, sync: bool, fence: Option<PathBuf>) -> PyResult<bool> {
        py.detach(|| self.inner.sync(sync, fence.as_deref()))
            .map_err(|e| os_error(e, &self.path))
    }
}

/// Adds this module's functions and class to `_core` (one line in lib.rs).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(segfile_scan, m)?)?;
    m.add_function(wrap_pyfunction!(segfile_read, m)?)?;
    m.add_class::<PySegmentAppender>()
}
