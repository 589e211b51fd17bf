//! `decode_entries`: the read path's parser. Readers and recovery decode every entry they read;
//! doing it here (one call per read, a small frozen object per entry) instead of through
//! protobuf's Python objects is most of a reader's speed.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyType};

use super::tuples::{new_tuple_of, tuple_types, untrack};
use crate::entry::{decode_entry, DecodedEntry};
use crate::errors::InvalidArgumentError;
use crate::keys::KEY_LEN;
use crate::window::Record;

/// One entry read back from a LogStore: `payload`, `properties` (a new dict each access),
/// `timestamp_ms`, `idempotency_key` (b"" when the entry has none), `segment_id`, `entry_id`.
#[pyclass(frozen, module = "woodpecker_idem._core", name = "StoredEntry")]
pub struct PyStoredEntry {
    #[pyo3(get)]
    pub(super) segment_id: i64,
    #[pyo3(get)]
    pub(super) entry_id: i64,
    #[pyo3(get)]
    pub(super) timestamp_ms: i64,
    #[pyo3(get)]
    payload: Py<PyBytes>,
    #[pyo3(get)]
    pub(super) idempotency_key: Py<PyBytes>,
    props: Vec<(String, String)>,
}

#[pymethods]
impl PyStoredEntry {
    #[getter]
    fn properties<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.props {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "StoredEntry({}:{}, {} payload bytes)",
            self.segment_id,
            self.entry_id,
            Python::attach(|py| self.payload.bind(py).as_bytes().len())
        )
    }
}

/// The entries decoded, and where and why decoding stopped early.
type Decoded = (Vec<Py<PyStoredEntry>>, Option<(usize, String)>);

/// The entries `raw` (LogEntry bytes of consecutive ids from `first_entry_id` of `segment_id`)
/// as `(entries, bad)`: `bad` is `(index, why)` for the first that does not parse or says it is
/// another entry, and `entries` then holds the ones before it.
#[pyfunction]
pub fn decode_entries<'py>(
    py: Python<'py>,
    raw: &Bound<'py, PyList>,
    segment_id: i64,
    first_entry_id: i64,
) -> PyResult<Decoded> {
    let mut out = Vec::with_capacity(raw.len());
    for (i, item) in raw.iter().enumerate() {
        let data = item.cast::<PyBytes>().map_err(|_| {
            crate::errors::InvalidTypeError::new_err(format!(
                "raw[{i}] must be bytes, not {}",
                crate::errors::type_name(&item)
            ))
        })?;
        let want = first_entry_id + i as i64;
        let e = match decode_entry(data.as_bytes()) {
            Ok(e) => e,
            Err(why) => return Ok((out, Some((i, format!("unparseable entry ({why})"))))),
        };
        if e.segment_id != segment_id || e.entry_id != want {
            let why = format!("stored entry says {}:{}", e.segment_id, e.entry_id);
            return Ok((out, Some((i, why))));
        }
        let entry = PyStoredEntry {
            segment_id,
            entry_id: want,
            timestamp_ms: e.timestamp_ms,
            payload: PyBytes::new(py, e.payload).unbind(),
            idempotency_key: PyBytes::new(py, e.idempotency_key).unbind(),
            props: e
                .properties
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        out.push(Py::new(py, entry)?);
    }
    Ok((out, None))
}

/// The keys of a run of entries read back from a LogStore, as recovery's replay adds them to
/// the window (`DedupWindow.add_committed_keys`): one object for the run, none per entry.
/// `len()` is the entries read, keyed or not.
#[pyclass(frozen, module = "woodpecker_idem._core", name = "EntryKeys")]
pub struct PyEntryKeys {
    pub(super) records: Vec<Record>,
    entries: usize,
    last_timestamp_ms: Option<i64>,
}

#[pymethods]
impl PyEntryKeys {
    fn __len__(&self) -> usize {
        self.entries
    }

    /// Entries that carry a key (a plain writer's carry none).
    #[getter]
    fn keyed(&self) -> usize {
        self.records.len()
    }

    /// The timestamp of the last entry, None for no entries.
    #[getter]
    fn last_timestamp_ms(&self) -> Option<i64> {
        self.last_timestamp_ms
    }

    fn __repr__(&self) -> String {
        format!(
            "EntryKeys({} entries, {} keyed)",
            self.entries,
            self.records.len()
        )
    }
}

/// `decode_entries` for recovery's replay: the keys (with their positions and timestamps) of
/// the entries `raw`, as one `EntryKeys`, and `bad` as `decode_entries` gives it (the keys are
/// then those of the entries before it). No payload is copied and no object made per entry.
#[pyfunction]
pub fn decode_entry_keys(
    raw: &Bound<'_, PyList>,
    segment_id: i64,
    first_entry_id: i64,
) -> PyResult<(PyEntryKeys, Option<(usize, String)>)> {
    let (Ok(segment), Ok(_)) = (u32::try_from(segment_id), u32::try_from(first_entry_id)) else {
        return Err(InvalidArgumentError::new_err(format!(
            "position {segment_id}:{first_entry_id} is out of range 0..={}",
            u32::MAX
        )));
    };
    let mut keys = PyEntryKeys {
        records: Vec::with_capacity(raw.len()),
        entries: 0,
        last_timestamp_ms: None,
    };
    for (i, item) in raw.iter().enumerate() {
        let data = bytes_item(&item, i)?;
        let want = first_entry_id + i as i64;
        let e = match decode_entry(data.as_bytes()) {
            Ok(e) => e,
            Err(why) => return Ok((keys, Some((i, format!("unparseable entry ({why})"))))),
        };
        if e.segment_id != segment_id || e.entry_id != want {
            let why = format!("stored entry says {}:{}", e.segment_id, e.entry_id);
            return Ok((keys, Some((i, why))));
        }
        let Ok(entry_id) = u32::try_from(want) else {
            return Ok((
                keys,
                Some((i, format!("entry id {want} is past {}", u32::MAX))),
            ));
        };
        if let Ok(key) = <[u8; KEY_LEN]>::try_from(e.idempotency_key) {
            keys.records.push(Record {
                key,
                segment_id: segment,
                entry_id,
                timestamp_ms: e.timestamp_ms,
            });
        }
        keys.entries += 1;
        keys.last_timestamp_ms = Some(e.timestamp_ms);
    }
    Ok((keys, None))
}

pyo3::import_exception!(woodpecker_idem.errors, CorruptEntryError);

/// The entries `raw` (LogEntry bytes of consecutive ids from `first_entry_id` of `segment_id`)
/// as the reader's messages, in one call: each is `message_type(id_type(segment_id, entry_id),
/// payload, properties, timestamp_ms, idempotency_key or None)`, built as the tuple itself (no
/// intermediate object, no Python call per entry). Both types must be tuple subclasses (the
/// `LogMessage` and `LogMessageId` NamedTuples). An entry that does not parse or says it is
/// another position raises `CorruptEntryError` naming it.
#[pyfunction]
pub fn decode_messages<'py>(
    py: Python<'py>,
    raw: &Bound<'py, PyList>,
    segment_id: i64,
    first_entry_id: i64,
    message_type: &Bound<'py, PyType>,
    id_type: &Bound<'py, PyType>,
) -> PyResult<Bound<'py, PyList>> {
    // An id holds two ints and, like LogMessageId, no `__dict__`: it can be in no reference
    // cycle, so the cycle collector need not track it (a message holds a dict: it stays tracked).
    let [_, plain_ids] = tuple_types(py, [("message_type", message_type), ("id_type", id_type)])?;
    let segment = segment_id.into_pyobject(py)?.into_any();
    let out = PyList::empty(py);
    for (i, item) in raw.iter().enumerate() {
        let data = bytes_item(&item, i)?;
        let want = first_entry_id + i as i64;
        let e = checked(data.as_bytes(), segment_id, want)?;
        let id = new_tuple_of(
            id_type,
            [segment.clone(), want.into_pyobject(py)?.into_any()],
        )?;
        if plain_ids {
            untrack(&id);
        }
        let props = PyDict::new(py);
        for (k, v) in &e.properties {
            props.set_item(k, v)?;
        }
        let key = if e.idempotency_key.is_empty() {
            py.None().into_bound(py)
        } else {
            PyBytes::new(py, e.idempotency_key).into_any()
        };
        let message = new_tuple_of(
            message_type,
            [
                id,
                PyBytes::new(py, e.payload).into_any(),
                props.into_any(),
                e.timestamp_ms.into_pyobject(py)?.into_any(),
                key,
            ],
        )?;
        out.append(message)?;
    }
    Ok(out)
}

/// Checks that every entry of `raw` (LogEntry bytes of consecutive ids from `first_entry_id` of
/// `segment_id`) parses and is the entry at its position, without building anything: a reader
/// checks a whole read (to fall back to another replica at once) and builds its messages a few
/// at a time with `decode_messages` (young objects the cycle collector does not have to keep
/// passing over). Raises `CorruptEntryError` naming the first bad entry.
#[pyfunction]
pub fn check_entries(
    raw: &Bound<'_, PyList>,
    segment_id: i64,
    first_entry_id: i64,
) -> PyResult<()> {
    for (i, item) in raw.iter().enumerate() {
        let data = bytes_item(&item, i)?;
        checked(data.as_bytes(), segment_id, first_entry_id + i as i64)?;
    }
    Ok(())
}

/// `raw[i]` as bytes, or `InvalidTypeError` naming it.
fn bytes_item<'a, 'py>(item: &'a Bound<'py, PyAny>, i: usize) -> PyResult<&'a Bound<'py, PyBytes>> {
    item.cast::<PyBytes>().map_err(|_| {
        crate::errors::InvalidTypeError::new_err(format!(
            "raw[{i}] must be bytes, not {}",
            crate::errors::type_name(item)
        ))
    })
}

/// Entry `entry_id` of `segment_id` parsed from `data`, or `CorruptEntryError` naming it.
fn checked(data: &[u8], segment_id: i64, entry_id: i64) -> PyResult<DecodedEntry<'_>> {
    let bad =
        |why: String| CorruptEntryError::new_err(format!("entry {segment_id}:{entry_id}: {why}"));
    let e = decode_entry(data).map_err(|why| bad(format!("unparseable entry ({why})")))?;
    if e.segment_id != segment_id || e.entry_id != entry_id {
        return Err(bad(format!(
            "stored entry says {}:{}",
            e.segment_id, e.entry_id
        )));
    }
    Ok(e)
}

/// Adds this module's functions and class to `_core` (one line in lib.rs).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(decode_entries, m)?)?;
    m.add_function(wrap_pyfunction!(decode_messages, m)?)?;
    m.add_function(wrap_pyfunction!(check_entries, m)?)?;
    m.add_function(wrap_pyfunction!(decode_entry_keys, m)?)?;
    m.add_class::<PyEntryKeys>()?;
    m.add_class::<PyStoredEntry>()
}
