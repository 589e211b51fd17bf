//! The key functions: content and explicit idempotency keys, one or many at a time, and CRC32C.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use super::payloads::PyPayloads;
use crate::args::{self, ByteArg};
use crate::errors::{type_name, InvalidArgumentError, InvalidTypeError};
use crate::keys;

/// Single payloads at least this long are hashed with the GIL released.
const DETACH_MIN_BYTES: usize = 64 * 1024;

/// Keys of slices (`fill` writes a run of them), releasing the GIL.
fn keys_bytes<'py>(
    py: Python<'py>,
    slices: &[&[u8]],
    fill: fn(&[&[u8]], &mut [u8]),
) -> Bound<'py, PyBytes> {
    let total = slices.iter().map(|s| s.len()).sum();
    let out = py.detach(|| keys::hash_batch(slices, total, fill));
    PyBytes::new(py, &out)
}

/// Items of a sequence argument; a lone str/bytes is refused (it would iterate characters).
fn sequence_items<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    what: &str,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<pyo3::types::PyByteArray>()
        || obj.is_instance_of::<PyDict>()
    {
        return Err(InvalidTypeError::new_err(format!(
            "{name} must be a sequence of {what}, not {}",
            type_name(obj)
        )));
    }
    if let Ok(list) = obj.cast::<PyList>() {
        return Ok(list.iter().collect());
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return Ok(t.iter().collect());
    }
    let it = obj.try_iter().map_err(|_| {
        InvalidTypeError::new_err(format!(
            "{name} must be a sequence of {what}, not {}",
            type_name(obj)
        ))
    })?;
    it.collect()
}

/// Bytes of one explicit id (str as UTF-8, or bytes), validated to 1..=1024 bytes.
pub(crate) fn id_bytes<'a, N: std::fmt::Display>(
    obj: &'a Bound<'_, PyAny>,
    name: impl Fn() -> N,
) -> PyResult<&'a [u8]> {
    let bytes = if let Ok(s) = obj.cast::<PyString>() {
        s.to_str()
            .map_err(|_| {
                InvalidArgumentError::new_err(format!("{} is not encodable as UTF-8", name()))
            })?
            .as_bytes()
    } else if let Ok(b) = obj.cast::<PyBytes>() {
        b.as_bytes()
    } else {
        return Err(InvalidTypeError::new_err(format!(
            "{} must be str or bytes, not {}",
            name(),
            type_name(obj)
        )));
    };
    match keys::explicit_id_problem(bytes) {
        None => Ok(bytes),
        Some(problem) => Err(InvalidArgumentError::new_err(format!(
            "{} {problem} (got {} bytes)",
            name(),
            bytes.len()
        ))),
    }
}

/// MD5 of a payload: the key of an entry written without an explicit id.
#[pyfunction]
pub fn content_key<'py>(
    py: Python<'py>,
    payload: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let data = args::bytes_like(payload, "payload")?;
    let s = data.as_slice();
    let key = if s.len() >= DETACH_MIN_BYTES {
        py.detach(|| keys::content_key(s))
    } else {
        keys::content_key(s)
    };
    Ok(PyBytes::new(py, &key))
}

/// Domain-separated MD5 of an explicit idempotency id.
#[pyfunction]
pub fn explicit_key<'py>(
    py: Python<'py>,
    idempotency_id: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let id = id_bytes(idempotency_id, || "idempotency_id")?;
    Ok(PyBytes::new(py, &keys::explicit_key(id)))
}

/// Content keys of many payloads, N*16 bytes.
#[pyfunction]
pub fn content_keys<'py>(
    py: Python<'py>,
    payloads: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    if let Ok(batch) = payloads.cast::<PyPayloads>() {
        // immutable, and held by `payloads` while the GIL is released
        let p = &batch.get().inner;
        let slices: Vec<&[u8]> = p.rows(0, p.len()).collect();
        return Ok(keys_bytes(py, &slices, keys::content_keys_into));
    }
    let items = sequence_items(payloads, "payloads", "bytes-like objects")?;
    // `items` holds one reference per payload, so the borrowed `bytes` data stays alive (and,
    // being immutable, unchanged) while the GIL is released. Other bytes-like items are copied.
    let mut copies: Vec<ByteArg<'_>> = Vec::new();
    for (i, o) in items.iter().enumerate() {
        if !o.is_instance_of::<PyBytes>() {
            copies.push(args::bytes_like(o, &format!("payloads[{i}]"))?);
        }
    }
    let mut copied = copies.iter();
    let slices: Vec<&[u8]> = items
        .iter()
        .map(|o| match o.cast::<PyBytes>() {
            Ok(b) => b.as_bytes(),
            Err(_) => copied.next().map(ByteArg::as_slice).unwrap_or_default(),
        })
        .collect();
    Ok(keys_bytes(py, &slices, keys::content_keys_into))
}

/// Content keys of an Arrow binary column, N*16 bytes.
#[pyfunction]
#[pyo3(signature = (offsets, data, *, large = false))]
pub fn content_keys_arrow<'py>(
    py: Python<'py>,
    offsets: &Bound<'py, PyAny>,
    data: &Bound<'py, PyAny>,
    large: bool,
) -> PyResult<Bound<'py, PyBytes>> {
    let offs = args::bytes_like(offsets, "offsets")?;
    let data = args::bytes_like(data, "data")?;
    let (offs, data) = (offs.as_slice(), data.as_slice());
    let out = py
        .detach(|| {
            let ranges = keys::arrow_ranges(offs, data.len(), large)?;
            let slices: Vec<&[u8]> = ranges
                .into_iter()
                .map(|r| data.get(r).unwrap_or_default())
                .collect();
            Ok::<_, String>(keys::hash_batch(
                &slices,
                data.len(),
                keys::content_keys_into,
            ))
        })
        .map_err(InvalidArgumentError::new_err)?;
    Ok(PyBytes::new(py, &out))
}

/// Explicit keys of many ids, N*16 bytes.
#[pyfunction]
pub fn explicit_keys<'py>(
    py: Python<'py>,
    ids: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let items = sequence_items(ids, "ids", "str or bytes")?;
    let slices = items
        .iter()
        .enumerate()
        .map(|(i, o)| id_bytes(o, || format!("ids[{i}]")))
        .collect::<PyResult<Vec<&[u8]>>>()?;
    Ok(keys_bytes(py, &slices, |part, out| {
        keys::each_key_into(part, out, |id| keys::explicit_key(id))
    }))
}

/// CRC32C of `data`, continuing from `value`.
#[pyfunction]
#[pyo3(name = "crc32c", signature = (data, value = None))]
pub fn py_crc32c(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    value: Option<&Bound<'_, PyAny>>,
) -> PyResult<u32> {
    let start = match value {
        Some(v) => args::int_u32(v, "value")?,
        None => 0,
    };
    let data = args::bytes_like(data, "data")?;
    let s = data.as_slice();
    Ok(if s.len() >= DETACH_MIN_BYTES {
        py.detach(|| keys::crc32c(start, s))
    } else {
        keys::crc32c(start, s)
    })
}
