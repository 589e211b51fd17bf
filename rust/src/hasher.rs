//! Idempotency keys, returned in the order their inputs were pushed.
//!
//! A producer thread pushes each payload (held, not copied: `P` is whatever owns its bytes, for
//! Python a reference to the immutable `bytes` object) or an explicit id (copied behind the
//! domain tag [`keys::explicit_key`] uses). Every [`CHUNK_ITEMS`] inputs or [`CHUNK_BYTES`] bytes
//! the open chunk is hashed, all its payloads and ids together (`md5x`, several per vector pass:
//! `push_id` and its share of `take` went from ~367 to ~302 ns per id against one MD5 per push).
//! A chunk of less than [`INLINE_BYTES`] payload bytes (ids alone, or small payloads) is hashed by
//! the pusher at once, cheaper than waking a thread. A larger chunk (64 payloads of 1 KiB) goes to
//! a worker thread that hashes it in parallel with the producer and without any Python lock: the
//! producer holds the GIL, so hashing there stalls every other Python thread (the idempotent
//! writer's content-key throughput against plain writes went from ~0.94x with 1 KiB chunks
//! hashed inline to ~0.96x on the worker). It comes back with its keys, so its payload references
//! are released by the taker (for Python, with the GIL held). [`KeyPipe::take`] returns the keys
//! of the oldest inputs, in push order: finished chunks are read as they are, a chunk not yet
//! handed over is hashed by the caller, and an unfinished one is waited for.

use std::collections::VecDeque;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;

use crate::keys::{self, Key, KEY_LEN};

/// A chunk goes to the worker at this many payloads ...
pub const CHUNK_ITEMS: usize = 64;
/// ... or at this many payload bytes, whichever comes first.
pub const CHUNK_BYTES: usize = 256 * 1024;

/// A chunk of fewer payload bytes than this is hashed by the pusher itself (~7 us at most).
pub const INLINE_BYTES: usize = 32 * 1024;

/// One queued input: a payload for its content key, an explicit id (its tagged bytes end at this
/// offset of the chunk's `tagged`), or a key computed already.
pub enum Input<P> {
    Payload(P),
    Id(usize),
    Key(Key),
}

/// Inputs in push order, with the payload bytes they hold.
struct Chunk<P> {
    items: Vec<Input<P>>,
    payload_bytes: usize,
    /// Whether any payload needs hashing (else the chunk is hashed without the worker).
    payloads: bool,
    /// The explicit ids, each behind its domain tag, end to end.
    tagged: Vec<u8>,
}

impl<P> Default for Chunk<P> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            payload_bytes: 0,
            payloads: false,
            tagged: Vec::new(),
        }
    }
}

impl<P: AsRef<[u8]>> Chunk<P> {
    fn len(&self) -> usize {
        self.items.len()
    }

    /// The payloads and tagged ids are hashed together (several per vector pass, see `md5x`),
    /// then their keys are merged with the given ones in push order.
    fn keys(&self) -> Vec<u8> {
        let mut start = 0;
        let messages: Vec<&[u8]> = self
            .items
            .iter()
            .filter_map(|item| match item {
                Input::Payload(p) => Some(p.as_ref()),
                Input::Id(end) => {
                    let tagged = self.tagged.get(start..*end).unwrap_or_default();
                    start = *end;
                    Some(tagged)
                }
                Input::Key(_) => None,
            })
            .collect();
        let mut hashed = vec![0u8; messages.len() * KEY_LEN];
        keys::content_keys_into(&messages, &mut hashed); // an MD5 of each, as they stand
        if messages.len() == self.len() {
            return hashed; // nothing given as a key, the usual chunk: nothing to merge
        }
        let mut hashed = hashed.chunks_exact(KEY_LEN);
        let mut out = Vec::with_capacity(self.len() * KEY_LEN);
        for item in &self.items {
            match item {
                Input::Payload(_) | Input::Id(_) => {
                    out.extend_from_slice(hashed.next().unwrap_or_default());
                }
                Input::Key(k) => out.extend_from_slice(k),
            }
        }
        out
    }
}

/// A finished chunk: its keys, and its inputs for the taker to release.
pub type Finished<P> = (Vec<u8>, Vec<Input<P>>);

/// Where the worker leaves a finished chunk.
pub struct Slot<P> {
    done: Mutex<Option<Finished<P>>>,
    filled: Condvar,
}

impl<P> Slot<P> {
    fn empty() -> Self {
        Self {
            done: Mutex::new(None),
            filled: Condvar::new(),
        }
    }

    /// A slot finished from the start: no condition variable is signalled (a signal is a system
    /// call even with nobody waiting, and key-only chunks never have a waiter).
    fn finished(keys: Vec<u8>) -> Self {
        Self {
            done: Mutex::new(Some((keys, Vec::new()))),
            filled: Condvar::new(),
        }
    }

    fn fill(&self, finished: Finished<P>) {
        *self.done.lock().unwrap_or_else(PoisonError::into_inner) = Some(finished);
        self.filled.notify_all();
    }

    fn is_filled(&self) -> bool {
        self.done
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    fn try_take(&self) -> Option<Finished<P>> {
        self.done
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Block until the worker has filled the slot.
    pub fn wait(&self) -> Finished<P> {
        let mut guard = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(finished) = guard.take() {
                return finished;
            }
            guard = self
                .filled
                .wait(guard)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Chunks handed to the worker, oldest first, with the number of inputs in each.
type InFlight<P> = VecDeque<(usize, Arc<Slot<P>>)>;
type ToWorker<P> = Sender<(Chunk<P>, Arc<Slot<P>>)>;

/// The pipe: the open chunk, the chunks in flight, and keys already taken from a finished chunk
/// but not yet returned.
pub struct KeyPipe<P> {
    open: Chunk<P>,
    in_flight: InFlight<P>,
    ready: Vec<u8>,
    ready_at: usize,
    to_worker: Option<ToWorker<P>>,
    pushed: u64,
    taken: u64,
}

impl<P: AsRef<[u8]> + Send + 'static> Default for KeyPipe<P> {
    fn default() -> Self {
        Self::new()
    }
}

fn work<P: AsRef<[u8]>>(chunks: Receiver<(Chunk<P>, Arc<Slot<P>>)>) {
    for (chunk, slot) in chunks {
        let keys = chunk.keys();
        slot.fill((keys, chunk.items));
    }
}

impl<P: AsRef<[u8]> + Send + 'static> KeyPipe<P> {
    /// A pipe; its worker thread starts with the first large chunk and ends with the pipe.
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

    /// Inputs pushed and not yet taken.
    pub fn len(&self) -> u64 {
        self.pushed - self.taken
    }

    /// Queue a payload for its content key (held until its chunk is taken).
    pub fn push(&mut self, payload: P) {
        self.open.payload_bytes += payload.as_ref().len();
        self.open.payloads = true;
        self.push_item(Input::Payload(payload));
    }

    /// Queue an explicit id (already validated) for its key, [`keys::explicit_key`]. Ids are
    /// short: a chunk of ids alone is hashed by the pusher, many ids per vector pass.
    pub fn push_id(&mut self, id: &[u8]) {
        let tagged = &mut self.open.tagged;
        if tagged.capacity() == 0 {
            tagged.reserve(CHUNK_ITEMS * (keys::EXPLICIT_DOMAIN.len() + 32));
        }
        tagged.extend_from_slice(keys::EXPLICIT_DOMAIN);
        tagged.extend_from_slice(id);
        let end = tagged.len();
        self.push_item(Input::Id(end));
    }

    /// Queue a key computed already (16 bytes), returned as it is in its turn.
    pub fn push_key(&mut self, key: &Key) {
        self.push_item(Input::Key(*key));
    }

    fn push_item(&mut self, item: Input<P>) {
        if self.open.items.capacity() == 0 {
            self.open.items.reserve(CHUNK_ITEMS);
        }
        self.open.items.push(item);
        self.pushed += 1;
        if self.open.len() >= CHUNK_ITEMS || self.open.payload_bytes >= CHUNK_BYTES {
            self.dispatch();
        }
    }

    fn dispatch(&mut self) {
        let chunk = std::mem::take(&mut self.open);
        let count = chunk.len();
        if !chunk.payloads || chunk.payload_bytes < INLINE_BYTES {
            // keys and ids only, or payloads hashed here faster than waking a worker for them
            let slot = Arc::new(Slot::finished(chunk.keys()));
            self.in_flight.push_back((count, slot));
            return;
        }
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
        let slot = Arc::new(Slot::empty());
        let sent = match &self.to_worker {
            Some(tx) => tx.send((chunk, Arc::clone(&slot))),
            None => Err(std::sync::mpsc::SendError((chunk, Arc::clone(&slot)))),
        };
        if let Err(std::sync::mpsc::SendError((chunk, slot))) = sent {
            self.to_worker = None;
            let keys = chunk.keys();
            slot.fill((keys, chunk.items));
        }
        self.in_flight.push_back((count, slot));
    }

    /// How many of the oldest inputs have their keys computed (so `take` of them neither
    /// waits nor hashes): those of finished chunks, up to the first unfinished one.
    pub fn ready_count(&self) -> usize {
        let mut have = (self.ready.len() - self.ready_at) / KEY_LEN;
        for (count, slot) in &self.in_flight {
            if !slot.is_filled() {
                break;
            }
            have += count;
        }
        have
    }

    /// The keys of the `n` oldest inputs not yet taken (N*16 bytes), in push order; `wait` is
    /// called to block for an unfinished chunk (so the caller can release locks around it).
    /// The taken chunks' payloads are released here, on the caller's thread.
    /// Panics if fewer than `n` inputs are queued (the caller checks `len`).
    pub fn take(&mut self, n: usize, wait: impl Fn(&Slot<P>) -> Finished<P>) -> Vec<u8> {
        assert!(n as u64 <= self.len(), "take({n}) of {} keys", self.len());
        let mut out = Vec::with_capacity(n * KEY_LEN);
        while out.len() < n * KEY_LEN {
            if self.ready_at == self.ready.len() {
                self.ready = match self.in_flight.pop_front() {
                    Some((_, slot)) => slot.try_take().unwrap_or_else(|| wait(&slot)).0,
                    None => std::mem::take(&mut self.open).keys(),
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

    /// Forget everything queued (the writes behind it failed). A chunk the worker is still
    /// hashing releases its payloads on the worker thread when it finishes.
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

    type Pipe = KeyPipe<Vec<u8>>;

    fn wait_slot(slot: &Slot<Vec<u8>>) -> Finished<Vec<u8>> {
        slot.wait()
    }

    fn payload(i: usize) -> Vec<u8> {
        (0..(i * 37) % 3000).map(|b| (b * 7 + i) as u8).collect()
    }

    #[test]
    fn keys_come_back_in_push_order_whatever_the_kinds_and_take_sizes() {
        let mut pipe = Pipe::new();
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
                    _ => pipe.push(p.clone()),
                }
            }
            pushed = upto;
            let n = (*take).min(pipe.len() as usize);
            got.extend(pipe.take(n, wait_slot));
            if pushed == all.len() && pipe.len() == 0 {
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
        let mut pipe = Pipe::new();
        for i in 0..150 {
            pipe.push(payload(i));
        }
        pipe.take(10, wait_slot);
        pipe.clear();
        assert!(pipe.len() == 0);
        pipe.push(b"after".to_vec());
        assert_eq!(
            pipe.take(1, wait_slot),
            keys::content_key(b"after").to_vec()
        );
    }

    #[test]
    fn ready_count_reaches_every_dispatched_payload() {
        let mut pipe = Pipe::new();
        for i in 0..CHUNK_ITEMS * 3 + 5 {
            pipe.push(payload(i));
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

    #[test]
    fn small_chunks_are_hashed_by_the_pusher() {
        let size = INLINE_BYTES / CHUNK_ITEMS - 1; // a whole chunk stays under INLINE_BYTES
        let mut pipe = Pipe::new();
        for i in 0..CHUNK_ITEMS {
            pipe.push(vec![i as u8; size]);
        }
        for i in 0..CHUNK_ITEMS {
            pipe.push_id(format!("order-{i}").as_bytes()); // ids alone: hashed at once too
        }
        assert_eq!(pipe.ready_count(), 2 * CHUNK_ITEMS, "hashed at once");
        assert!(
            pipe.to_worker.is_none(),
            "no thread started for small chunks"
        );
        let keys = pipe.take(2 * CHUNK_ITEMS, wait_slot);
        let (payload_keys, id_keys) = keys.split_at(CHUNK_ITEMS * KEY_LEN);
        for (i, k) in payload_keys.chunks_exact(KEY_LEN).enumerate() {
            assert_eq!(k, keys::content_key(&vec![i as u8; size]));
        }
        for (i, k) in id_keys.chunks_exact(KEY_LEN).enumerate() {
            assert_eq!(k, keys::explicit_key(format!("order-{i}").as_bytes()));
        }
    }

    #[test]
    fn chunks_of_1_kib_payloads_go_to_the_worker() {
        // 64 x 1 KiB: the producer holds the GIL, so it hands these to the worker (hasher.rs doc)
        let mut pipe = Pipe::new();
        for i in 0..CHUNK_ITEMS {
            pipe.push(vec![i as u8; 1024]);
        }
        assert!(pipe.to_worker.is_some(), "the worker took the chunk");
        let keys = pipe.take(CHUNK_ITEMS, wait_slot);
        for (i, k) in keys.chunks_exact(KEY_LEN).enumerate() {
            assert_eq!(k, keys::content_key(&[i as u8; 1024]));
        }
    }

    #[test]
    fn large_chunks_go_to_the_worker() {
        let mut pipe = Pipe::new();
        let big = |i: usize| vec![i as u8; 100 * 1024];
        for i in 0..7 {
            pipe.push(big(i)); // 300 KiB dispatch a chunk, twice; one stays open
        }
        assert!(pipe.to_worker.is_some(), "a large chunk starts the worker");
        let keys = pipe.take(7, wait_slot);
        for (i, k) in keys.chunks_exact(KEY_LEN).enumerate() {
            assert_eq!(k, keys::content_key(&big(i)));
        }
    }
}
