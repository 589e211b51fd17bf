//! Python face of `fileput`: `put_file`, the local object store's durable put without the GIL.

use std::path::PathBuf;

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

use crate::args;
use crate::fileput::{self, PutError};

fn os_error(e: PutError) -> PyErr {
    // OSError(errno, strerror, filename) picks the subclass (FileExistsError, ...) by errno.
    match e.error.raw_os_error() {
        Some(code) => PyOSError::new_err((code, e.error.to_string(), e.path)),
        None => PyOSError::new_err(format!("{}: {}", e.path, e.error)),
    }
}

/// Durably write `data` to the fresh file `temp` and publish it as `final_path` (link when
/// `exclusive`, else rename); returns 0 published, 1 final exists (exclusive), 2 temp name taken,
/// 3 directory missing. Other failures raise `OSError` (with errno and filename); the temp file
/// is removed on every outcome but 2.
#[pyfunction]
#[pyo3(signature = (temp, final_path, data, *, exclusive, sync))]
pub fn put_file(
    py: Python<'_>,
    temp: PathBuf,
    final_path: PathBuf,
    data: &Bound<'_, PyAny>,
    exclusive: bool,
    sync: bool,
) -> PyResult<u8> {
    let data = args::bytes_like(data, "data")?;
    let bytes = data.as_slice();
    py.detach(|| fileput::put_file(&temp, &final_path, bytes, exclusive, sync))
        .map(|outcome| outcome as u8)
        .map_err(os_error)
}
