//! Python face of `net`: `NodeChannel.call` and `NodeServer`'s handler take and give protobuf
//! bytes only; a failed call is an `RpcError` either way (a handler raises one to fail a call
//! with that status and project error code; a client gets one for every failed call).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tonic::Code;

use super::client::NodeChannel;
use super::completions::Completions;
use super::server::{Handler, NodeServer};
use super::{code_by_name, code_name, Failure, TlsPem};

create_exception!(
    _core,
    RpcError,
    PyException,
    "A failed gRPC call: `args` is (code, details, error): `code` the status name \
     (\"UNAVAILABLE\", \"ABORTED\", ...), `details` its message, `error` the project error code \
     the node sent (`wp-error`) or None. A handler raises one to fail its call so."
);

fn raise(failure: Failure) -> PyErr {
    RpcError::new_err((code_name(failure.code), failure.message, failure.error))
}

/// The failure a handler's `RpcError` stands for (None: the error is no well-formed RpcError).
fn failure_of(py: Python<'_>, err: &PyErr) -> Option<Failure> {
    if !err.is_instance_of::<RpcError>(py) {
        return None;
    }
    let args = err.value(py).getattr("args").ok()?;
    let (code, message, error): (String, String, Option<String>) = args.extract().ok()?;
    let code = code_by_name(&code).filter(|c| *c != Code::Ok)?;
    Some(Failure {
        code,
        message,
        error,
    })
}

fn tls_pem(
    ca: Option<Vec<u8>>,
    cert: Option<Vec<u8>>,
    key: Option<Vec<u8>>,
    tls: bool,
) -> Option<TlsPem> {
    tls.then_some(TlsPem { ca, cert, key })
}

fn seconds(value: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| PyValueError::new_err(format!("{what} must be seconds >= 0, got {value}")))
}

/// One node's channel (see `net::client`): `call` blocks its thread, not the GIL.
#[pyclass(module = "woodpecker_idem._core", name = "NodeChannel", frozen)]
pub struct PyNodeChannel {
    inner: NodeChannel,
}

#[pymethods]
impl PyNodeChannel {
    #[new]
    #[pyo3(signature = (address, service, *, tls = false, ca = None, cert = None, key = None))]
    fn new(
        address: &str,
        service: &str,
        tls: bool,
        ca: Option<Vec<u8>>,
        cert: Option<Vec<u8>>,
        key: Option<Vec<u8>>,
    ) -> PyResult<Self> {
        let inner = NodeChannel::new(address, service, tls_pem(ca, cert, key, tls))
            .map_err(PyValueError::new_err)?;
        Ok(PyNodeChannel { inner })
    }

    /// Call `method` with the request's bytes; the response's bytes, or `RpcError`.
    fn call<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        request: &[u8],
        timeout_s: f64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let timeout = seconds(timeout_s, "timeout_s")?;
        let body = Bytes::copy_from_slice(request);
        match py.detach(|| self.inner.call(method, body, timeout)) {
            Ok(response) => Ok(PyBytes::new(py, &response)),
            Err(failure) => Err(raise(failure)),
        }
    }

    /// Start the call without waiting: its outcome goes to `completions` under `token`.
    fn start(
        &self,
        method: &str,
        request: &[u8],
        timeout_s: f64,
        completions: &Bound<'_, PyCompletions>,
        token: u64,
    ) -> PyResult<()> {
        let timeout = seconds(timeout_s, "timeout_s")?;
        let queue = completions.get().inner.clone();
        let body = Bytes::copy_from_slice(request);
        self.inner
            .start(method, body, timeout, move |outcome| {
                queue.push((token, outcome))
            })
            .map_err(raise)
    }

    /// Drop the connection (a later call connects again).
    fn close(&self) {
        self.inner.close();
    }
}

/// The outcomes of started calls (`NodeChannel.start`), for one thread to take in turn.
#[pyclass(module = "woodpecker_idem._core", name = "Completions", frozen)]
pub struct PyCompletions {
    inner: Arc<Completions>,
}

#[pymethods]
impl PyCompletions {
    #[new]
    fn new() -> Self {
        PyCompletions {
            inner: Arc::new(Completions::default()),
        }
    }

    /// The next outcome, `(token, response bytes or RpcError)`, waiting for one without the
    /// GIL; None once closed.
    fn next<'py>(&self, py: Python<'py>) -> Option<(u64, Bound<'py, PyAny>)> {
        let queue = self.inner.clone();
        let (token, outcome) = py.detach(move || queue.next())?;
        let value = match outcome {
            Ok(response) => PyBytes::new(py, &response).into_any(),
            Err(failure) => raise(failure).into_value(py).into_bound(py).into_any(),
        };
        Some((token, value))
    }

    /// Wake the thread in `next` with None; outcomes not taken yet are dropped.
    fn close(&self) {
        self.inner.close();
    }
}

struct PyHandler(Py<PyAny>);

impl Handler for PyHandler {
    fn handle(&self, method: &str, body: Bytes) -> Result<Bytes, Failure> {
        Python::attach(|py| {
            let request = PyBytes::new(py, &body);
            match self.0.call1(py, (method, request)) {
                Ok(response) => match response.cast_bound::<PyBytes>(py) {
                    Ok(bytes) => Ok(Bytes::copy_from_slice(bytes.as_bytes())),
                    Err(_) => Err(Failure::new(
                        Code::Internal,
                        format!("{method}: the handler returned no bytes"),
                    )),
                },
                Err(err) => Err(failure_of(py, &err)
                    .unwrap_or_else(|| Failure::new(Code::Unknown, format!("{method}: {err}")))),
            }
        })
    }
}

/// A served service (see `net::server`): `handler(method, request) -> response` is called on a
/// thread of the server's with the GIL, at most `workers` at once.
#[pyclass(module = "woodpecker_idem._core", name = "NodeServer", frozen)]
pub struct PyNodeServer {
    inner: NodeServer,
}

#[pymethods]
impl PyNodeServer {
    #[new]
    #[pyo3(signature = (address, service, handler, *, workers = 8, tls = false, ca = None, cert = None, key = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        address: &str,
        service: &str,
        handler: Py<PyAny>,
        workers: usize,
        tls: bool,
        ca: Option<Vec<u8>>,
        cert: Option<Vec<u8>>,
        key: Option<Vec<u8>>,
    ) -> PyResult<Self> {
        if !handler.bind(py).is_callable() {
            return Err(PyValueError::new_err("handler must be callable"));
        }
        let tls = tls_pem(ca, cert, key, tls);
        let handler: Arc<dyn Handler> = Arc::new(PyHandler(handler));
        let inner = py
            .detach(|| NodeServer::bind(address, service, handler, tls, workers))
            .map_err(pyo3::exceptions::PyOSError::new_err)?;
        Ok(PyNodeServer { inner })
    }

    /// The port listened on.
    #[getter]
    fn port(&self) -> u16 {
        self.inner.port()
    }

    /// Refuse new calls, let the ones under way finish within `grace_s`, stop listening.
    fn stop(&self, py: Python<'_>, grace_s: f64) -> PyResult<()> {
        let grace = seconds(grace_s, "grace_s")?;
        py.detach(|| self.inner.stop(grace));
        Ok(())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("RpcError", m.py().get_type::<RpcError>())?;
    m.add_class::<PyNodeChannel>()?;
    m.add_class::<PyNodeServer>()?;
    m.add_class::<PyCompletions>()?;
    Ok(())
}
