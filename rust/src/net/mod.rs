//! The LogStore wire, natively: unary gRPC calls whose messages stay opaque bytes (the protobuf
//! encoding and every decision are Python's, `logstore/remote.py`). `client::NodeChannel` is one
//! HTTP/2 connection to one node; `server::NodeServer` serves one service by handing each call to
//! a `Handler` on a blocking thread. Both run on one tokio runtime per process (`runtime()`),
//! made on first use, so a process forked before it (Spark's Python workers) makes its own.
//! A call either blocks its caller (`NodeChannel::call`) or is started and its outcome queued
//! (`NodeChannel::start` into `completions::Completions`), for a caller that must not wait.
//! `py` is the Python face (`_core.NodeChannel`, `_core.NodeServer`, `_core.RpcError`).

mod client;
mod completions;
mod py;
mod server;

pub use py::register;

use std::sync::{Arc, Mutex};

use bytes::{Buf, BufMut, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};

/// The largest message either side sends or accepts: a batch of `append.max_batch_bytes`
/// (<= 64 MiB) fits with room.
pub const MAX_MESSAGE_BYTES: usize = 512 * 1024 * 1024;
/// HTTP/2 flow-control windows: a large batch goes in one round trip, not 64 KiB at a time.
const STREAM_WINDOW: u32 = 16 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 32 * 1024 * 1024;
/// The trailing metadata key carrying a project error's stable code.
pub const ERROR_KEY: &str = "wp-error";

/// A failed call: its gRPC status, message, and the project error code (`wp-error`) if the
/// node sent one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: Code,
    pub message: String,
    pub error: Option<String>,
}

impl Failure {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
            error: None,
        }
    }

    fn from_status(status: &Status) -> Self {
        let error = status
            .metadata()
            .get(ERROR_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut message = status.message().to_owned();
        let mut code = status.code();
        let mut source = std::error::Error::source(status);
        if source.is_some() && code == Code::Unknown {
            // a failure of this side's connection (refused, reset, TLS), not a status the node
            // sent: UNAVAILABLE, as gRPC names a broken connection
            code = Code::Unavailable;
        }
        while let Some(cause) = source {
            message = format!("{message}: {cause}");
            source = cause.source();
        }
        Failure {
            code,
            message,
            error,
        }
    }

    fn into_status(self) -> Status {
        let mut metadata = tonic::metadata::MetadataMap::new();
        if let Some(code) = self.error.as_deref().and_then(|c| c.parse().ok()) {
            metadata.insert(ERROR_KEY, code);
        }
        Status::with_metadata(self.code, self.message, metadata)
    }
}

/// gRPC's canonical status names, as grpcio and every gRPC library spell them.
const CODE_NAMES: [(Code, &str); 17] = [
    (Code::Ok, "OK"),
    (Code::Cancelled, "CANCELLED"),
    (Code::Unknown, "UNKNOWN"),
    (Code::InvalidArgument, "INVALID_ARGUMENT"),
    (Code::DeadlineExceeded, "DEADLINE_EXCEEDED"),
    (Code::NotFound, "NOT_FOUND"),
    (Code::AlreadyExists, "ALREADY_EXISTS"),
    (Code::PermissionDenied, "PERMISSION_DENIED"),
    (Code::ResourceExhausted, "RESOURCE_EXHAUSTED"),
    (Code::FailedPrecondition, "FAILED_PRECONDITION"),
    (Code::Aborted, "ABORTED"),
    (Code::OutOfRange, "OUT_OF_RANGE"),
    (Code::Unimplemented, "UNIMPLEMENTED"),
    (Code::Internal, "INTERNAL"),
    (Code::Unavailable, "UNAVAILABLE"),
    (Code::DataLoss, "DATA_LOSS"),
    (Code::Unauthenticated, "UNAUTHENTICATED"),
];

pub fn code_name(code: Code) -> &'static str {
    CODE_NAMES
        .iter()
        .find(|(c, _)| *c == code)
        .map_or("UNKNOWN", |(_, name)| name)
}

pub fn code_by_name(name: &str) -> Option<Code> {
    CODE_NAMES.iter().find(|(_, n)| *n == name).map(|(c, _)| *c)
}

/// PEM bytes. A client: `ca` verifies the nodes (None: the system's roots), `cert`/`key` is its
/// own certificate. A server: `cert`/`key` is its certificate, `ca` (if set) the CA whose client
/// certificates it requires.
#[derive(Clone, Default)]
pub struct TlsPem {
    pub ca: Option<Vec<u8>>,
    pub cert: Option<Vec<u8>>,
    pub key: Option<Vec<u8>>,
}

/// One runtime per process. A runtime inherited through fork has no threads in the child: it is
/// leaked there (dropping it would wait for threads that do not exist) and a new one made.
static RUNTIME: Mutex<Option<(u32, Arc<tokio::runtime::Runtime>)>> = Mutex::new(None);

pub fn runtime() -> std::io::Result<Arc<tokio::runtime::Runtime>> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((owner, rt)) = slot.as_ref() {
        if *owner == pid {
            return Ok(rt.clone());
        }
    }
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("wp-net")
            .enable_io()
            .enable_time()
            .build()?,
    );
    if let Some((_, stale)) = slot.replace((pid, rt.clone())) {
        std::mem::forget(stale); // the parent's: its threads are not in this process
    }
    Ok(rt)
}

/// The messages as they are: bytes in, bytes out (no protobuf here).
#[derive(Clone, Copy, Default)]
struct RawCodec;
struct RawEncoder;
struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

#[cfg(test)]
mod tests;
