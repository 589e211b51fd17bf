//! The Python error classes of `woodpecker_idem.errors`, raised from Rust as they are: pyo3's
//! `import_exception!` imports each class on first use and keeps it. The extension ships inside
//! the `woodpecker_idem` package, so the module is always importable next to it.

use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;

pyo3::import_exception!(woodpecker_idem.errors, InvalidArgumentError);
pyo3::import_exception!(woodpecker_idem.errors, InvalidTypeError);
pyo3::import_exception!(woodpecker_idem.errors, SnapshotCorruptError);
pyo3::import_exception!(woodpecker_idem.errors, CorruptEntryError);

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
