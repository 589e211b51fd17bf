//! The Python error classes of `woodpecker_idem.errors`, imported once and cached, plus helpers
//! that build instances with a message naming the offending argument.

use pyo3::exceptions::{PyMemoryError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

struct Classes {
    invalid_argument: Py<PyType>,
    invalid_type: Py<PyType>,
    snapshot_corrupt: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

/// The cached classes; the import is retried on every error until it succeeds (a failed import is
/// not cached, so a broken environment is not hidden for the rest of the process).
fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let m = py.import("woodpecker_idem.errors")?;
        let get = |name: &str| -> PyResult<Py<PyType>> {
            Ok(m.getattr(name)?.cast_into::<PyType>()?.unbind())
        };
        Ok(Classes {
            invalid_argument: get("InvalidArgumentError")?,
            invalid_type: get("InvalidTypeError")?,
            snapshot_corrupt: get("SnapshotCorruptError")?,
        })
    })
}

/// `InvalidArgumentError` (a `ValueError`); falls back to `ValueError` if the module is missing.
pub fn invalid_argument(py: Python<'_>, msg: impl Into<String>) -> PyErr {
    match classes(py) {
        Ok(c) => PyErr::from_type(c.invalid_argument.bind(py).clone(), msg.into()),
        Err(_) => PyValueError::new_err(msg.into()),
    }
}

/// `InvalidTypeError` (a `TypeError`); falls back to `TypeError` if the module is missing.
pub fn invalid_type(py: Python<'_>, msg: impl Into<String>) -> PyErr {
    match classes(py) {
        Ok(c) => PyErr::from_type(c.invalid_type.bind(py).clone(), msg.into()),
        Err(_) => PyTypeError::new_err(msg.into()),
    }
}

/// `SnapshotCorruptError`; falls back to `ValueError` if the module is missing.
pub fn snapshot_corrupt(py: Python<'_>, msg: impl Into<String>) -> PyErr {
    match classes(py) {
        Ok(c) => PyErr::from_type(c.snapshot_corrupt.bind(py).clone(), msg.into()),
        Err(_) => PyValueError::new_err(msg.into()),
    }
}

/// An allocation the caller asked for (e.g. `max_keys` far beyond memory) could not be made.
pub fn out_of_memory(what: &str) -> PyErr {
    PyMemoryError::new_err(format!("cannot allocate {what}"))
}

/// Python type name of `obj`, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned())
}
