//! Tuple-subclass instances (the package's NamedTuples) built in place, for the paths that make
//! one per entry: a reader's messages and positions, a batch's write results.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyList, PyTuple, PyType};

use crate::errors::InvalidTypeError;

/// A new instance of the tuple subclass `ty` holding `items`: what `tuple.__new__(ty, items)`
/// makes, without a call and its argument tuples (a NamedTuple's own `__new__` is Python code).
#[allow(unsafe_code)]
pub(crate) fn new_tuple_of<'py, const N: usize>(
    ty: &Bound<'py, PyType>,
    items: [Bound<'py, PyAny>; N],
) -> PyResult<Bound<'py, PyAny>> {
    let py = ty.py();
    // SAFETY: the caller checked that `ty` subclasses tuple, so its `tp_alloc` slot (set on every
    // ready type, inherited from tuple) allocates a tuple of `ty` with N empty (NULL) items and
    // one reference, ours; `PyTuple_SetItem` accepts tuple subclasses with one reference and
    // fills each slot once, taking over the item's reference (even when it fails). This is
    // CPython's own `tuple_subtype_new`. If a fill fails, dropping the half-filled tuple is safe:
    // tuple deallocation skips NULL items.
    unsafe {
        let slot = ffi::PyType_GetSlot(ty.as_type_ptr(), ffi::Py_tp_alloc);
        let alloc: Option<ffi::allocfunc> = std::mem::transmute(slot);
        let alloc = alloc.ok_or_else(|| PyErr::fetch(py))?;
        let obj = Bound::from_owned_ptr_or_err(py, alloc(ty.as_type_ptr(), N as ffi::Py_ssize_t))?;
        for (i, item) in items.into_iter().enumerate() {
            if ffi::PyTuple_SetItem(obj.as_ptr(), i as ffi::Py_ssize_t, item.into_ptr()) != 0 {
                return Err(PyErr::fetch(py));
            }
        }
        Ok(obj)
    }
}

/// Takes `obj` (a new tuple that can be in no cycle) out of the cycle collector: its passes over
/// a reader's many young positions were a large part of a read's time. CPython untracks such
/// plain tuples itself, but not a NamedTuple's.
#[allow(unsafe_code)]
pub(crate) fn untrack(obj: &Bound<'_, PyAny>) {
    // SAFETY: `obj` is a live GC object (a tuple made by `new_tuple_of`, tracked by tp_alloc);
    // untracking a tracked object is always sound (it only leaves the collector's lists; at
    // worst a cycle through it would never be collected, which the caller rules out).
    unsafe { ffi::PyObject_GC_UnTrack(obj.as_ptr().cast()) }
}

/// Checks that each named type subclasses tuple (so `new_tuple_of` may build it), and tells for
/// each whether its instances are laid out as a plain tuple's (no `__dict__`, as a NamedTuple):
/// then they can be in no reference cycle, and `untrack` may take them out of the collector.
pub(crate) fn tuple_types<const N: usize>(
    py: Python<'_>,
    types: [(&str, &Bound<'_, PyType>); N],
) -> PyResult<[bool; N]> {
    let tuple = py.get_type::<PyTuple>();
    let basic_size = |ty: &Bound<'_, PyType>| ty.getattr("__basicsize__")?.extract::<isize>();
    let basic = basic_size(&tuple)?;
    let mut plain = [false; N];
    for ((name, ty), out) in types.into_iter().zip(plain.iter_mut()) {
        if !ty.is_subclass(&tuple)? {
            return Err(InvalidTypeError::new_err(format!(
                "{name} must be a tuple subclass, not {}",
                ty.name()?
            )));
        }
        *out = basic_size(ty)? == basic;
    }
    Ok(plain)
}

/// `[result_type(id_type(segment_id, first_entry_id + i), duplicate) for i in range(count)]`:
/// the results of a run of `count` writes settled by one ack, built as the tuples themselves (no
/// Python call per write) and left out of the cycle collector when, like `WriteResult` and
/// `LogMessageId`, the types add no `__dict__` (a tuple of ints and a bool is in no cycle).
#[pyfunction]
pub fn write_results<'py>(
    py: Python<'py>,
    segment_id: i64,
    first_entry_id: i64,
    count: usize,
    duplicate: bool,
    result_type: &Bound<'py, PyType>,
    id_type: &Bound<'py, PyType>,
) -> PyResult<Bound<'py, PyList>> {
    let [plain_results, plain_ids] =
        tuple_types(py, [("result_type", result_type), ("id_type", id_type)])?;
    let plain = plain_results && plain_ids;
    let segment = segment_id.into_pyobject(py)?.into_any();
    let flag = PyBool::new(py, duplicate).to_owned().into_any();
    let out = PyList::empty(py);
    for i in 0..count {
        let entry = (first_entry_id + i as i64).into_pyobject(py)?.into_any();
        let id = new_tuple_of(id_type, [segment.clone(), entry])?;
        if plain {
            untrack(&id);
        }
        let result = new_tuple_of(result_type, [id, flag.clone()])?;
        if plain {
            untrack(&result);
        }
        out.append(result)?;
    }
    Ok(out)
}
