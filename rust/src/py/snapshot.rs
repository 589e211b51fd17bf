//! `Snapshot` and the snapshot functions: a window's committed keys to bytes and back
//! (`crate::snapshot` is the codec).

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use super::convert::{entries_list, parse_max_keys, parse_window_ms};
use super::window::PyDedupWindow;
use crate::args;
use crate::errors::{type_name, InvalidArgumentError, InvalidTypeError, SnapshotCorruptError};
use crate::snapshot::{self, Positions, SnapshotData, StreamEncoder};
use crate::window::Record;

/// A decoded dedup snapshot. Its entries are held apart from the rest, so that `take_into` can
/// hand them to a window; what the checks need of their positions is found once, at decode.
#[pyclass(frozen, module = "woodpecker_idem._core", name = "Snapshot")]
pub struct PySnapshot {
    data: SnapshotData, // its `entries` are empty: they are in `entries`
    /// Held only by code that needs no GIL (copying, moving, loading a window), never while a
    /// Python object is made: making one can run the cycle collector, and Python code with it,
    /// which lets another thread take the GIL and then wait here for ever (the holder waiting
    /// for the GIL it holds). A thread holding the GIL may wait for it: its holder lets go
    /// without the GIL.
    entries: Mutex<Vec<Record>>,
    positions: Positions,
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
        self.entries.lock().len()
    }

    fn shared_position(&self) -> Option<(u32, u32)> {
        self.positions.shared
    }

    fn segment_ends<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for &(seg, last) in &self.positions.ends {
            d.set_item(seg, last)?;
        }
        Ok(d)
    }

    fn entries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let entries = py.detach(|| self.entries.lock().clone()); // see `entries`: no object made under it
        entries_list(py, &entries)
    }

    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let keys: Vec<u8> = py.detach(|| {
            let entries = self.entries.lock();
            entries.iter().flat_map(|r| r.key).collect()
        });
        Ok(PyBytes::new(py, &keys))
    }

    fn load_into(&self, py: Python<'_>, window: &Bound<'_, PyAny>) -> PyResult<usize> {
        let window = window_arg(window)?.get();
        Ok(py.detach(|| {
            let entries = self.entries.lock();
            let mut window = window.inner.lock();
            window
                .load_committed(&entries)
                .unwrap_or_else(|| window.add_committed_many(entries.iter().copied()))
        }))
    }

    /// `load_into`, handing the entries over instead of copying them: a new window takes them as
    /// its ring. The snapshot holds no entries afterwards (its length is 0); the rest of it, and
    /// what `segment_ends` and `shared_position` say, stays.
    fn take_into(&self, py: Python<'_>, window: &Bound<'_, PyAny>) -> PyResult<usize> {
        let window = window_arg(window)?.get();
        Ok(py.detach(|| {
            let entries = std::mem::take(&mut *self.entries.lock());
            let mut window = window.inner.lock();
            window
                .adopt_committed(entries)
                .unwrap_or_else(|entries| window.add_committed_many(entries))
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
        py.detach(|| {
            let all = self.entries.lock();
            let entries = all
                .get(all.len().saturating_sub(max_keys)..)
                .unwrap_or_default();
            w.load_committed(entries)
                .unwrap_or_else(|| w.add_committed_many(entries.iter().copied()))
        });
        Ok(PyDedupWindow::wrap(w))
    }

    fn __repr__(&self) -> String {
        format!(
            "Snapshot(log_id={}, epoch={}, timestamp_ms={}, entries={}, window_max_keys={}, window_ms={})",
            self.data.log_id,
            self.data.epoch,
            self.data.timestamp_ms,
            self.entries.lock().len(),
            self.data.window_max_keys,
            self.data.window_ms
        )
    }
}

/// Encode the committed entries of `window` (commit order) with the snapshot metadata, whole (the
/// bytes a `SnapshotStream` of the window gives, end to end).
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
    let marks = watermarks_arg(watermarks)?;
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

fn watermarks_arg(watermarks: &Bound<'_, PyAny>) -> PyResult<Vec<(u32, i64)>> {
    let marks = watermarks.cast::<PyDict>().map_err(|_| {
        InvalidTypeError::new_err(format!(
            "watermarks must be a dict[int, int], not {}",
            type_name(watermarks)
        ))
    })?;
    marks
        .iter()
        .map(|(k, v)| {
            Ok((
                args::int_u32(&k, "watermarks key")?,
                args::int_i64(&v, "watermarks value")?,
            ))
        })
        .collect()
}

const _: () = assert!(snapshot::CHUNK_RECORDS == 16_384);

/// A snapshot of a live window, made a chunk at a time as it is iterated: first the header and
/// the metadata frame, then one frame per `chunk_records` committed entries, then the trailer
/// (see `crate::snapshot`). The entries are those committed when the stream was made: the end
/// of the commit order is fixed then, and each chunk is read under the window's lock, taken for
/// that chunk alone, so writers go on between chunks. What the writer evicts meanwhile is not in
/// the snapshot, as if evicted before; what it commits meanwhile is not either (it lies above the
/// watermarks the caller copied before making the stream, so a rebuild reads it from the log).
#[pyclass(module = "woodpecker_idem._core", name = "SnapshotStream")]
pub struct PySnapshotStream {
    window: Py<PyDedupWindow>,
    encoder: StreamEncoder,
    head: Option<Vec<u8>>,
    cursor: u64,
    end: u64,
    chunk_records: usize,
    done: bool,
    bytes: u64,
}

#[pymethods]
impl PySnapshotStream {
    #[new]
    // The default is `snapshot::CHUNK_RECORDS`, written out so the signature Python sees shows it.
    #[pyo3(signature = (window, log_id, epoch, timestamp_ms, watermarks, chunk_records = 16_384))]
    fn new(
        py: Python<'_>,
        window: &Bound<'_, PyAny>,
        log_id: &Bound<'_, PyAny>,
        epoch: &Bound<'_, PyAny>,
        timestamp_ms: &Bound<'_, PyAny>,
        watermarks: &Bound<'_, PyAny>,
        chunk_records: usize,
    ) -> PyResult<Self> {
        let window = window_arg(window)?;
        let log_id = args::int_u64(log_id, "log_id")?;
        let epoch = args::int_u64(epoch, "epoch")?;
        let timestamp_ms = args::int_i64(timestamp_ms, "timestamp_ms")?;
        let marks = watermarks_arg(watermarks)?;
        if chunk_records == 0 {
            return Err(InvalidArgumentError::new_err(
                "chunk_records must be at least 1",
            ));
        }
        let inner = &window.get().inner;
        let (max_keys, window_ms, (cursor, end)) = py.detach(|| {
            let w = inner.lock();
            (w.max_keys() as u64, w.window_ms(), w.positions())
        });
        let (encoder, head) =
            StreamEncoder::start(log_id, epoch, timestamp_ms, max_keys, window_ms, &marks)
                .map_err(|e| InvalidArgumentError::new_err(format!("cannot snapshot: {e}")))?;
        Ok(Self {
            window: window.clone().unbind(),
            encoder,
            head: Some(head),
            cursor,
            end,
            chunk_records,
            done: false,
            bytes: 0,
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let out = if let Some(head) = self.head.take() {
            head
        } else if self.done {
            return Ok(None);
        } else {
            let window = self.window.get();
            let (cursor, end, per) = (self.cursor, self.end, self.chunk_records);
            let room = usize::try_from(end.saturating_sub(cursor)).map_or(per, |r| r.min(per));
            // The lock is held while the chunk's columns are built, not while they are framed.
            let (chunk, last) = py.detach(|| {
                let w = window.inner.lock();
                let mut last = None;
                let entries = w.committed_between(cursor, end).take(per).map(|(at, r)| {
                    last = Some(at);
                    r
                });
                let chunk = StreamEncoder::columns(entries, room);
                (chunk, last)
            });
            let encoder = &mut self.encoder;
            let framed = py.detach(|| {
                let mut out = Vec::new();
                let n = encoder.push_chunk(chunk, &mut out)?;
                if n == 0 {
                    encoder.finish(&mut out)?;
                }
                Ok::<_, snapshot::SnapshotError>(out)
            });
            let framed = framed
                .map_err(|e| InvalidArgumentError::new_err(format!("cannot snapshot: {e}")))?;
            match last {
                Some(at) => self.cursor = at + 1,
                None => self.done = true,
            }
            framed
        };
        self.bytes += out.len() as u64;
        Ok(Some(PyBytes::new(py, &out)))
    }

    /// Entries in the chunks produced so far.
    #[getter]
    fn count(&self) -> u64 {
        self.encoder.entries()
    }

    /// Bytes produced so far.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the trailer has been produced (the snapshot is complete).
    #[getter]
    fn done(&self) -> bool {
        self.done
    }
}

/// Decode and validate a snapshot.
#[pyfunction]
pub fn decode_snapshot(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<PySnapshot> {
    let data = args::bytes_like(data, "data")?;
    let s = data.as_slice();
    py.detach(|| {
        snapshot::decode(s).map(|mut data| {
            let positions = data.positions();
            let entries = Mutex::new(std::mem::take(&mut data.entries));
            PySnapshot {
                data,
                entries,
                positions,
            }
        })
    })
    .map_err(|e| SnapshotCorruptError::new_err(e.0))
}
