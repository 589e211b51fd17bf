//! One service served: each call's method and request bytes go to a `Handler` on a blocking
//! thread (at most `workers` at once), its answer goes back as the response or a failed status.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{oneshot, Semaphore};
use tonic::body::Body;
use tonic::server::{Grpc, UnaryService};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status};

use super::{
    runtime, Failure, RawCodec, TlsPem, CONNECTION_WINDOW, MAX_MESSAGE_BYTES, STREAM_WINDOW,
};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What serves the calls. `handle` runs on a thread of its own (it may block: disk, locks).
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, method: &str, body: Bytes) -> Result<Bytes, Failure>;
}

struct Shared {
    prefix: String, // "/{service}/"
    handler: Arc<dyn Handler>,
    workers: Arc<Semaphore>,
    stopping: AtomicBool,
}

#[derive(Clone)]
struct Routes(Arc<Shared>);

impl tower_service::Service<http::Request<Body>> for Routes {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let shared = self.0.clone();
        Box::pin(async move {
            let method = match request.uri().path().strip_prefix(shared.prefix.as_str()) {
                Some(method) if !method.is_empty() && !method.contains('/') => method.to_owned(),
                _ => {
                    let path = request.uri().path().to_owned();
                    return Ok(Status::unimplemented(format!("no such method: {path}")).into_http());
                }
            };
            let mut grpc = Grpc::new(RawCodec)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            Ok(grpc.unary(Call { shared, method }, request).await)
        })
    }
}

struct Call {
    shared: Arc<Shared>,
    method: String,
}

impl UnaryService<Bytes> for Call {
    type Response = Bytes;
    type Future = BoxFuture<Result<Response<Bytes>, Status>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let shared = self.shared.clone();
        let method = std::mem::take(&mut self.method);
        Box::pin(async move {
            if shared.stopping.load(Ordering::Acquire) {
                return Err(Status::unavailable("the node is stopping"));
            }
            let _worker = shared
                .workers
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| Status::unavailable("the node is stopping"))?;
            let handler = shared.handler.clone();
            let body = request.into_inner();
            match tokio::task::spawn_blocking(move || handler.handle(&method, body)).await {
                Ok(Ok(response)) => Ok(Response::new(response)),
                Ok(Err(failure)) => Err(failure.into_status()),
                Err(e) => Err(Status::internal(format!("the handler did not finish: {e}"))),
            }
        })
    }
}

pub struct NodeServer {
    port: u16,
    shared: Arc<Shared>,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    served: Mutex<Option<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>>,
}

impl NodeServer {
    /// Listen on `address` ("host:port"; port 0 picks a free one) and serve `service`.
    pub fn bind(
        address: &str,
        service: &str,
        handler: Arc<dyn Handler>,
        tls: Option<TlsPem>,
        workers: usize,
    ) -> Result<Self, String> {
        let mut builder = tonic::transport::Server::builder()
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW);
        if let Some(pem) = tls {
            let (Some(cert), Some(key)) = (pem.cert, pem.key) else {
                return Err("a TLS node needs its certificate and its key".to_owned());
            };
            let mut config = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
            if let Some(ca) = pem.ca {
                config = config.client_ca_root(Certificate::from_pem(ca));
            }
            builder = builder
                .tls_config(config)
                .map_err(|e| format!("TLS settings: {e}"))?;
        }
        let listener = std::net::TcpListener::bind(address)
            .map_err(|e| format!("cannot listen on {address}: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let rt = runtime().map_err(|e| format!("no runtime: {e}"))?;
        let shared = Arc::new(Shared {
            prefix: format!("/{service}/"),
            handler,
            workers: Arc::new(Semaphore::new(workers.max(1))),
            stopping: AtomicBool::new(false),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let routes = Routes(shared.clone());
        let _context = rt.enter();
        let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let served = rt.spawn(async move {
            builder
                .serve_with_incoming_shutdown(routes, incoming, async {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(NodeServer {
            port,
            shared,
            stop: Mutex::new(Some(stop)),
            served: Mutex::new(Some(served)),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stop listening and refuse new calls (UNAVAILABLE); calls under way get `grace` to finish,
    /// then the server is dropped. Blocks until then; idempotent.
    pub fn stop(&self, grace: Duration) {
        self.shared.stopping.store(true, Ordering::Release);
        if let Some(stop) = self.stop.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = stop.send(());
        }
        let served = self.served.lock().unwrap_or_else(|e| e.into_inner()).take();
        let (Some(mut served), Ok(rt)) = (served, runtime()) else {
            return;
        };
        rt.block_on(async {
            if tokio::time::timeout(grace, &mut served).await.is_err() {
                served.abort();
            }
        });
    }
}
