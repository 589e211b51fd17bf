//! Argument extraction: bytes-like buffers (zero-copy for `bytes`), little-endian int64 columns,
//! keys and range-checked integers, each failing with the package's error classes and the
//! argument's name.

use pyo3::buffer::{PyBuffer, ReadOnlyCell};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyInt, PyString};

use crate::errors::{type_name, InvalidArgumentError, InvalidTypeError};
use crate::keys::{Key, KEY_LEN};

/// Bytes of a bytes-like argument: borrowed from an immutable `bytes` object, otherwise copied
/// out of the buffer while the GIL is held. The copy is deliberate: a writable exporter
/// (bytearray, array, numpy) could be resized or written by another thread once the GIL is
/// released, so only `bytes` is safe to read in place without the GIL.
pub enum ByteArg<'py> {
    Borrowed(Bound<'py, PyBytes>),
    Owned(Vec<u8>),
}

impl ByteArg<'_> {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            ByteArg::Borrowed(b) => b.as_bytes(),
            ByteArg::Owned(v) => v,
        }
    }
}

/// Extract a bytes-like object (bytes, bytearray, memoryview, array.array, any C-contiguous
/// buffer of any item type: the raw bytes are used).
pub fn bytes_like<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<ByteArg<'py>> {
    let py = obj.py();
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(ByteArg::Borrowed(b.clone()));
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(ByteArg::Owned(b.to_vec()));
    }
    if !obj.is_instance_of::<PyString>() {
        if let Ok(buf) = PyBuffer::<u8>::get(obj) {
            return Ok(ByteArg::Owned(buf.to_vec(py)?));
        }
        // Other item formats ('q', 'I', 'd', ...): view the same memory as unsigned bytes.
        let raw = py
            .import("builtins")
            .and_then(|b| b.getattr("memoryview"))
            .and_then(|mv| mv.call1((obj,)))
            .and_then(|view| view.call_method1("cast", ("B",)));
        if let Ok(view) = raw {
            if let Ok(buf) = PyBuffer::<u8>::get(&view) {
                return Ok(ByteArg::Owned(buf.to_vec(py)?));
            }
        }
    }
    Err(InvalidTypeError::new_err(format!(
        "{name} must be a bytes-like object, not {}",
        type_name(obj)
    )))
}

/// A 16-byte key argument.
pub fn key(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Key> {
    let b = bytes_like(obj, name)?;
    <Key>::try_from(b.as_slice()).map_err(|_| {
        InvalidArgumentError::new_err(format!(
            "{name} must be exactly {KEY_LEN} bytes, got {}",
            b.as_slice().len()
        ))
    })
}

/// A buffer of N*16 key bytes.
pub fn key_buffer<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<ByteArg<'py>> {
    let b = bytes_like(obj, name)?;
    if !b.as_slice().len().is_multiple_of(KEY_LEN) {
        return Err(InvalidArgumentError::new_err(format!(
            "{name} must be a multiple of {KEY_LEN} bytes (N concatenated keys), got {}",
            b.as_slice().len()
        )));
    }
    Ok(b)
}

/// A column of int64 values read in place where possible: raw little-endian bytes (`bytes` is
/// borrowed), or a C-contiguous buffer of int64/uint64 items (array('q'), numpy). Batch inserts
/// read it chunk by chunk, so a million-row recovery needs no full-size temporary copies.
pub enum I64Column<'py> {
    Raw(ByteArg<'py>),
    I64(PyBuffer<i64>),
    U64(PyBuffer<u64>),
    Owned(Vec<i64>),
}

impl I64Column<'_> {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            I64Column::Raw(b) => b.as_slice().len() / 8,
            I64Column::I64(b) => b.item_count(),
            I64Column::U64(b) => b.item_count(),
            I64Column::Owned(v) => v.len(),
        }
    }

    /// A cheap view for element access (contiguity is checked once here, not per element).
    pub fn view<'a>(&'a self, py: Python<'a>) -> I64View<'a> {
        match self {
            I64Column::Raw(b) => I64View::Raw(b.as_slice()),
            I64Column::I64(b) => I64View::I64(b.as_slice(py).unwrap_or_default()),
            I64Column::U64(b) => I64View::U64(b.as_slice(py).unwrap_or_default()),
            I64Column::Owned(v) => I64View::Owned(v),
        }
    }
}

/// Borrowed element access to an [`I64Column`].
pub enum I64View<'a> {
    Raw(&'a [u8]),
    I64(&'a [ReadOnlyCell<i64>]),
    U64(&'a [ReadOnlyCell<u64>]),
    Owned(&'a [i64]),
}

impl I64View<'_> {
    /// Value `i` widened to i128 (so uint64 items beyond int64 are visible to range checks);
    /// `None` past the end.
    #[inline]
    pub fn get(&self, i: usize) -> Option<i128> {
        match self {
            I64View::Raw(b) => {
                let chunk = b.get(i * 8..i * 8 + 8)?;
                Some(i128::from(i64::from_le_bytes(chunk.try_into().ok()?)))
            }
            I64View::I64(c) => c.get(i).map(|c| i128::from(c.get())),
            I64View::U64(c) => c.get(i).map(|c| i128::from(c.get())),
            I64View::Owned(v) => v.get(i).map(|&x| i128::from(x)),
        }
    }
}

/// Extract an int64 column argument (see [`I64Column`]).
pub fn i64_column<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<I64Column<'py>> {
    let py = obj.py();
    if !obj.is_instance_of::<PyBytes>() && !obj.is_instance_of::<PyByteArray>() {
        if let Ok(buf) = PyBuffer::<i64>::get(obj) {
            return Ok(if buf.as_slice(py).is_some() {
                I64Column::I64(buf)
            } else {
                I64Column::Owned(buf.to_vec(py)?)
            });
        }
        if let Ok(buf) = PyBuffer::<u64>::get(obj) {
            if buf.as_slice(py).is_some() {
                return Ok(I64Column::U64(buf));
            }
            let v = buf.to_vec(py)?;
            return v
                .iter()
                .enumerate()
                .map(|(i, &x)| {
                    i64::try_from(x).map_err(|_| {
                        InvalidArgumentError::new_err(format!(
                            "{name}[{i}] = {x} does not fit int64"
                        ))
                    })
                })
                .collect::<PyResult<Vec<i64>>>()
                .map(I64Column::Owned);
        }
    }
    let raw = bytes_like(obj, name)?;
    if !raw.as_slice().len().is_multiple_of(8) {
        return Err(InvalidArgumentError::new_err(format!(
            "{name} must hold whole little-endian int64 values, got {} bytes",
            raw.as_slice().len()
        )));
    }
    Ok(I64Column::Raw(raw))
}

/// An int argument as i64 (bool counts as int, like everywhere in Python).
pub fn int_i64(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    if !obj.is_instance_of::<PyInt>() {
        return Err(InvalidTypeError::new_err(format!(
            "{name} must be an int, not {}",
            type_name(obj)
        )));
    }
    obj.extract::<i64>()
        .map_err(|_| InvalidArgumentError::new_err(format!("{name} = {obj} does not fit int64")))
}

fn out_of_range(obj: &Bound<'_, PyAny>, name: &str, range: &str) -> PyErr {
    InvalidArgumentError::new_err(format!("{name} = {obj} is out of range {range}"))
}

/// An int argument that must fit u32 (segment and entry ids).
pub fn int_u32(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
    let range = "0..=4294967295";
    let v = int_i64(obj, name).map_err(|e| {
        if obj.is_instance_of::<PyInt>() {
            out_of_range(obj, name, range)
        } else {
            e
        }
    })?;
    u32::try_from(v).map_err(|_| out_of_range(obj, name, range))
}

/// An int argument that must fit u64 (log ids, epochs).
pub fn int_u64(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    if !obj.is_instance_of::<PyInt>() {
        return Err(InvalidTypeError::new_err(format!(
            "{name} must be an int, not {}",
            type_name(obj)
        )));
    }
    obj.extract::<u64>()
        .map_err(|_| out_of_range(obj, name, "0..=18446744073709551615"))
}

/// An optional int64 argument (`None` allowed).
pub fn opt_i64(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<i64>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => int_i64(o, name).map(Some),
    }
}
