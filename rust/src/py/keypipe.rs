//! Python face of `hasher`: `KeyPipe`, idempotency keys hashed a chunk at a time, many per pass.

use parking_lot::{Mutex, MutexGuard};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

use crate::args::{self, ByteArg};
use crate::errors::InvalidArgumentError;
use crate::hasher::KeyPipe;

/// A queued payload: a `bytes` object held by reference (immutable, so the worker thread may
/// read it without the GIL), or a copy of any other buffer (which could change under it).
pub enum Payload {
    Held(PyBackedBytes),
    Copied(Vec<u8>),
}

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        match self {
            Payload::Held(b) => b,
            Payload::Copied(v) => v,
        }
    }
}

/// Keys of pushed payloads and ids, hashed a chunk at a time (large chunks on a background
/// thread), returned in push order.
#[pyclass(module = "woodpecker_idem._core", name = "KeyPipe")]
pub struct PyKeyPipe {
    inner: Mutex<KeyPipe<Payload>>,
}

impl PyKeyPipe {
    fn lock(&self, py: Python<'_>) -> MutexGuard<'_, KeyPipe<Payload>> {
        match self.inner.try_lock() {
            Some(g) => g,
            None => py.detach(|| self.inner.lock()),
        }
    }
}

#[pymethods]
impl PyKeyPipe {
    #[new]
    fn new() -> Self {
        Self {
            inner: Mutex::new(KeyPipe::new()),
        }
    }

    /// Queue `payload` for hashing: a `bytes` object is held (a reference, no copy) until its
    /// key is taken; other buffers are copied.
    fn push(&self, py: Python<'_>, payload: &Bound<'_, PyAny>) -> PyResult<()> {
        let payload = match args::bytes_like(payload, "payload")? {
            ByteArg::Borrowed(b) => Payload::Held(PyBackedBytes::from(b)),
            ByteArg::Owned(v) => Payload::Copied(v),
        };
        self.lock(py).push(payload);
        Ok(())
    }

    /// Queue a copy of an explicit id for its key; a bad id raises here, queueing nothing.
    fn push_id(&self, py: Python<'_>, idempotency_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = super::keys::id_bytes(idempotency_id, || "idempotency_id")?;
        self.lock(py).push_id(id);
        Ok(())
    }

    /// Queue a key computed already (16 bytes); it comes back as it is, in its turn.
    fn push_key(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = args::key(key, "key")?;
        self.lock(py).push_key(&key);
        Ok(())
    }

    /// How many of the oldest queued payloads have their keys computed already.
    fn ready_count(&self, py: Python<'_>) -> usize {
        self.lock(py).ready_count()
    }

    /// The keys of the `n` oldest queued payloads (N*16 bytes), in push order.
    fn take<'py>(&self, py: Python<'py>, n: usize) -> PyResult<Bound<'py, PyBytes>> {
        let mut pipe = self.lock(py);
        if n as u64 > pipe.len() {
            return Err(InvalidArgumentError::new_err(format!(
                "take({n}) but only {} payloads are queued",
                pipe.len()
            )));
        }
        let keys = pipe.take(n, |slot| py.detach(|| slot.wait()));
        Ok(PyBytes::new(py, &keys))
    }

    /// Forget every queued payload.
    fn clear(&self, py: Python<'_>) {
        self.lock(py).clear();
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.lock(py).len() as usize
    }
}
