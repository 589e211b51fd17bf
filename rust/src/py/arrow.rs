//! The Python face of `arrow_keys`: Arrow data comes in through the Arrow PyCapsule interface
//! (`__arrow_c_array__` for arrays and record batches, `__arrow_c_stream__` for chunked arrays,
//! tables and other streams: pyarrow, polars, ...), zero-copy; keys, routes and canonical JSON
//! are computed with the GIL released, and only the per-row `bytes` are built with it held.

use arrow_array::ffi::{from_ffi, FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::ffi_stream::{ArrayStreamReader, FFI_ArrowArrayStream};
use arrow_array::{make_array, Array, ArrayRef};
use arrow_schema::DataType;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyCapsuleMethods, PyList, PyString, PyTuple};

use super::payloads::PyPayloads;
use crate::arrow_keys::{self, ArrowKeyError};
use crate::errors::{type_name, InvalidArgumentError, InvalidTypeError};
use crate::keys::KEY_LEN;

fn to_py(e: ArrowKeyError) -> PyErr {
    match e {
        ArrowKeyError::Type(m) => InvalidTypeError::new_err(m),
        ArrowKeyError::Value(m) => InvalidArgumentError::new_err(m),
    }
}

/// The chunks of an Arrow array, chunked array, record batch or table (zero-copy).
#[allow(unsafe_code)]
pub fn import_arrow(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<ArrayRef>> {
    let broken = |e: &dyn std::fmt::Display| {
        InvalidArgumentError::new_err(format!("{name}: Arrow data could not be imported: {e}"))
    };
    if obj.hasattr("__arrow_c_array__")? {
        let pair = obj.call_method0("__arrow_c_array__")?;
        let pair = pair.cast::<PyTuple>().map_err(|_| broken(&"not a tuple"))?;
        let schema = pair.get_item(0)?;
        let array = pair.get_item(1)?;
        let schema = schema
            .cast::<PyCapsule>()
            .map_err(|_| broken(&"no schema"))?;
        let array = array.cast::<PyCapsule>().map_err(|_| broken(&"no array"))?;
        let schema_ptr = schema.pointer_checked(Some(c"arrow_schema"))?;
        let array_ptr = array.pointer_checked(Some(c"arrow_array"))?;
        // SAFETY: the capsules are named per the Arrow PyCapsule interface, so they hold an
        // ArrowSchema and an ArrowArray. The schema is only borrowed while its capsule lives.
        // `from_raw` moves the array out and leaves a released (empty) struct behind, so the
        // capsule's destructor does not release it a second time; its buffers now live as long
        // as the imported ArrayData.
        let data = unsafe {
            let schema = &*(schema_ptr.as_ptr() as *const FFI_ArrowSchema);
            let array = FFI_ArrowArray::from_raw(array_ptr.as_ptr() as *mut FFI_ArrowArray);
            from_ffi(array, schema)
        }
        .map_err(|e| broken(&e))?;
        return Ok(vec![make_array(data)]);
    }
    if obj.hasattr("__arrow_c_stream__")? {
        let capsule = obj.call_method0("__arrow_c_stream__")?;
        let capsule = capsule
            .cast::<PyCapsule>()
            .map_err(|_| broken(&"no stream"))?;
        let ptr = capsule.pointer_checked(Some(c"arrow_array_stream"))?;
        // SAFETY: a capsule named "arrow_array_stream" holds an ArrowArrayStream; `from_raw`
        // moves it out (leaving a released one for the capsule's destructor), and the reader
        // releases it when dropped.
        let reader =
            unsafe { ArrayStreamReader::from_raw(ptr.as_ptr() as *mut FFI_ArrowArrayStream) }
                .map_err(|e| broken(&e))?;
        return reader.map(|chunk| chunk.map_err(|e| broken(&e))).collect();
    }
    Err(InvalidTypeError::new_err(format!(
        "{name} must be Arrow data (a pyarrow Array, ChunkedArray, RecordBatch or Table, or \
             any object with __arrow_c_array__ or __arrow_c_stream__), not {}",
        type_name(obj)
    )))
}

fn is_batch(chunks: &[ArrayRef]) -> bool {
    chunks
        .first()
        .is_some_and(|c| matches!(c.data_type(), DataType::Struct(_)))
}

/// Chunks of the top-level column `name` of batch chunks.
fn column(chunks: &[ArrayRef], name: &str) -> PyResult<Vec<ArrayRef>> {
    chunks
        .iter()
        .map(|c| {
            let s = arrow_keys::struct_of(c, "the batch").map_err(to_py)?;
            s.column_by_name(name).cloned().ok_or_else(|| {
                let names: Vec<String> = s.column_names().iter().map(|n| n.to_string()).collect();
                InvalidArgumentError::new_err(format!(
                    "the batch has no column '{name}' (columns: {})",
                    names.join(", ")
                ))
            })
        })
        .collect()
}

fn bytes_list<'py>(py: Python<'py>, rows: &[&[u8]]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, rows.iter().map(|r| PyBytes::new(py, r)))
}

/// Explicit keys of a key column (string, binary or integer), N*16 bytes.
#[pyfunction]
pub fn arrow_explicit_keys<'py>(
    py: Python<'py>,
    column: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let chunks = import_arrow(column, "column")?;
    let out = py
        .detach(|| arrow_keys::explicit_keys(&chunks, "the key column"))
        .map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

/// Content keys (MD5) of a binary or string column, N*16 bytes.
#[pyfunction]
pub fn arrow_content_keys<'py>(
    py: Python<'py>,
    column: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let chunks = import_arrow(column, "column")?;
    let out = py
        .detach(|| {
            let values = arrow_keys::payload_values(&chunks, "the column")?;
            Ok(arrow_keys::content_keys(&values))
        })
        .map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

/// Canonical JSON of every row of a record batch or table, one `bytes` per row.
#[pyfunction]
#[pyo3(signature = (batch, exclude = Vec::new()))]
pub fn arrow_canonical_json<'py>(
    py: Python<'py>,
    batch: &Bound<'py, PyAny>,
    exclude: Vec<String>,
) -> PyResult<Bound<'py, PyList>> {
    let chunks = import_arrow(batch, "batch")?;
    let rows = py
        .detach(|| arrow_keys::json_rows(&chunks, &exclude))
        .map_err(to_py)?;
    bytes_list(py, &rows.rows(0, rows.len()).collect::<Vec<_>>())
}

/// Payloads (a `Payloads`: the payload column's buffers, shared, or the rows' canonical JSON in
/// one buffer) and keys of the rows of `data`, for `IdempotentLogWriter.write_arrow` and the
/// Spark sink: no Python object per row.
#[pyfunction]
#[pyo3(signature = (data, *, key = None, payload = None, exclude = Vec::new()))]
pub fn arrow_rows<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    key: Option<&Bound<'py, PyAny>>,
    payload: Option<String>,
    exclude: Vec<String>,
) -> PyResult<(Bound<'py, PyPayloads>, Bound<'py, PyBytes>)> {
    let chunks = import_arrow(data, "data")?;
    let batch = is_batch(&chunks);
    let key_chunks = match key {
        None => None,
        Some(k) if k.is_instance_of::<PyString>() => {
            if !batch {
                return Err(InvalidArgumentError::new_err(
                    "key_column names a column, but data is a single column: pass the key \
                     column itself, or a record batch",
                ));
            }
            let name: String = k.extract()?;
            Some((column(&chunks, &name)?, format!("key column '{name}'")))
        }
        Some(k) => Some((import_arrow(k, "key_column")?, "the key column".to_owned())),
    };
    let payload_chunks = match (&payload, batch) {
        (Some(name), true) => Some(column(&chunks, name)?),
        (Some(_), false) => {
            return Err(InvalidArgumentError::new_err(
                "payload_column names a column, but data is a single column (the payloads)",
            ))
        }
        (None, true) => None,
        (None, false) => Some(chunks.clone()),
    };
    let what = payload.as_ref().map_or_else(
        || "the payload column".to_owned(),
        |n| format!("payload column '{n}'"),
    );
    let (rows, keys) = py
        .detach(|| {
            let rows = match &payload_chunks {
                None => arrow_keys::json_rows(&chunks, &exclude)?,
                Some(p) => arrow_keys::payload_column(p, &what)?,
            };
            let keys = match &key_chunks {
                None => arrow_keys::content_keys(&rows.rows(0, rows.len()).collect::<Vec<_>>()),
                Some((k, what)) => {
                    let keys = arrow_keys::explicit_keys(k, what)?;
                    if keys.len() != rows.len() * KEY_LEN {
                        return Err(ArrowKeyError::Value(format!(
                            "{what} has {} rows but there are {} payloads",
                            keys.len() / KEY_LEN,
                            rows.len()
                        )));
                    }
                    keys
                }
            };
            Ok((rows, keys))
        })
        .map_err(to_py)?;
    Ok((
        Bound::new(py, PyPayloads { inner: rows })?,
        PyBytes::new(py, &keys),
    ))
}

fn partitions_arg(partitions: i64) -> PyResult<u32> {
    u32::try_from(partitions)
        .ok()
        .filter(|&p| p >= 1)
        .ok_or_else(|| {
            InvalidArgumentError::new_err(format!(
                "partitions must be 1..=4294967295, not {partitions}"
            ))
        })
}

/// Routes of N*16 key bytes among `partitions` logs: N little-endian int32.
#[pyfunction]
pub fn route_keys<'py>(
    py: Python<'py>,
    keys: &Bound<'py, PyAny>,
    partitions: i64,
) -> PyResult<Bound<'py, PyBytes>> {
    let p = partitions_arg(partitions)?;
    let keys = crate::args::key_buffer(keys, "keys")?;
    let out: Vec<u8> = arrow_keys::routes(keys.as_slice(), p)
        .into_iter()
        .flat_map(|r| (r as i32).to_le_bytes())
        .collect();
    Ok(PyBytes::new(py, &out))
}

/// The first row whose route column disagrees with its key: (row, found or None, expected).
#[pyfunction]
pub fn arrow_first_misrouted(
    py: Python<'_>,
    keys: &Bound<'_, PyAny>,
    partitions: i64,
    routes: &Bound<'_, PyAny>,
) -> PyResult<Option<(usize, Option<i128>, u32)>> {
    let p = partitions_arg(partitions)?;
    let keys = crate::args::key_buffer(keys, "keys")?;
    let chunks = import_arrow(routes, "routes")?;
    let keys = keys.as_slice();
    py.detach(|| arrow_keys::first_misrouted(keys, p, &chunks))
        .map_err(to_py)
}

/// Registers the functions above on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(arrow_explicit_keys, m)?)?;
    m.add_function(wrap_pyfunction!(arrow_content_keys, m)?)?;
    m.add_function(wrap_pyfunction!(arrow_canonical_json, m)?)?;
    m.add_function(wrap_pyfunction!(arrow_rows, m)?)?;
    m.add_function(wrap_pyfunction!(route_keys, m)?)?;
    m.add_function(wrap_pyfunction!(arrow_first_misrouted, m)?)?;
    Ok(())
}
