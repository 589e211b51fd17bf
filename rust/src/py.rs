//! The Python face: `DedupWindow`, `WindowEntry`, `Snapshot` and the module functions. Argument
//! checking happens here with the GIL held; the work itself runs in the pure-Rust modules with the
//! GIL released wherever it is more than a few hundred nanoseconds.

use parking_lot::{Mutex, MutexGuard};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::args::{self, ByteArg};
use crate::errors::{
    out_of_memory, type_name, InvalidArgumentError, InvalidTypeError, SnapshotCorruptError,
};
use crate::keys::{self, KEY_LEN};
use crate::snapshot::{self, SnapshotData};
use crate::window::{Lookup, Record, Window, MAX_KEYS_LIMIT};

/// Rows per lock acquisition in `add_committed_many`.
const INSERT_CHUNK: usize = 4096;

/// Single payloads at least this long are hashed with the GIL released.
const DETACH_MIN_BYTES: usize = 64 * 1024;

// ---------------------------------------------------------------------------------------------
// WindowEntry

/// What the window knows about one key.
#[pyclass(
    frozen,
    eq,
    hash,
    module = "woodpecker_idem._core",
    name = "WindowEntry"
)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PyWindowEntry {
    #[pyo3(get)]
    segment_id: u32,
    #[pyo3(get)]
    entry_id: u32,
    #[pyo3(get)]
    timestamp_ms: i64,
    #[pyo3(get)]
    committed: bool,
}

impl PyWindowEntry {
    fn from_record(r: &Record, committed: bool) -> Self {
        Self {
            segment_id: r.segment_id,
            entry_id: r.entry_id,
            timestamp_ms: r.timestamp_ms,
            committed,
        }
    }
}

#[pymethods]
impl PyWindowEntry {
    #[new]
    #[pyo3(signature = (segment_id, entry_id, timestamp_ms, committed))]
    fn new(
        segment_id: &Bound<'_, PyAny>,
        entry_id: &Bound<'_, PyAny>,
        timestamp_ms: &Bound<'_, PyAny>,
        committed: bool,
    ) -> PyResult<Self> {
        Ok(Self {
            segment_id: args::int_u32(segment_id, "segment_id")?,
            entry_id: args::int_u32(entry_id, "entry_id")?,
            timestamp_ms: args::int_i64(timestamp_ms, "timestamp_ms")?,
            committed,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "WindowEntry(segment_id={}, entry_id={}, timestamp_ms={}, committed={})",
            self.segment_id,
            self.entry_id,
            self.timestamp_ms,
            if self.committed { "True" } else { "False" }
        )
    }
}

// ---------------------------------------------------------------------------------------------
// DedupWindow

/// The per-log dedup window (see `window.rs`), behind a mutex so Python threads can share it.
#[pyclass(frozen, module = "woodpecker_idem._core", name = "DedupWindow")]
pub struct PyDedupWindow {
    inner: Mutex<Window>,
}

impl PyDedupWindow {
    fn wrap(w: Window) -> Self {
        Self {
            inner: Mutex::new(w),
        }
    }

    /// Take the lock; if another thread holds it (possibly a batch running without the GIL),
    /// wait with the GIL released so that thread and every other Python thread can progress.
    fn lock(&self, py: Python<'_>) -> MutexGuard<'_, Window> {
        match self.inner.try_lock() {
            Some(g) => g,
            None => py.detach(|| self.inner.lock()),
        }
    }

    fn new_window(py: Python<'_>, max_keys: usize, window_ms: i64) -> PyResult<Window> {
        py.detach(|| Window::new(max_keys, window_ms))
            .map_err(|_| out_of_memory(&format!("a dedup window of {max_keys} keys")))
    }
}

fn record(
    key: &Bound<'_, PyAny>,
    segment_id: &Bound<'_, PyAny>,
    entry_id: &Bound<'_, PyAny>,
    timestamp_ms: &Bound<'_, PyAny>,
) -> PyResult<Record> {
    Ok(Record {
        key: args::key(key, "key")?,
        segment_id: args::int_u32(segment_id, "segment_id")?,
        entry_id: args::int_u32(entry_id, "entry_id")?,
        timestamp_ms: args::int_i64(timestamp_ms, "timestamp_ms")?,
    })
}

fn entry_tuple<'py>(py: Python<'py>, r: &Record) -> PyResult<Bound<'py, PyTuple>> {
    (
        PyBytes::new(py, &r.key),
        r.segment_id,
        r.entry_id,
        r.timestamp_ms,
    )
        .into_pyobject(py)
}

fn entries_list<'py>(py: Python<'py>, recs: &[Record]) -> PyResult<Bound<'py, PyList>> {
    let items = recs
        .iter()
        .map(|r| entry_tuple(py, r))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

fn parse_max_keys(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    let v = args::int_i64(obj, "max_keys").map_err(|e| {
        if obj.is_instance_of::<pyo3::types::PyInt>() {
            InvalidArgumentError::new_err(format!(
                "max_keys = {obj} is out of range 1..={MAX_KEYS_LIMIT}"
            ))
        } else {
            e
        }
    })?;
    usize::try_from(v)
        .ok()
        .filter(|&v| v >= 1 && v as u64 <= MAX_KEYS_LIMIT)
        .ok_or_else(|| {
            InvalidArgumentError::new_err(format!(
                "max_keys = {v} is out of range 1..={MAX_KEYS_LIMIT}"
            ))
        })
}

fn parse_window_ms(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    let v = args::int_i64(obj, "window_ms")?;
    if v < 1 {
        return Err(InvalidArgumentError::new_err(format!(
            "window_ms = {v} must be >= 1"
        )));
    }
    Ok(v)
}

#[pymethods]
impl PyDedupWindow {
    #[new]
    #[pyo3(signature = (max_keys, window_ms))]
    fn new(
        py: Python<'_>,
        max_keys: &Bound<'_, PyAny>,
        window_ms: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let max_keys = parse_max_keys(max_keys)?;
        let window_ms = parse_window_ms(window_ms)?;
        Ok(Self::wrap(Self::new_window(py, max_keys, window_ms)?))
    }

    #[pyo3(signature = (key, now_ms = None))]
    fn get(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        now_ms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<PyWindowEntry>> {
        let key = args::key(key, "key")?;
        let now = args::opt_i64(now_ms, "now_ms")?;
        let found = self.lock(py).get(&key, now);
        Ok(match found {
            Lookup::Absent => None,
            Lookup::Pending(r) => Some(PyWindowEntry::from_record(&r, false)),
            Lookup::Committed(r) => Some(PyWindowEntry::from_record(&r, true)),
        })
    }

    fn add_pending(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        segment_id: &Bound<'_, PyAny>,
        entry_id: &Bound<'_, PyAny>,
        timestamp_ms: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let rec = record(key, segment_id, entry_id, timestamp_ms)?;
        let result = self.lock(py).add_pending(rec);
        result.map_err(|_| {
            InvalidArgumentError::new_err("key is already in the window (pending or committed)")
        })
    }

    fn commit(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = args::key(key, "key")?;
        Ok(self.lock(py).commit(&key))
    }

    /// Commit the pending keys of `segment_id` up to `last_entry_id`, in entry order (a quorum
    /// ack commits a prefix of a segment); returns how many were committed.
    fn commit_through(
        &self,
        py: Python<'_>,
        segment_id: &Bound<'_, PyAny>,
        last_entry_id: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let segment_id = args::int_u32(segment_id, "segment_id")?;
        let last = args::int_u32(last_entry_id, "last_entry_id")?;
        Ok(self.lock(py).commit_through(segment_id, last))
    }

    /// Forget every pending key of `segment_id` (completed without them); returns how many.
    fn drop_segment(&self, py: Python<'_>, segment_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let segment_id = args::int_u32(segment_id, "segment_id")?;
        Ok(self.lock(py).drop_segment(segment_id))
    }

    fn drop_pending(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = args::key(key, "key")?;
        Ok(self.lock(py).drop_pending(&key))
    }

    fn add_committed(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        segment_id: &Bound<'_, PyAny>,
        entry_id: &Bound<'_, PyAny>,
        timestamp_ms: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let rec = record(key, segment_id, entry_id, timestamp_ms)?;
        Ok(self.lock(py).add_committed(rec))
    }

    fn evict(&self, py: Python<'_>, now_ms: &Bound<'_, PyAny>) -> PyResult<usize> {
        let now = args::int_i64(now_ms, "now_ms")?;
        Ok(self.lock(py).evict(now))
    }

    #[pyo3(signature = (keys, now_ms = None))]
    fn get_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        now_ms: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
    )> {
        let keys = args::key_buffer(keys, "keys")?;
        let now = args::opt_i64(now_ms, "now_ms")?;
        let slice = keys.as_slice();
        let (status, segs, ents) = py.detach(|| self.inner.lock().get_many(slice, now));
        Ok((
            PyBytes::new(py, &status),
            PyBytes::new(py, &segs),
            PyBytes::new(py, &ents),
        ))
    }

    /// The intake of a batch of writes (see `Window::reserve_many`).
    fn reserve_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        timestamps_ms: &Bound<'py, PyAny>,
        segment_id: &Bound<'py, PyAny>,
        first_entry_id: &Bound<'py, PyAny>,
    ) -> PyResult<(
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
    )> {
        let keys = args::key_buffer(keys, "keys")?;
        let n = keys.as_slice().len() / KEY_LEN;
        let column = args::i64_column(timestamps_ms, "timestamps_ms")?;
        if column.len() != n {
            return Err(InvalidArgumentError::new_err(format!(
                "timestamps_ms holds {} values but keys holds {n} keys",
                column.len()
            )));
        }
        let view = column.view(py);
        let mut timestamps = Vec::with_capacity(n);
        for i in 0..n {
            match view.get(i).map(i64::try_from) {
                Some(Ok(t)) => timestamps.push(t),
                v => {
                    return Err(InvalidArgumentError::new_err(format!(
                        "timestamps_ms[{i}] = {v:?} does not fit int64"
                    )))
                }
            }
        }
        let segment_id = args::int_u32(segment_id, "segment_id")?;
        let first = args::int_u32(first_entry_id, "first_entry_id")?;
        if u64::from(first) + n as u64 > u64::from(u32::MAX) + 1 {
            return Err(InvalidArgumentError::new_err(format!(
                "first_entry_id {first} + {n} rows exceeds the uint32 entry id range"
            )));
        }
        let slice = keys.as_slice();
        // A writer's intake batch takes microseconds: keep the GIL (giving it up would make the
        // flusher queue behind the producer threads to get it back).
        let (status, segs, ents) =
            self.lock(py)
                .reserve_many(slice, &timestamps, segment_id, first);
        Ok((
            PyBytes::new(py, &status),
            PyBytes::new(py, &segs),
            PyBytes::new(py, &ents),
        ))
    }

    fn add_committed_many(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        segment_ids: &Bound<'_, PyAny>,
        entry_ids: &Bound<'_, PyAny>,
        timestamps_ms: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let keys = args::key_buffer(keys, "keys")?;
        let n = keys.as_slice().len() / KEY_LEN;
        let cols = [
            (
                "segment_ids",
                args::i64_column(segment_ids, "segment_ids")?,
                u32::MAX as i128,
            ),
            (
                "entry_ids",
                args::i64_column(entry_ids, "entry_ids")?,
                u32::MAX as i128,
            ),
            (
                "timestamps_ms",
                args::i64_column(timestamps_ms, "timestamps_ms")?,
                i64::MAX as i128,
            ),
        ];
        // Validate everything first, so a bad value inserts nothing.
        for (name, col, hi) in &cols {
            if col.len() != n {
                return Err(InvalidArgumentError::new_err(format!(
                    "{name} holds {} values but keys holds {n} keys",
                    col.len()
                )));
            }
            let lo = if *hi == i64::MAX as i128 {
                i64::MIN as i128
            } else {
                0
            };
            let view = col.view(py);
            for i in 0..n {
                match view.get(i) {
                    Some(v) if (lo..=*hi).contains(&v) => {}
                    v => {
                        return Err(InvalidArgumentError::new_err(format!(
                            "{name}[{i}] = {v:?} is out of range {lo}..={hi}"
                        )))
                    }
                }
            }
        }
        let [segs, ents, tss] = [0, 1, 2].map(|c| cols[c].1.view(py));
        let keys = keys.as_slice();
        // Chunks keep the temporary records small; the window lock is taken once per chunk with
        // the GIL released.
        let mut inserted = 0;
        let mut start = 0;
        while start < n {
            let end = n.min(start + INSERT_CHUNK);
            // Values were range-checked above, so the narrowing casts are exact.
            let recs: Vec<Record> = (start..end)
                .map(|i| Record {
                    key: keys
                        .get(i * KEY_LEN..(i + 1) * KEY_LEN)
                        .and_then(|k| <[u8; KEY_LEN]>::try_from(k).ok())
                        .unwrap_or_default(),
                    segment_id: segs.get(i).unwrap_or_default() as u32,
                    entry_id: ents.get(i).unwrap_or_default() as u32,
                    timestamp_ms: tss.get(i).unwrap_or_default() as i64,
                })
                .collect();
            inserted += py.detach(|| self.inner.lock().add_committed_many(recs));
            start = end;
        }
        Ok(inserted)
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        let w = self.lock(py);
        w.committed_count() + w.pending_count()
    }

    #[getter]
    fn pending_count(&self, py: Python<'_>) -> usize {
        self.lock(py).pending_count()
    }

    #[getter]
    fn committed_count(&self, py: Python<'_>) -> usize {
        self.lock(py).committed_count()
    }

    #[getter]
    fn max_keys(&self, py: Python<'_>) -> usize {
        self.lock(py).max_keys()
    }

    #[getter]
    fn window_ms(&self, py: Python<'_>) -> i64 {
        self.lock(py).window_ms()
    }

    #[getter]
    fn hits(&self, py: Python<'_>) -> u64 {
        self.lock(py).counters().hits
    }

    #[getter]
    fn misses(&self, py: Python<'_>) -> u64 {
        self.lock(py).counters().misses
    }

    #[getter]
    fn evictions(&self, py: Python<'_>) -> u64 {
        self.lock(py).counters().evictions
    }

    #[getter]
    fn early_evictions(&self, py: Python<'_>) -> u64 {
        self.lock(py).counters().early_evictions
    }

    fn memory_bytes(&self, py: Python<'_>) -> usize {
        self.lock(py).memory_bytes()
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (c, pending, committed, max_keys, window_ms, mem) = {
            let w = self.lock(py);
            (
                w.counters(),
                w.pending_count() as u64,
                w.committed_count() as u64,
                w.max_keys() as u64,
                w.window_ms(),
                w.memory_bytes() as u64,
            )
        };
        let d = PyDict::new(py);
        d.set_item("hits", c.hits)?;
        d.set_item("misses", c.misses)?;
        d.set_item("evictions", c.evictions)?;
        d.set_item("early_evictions", c.early_evictions)?;
        d.set_item("pending_count", pending)?;
        d.set_item("committed_count", committed)?;
        d.set_item("max_keys", max_keys)?;
        d.set_item("window_ms", window_ms)?;
        d.set_item("memory_bytes", mem)?;
        Ok(d)
    }

    fn clone_committed(&self, py: Python<'_>) -> PyResult<Self> {
        py.detach(|| self.inner.lock().clone_committed())
            .map(Self::wrap)
            .map_err(|_| out_of_memory("a copy of the dedup window"))
    }

    fn committed_entries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let recs: Vec<Record> = py.detach(|| self.inner.lock().committed_iter().copied().collect());
        entries_list(py, &recs)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let w = self.lock(py);
        format!(
            "DedupWindow(max_keys={}, window_ms={}, committed={}, pending={})",
            w.max_keys(),
            w.window_ms(),
            w.committed_count(),
            w.pending_count()
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Snapshot

/// A decoded dedup snapshot.
#[pyclass(frozen, module = "woodpecker_idem._core", name = "Snapshot")]
pub struct PySnapshot {
    data: SnapshotData,
}

fn window_arg<'a, 'py>(obj: &'a Bound<'py, PyAny>) -> PyResult<&'a Bound<'py, PyDedupWindow>> {
    obj.cast::<PyDedupWindow>().map_err(|_| {
        InvalidTypeError::new_err(format!(
            "window must be a DedupWindow, not {}",
            type_name(obj)
        ))
    })
}

#[pymethods]
impl PySnapshot {
    #[getter]
    fn format_version(&self) -> u16 {
        self.data.format_version
    }
    #[getter]
    fn log_id(&self) -> u64 {
        self.data.log_id
    }
    #[getter]
    fn epoch(&self) -> u64 {
        self.data.epoch
    }
    #[getter]
    fn timestamp_ms(&self) -> i64 {
        self.data.timestamp_ms
    }
    #[getter]
    fn window_max_keys(&self) -> u64 {
        self.data.window_max_keys
    }
    #[getter]
    fn window_ms(&self) -> i64 {
        self.data.window_ms
    }
    #[getter]
    fn watermarks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for &(seg, last) in &self.data.watermarks {
            d.set_item(seg, last)?;
        }
        Ok(d)
    }

    fn __len__(&self) -> usize {
        self.data.entries.len()
    }

    fn entries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        entries_list(py, &self.data.entries)
    }

    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let n = self.data.entries.len() * KEY_LEN;
        PyBytes::new_with(py, n, |buf| {
            for (dst, r) in buf.chunks_exact_mut(KEY_LEN).zip(&self.data.entries) {
                dst.copy_from_slice(&r.key);
            }
            Ok(())
        })
    }

    fn load_into(&self, py: Python<'_>, window: &Bound<'_, PyAny>) -> PyResult<usize> {
        let window = window_arg(window)?.get();
        let entries = &self.data.entries;
        Ok(py.detach(|| {
            window
                .inner
                .lock()
                .add_committed_many(entries.iter().copied())
        }))
    }

    #[pyo3(signature = (max_keys = None, window_ms = None))]
    fn to_window(
        &self,
        py: Python<'_>,
        max_keys: Option<&Bound<'_, PyAny>>,
        window_ms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyDedupWindow> {
        let max_keys = match max_keys {
            Some(m) if !m.is_none() => parse_max_keys(m)?,
            // Validated at decode time: 1..=MAX_KEYS_LIMIT.
            _ => self.data.window_max_keys as usize,
        };
        let window_ms = match window_ms {
            Some(w) if !w.is_none() => parse_window_ms(w)?,
            _ => self.data.window_ms,
        };
        let mut w = PyDedupWindow::new_window(py, max_keys, window_ms)?;
        // Replaying everything into a smaller window would end with exactly the newest
        // `max_keys` entries; load only those, so the new window starts with zero evictions.
        let all = &self.data.entries;
        let entries = all
            .get(all.len().saturating_sub(max_keys)..)
            .unwrap_or_default();
        py.detach(|| w.add_committed_many(entries.iter().copied()));
        Ok(PyDedupWindow::wrap(w))
    }

    fn __repr__(&self) -> String {
        format!(
            "Snapshot(log_id={}, epoch={}, timestamp_ms={}, entries={}, window_max_keys={}, window_ms={})",
            self.data.log_id,
            self.data.epoch,
            self.data.timestamp_ms,
            self.data.entries.len(),
            self.data.window_max_keys,
            self.data.window_ms
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Functions

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

/// Encode the committed entries of `window` (commit order) with the snapshot metadata.
#[pyfunction]
pub fn encode_snapshot<'py>(
    py: Python<'py>,
    window: &Bound<'py, PyAny>,
    log_id: &Bound<'py, PyAny>,
    epoch: &Bound<'py, PyAny>,
    timestamp_ms: &Bound<'py, PyAny>,
    watermarks: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let window = window_arg(window)?.get();
    let log_id = args::int_u64(log_id, "log_id")?;
    let epoch = args::int_u64(epoch, "epoch")?;
    let timestamp_ms = args::int_i64(timestamp_ms, "timestamp_ms")?;
    let marks = watermarks.cast::<PyDict>().map_err(|_| {
        InvalidTypeError::new_err(format!(
            "watermarks must be a dict[int, int], not {}",
            type_name(watermarks)
        ))
    })?;
    let marks = marks
        .iter()
        .map(|(k, v)| {
            Ok((
                args::int_u32(&k, "watermarks key")?,
                args::int_i64(&v, "watermarks value")?,
            ))
        })
        .collect::<PyResult<Vec<(u32, i64)>>>()?;
    let out = py.detach(|| {
        let w = window.inner.lock();
        snapshot::encode(
            log_id,
            epoch,
            timestamp_ms,
            w.max_keys() as u64,
            w.window_ms(),
            &marks,
            w.committed_iter(),
        )
    });
    let out = out
        .map_err(|e| InvalidArgumentError::new_err(format!("window cannot be snapshotted: {e}")))?;
    Ok(PyBytes::new(py, &out))
}

/// Decode and validate a snapshot.
#[pyfunction]
pub fn decode_snapshot(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<PySnapshot> {
    let data = args::bytes_like(data, "data")?;
    let s = data.as_slice();
    py.detach(|| snapshot::decode(s))
        .map(|data| PySnapshot { data })
        .map_err(|e| SnapshotCorruptError::new_err(e.0))
}
