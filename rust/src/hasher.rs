//! Idempotency keys computed on a background thread, in the order their inputs were pushed.
//!
//! A producer thread pushes a copy of each payload or explicit id (cheap: a memcpy) and carries
//! on; every
//! [`CHUNK_ITEMS`] payloads or [`CHUNK_BYTES`] bytes the chunk goes to a worker thread that hashes
//! it, in parallel with the producer and without any Python lock. [`KeyPipe::take`] returns the
//! keys of the oldest payloads, in push order: finished chunks are read as they are, a chunk not
//! yet handed over is hashed by the caller, and an unfinished one is waited for.

use std::collections::VecDeque;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;

use crate::keys::{self, KEY_LEN};

/// A chunk goes to the worker at this many payloads ...
pub const CHUNK_ITEMS: usize = 64;
/// ... or at this many payload bytes, whichever comes first.
pub const CHUNK_BYTES: usize = 256 * 1024;

/// What a pushed input is, so which key it gets.
#[derive(Clone, Copy)]
enum Kind {
    /// A payload: its content key.
    Payload,
    /// A key computed already: passed through as it is.
    Key,
}

/// Input copies laid end to end, with each one's end offset and kind.
#[derive(Default)]
struct Chunk {
    data: Vec<u8>,
    ends: Vec<usize>,
    kinds: Vec<Kind>,
    /// Whether any input needs hashing (else the chunk is finished without the worker).
    payloads: bool,
}

impl Chunk {
    fn len(&self) -> usize {
        self.ends.len()
    }

    fn keys(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len() * KEY_LEN);
        let mut start = 0;
        for (&end, &kind) in self.ends.iter().zip(&self.kinds) {
            let bytes = self.data.get(start..end).unwrap_or_default();
            match kind {
                Kind::Payload => out.extend_from_slice(&keys::content_key(bytes)),
                Kind::Key => out.extend_from_slice(bytes),
            }
            start = end;
        }
        out
    }
}

/// Where the worker leaves a chunk's keys.
#[derive(Default)]
pub struct Slot {
    keys: Mutex<Option<Vec<u8>>>,
    done: Condvar,
}

impl Slot {
    /// A slot finished from the start: no condition variable is signalled (a signal is a system
    /// call even with nobody waiting, and key-only chunks never have a waiter).
    fn filled(keys: Vec<u8>) -> Self {
        Self {
            keys: Mutex::new(Some(keys)),
            done: Condvar::new(),
        }
    }

    fn fill(&self, keys: Vec<u8>) {
        *self.keys.lock().unwrap_or_else(PoisonError::into_inner) = Some(keys);
        self.done.notify_all();
    }

    fn try_take(&self) -> Option<Vec<u8>> {
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Block until the worker has filled the slot.
    pub fn wait(&self) -> Vec<u8> {
        let mut guard = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(keys) = guard.take() {
                return keys;
            }
            guard = self
                .done
                .wait(guard)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Chunks handed to the worker, oldest first, with the number of payloads in each.
type InFlight = VecDeque<(usize, Arc<Slot>)>;

/// The pipe: the open chunk, the chunks in flight, and keys already taken from a finished chunk
/// but not yet returned.
pub struct KeyPipe {
    open: Chunk,
    in_flight: InFlight,
    ready: Vec<u8>,
    ready_at: usize,
    to_worker: Option<Sender<(Chunk, Arc<Slot>)>>,
    pushed: u64,
    taken: u64,
}

impl Default for KeyPipe {
    fn default() -> Self {
        Self::new()
    }
}

fn work(chunks: Receiver<(Chunk, Arc<Slot>)>) {
    for (chunk, slot) in chunks {
        slot.fill(chunk.keys());
    }
}

impl KeyPipe {
    /// A pipe; its worker thread starts with the first full chunk and ends with the pipe.
    pub fn new() -> Self {
        Self {
            open: Chunk::default(),
            in_flight: VecDeque::new(),
            ready: Vec::new(),
            ready_at: 0,
            to_worker: None,
            pushed: 0,
            taken: 0,
        }
    }

    /// Payloads pushed and not yet taken.
    pub fn len(&self) -> u64 {
        self.pushed - self.taken
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queue a copy of `payload` for its content key.
    pub fn push(&mut self, payload: &[u8]) {
        self.push_item(payload, Kind::Payload);
    }

    /// Queue the key of an explicit id (already validated). An id is short, so its key is
    /// computed here: waking the worker for it would cost more than the MD5 itself.
    pub fn push_id(&mut self, id: &[u8]) {
        self.push_item(&keys::explicit_key(id), Kind::Key);
    }

    /// Queue a key computed already (16 bytes), returned as it is in its turn.
    pub fn push_key(&mut self, key: &crate::keys::Key) {
        self.push_item(key, Kind::Key);
    }

    fn push_item(&mut self, bytes: &[u8], kind: Kind) {
        self.open.data.extend_from_slice(bytes);
        self.open.ends.push(self.open.data.len());
        self.open.kinds.push(kind);
        self.open.payloads |= matches!(kind, Kind::Payload);
        self.pushed += 1;
        if self.open.len() >= CHUNK_ITEMS || self.open.data.len() >= CHUNK_BYTES {
            self.dispatch();
        }
    }

    fn dispatch(&mut self) {
        let chunk = std::mem::take(&mut self.open);
        let count = chunk.len();
        // The next chunk is likely as big: size it now rather than grow it copy by copy.
        self.open.data.reserve(chunk.data.len().min(CHUNK_BYTES));
        self.open.ends.reserve(CHUNK_ITEMS);
        self.open.kinds.reserve(CHUNK_ITEMS);
        if !chunk.payloads {
            let slot = Arc::new(Slot::filled(chunk.keys())); // keys only: nothing to hash
            self.in_flight.push_back((count, slot));
            return;
        }
        let slot = Arc::new(Slot::default());
        if self.to_worker.is_none() {
            let (tx, rx) = channel();
            // Without a worker (thread creation refused), chunks are hashed by `take`.
            if thread::Builder::new()
                .name("wp-keys".into())
                .spawn(move || work(rx))
                .is_ok()
            {
                self.to_worker = Some(tx);
            }
        }
        let sent = match &self.to_worker {
            Some(tx) => tx.send((chunk, Arc::clone(&slot))),
            None => Err(std::sync::mpsc::SendError((chunk, Arc::clone(&slot)))),
        };
        if let Err(std::sync::mpsc::SendError((chunk, slot))) = sent {
            self.to_worker = None;
            slot.fill(chunk.keys());
        }
        self.in_flight.push_back((count, slot));
    }

    /// How many of the oldest payloads have their keys computed (so `take` of them neither
    /// waits nor hashes): those of finished chunks, up to the first unfinished one.
    pub fn ready_count(&self) -> usize {
        let mut have = (self.ready.len() - self.ready_at) / KEY_LEN;
        for (count, slot) in &self.in_flight {
            if slot
                .keys
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_none()
            {
                break;
            }
            have += count;
        }
        have
    }

    /// The keys of the `n` oldest payloads not yet taken (N*16 bytes), in push order; `wait` is
    /// called to block for an unfinished chunk (so the caller can release locks around it).
    /// Panics if fewer than `n` payloads are queued (the caller checks `len`).
    pub fn take(&mut self, n: usize, wait: impl Fn(&Slot) -> Vec<u8>) -> Vec<u8> {
        assert!(n as u64 <= self.len(), "take({n}) of {} keys", self.len());
        let mut out = Vec::with_capacity(n * KEY_LEN);
        while out.len() < n * KEY_LEN {
            if self.ready_at == self.ready.len() {
                self.ready = match self.in_flight.pop_front() {
                    Some((_, slot)) => slot.try_take().unwrap_or_else(|| wait(&slot)),
                    None => {
                        let keys = self.open.keys();
                        self.open = Chunk::default();
                        keys
                    }
                };
                self.ready_at = 0;
            }
            let want = n * KEY_LEN - out.len();
            let end = self.ready.len().min(self.ready_at + want);
            out.extend_from_slice(self.ready.get(self.ready_at..end).unwrap_or_default());
            self.ready_at = end;
        }
        self.taken += n as u64;
        out
    }

    /// Forget everything queued (the writes behind it failed).
    pub fn clear(&mut self) {
        self.open = Chunk::default();
        self.in_flight.clear();
        self.ready.clear();
        self.ready_at = 0;
        self.taken = self.pushed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_slot(slot: &Slot) -> Vec<u8> {
        slot.wait()
    }

    fn payload(i: usize) -> Vec<u8> {
        (0..(i * 37) % 3000).map(|b| (b * 7 + i) as u8).collect()
    }

    #[test]
    fn keys_come_back_in_push_order_whatever_the_kinds_and_take_sizes() {
        let mut pipe = KeyPipe::new();
        let all: Vec<Vec<u8>> = (0..1000).map(payload).collect();
        let mut expected = Vec::new();
        for p in &all {
            expected.extend_from_slice(&if p.len() % 5 == 0 {
                keys::explicit_key(p)
            } else {
                keys::content_key(p)
            });
        }
        let mut got = Vec::new();
        let mut pushed = 0;
        for (step, take) in [1usize, 63, 64, 65, 200, 7, 0, 300]
            .iter()
            .cycle()
            .enumerate()
        {
            let upto = (pushed + 97 + step * 13).min(all.len());
            for p in &all[pushed..upto] {
                match p.len() % 5 {
                    0 => pipe.push_id(p),
                    1 => pipe.push_key(&keys::content_key(p)),
                    _ => pipe.push(p),
                }
            }
            pushed = upto;
            let n = (*take).min(pipe.len() as usize);
            got.extend(pipe.take(n, wait_slot));
            if pushed == all.len() && pipe.is_empty() {
                break;
            }
            if pushed == all.len() {
                let rest = pipe.len() as usize;
                got.extend(pipe.take(rest, wait_slot));
                break;
            }
        }
        assert_eq!(got, expected);
    }

    #[test]
    fn clear_drops_queued_payloads() {
        let mut pipe = KeyPipe::new();
        for i in 0..150 {
            pipe.push(&payload(i));
        }
        pipe.take(10, wait_slot);
        pipe.clear();
        assert!(pipe.is_empty());
        pipe.push(b"after");
        assert_eq!(
            pipe.take(1, wait_slot),
            keys::content_key(b"after").to_vec()
        );
    }

    #[test]
    fn ready_count_reaches_every_dispatched_payload() {
        let mut pipe = KeyPipe::new();
        for i in 0..CHUNK_ITEMS * 3 + 5 {
            pipe.push(&payload(i));
        }
        // five payloads stay in the open chunk; give the worker time to finish the rest
        for _ in 0..400 {
            if pipe.ready_count() == CHUNK_ITEMS * 3 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(pipe.ready_count(), CHUNK_ITEMS * 3);
        assert_eq!(
            pipe.take(CHUNK_ITEMS * 3, wait_slot).len(),
            CHUNK_ITEMS * 3 * KEY_LEN
        );
    }
}
