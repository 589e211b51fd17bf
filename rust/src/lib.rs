//! `woodpecker_idem._core`: the Rust core of woodpecker_idem — idempotency keys, the dedup window,
//! the dedup snapshot codec, LogStore record encoding, columnar payload batches and the local
//! store's durable put. The pure-Rust modules (`keys`, `hasher`, `window` with its `slot_index`
//! and `pending`, `snapshot`, `entry`, `payloads`, `fileput`) have no Python dependency and are
//! unit-tested with `cargo test`; `py` (one
//! file per class), `args` and `errors` are the PyO3 layer. The contract is `docs/core-api.md`.

#![deny(unsafe_code)] // exceptions, each proven sound where it is: md5x::digest_many, py::arrow (Arrow C data interface import), py::tuples::new_tuple_of (a NamedTuple built in place) and untrack, slot_index::prefetch_read (a cache hint)

mod args;
mod arrow_keys;
mod codec;
mod entry;
mod errors;
mod fileput;
mod hasher;
mod keys;
mod md5x;
mod net;
mod payloads;
mod pending;
mod py;
mod segfile;
mod slot_index;
mod snapshot;
mod window;

// The Rust API of the pure-Rust core (the Python module below is the product; these are what a
// Rust caller or benchmark would use). Everything else is private, so the dead-code lint sees it.
pub use keys::{content_key, explicit_key, Key, KEY_LEN};
pub use snapshot::{decode as decode_snapshot, encode as encode_snapshot, SnapshotData};
pub use window::{Record, Window};

use pyo3::prelude::*;

/// The package version, from `Cargo.toml` (the one place it is written; maturin gives the wheel
/// the same one), spelled as PEP 440 spells a pre-release (`1.0.0-alpha.1` -> `1.0.0a1`), as
/// maturin does for the wheel metadata.
fn version() -> String {
    pep440(env!("CARGO_PKG_VERSION"))
}

fn pep440(v: &str) -> String {
    match v.split_once('-') {
        None => v.to_owned(),
        Some((release, pre)) => {
            let pre = pre
                .replace("alpha", "a")
                .replace("beta", "b")
                .replace('.', "");
            format!("{release}{pre}")
        }
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<py::PyDedupWindow>()?;
    m.add_class::<py::PyWindowEntry>()?;
    m.add_class::<py::PySnapshot>()?;
    m.add_class::<py::PySnapshotStream>()?;
    m.add_class::<py::PyKeyPipe>()?;
    m.add_class::<py::PyPayloads>()?;
    m.add_function(wrap_pyfunction!(py::content_key, m)?)?;
    m.add_function(wrap_pyfunction!(py::explicit_key, m)?)?;
    m.add_function(wrap_pyfunction!(py::content_keys, m)?)?;
    m.add_function(wrap_pyfunction!(py::content_keys_arrow, m)?)?;
    m.add_function(wrap_pyfunction!(py::explicit_keys, m)?)?;
    m.add_function(wrap_pyfunction!(py::py_crc32c, m)?)?;
    m.add_function(wrap_pyfunction!(py::encode_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(py::decode_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(py::encode_entry, m)?)?;
    m.add_function(wrap_pyfunction!(py::write_results, m)?)?;
    m.add_function(wrap_pyfunction!(py::encode_frame, m)?)?;
    m.add_function(wrap_pyfunction!(py::chunk_end, m)?)?;
    m.add_function(wrap_pyfunction!(py::count_records, m)?)?;
    m.add_function(wrap_pyfunction!(py::decompress_frame, m)?)?;
    m.add_function(wrap_pyfunction!(py::frame_codec, m)?)?;
    m.add_function(wrap_pyfunction!(py::concat, m)?)?;
    m.add_function(wrap_pyfunction!(py::put_file, m)?)?;
    py::register_segfile(m)?;
    py::register_stored(m)?;
    net::register(m)?;
    m.add("__version__", version())?;
    py::register_arrow(m)?;
    m.add("KEY_SIZE", keys::KEY_LEN)?;
    m.add("SNAPSHOT_FORMAT_VERSION", snapshot::FORMAT_VERSION)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::pep440;

    #[test]
    fn versions_spelled_as_pep440() {
        assert_eq!(pep440("0.1.0"), "0.1.0");
        assert_eq!(pep440("1.2.0-alpha.1"), "1.2.0a1");
        assert_eq!(pep440("1.2.0-beta.2"), "1.2.0b2");
        assert_eq!(pep440("1.2.0-rc.3"), "1.2.0rc3");
    }
}
