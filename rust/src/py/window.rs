//! `DedupWindow`: the per-log dedup window (`crate::window`) behind a lock Python threads share.
//! Single-key methods keep the GIL (they take nanoseconds), and so does `reserve_many` (the
//! writer's intake, microseconds); the other batch methods release it.

use parking_lot::{Mutex, MutexGuard};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use super::convert::{entries_list, parse_max_keys, parse_window_ms, record};
use super::entry::{Held, Run, Stamps};
use super::payloads::PayloadRows;
use super::stored::PyEntryKeys;
use super::window_entry::PyWindowEntry;
use crate::args;
use crate::codec::Codec;
use crate::errors::{out_of_memory, type_name, InvalidArgumentError, InvalidTypeError};
use crate::keys::KEY_LEN;
use crate::window::{Lookup, Record, Window};

/// Rows per lock acquisition in `add_committed_many`.
const INSERT_CHUNK: usize = 4096;

/// The per-log dedup window (see `window.rs`), behind a mutex so Python threads can share it.
#[pyclass(frozen, module = "woodpecker_idem._core", name = "DedupWindow")]
pub struct PyDedupWindow {
    pub(super) inner: Mutex<Window>,
}

impl PyDedupWindow {
    pub(super) fn wrap(w: Window) -> Self {
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

    pub(super) fn new_window(py: Python<'_>, max_keys: usize, window_ms: i64) -> PyResult<Window> {
        py.detach(|| Window::new(max_keys, window_ms))
            .map_err(|_| out_of_memory(&format!("a dedup window of {max_keys} keys")))
    }
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

    /// A run's intake and its frame in one call: rows `start..end` of `payloads` (a list of
    /// bytes or a `Payloads`) with their keys (`keys`: N*16 bytes for the whole list) judged as
    /// `reserve_many` judges them (each as of its `timestamp_ms`: one int, or an int64 column of
    /// N), and the new ones encoded as `encode_frame` encodes them, compressed per
    /// `compression`. Every argument is checked before a key is reserved, so a run whose keys
    /// were reserved always gets its frame. Returns `(status, segment_ids, entry_ids, frame,
    /// count)`.
    #[pyo3(signature = (keys, start, end, timestamp_ms, segment_id, first_entry_id, payloads, properties=None, compression=0))]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn reserve_frame<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        start: usize,
        end: usize,
        timestamp_ms: &Bound<'py, PyAny>,
        segment_id: &Bound<'py, PyAny>,
        first_entry_id: &Bound<'py, PyAny>,
        payloads: &Bound<'py, PyAny>,
        properties: Option<&Bound<'py, PyAny>>,
        compression: u8,
    ) -> PyResult<(
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        usize,
    )> {
        let codec = Codec::from_u8(compression).map_err(InvalidArgumentError::new_err)?;
        let rows = PayloadRows::of(payloads)?;
        let n = rows.len();
        let keys = args::key_buffer(keys, "keys")?;
        let all = keys.as_slice();
        if all.len() != n * KEY_LEN {
            return Err(InvalidArgumentError::new_err(format!(
                "keys holds {} keys but payloads {n} rows",
                all.len() / KEY_LEN
            )));
        }
        let held = Held::new(py, &rows, start, end, properties)?;
        let stamps = Stamps::of(timestamp_ms, n)?.range(py, start, end)?;
        let segment = args::int_u32(segment_id, "segment_id")?;
        let first = args::int_u32(first_entry_id, "first_entry_id")?;
        if u64::from(first) + (end - start) as u64 > u64::from(u32::MAX) + 1 {
            return Err(InvalidArgumentError::new_err(format!(
                "first_entry_id {first} + {} rows exceeds the uint32 entry id range",
                end - start
            )));
        }
        let run = Run::new(
            py,
            i64::from(segment),
            i64::from(first),
            stamps,
            &rows,
            &held,
            start,
            Some(all),
            codec,
        )?;
        let run_keys = &all[start * KEY_LEN..end * KEY_LEN];
        // as reserve_many: microseconds, with the GIL kept
        let (status, segs, ents) =
            self.lock(py)
                .reserve_many(run_keys, run.stamps(), segment, first);
        let mixed = status.iter().any(|&s| s != 0);
        match run.encode(py, mixed.then_some(&status[..])) {
            Ok((frame, count)) => Ok((
                PyBytes::new(py, &status),
                PyBytes::new(py, &segs),
                PyBytes::new(py, &ents),
                frame,
                count,
            )),
            Err(e) => {
                // no frame (a codec failed): the keys reserved for it go, as if never judged
                let mut w = self.lock(py);
                for (key, _) in run_keys
                    .chunks_exact(KEY_LEN)
                    .zip(&status)
                    .filter(|(_, &s)| s == 0)
                {
                    if let Ok(k) = key.try_into() {
                        w.drop_pending(&k);
                    }
                }
                Err(e)
            }
        }
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
        py.detach(|| self.inner.lock().reserve_committed(n)); // one rehash, not one per doubling
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

    /// Room in the index for `additional` more committed keys (`max_keys` in all at most), in
    /// one resize: recovery knows how many keys its snapshot and gap hold before it loads them.
    fn reserve_committed(&self, py: Python<'_>, additional: usize) {
        py.detach(|| self.inner.lock().reserve_committed(additional));
    }

    /// `add_committed` for the keys of `keys` (`decode_entry_keys` made it) in order: recovery's
    /// replay, with no object per entry between the read and the window.
    fn add_committed_keys(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        let keys = keys.cast::<PyEntryKeys>().map_err(|_| {
            InvalidTypeError::new_err(format!(
                "keys must be an EntryKeys, not {}",
                type_name(keys)
            ))
        })?;
        let records = &keys.get().records;
        Ok(py.detach(|| {
            self.inner
                .lock()
                .add_committed_many(records.iter().copied())
        }))
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
