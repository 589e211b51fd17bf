//! One node's channel: one HTTP/2 connection (TLS if configured), made on the first call and
//! remade after it breaks, which every call of every thread shares. After the connection fails
//! (refused, reset, a TLS handshake refused), calls fail at once (UNAVAILABLE) until the next try
//! is due: `RECONNECT_MIN`, doubling to `RECONNECT_MAX` while tries keep failing, so a node that
//! is down costs its callers nothing and a restarted one is reached within a second (gRPC's own
//! default grows to two minutes).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::PathAndQuery;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

use super::{
    runtime, Failure, RawCodec, TlsPem, CONNECTION_WINDOW, MAX_MESSAGE_BYTES, STREAM_WINDOW,
};

pub const RECONNECT_MIN: Duration = Duration::from_millis(100);
pub const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// Consecutive connection failures, and when the next call may try again.
#[derive(Default)]
pub(super) struct Reconnect {
    failures: u32,
    pub(super) next_try: Option<Instant>,
}

impl Reconnect {
    pub(super) fn failed(&mut self, now: Instant) {
        self.failures = self.failures.saturating_add(1);
        let wait = RECONNECT_MIN.saturating_mul(1 << (self.failures - 1).min(16));
        self.next_try = Some(now + wait.min(RECONNECT_MAX));
    }
}

pub struct NodeChannel {
    endpoint: Endpoint,
    address: String,
    service: String,
    reconnect: Arc<Mutex<Reconnect>>,
    /// The channel and the process it was made in (a forked child makes its own: the parent's
    /// connection task runs on a runtime the child does not have).
    live: Mutex<Option<(u32, Channel)>>,
}

impl NodeChannel {
    /// A channel to `address` ("host:port") for `service`'s methods; nothing is connected yet.
    pub fn new(address: &str, service: &str, tls: Option<TlsPem>) -> Result<Self, String> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|e| format!("bad node address {address:?}: {e}"))?
            .tcp_nodelay(true)
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW);
        if let Some(pem) = tls {
            let mut config = ClientTlsConfig::new();
            config = match pem.ca {
                Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
                None => config.with_native_roots(),
            };
            match (pem.cert, pem.key) {
                (Some(cert), Some(key)) => config = config.identity(Identity::from_pem(cert, key)),
                (None, None) => {}
                _ => return Err("a client certificate needs its key (set both)".to_owned()),
            }
            endpoint = endpoint
                .tls_config(config)
                .map_err(|e| format!("TLS settings for {address}: {e}"))?;
        }
        Ok(NodeChannel {
            endpoint,
            address: address.to_owned(),
            service: service.to_owned(),
            reconnect: Arc::default(),
            live: Mutex::new(None),
        })
    }

    fn channel(&self) -> std::io::Result<(Arc<tokio::runtime::Runtime>, Channel)> {
        let rt = runtime()?;
        let pid = std::process::id();
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((owner, channel)) = live.as_ref() {
            if *owner == pid {
                return Ok((rt, channel.clone()));
            }
        }
        let channel = {
            let _context = rt.enter(); // the channel's connection task is spawned on it
            self.endpoint.connect_lazy()
        };
        if let Some((_, stale)) = live.replace((pid, channel.clone())) {
            std::mem::forget(stale); // the parent's: its task is not in this process
        }
        Ok((rt, channel))
    }

    /// One unary call, blocking the calling thread: the response's bytes, or why it failed
    /// (DEADLINE_EXCEEDED once `timeout` passes, connecting included).
    pub fn call(&self, method: &str, body: Bytes, timeout: Duration) -> Result<Bytes, Failure> {
        let path = self.path(method)?;
        self.may_try()?;
        let (rt, channel) = self.live()?;
        let reconnect = self.reconnect.clone();
        rt.block_on(async move { noted(&reconnect, attempt(channel, path, body, timeout).await) })
    }

    /// The same call started on the runtime without waiting: `finish` gets its outcome there
    /// (on a runtime thread, so it must not block).
    pub fn start(
        &self,
        method: &str,
        body: Bytes,
        timeout: Duration,
        finish: impl FnOnce(Result<Bytes, Failure>) + Send + 'static,
    ) -> Result<(), Failure> {
        let path = self.path(method)?;
        self.may_try()?;
        let (rt, channel) = self.live()?;
        let reconnect = self.reconnect.clone();
        rt.spawn(async move {
            finish(noted(
                &reconnect,
                attempt(channel, path, body, timeout).await,
            ))
        });
        Ok(())
    }

    /// UNAVAILABLE while the connection failed and its next try is not due yet.
    fn may_try(&self) -> Result<(), Failure> {
        let reconnect = self.reconnect.lock().unwrap_or_else(|e| e.into_inner());
        match reconnect.next_try {
            Some(next) if Instant::now() < next => Err(Failure::new(
                Code::Unavailable,
                format!(
                    "{}: not connected ({} tries failed; the next in {} ms)",
                    self.address,
                    reconnect.failures,
                    next.saturating_duration_since(Instant::now()).as_millis()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The consecutive connection failures so far (for tests).
    #[cfg(test)]
    pub fn failures(&self) -> u32 {
        self.reconnect
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .failures
    }

    fn path(&self, method: &str) -> Result<PathAndQuery, Failure> {
        PathAndQuery::try_from(format!("/{}/{}", self.service, method))
            .map_err(|e| Failure::new(Code::InvalidArgument, format!("method {method:?}: {e}")))
    }

    fn live(&self) -> Result<(Arc<tokio::runtime::Runtime>, Channel), Failure> {
        self.channel()
            .map_err(|e| Failure::new(Code::Internal, format!("no runtime: {e}")))
    }

    /// Drop the connection (a later call connects again).
    pub fn close(&self) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((owner, channel)) = live.take() {
            if owner != std::process::id() {
                std::mem::forget(channel);
            }
        }
    }
}

/// Note what `outcome` says of the connection: an answer from the node (a response or its
/// status) resets the backoff, a failure of the connection itself extends it; a deadline
/// passed says nothing of it.
fn noted(
    reconnect: &Mutex<Reconnect>,
    outcome: (Result<Bytes, Failure>, bool),
) -> Result<Bytes, Failure> {
    let (result, connection_failed) = outcome;
    let mut state = reconnect.lock().unwrap_or_else(|e| e.into_inner());
    if connection_failed {
        state.failed(Instant::now());
    } else if result.is_ok()
        || result
            .as_ref()
            .is_err_and(|f| f.code != Code::DeadlineExceeded)
    {
        *state = Reconnect::default();
    }
    result
}

/// The call's result, and whether it failed for the connection (no answer from the node).
async fn attempt(
    channel: Channel,
    path: PathAndQuery,
    body: Bytes,
    timeout: Duration,
) -> (Result<Bytes, Failure>, bool) {
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    // No grpc-timeout header: the deadline is this side's (a node's server would cancel the
    // call as CANCELLED first, and its handler runs to the end whatever it is told)
    let request = tonic::Request::new(body);
    let call = async {
        grpc.ready().await.map_err(|e| {
            let mut status = tonic::Status::unavailable(e.to_string());
            status.set_source(Arc::new(e));
            status
        })?;
        grpc.unary(request, path, RawCodec).await
    };
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(response)) => (Ok(response.into_inner()), false),
        Ok(Err(status)) => {
            // a status made on this side, from a transport error: the node did not answer
            let local = std::error::Error::source(&status).is_some();
            let mut failure = Failure::from_status(&status);
            if local && failure.code == Code::Cancelled {
                // the connection closed under the call (the node stopped): unavailable, as a
                // refused connection is, not a call someone cancelled
                failure.code = Code::Unavailable;
            }
            (Err(failure), local)
        }
        Err(_) => (
            Err(Failure::new(
                Code::DeadlineExceeded,
                format!("no answer within {:.3} s", timeout.as_secs_f64()),
            )),
            false,
        ),
    }
}
