//! `woodpecker_idem._core`: the Rust core of woodpecker_idem — idempotency keys, the dedup window,
//! the dedup snapshot codec, LogStore record encoding and the local store's durable put. The
//! pure-Rust modules (`keys`, `hasher`, `window`, `snapshot`, `entry`, `fileput`) have
//! no Python dependency and are unit-tested with `cargo test`; `py` (one file per class), `args` and
//! `errors` are the PyO3 layer. The contract is `docs/core-api.md`.

#![deny(unsafe_code)] // one exception, proven sound where it is: md5x::digest_many

mod args;
mod entry;
mod errors;
mod fileput;
mod hasher;
mod keys;
mod md5x;
mod py;
mod snapshot;
mod window;

// The Rust API of the pure-Rust core (the Python module below is the product; these are what a
// Rust caller or benchmark would use). Everything else is private, so the dead-code lint sees it.
pub use keys::{content_key, explicit_key, Key, KEY_LEN};
pub use snapshot::{decode as decode_snapshot, encode as encode_snapshot, SnapshotData};
pub use window::{Record, Window};

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<py::PyDedupWindow>()?;
    m.add_class::<py::PyWindowEntry>()?;
    m.add_class::<py::PySnapshot>()?;
    m.add_class::<py::PyKeyPipe>()?;
    m.add_function(wrap_pyfunction!(py::content_key, m)?)?;
    m.add_function(wrap_pyfunction!(py::explicit_key, m)?)?;
    m.add_function(wrap_pyfunction!(py::content_keys, m)?)?;
    m.add_function(wrap_pyfunction!(py::content_keys_arrow, m)?)?;
    m.add_function(wrap_pyfunction!(py::explicit_keys, m)?)?;
    m.add_function(wrap_pyfunction!(py::py_crc32c, m)?)?;
    m.add_function(wrap_pyfunction!(py::encode_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(py::decode_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(py::encode_entry, m)?)?;
    m.add_function(wrap_pyfunction!(py::encode_new_entries, m)?)?;
    m.add_function(wrap_pyfunction!(py::count_records, m)?)?;
    m.add_function(wrap_pyfunction!(py::concat, m)?)?;
    m.add_function(wrap_pyfunction!(py::put_file, m)?)?;
    m.add("KEY_SIZE", keys::KEY_LEN)?;
    m.add("SNAPSHOT_FORMAT_VERSION", snapshot::FORMAT_VERSION)?;
    Ok(())
}
