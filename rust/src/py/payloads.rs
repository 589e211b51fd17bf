//! `Payloads`: a batch's payloads as one buffer and its offsets (`crate::payloads`), what the
//! batch calls hand the writer instead of one `bytes` object per row. Made from an Arrow binary
//! or string column without a copy (`from_arrow`), or from a list of bytes in one pass; given
//! back to Arrow without a copy (`__arrow_c_array__`).

use std::ffi::CString;
use std::sync::Arc;

use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::{Array, ArrayRef, BinaryArray, LargeBinaryArray};
use pyo3::prelude::*;
use pyo3::types::{
    PyByteArray, PyBytes, PyCapsule, PyDict, PyList, PyMemoryView, PySlice, PyString, PyTuple,
};

use super::arrow::import_arrow;
use crate::args;
use crate::arrow_keys::{self, ArrowKeyError};
use crate::errors::{type_name, InvalidArgumentError, InvalidTypeError};
use crate::payloads::Payloads;

/// A batch of payloads; see the module documentation and `docs/core-api.md`.
#[pyclass(frozen, sequence, module = "woodpecker_idem._core", name = "Payloads")]
pub struct PyPayloads {
    pub(crate) inner: Payloads,
}

/// The items of a sequence of payloads (a lone bytes-like or str would iterate its characters).
fn items<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let refused = || {
        InvalidTypeError::new_err(format!(
            "payloads must be a sequence of bytes (a list or tuple), not {}",
            type_name(obj)
        ))
    };
    if let Ok(list) = obj.cast::<PyList>() {
        return Ok(list.iter().collect());
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return Ok(tuple.iter().collect());
    }
    if obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
        || obj.is_instance_of::<PyMemoryView>()
        || obj.is_instance_of::<PyDict>()
        || !(obj.hasattr("__len__")? && obj.hasattr("__getitem__")?)
    {
        return Err(refused());
    }
    obj.try_iter().map_err(|_| refused())?.collect()
}

/// The bytes of payload `i`: `bytes` as it is, a bytearray or memoryview copied (as a write
/// takes them); anything else is refused naming the row.
fn row_bytes<'py>(item: &Bound<'py, PyAny>, i: usize) -> PyResult<args::ByteArg<'py>> {
    let refused = || {
        let hint = if item.is_instance_of::<PyString>() {
            " (encode str first)"
        } else {
            ""
        };
        InvalidTypeError::new_err(format!(
            "payloads[{i}] must be bytes, bytearray or memoryview, not {}{hint}",
            type_name(item)
        ))
    };
    if let Ok(b) = item.cast::<PyBytes>() {
        return Ok(args::ByteArg::Borrowed(b.clone()));
    }
    if !(item.is_instance_of::<PyByteArray>() || item.is_instance_of::<PyMemoryView>()) {
        return Err(refused());
    }
    match args::bytes_like(item, "payload") {
        Ok(b) => Ok(b),
        // a memoryview that is not C-contiguous: bytes() copies it in order
        Err(_) => Ok(args::ByteArg::Borrowed(
            item.py()
                .get_type::<PyBytes>()
                .call1((item,))?
                .cast_into::<PyBytes>()
                .map_err(|_| refused())?,
        )),
    }
}

impl PyPayloads {
    /// A list, tuple or other sequence of bytes-likes laid end to end (GIL held: the rows are
    /// Python objects another thread could change).
    pub(crate) fn from_sequence(obj: &Bound<'_, PyAny>) -> PyResult<Payloads> {
        let items = items(obj)?;
        let rows = items
            .iter()
            .enumerate()
            .map(|(i, item)| row_bytes(item, i))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Payloads::from_rows(rows.iter().map(|r| r.as_slice())))
    }

    fn check_range(&self, start: usize, end: usize) -> PyResult<()> {
        let n = self.inner.len();
        if start > end || end > n {
            return Err(InvalidArgumentError::new_err(format!(
                "rows {start}..{end} are not within the {n} payloads"
            )));
        }
        Ok(())
    }

    fn as_arrow(&self) -> ArrayRef {
        match self.inner.arrow_parts() {
            (data, Ok(offsets)) => Arc::new(BinaryArray::new(offsets.clone(), data.clone(), None)),
            (data, Err(offsets)) => {
                Arc::new(LargeBinaryArray::new(offsets.clone(), data.clone(), None))
            }
        }
    }
}

fn to_py(e: ArrowKeyError) -> PyErr {
    match e {
        ArrowKeyError::Type(m) => InvalidTypeError::new_err(m),
        ArrowKeyError::Value(m) => InvalidArgumentError::new_err(m),
    }
}

#[pymethods]
impl PyPayloads {
    /// The payloads of a sequence of bytes (bytearray and memoryview rows are taken too),
    /// copied into one buffer in one pass; a row of another type is refused naming its index.
    #[new]
    fn new(rows: &Bound<'_, PyAny>) -> PyResult<Self> {
        let inner = match rows.cast::<PyPayloads>() {
            Ok(p) => p.get().inner.clone(),
            Err(_) => Self::from_sequence(rows)?,
        };
        Ok(PyPayloads { inner })
    }

    /// The values of an Arrow binary or string column (pyarrow, polars, ...: anything with
    /// `__arrow_c_array__` or `__arrow_c_stream__`), without a copy when it is one chunk of
    /// binary, large binary, string or large string; a null value is refused naming its row.
    #[staticmethod]
    fn from_arrow(py: Python<'_>, column: &Bound<'_, PyAny>) -> PyResult<Self> {
        let chunks = import_arrow(column, "column")?;
        let inner = py
            .detach(|| arrow_keys::payload_column(&chunks, "the column"))
            .map_err(to_py)?;
        Ok(PyPayloads { inner })
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Row `index` as `bytes` (a copy), or the rows of a slice (step 1) as a `Payloads`
    /// sharing this one's buffer.
    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n = self.inner.len();
        if let Ok(slice) = index.cast::<PySlice>() {
            let s = slice.indices(n as isize)?;
            if s.step != 1 {
                return Err(InvalidArgumentError::new_err(
                    "a slice of Payloads takes step 1 only",
                ));
            }
            let (start, stop) = (s.start as usize, (s.stop.max(s.start)) as usize);
            let part = PyPayloads {
                inner: self.inner.slice(start, stop),
            };
            return Ok(Bound::new(py, part)?.into_any());
        }
        let i: isize = index.extract().map_err(|_| {
            InvalidTypeError::new_err(format!(
                "Payloads indices must be integers or slices, not {}",
                type_name(index)
            ))
        })?;
        let at = if i < 0 { i + n as isize } else { i };
        if at < 0 || at as usize >= n {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "payload {i} is not within the {n} payloads"
            )));
        }
        Ok(PyBytes::new(py, self.inner.row(at as usize)).into_any())
    }

    /// Equal to another `Payloads` or a sequence of bytes-likes holding the same rows.
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        if let Ok(o) = other.cast::<PyPayloads>() {
            return Ok(self.inner == o.get().inner);
        }
        let Ok(items) = items(other) else {
            return Ok(false);
        };
        if items.len() != self.inner.len() {
            return Ok(false);
        }
        for (i, item) in items.iter().enumerate() {
            match row_bytes(item, i) {
                Ok(b) if b.as_slice() == self.inner.row(i) => {}
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    fn __repr__(&self) -> String {
        format!(
            "Payloads({} rows, {} bytes)",
            self.inner.len(),
            self.inner.nbytes(0, self.inner.len())
        )
    }

    /// Bytes of every row together.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes(0, self.inner.len())
    }

    /// Length of the longest row (0 when there is none).
    #[getter]
    fn longest(&self) -> usize {
        self.inner.longest()
    }

    /// Bytes of the rows `start..end`, `overhead` more per row: from two offsets.
    #[pyo3(signature = (start, end, overhead = 0))]
    fn range_bytes(&self, start: usize, end: usize, overhead: usize) -> PyResult<usize> {
        self.check_range(start, end)?;
        Ok(self.inner.nbytes(start, end) + overhead * (end - start))
    }

    /// The first row longer than `max_bytes`, or None (no row is read when none is).
    fn first_longer(&self, max_bytes: usize) -> Option<usize> {
        self.inner.first_longer(max_bytes)
    }

    /// `(bytes, end)`: the rows from `start` (before `end`) whose bytes, `overhead` more each,
    /// fit `limit` (at least one row), by bisection over the offsets.
    #[pyo3(signature = (start, end, limit, overhead = 0))]
    fn fit(
        &self,
        start: usize,
        end: usize,
        limit: usize,
        overhead: usize,
    ) -> PyResult<(usize, usize)> {
        self.check_range(start, end)?;
        Ok(self.inner.fit(start, end, limit, overhead))
    }

    /// The rows numbered in `rows` (a list of ints or an int64 buffer such as array('q')), in
    /// that order, in a new batch.
    fn take(&self, py: Python<'_>, rows: &Bound<'_, PyAny>) -> PyResult<Self> {
        let n = self.inner.len();
        let wanted: Vec<i64> =
            if rows.is_instance_of::<PyList>() || rows.is_instance_of::<PyTuple>() {
                rows.extract().map_err(|_| {
                    InvalidTypeError::new_err("rows must be a list of ints or an int64 buffer")
                })?
            } else {
                let col = args::i64_column(rows, "rows")?;
                let view = col.view(py);
                (0..col.len())
                    .map(|i| {
                        view.get(i)
                            .and_then(|v| i64::try_from(v).ok())
                            .unwrap_or(-1)
                    })
                    .collect()
            };
        if let Some((i, &bad)) = wanted
            .iter()
            .enumerate()
            .find(|&(_, &r)| r < 0 || r as u64 >= n as u64)
        {
            return Err(InvalidArgumentError::new_err(format!(
                "rows[{i}] = {bad} is not a row of the {n} payloads"
            )));
        }
        Ok(PyPayloads {
            inner: self.inner.take(wanted.into_iter().map(|r| r as usize)),
        })
    }

    /// Every row as `bytes`, in a list.
    fn to_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(
            py,
            self.inner
                .rows(0, self.inner.len())
                .map(|r| PyBytes::new(py, r)),
        )
    }

    /// The Arrow PyCapsule interface: the rows as an Arrow binary (or large binary) array
    /// sharing this batch's buffers, e.g. for `pyarrow.array(payloads)`. A requested schema is
    /// not followed (the interface lets a producer leave it; the consumer casts).
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyCapsule>, Bound<'py, PyCapsule>)> {
        let _ = requested_schema;
        let data = self.as_arrow().to_data();
        let schema = FFI_ArrowSchema::try_from(data.data_type())
            .map_err(|e| InvalidArgumentError::new_err(format!("the payloads' Arrow type: {e}")))?;
        let array = FFI_ArrowArray::new(&data);
        // The consumer moves each struct out (leaving it released), so dropping the capsule
        // releases only what was not taken.
        let schema = PyCapsule::new(py, schema, Some(CString::from(c"arrow_schema")))?;
        let array = PyCapsule::new(py, array, Some(CString::from(c"arrow_array")))?;
        Ok((schema, array))
    }
}

/// Where a frame's payloads come from: a list of `bytes` (the queue's writes) or a `Payloads`
/// batch (the batch calls).
pub(crate) enum PayloadRows<'py> {
    List(Bound<'py, PyList>),
    Batch(Bound<'py, PyPayloads>),
}

impl<'py> PayloadRows<'py> {
    pub(crate) fn of(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(p) = obj.cast::<PyPayloads>() {
            return Ok(PayloadRows::Batch(p.clone()));
        }
        if let Ok(list) = obj.cast::<PyList>() {
            return Ok(PayloadRows::List(list.clone()));
        }
        Err(InvalidTypeError::new_err(format!(
            "payloads must be a Payloads or a list of bytes, not {}",
            type_name(obj)
        )))
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            PayloadRows::List(l) => l.len(),
            PayloadRows::Batch(p) => p.get().inner.len(),
        }
    }
}
