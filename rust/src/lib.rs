//! `woodpecker_idem._core`: the Rust core of woodpecker_idem — idempotency keys, the dedup window,
//! the dedup snapshot codec, LogStore record encoding and the local store's durable put. The
//! pure-Rust modules (`keys`, `hasher`, `varint`, `window`, `snapshot`, `entry`, `fileput`) have
//! no Python dependency and are unit-tested with `cargo test`; `py*`, `args` and `errors` are the
//! PyO3 layer. The contract is `docs/core-api.md`.

#![deny(unsafe_code)] // one exception, proven sound where it is: md5x::digest_many

pub mod args;
pub mod arrow_keys;
pub mod entry;
pub mod errors;
pub mod fileput;
pub mod hasher;
pub mod keys;
pub mod md5x;
pub mod py;
pub mod py_arrow;
pub mod py_entry;
pub mod py_fileput;
pub mod py_hasher;
pub mod snapshot;
pub mod varint;
pub mod window;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<py::PyDedupWindow>()?;
    m.add_class::<py::PyWindowEntry>()?;
    m.add_class::<py::PySnapshot>()?;
    m.add_class::<py_hasher::PyKeyPipe>()?;
    m.add_function(wrap_pyfunction!(py::content_key, m)?)?;
    m.add_function(wrap_pyfunction!(py::explicit_key, m)?)?;
    m.add_function(wrap_pyfunction!(py::content_keys, m)?)?;
    m.add_function(wrap_pyfunction!(py::content_keys_arrow, m)?)?;
    m.add_function(wrap_pyfunction!(py::explicit_keys, m)?)?;
    m.add_function(wrap_pyfunction!(py::py_crc32c, m)?)?;
    m.add_function(wrap_pyfunction!(py::encode_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(py::decode_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(py_entry::encode_entry, m)?)?;
    m.add_function(wrap_pyfunction!(py_entry::encode_new_entries, m)?)?;
    m.add_function(wrap_pyfunction!(py_entry::count_records, m)?)?;
    m.add_function(wrap_pyfunction!(py_entry::concat, m)?)?;
    m.add_function(wrap_pyfunction!(py_fileput::put_file, m)?)?;
    py_arrow::register(m)?;
    m.add("KEY_SIZE", keys::KEY_LEN)?;
    m.add("SNAPSHOT_FORMAT_VERSION", snapshot::FORMAT_VERSION)?;
    Ok(())
}
