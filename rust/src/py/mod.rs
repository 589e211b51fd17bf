//! The Python face, one file per class or concern (as polars splits its bindings): argument
//! checking happens here with the GIL held; the work itself runs in the pure-Rust modules with the
//! GIL released wherever it is more than a few hundred nanoseconds.

mod arrow;
mod convert;
mod entry;
mod fileput;
mod keypipe;
mod keys;
mod payloads;
mod segfile;
mod snapshot;
mod stored;
mod tuples;
mod window;
mod window_entry;

pub use arrow::register as register_arrow;
pub use entry::{
    chunk_end, concat, count_records, decompress_frame, encode_entry, encode_frame, frame_codec,
};
pub use fileput::put_file;
pub use keypipe::PyKeyPipe;
pub use keys::{
    content_key, content_keys, content_keys_arrow, explicit_key, explicit_keys, py_crc32c,
};
pub use payloads::PyPayloads;
pub use segfile::register as register_segfile;
pub use snapshot::{decode_snapshot, encode_snapshot, PySnapshot, PySnapshotStream};
pub use stored::register as register_stored;
pub use tuples::write_results;
pub use window::PyDedupWindow;
pub use window_entry::PyWindowEntry;
