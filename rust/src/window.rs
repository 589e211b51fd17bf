//! The dedup window: pending keys in a small side table, committed keys in a preallocated ring
//! kept in commit order and indexed by a [`SlotIndex`] of ring slot numbers, which grows with the
//! keys (doubling, at most to what `max_keys` keys need).
//!
//! Layout per committed key: one 32-byte [`Record`] in the ring plus one `u32` cell in the index
//! (32 + 4 * 4/3 = 37.3 bytes in a full window, up to 32 + 4 * 8/3 = 42.7 in a growing one). The
//! pending table holds the writes in flight and is released when they are all acknowledged.
//!
//! A key written again after its window expired (or a newer occurrence met during recovery)
//! replaces its old record: the old slot leaves the index and stays in the ring as a *dead* slot
//! until it reaches the oldest end, where it is dropped without counting as an eviction. A slot
//! is live exactly when the index points at it.

use std::collections::{HashMap, TryReserveError, VecDeque};
use std::hash::BuildHasher;

use crate::keys::{Key, KEY_LEN};
use crate::pending::{Pending, Reserved};
use crate::slot_index::{sort_by_home, SlotIndex};

/// Largest accepted `max_keys`: ring slots are addressed by `u32`.
pub const MAX_KEYS_LIMIT: u64 = u32::MAX as u64;

/// One window entry, exactly 32 bytes: the ring element and the pending-table element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Record {
    pub key: Key,
    pub segment_id: u32,
    pub entry_id: u32,
    pub timestamp_ms: i64,
}

const _: () = assert!(std::mem::size_of::<Record>() == 32);

/// Status codes used by batch lookups.
pub const ABSENT: u8 = 0;
pub const PENDING: u8 = 1;
pub const COMMITTED: u8 = 2;

/// Result of a single lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Absent,
    Pending(Record),
    Committed(Record),
}

/// Why a window operation failed.
#[derive(Debug, PartialEq, Eq)]
pub enum WindowError {
    /// `add_pending` of a key that is already pending or committed.
    KeyPresent,
}

/// Counters, all monotonically increasing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub early_evictions: u64,
}

/// The dedup window. Not synchronised: the Python class wraps it in a mutex.
#[derive(Debug)]
pub struct Window {
    max_keys: usize,
    window_ms: i64,
    seed: u64,
    /// Committed records; live ones are `[head, head + len)` modulo `max_keys`. Capacity is
    /// reserved up front and the vector only grows by `push` until it wraps.
    ring: Vec<Record>,
    head: usize,
    len: usize,
    /// Records that ever left the oldest end: the logical position (sequence number) of the
    /// record at `head`. Position `popped + nth` names the `nth` oldest record for as long as it
    /// is held, so a snapshot can read the window a chunk at a time ([`Window::committed_between`])
    /// while records come and go between the chunks.
    popped: u64,
    /// Ring slot numbers, hashed on the key of the record in that slot.
    index: SlotIndex,
    /// Slots in `[head, head + len)` that the index no longer points at.
    dead: usize,
    pending: Pending,
    /// The pending keys of each segment, in entry order (ties in insertion order), so a quorum
    /// ack commits a prefix of a segment by position ([`Window::commit_through`]).
    pending_order: HashMap<u32, VecDeque<(u32, u32)>>,
    counters: Counters,
}

/// murmur3's 64-bit finaliser: a bijection with full avalanche.
#[inline]
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Hash of a key. Keys are usually MD5 output, but callers may pass structured keys (counters,
/// zero-padded ids), so all 16 bytes are mixed; the per-window random seed keeps crafted keys
/// from piling into one probe sequence.
#[inline]
fn key_hash(seed: u64, key: &Key) -> u64 {
    let (lo, hi) = key.split_at(8);
    let lo = <[u8; 8]>::try_from(lo).map_or(0, u64::from_le_bytes);
    let hi = <[u8; 8]>::try_from(hi).map_or(0, u64::from_le_bytes);
    fmix64(fmix64(lo ^ seed) ^ hi)
}

/// Take the entry whose slot satisfies `eq` out of `index` (slots of `ring`); whether there was
/// one.
fn unindex(
    index: &mut SlotIndex,
    ring: &[Record],
    seed: u64,
    h: u64,
    eq: impl FnMut(u32) -> bool,
) -> bool {
    let hash_of = |s: u32| ring.get(s as usize).map_or(0, |r| key_hash(seed, &r.key));
    match index.find(h, eq, &hash_of) {
        Some(pos) => {
            index.remove_at(pos, &hash_of);
            true
        }
        None => false,
    }
}

/// Add a pending record (its entry id, and its position in the pending slab) to its segment's
/// order queue, which stays sorted by entry id.
fn push_ordered(order: &mut VecDeque<(u32, u32)>, entry_id: u32, at: u32) {
    match order.back() {
        Some(&(last, _)) if last >= entry_id => {
            // Out of order (never from the writer): keep the queue sorted by entry id.
            let i = order.partition_point(|&(e, _)| e <= entry_id);
            order.insert(i, (entry_id, at));
        }
        _ => order.push_back((entry_id, at)),
    }
}

fn random_seed() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64)
}

/// Age of an entry at `now`, without overflow for any pair of i64 timestamps.
#[inline]
fn age(now_ms: i64, ts_ms: i64) -> i128 {
    i128::from(now_ms) - i128::from(ts_ms)
}

impl Window {
    /// A window for at most `max_keys` committed keys (1..=[`MAX_KEYS_LIMIT`]) and `window_ms`
    /// (>= 1). The ring and the index are reserved for `max_keys` now (address space: pages are
    /// touched as records land and as the index grows), so an impossible size fails here; the
    /// index grows with the keys, so a window far from full costs, and copies
    /// ([`Window::clone_committed`]), what it holds.
    pub fn new(max_keys: usize, window_ms: i64) -> Result<Self, TryReserveError> {
        Self::with_seed(max_keys, window_ms, random_seed())
    }

    fn with_seed(max_keys: usize, window_ms: i64, seed: u64) -> Result<Self, TryReserveError> {
        debug_assert!(max_keys >= 1 && max_keys as u64 <= MAX_KEYS_LIMIT && window_ms >= 1);
        let mut ring = Vec::new();
        ring.try_reserve_exact(max_keys)?;
        let mut index = SlotIndex::new(max_keys);
        index.reserve_address_space()?;
        Ok(Self {
            max_keys,
            window_ms,
            seed,
            ring,
            head: 0,
            len: 0,
            popped: 0,
            index,
            dead: 0,
            pending: Pending::default(),
            pending_order: HashMap::new(),
            counters: Counters::default(),
        })
    }

    pub fn max_keys(&self) -> usize {
        self.max_keys
    }
    pub fn window_ms(&self) -> i64 {
        self.window_ms
    }
    pub fn committed_count(&self) -> usize {
        self.len - self.dead
    }
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Heap bytes owned: ring capacity, the index's table in use, pending table and pending order
    /// allocations.
    pub fn memory_bytes(&self) -> usize {
        self.ring.capacity() * std::mem::size_of::<Record>()
            + self.index.allocation_size()
            + self.pending.allocation_size()
            + self
                .pending_order
                .values()
                .map(|q| q.capacity() * std::mem::size_of::<(u32, u32)>())
                .sum::<usize>()
    }

    #[inline]
    fn slot(&self, nth: usize) -> usize {
        let s = self.head + nth;
        if s >= self.max_keys {
            s - self.max_keys
        } else {
            s
        }
    }

    #[inline]
    fn find_committed(&self, key: &Key, hash: u64) -> Option<&Record> {
        let ring = &self.ring;
        let seed = self.seed;
        let hash_of = |s: u32| ring.get(s as usize).map_or(0, |r| key_hash(seed, &r.key));
        self.index
            .find(
                hash,
                |s| ring.get(s as usize).is_some_and(|r| r.key == *key),
                &hash_of,
            )
            .and_then(|pos| ring.get(self.index.slot_at(pos) as usize))
    }

    #[inline]
    fn find_pending(&self, key: &Key, hash: u64) -> Option<&Record> {
        let seed = self.seed;
        self.pending.find(key, hash, |k| key_hash(seed, k))
    }

    /// Uncounted lookup. With `now_ms`, a committed entry at least `window_ms` old is absent.
    #[inline]
    pub fn peek(&self, key: &Key, now_ms: Option<i64>) -> Lookup {
        self.peek_hashed(key, key_hash(self.seed, key), now_ms)
    }

    #[inline]
    fn peek_hashed(&self, key: &Key, h: u64, now_ms: Option<i64>) -> Lookup {
        if let Some(r) = self.find_committed(key, h) {
            return match now_ms {
                Some(now) if age(now, r.timestamp_ms) >= i128::from(self.window_ms) => {
                    Lookup::Absent
                }
                _ => Lookup::Committed(*r),
            };
        }
        match self.find_pending(key, h) {
            Some(r) => Lookup::Pending(*r),
            None => Lookup::Absent,
        }
    }

    /// The hashes of a batch's `keys` (N*16 bytes), with the index cells of the first few asked
    /// for: a batch pass then asks for those of the key [`PREFETCH_AHEAD`] ahead of each one it
    /// works on ([`Window::prefetch_ahead`]), so their cache misses overlap.
    fn prefetched_hashes(&self, keys: &[u8]) -> Vec<u64> {
        let seed = self.seed;
        let hashes: Vec<u64> = keys
            .chunks_exact(KEY_LEN)
            .map(|k| key_hash(seed, &<Key>::try_from(k).unwrap_or_default()))
            .collect();
        for &h in hashes.iter().take(PREFETCH_AHEAD) {
            self.index.prefetch(h);
            self.pending.prefetch(h);
        }
        hashes
    }

    #[inline]
    fn prefetch_ahead(&self, hashes: &[u64], i: usize) {
        if let Some(&ahead) = hashes.get(i + PREFETCH_AHEAD) {
            self.index.prefetch(ahead);
            self.pending.prefetch(ahead);
        }
    }

    /// Counted lookup: pending and committed entries are hits, anything else a miss.
    pub fn get(&mut self, key: &Key, now_ms: Option<i64>) -> Lookup {
        let found = self.peek(key, now_ms);
        if found == Lookup::Absent {
            self.counters.misses += 1;
        } else {
            self.counters.hits += 1;
        }
        found
    }

    /// Register an in-flight write. The key must not be pending, nor committed within the window
    /// as seen from `rec.timestamp_ms` (an expired committed record of it is replaced).
    pub fn add_pending(&mut self, rec: Record) -> Result<(), WindowError> {
        let h = key_hash(self.seed, &rec.key);
        if self.find_pending(&rec.key, h).is_some() {
            return Err(WindowError::KeyPresent);
        }
        if let Some(old) = self.find_committed(&rec.key, h) {
            if age(rec.timestamp_ms, old.timestamp_ms) < i128::from(self.window_ms) {
                return Err(WindowError::KeyPresent);
            }
            self.kill(&rec.key, h);
        }
        self.insert_pending(rec, h);
        Ok(())
    }

    /// Insert a key known to be neither pending nor committed (live) under hash `h`.
    fn insert_pending(&mut self, rec: Record, h: u64) {
        let seed = self.seed;
        let at = self.pending.insert(rec, h, |k| key_hash(seed, k));
        push_ordered(
            self.pending_order.entry(rec.segment_id).or_default(),
            rec.entry_id,
            at,
        );
    }

    /// Commit the pending keys of `segment_id` whose entry ids are at most `last_entry_id`, in
    /// entry order: a quorum ack commits a prefix of a segment, so the writer names the position
    /// instead of handing every key back. Returns how many were committed.
    pub fn commit_through(&mut self, segment_id: u32, last_entry_id: u32) -> usize {
        self.take_through(segment_id, Some(last_entry_id), true)
    }

    /// Forget every pending key of `segment_id` (the segment was completed without them).
    /// Returns how many there were.
    pub fn drop_segment(&mut self, segment_id: u32) -> usize {
        self.take_through(segment_id, None, false)
    }

    fn take_through(&mut self, segment_id: u32, last: Option<u32>, commit: bool) -> usize {
        let Some(mut order) = self.pending_order.remove(&segment_id) else {
            return 0;
        };
        let mut n = 0;
        let seed = self.seed;
        for &(_, at) in order.iter().take(PREFETCH_AHEAD) {
            self.prefetch_pending(at, commit);
        }
        while let Some(&(entry_id, at)) = order.front() {
            if last.is_some_and(|last| entry_id > last) {
                break;
            }
            if let Some(&(_, ahead)) = order.get(PREFETCH_AHEAD) {
                self.prefetch_pending(ahead, commit);
            }
            order.pop_front();
            // The queue holds exactly the segment's pending keys (take_pending keeps it so).
            if let Some((rec, h)) = self.pending.take_at(at, |k| key_hash(seed, k)) {
                debug_assert!(rec.segment_id == segment_id && rec.entry_id == entry_id);
                if commit {
                    self.push_committed(rec, h);
                }
                n += 1;
            }
        }
        if !order.is_empty() {
            self.pending_order.insert(segment_id, order);
        }
        self.pending.release_if_drained();
        n
    }

    /// Start loading the index cells that taking the pending record at slab position `at` out
    /// (and, with `commit`, indexing it as committed) will walk: see [`PREFETCH_AHEAD`].
    #[inline]
    fn prefetch_pending(&self, at: u32, commit: bool) {
        if let Some(rec) = self.pending.record_at(at) {
            let h = key_hash(self.seed, &rec.key);
            self.pending.prefetch(h);
            if commit {
                self.index.prefetch(h);
            }
        }
    }

    fn take_pending(&mut self, key: &Key, h: u64) -> Option<Record> {
        let seed = self.seed;
        let (at, rec) = self.pending.remove(key, h, |k| key_hash(seed, k))?;
        // Usually at the front (keys go in entry order); anywhere else costs a shift, which only
        // API callers taking keys one by one pay, never the writer.
        if let Some(order) = self.pending_order.get_mut(&rec.segment_id) {
            let from = order.partition_point(|&(e, _)| e < rec.entry_id);
            let at = (from..order.len())
                .take_while(|&i| order[i].0 == rec.entry_id)
                .find(|&i| order[i].1 == at);
            if let Some(at) = at {
                order.remove(at);
            }
            if order.is_empty() {
                self.pending_order.remove(&rec.segment_id);
            }
        }
        self.pending.release_if_drained();
        Some(rec)
    }

    /// Move a pending key to the newest end of the commit order; false if it is not pending.
    pub fn commit(&mut self, key: &Key) -> bool {
        let h = key_hash(self.seed, key);
        match self.take_pending(key, h) {
            Some(rec) => {
                self.push_committed(rec, h);
                true
            }
            None => false,
        }
    }

    /// Forget a pending key (its write failed); false if it is not pending.
    pub fn drop_pending(&mut self, key: &Key) -> bool {
        let h = key_hash(self.seed, key);
        self.take_pending(key, h).is_some()
    }

    /// Recovery insert at the newest end. The later log position wins: an existing committed
    /// record at the same or a later (segment, entry) is kept (returns false); one at an earlier
    /// position is replaced. A pending entry is replaced by the given ids and becomes committed.
    pub fn add_committed(&mut self, rec: Record) -> bool {
        self.add_committed_hashed(rec, key_hash(self.seed, &rec.key))
    }

    /// [`Window::add_committed`] of `rec`, whose key hashes to `h`.
    fn add_committed_hashed(&mut self, rec: Record, h: u64) -> bool {
        if self.len < self.max_keys && self.pending.is_empty() && self.index.growth().is_none() {
            // A bulk load's common case (no eviction, nothing pending, no growth): look the key
            // up and index it at the next ring slot in one walk of the index.
            let slot = self.slot(self.len);
            let ring = &self.ring;
            let seed = self.seed;
            let hash_of = |s: u32| ring.get(s as usize).map_or(0, |r| key_hash(seed, &r.key));
            let eq = |s: u32| ring.get(s as usize).is_some_and(|r| r.key == rec.key);
            // max_keys <= u32::MAX, so every slot number fits.
            match self.index.find_or_insert(h, eq, slot as u32, &hash_of) {
                None => {
                    match self.ring.get_mut(slot) {
                        Some(dst) => *dst = rec,
                        None => self.ring.push(rec),
                    }
                    self.len += 1;
                    return true;
                }
                Some(pos) => {
                    let old = self.ring.get(self.index.slot_at(pos) as usize);
                    if old.is_some_and(|old| {
                        (rec.segment_id, rec.entry_id) <= (old.segment_id, old.entry_id)
                    }) {
                        return false;
                    }
                    // a newer occurrence: replaced below
                }
            }
        }
        if let Some(old) = self.find_committed(&rec.key, h) {
            if (rec.segment_id, rec.entry_id) <= (old.segment_id, old.entry_id) {
                return false;
            }
            self.kill(&rec.key, h);
        }
        if !self.pending.is_empty() {
            self.take_pending(&rec.key, h);
        }
        self.push_committed(rec, h);
        true
    }

    /// Take a committed key out of the index; its ring slot becomes dead.
    fn kill(&mut self, key: &Key, h: u64) {
        let ring = &self.ring;
        let found = unindex(&mut self.index, ring, self.seed, h, |s| {
            ring.get(s as usize).is_some_and(|r| r.key == *key)
        });
        if found {
            self.dead += 1;
        }
    }

    /// Whether the index points at `slot` (holding `rec`).
    fn is_live(&self, slot: usize, rec: &Record) -> bool {
        let h = key_hash(self.seed, &rec.key);
        let ring = &self.ring;
        let seed = self.seed;
        let hash_of = |s: u32| ring.get(s as usize).map_or(0, |r| key_hash(seed, &r.key));
        self.index
            .find(h, |s| s as usize == slot, &hash_of)
            .is_some()
    }

    /// Append a record known to be absent, evicting the oldest when the ring is full.
    fn push_committed(&mut self, rec: Record, h: u64) {
        if self.len == self.max_keys {
            if let Some((old, true)) = self.pop_oldest() {
                if age(rec.timestamp_ms, old.timestamp_ms) < i128::from(self.window_ms) {
                    self.counters.early_evictions += 1;
                }
            }
        }
        let slot = self.slot(self.len);
        // Slots are written in order 0, 1, .. until the ring wraps, so `slot` is either an
        // existing element or exactly the next one to push.
        match self.ring.get_mut(slot) {
            Some(dst) => *dst = rec,
            None => self.ring.push(rec),
        }
        self.len += 1;
        let ring = &self.ring;
        let seed = self.seed;
        let hash_of = |s: u32| ring.get(s as usize).map_or(0, |r| key_hash(seed, &r.key));
        if self.dead == 0 {
            if let Some(cells) = self.index.growth() {
                // every older slot is indexed: rehash them in ring order (sequential reads)
                let (head, max_keys) = (self.head, self.max_keys);
                let indexed = (0..self.len - 1).map(|nth| {
                    let s = if head + nth >= max_keys {
                        head + nth - max_keys
                    } else {
                        head + nth
                    };
                    (s as u32, hash_of(s as u32))
                });
                self.index.rebuild(cells, indexed, &hash_of);
            }
        }
        // max_keys <= u32::MAX, so every slot number fits.
        self.index.insert(h, slot as u32, &hash_of);
    }

    /// The oldest committed record.
    fn oldest(&self) -> Option<Record> {
        if self.len == 0 {
            None
        } else {
            self.ring.get(self.head).copied()
        }
    }

    /// Remove the oldest slot: (record, true) for a live one (counted as an eviction),
    /// (record, false) for a dead one.
    fn pop_oldest(&mut self) -> Option<(Record, bool)> {
        if self.len == 0 {
            return None;
        }
        let slot = self.head;
        let rec = *self.ring.get(slot)?;
        let h = key_hash(self.seed, &rec.key);
        let live = unindex(&mut self.index, &self.ring, self.seed, h, |s| {
            s as usize == slot
        });
        self.head = self.slot(1);
        self.len -= 1;
        self.popped += 1;
        if live {
            self.counters.evictions += 1;
        } else {
            self.dead -= 1;
        }
        Some((rec, live))
    }

    /// Evict committed keys from the oldest end while they are at least `window_ms` old (dead
    /// slots met on the way are dropped and not counted).
    pub fn evict(&mut self, now_ms: i64) -> usize {
        let mut n = 0;
        while let Some(rec) = self.oldest() {
            let dead = self.dead > 0 && !self.is_live(self.head, &rec);
            if !dead && age(now_ms, rec.timestamp_ms) < i128::from(self.window_ms) {
                break;
            }
            self.pop_oldest();
            n += usize::from(!dead);
        }
        n
    }

    /// Committed records in commit order as two slices (oldest part first), like `VecDeque`.
    fn committed_slices(&self) -> (&[Record], &[Record]) {
        let end = self.head + self.len;
        if end <= self.ring.len() {
            (self.ring.get(self.head..end).unwrap_or_default(), &[])
        } else {
            let wrapped = end - self.max_keys;
            (
                self.ring.get(self.head..).unwrap_or_default(),
                self.ring.get(..wrapped).unwrap_or_default(),
            )
        }
    }

    /// Live committed records in commit order, oldest first.
    pub fn committed_iter(&self) -> impl Iterator<Item = &Record> + '_ {
        let (a, b) = self.committed_slices();
        let check = self.dead > 0;
        a.iter()
            .chain(b)
            .enumerate()
            .filter(move |(i, r)| !check || self.is_live(self.slot(*i), r))
            .map(|(_, r)| r)
    }

    /// The logical positions of the committed records held: `[oldest, end)` (see `popped`).
    /// Dead slots count: they hold positions until they leave the oldest end.
    pub fn positions(&self) -> (u64, u64) {
        (self.popped, self.popped + self.len as u64)
    }

    /// Live committed records whose positions lie in `[from, end)`, in commit order, with their
    /// positions. Positions below the oldest held (evicted since `from` was taken) are skipped,
    /// as are dead slots (as [`Window::committed_iter`] skips them). A snapshot reads the window
    /// in chunks this way, `end` fixed when it started; see `crate::snapshot`.
    pub fn committed_between(
        &self,
        from: u64,
        end: u64,
    ) -> impl Iterator<Item = (u64, &Record)> + '_ {
        let (oldest, newest) = self.positions();
        let lo = from.clamp(oldest, newest);
        let hi = end.clamp(lo, newest);
        // Both are within [oldest, oldest + len], so the offsets fit usize.
        let (first, last) = ((lo - oldest) as usize, (hi - oldest) as usize);
        let check = self.dead > 0;
        (first..last).filter_map(move |nth| {
            let slot = self.slot(nth);
            let rec = self.ring.get(slot)?;
            if check && !self.is_live(slot, rec) {
                return None;
            }
            Some((oldest + nth as u64, rec))
        })
    }

    /// Same config and committed entries in the same order; no pending, zero counters. Copies the
    /// ring's records and the index as they are (no rehashing): O(keys held), whatever
    /// `max_keys` is. The copy's ring is not reserved for `max_keys` (it grows if written to).
    pub fn clone_committed(&self) -> Result<Self, TryReserveError> {
        let mut ring = Vec::new();
        ring.try_reserve_exact(self.ring.len())?;
        ring.extend_from_slice(&self.ring);
        Ok(Self {
            max_keys: self.max_keys,
            window_ms: self.window_ms,
            seed: self.seed,
            ring,
            head: self.head,
            len: self.len,
            popped: self.popped,
            index: self.index.clone(),
            dead: self.dead,
            pending: Pending::default(),
            pending_order: HashMap::new(),
            counters: Counters::default(),
        })
    }

    /// Batch lookup of `keys` (N*16 bytes). Writes N status bytes and N little-endian i64 segment
    /// and entry ids (-1 where absent) and counts hits and misses. Large batches are split over
    /// threads; the lookups only read the window.
    pub fn get_many(&mut self, keys: &[u8], now_ms: Option<i64>) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let n = keys.len() / KEY_LEN;
        let mut status = vec![0u8; n];
        let mut segs = vec![0u8; n * 8];
        let mut ents = vec![0u8; n * 8];
        let threads = crate::keys::parallelism();
        let hits = if threads < 2 || n < GET_MANY_PARALLEL_MIN {
            self.lookup_into(keys, now_ms, &mut status, &mut segs, &mut ents)
        } else {
            let per = n.div_ceil(threads);
            let this = &*self;
            std::thread::scope(|s| {
                let mut parts = keys
                    .chunks(per * KEY_LEN)
                    .zip(status.chunks_mut(per))
                    .zip(segs.chunks_mut(per * 8).zip(ents.chunks_mut(per * 8)));
                let first = parts.next();
                let handles: Vec<_> = parts
                    .map(|((k, st), (sg, en))| {
                        s.spawn(move || this.lookup_into(k, now_ms, st, sg, en))
                    })
                    .collect();
                let mut hits = first.map_or(0, |((k, st), (sg, en))| {
                    this.lookup_into(k, now_ms, st, sg, en)
                });
                for h in handles {
                    // A lookup cannot panic; if a thread somehow did, re-raise it here.
                    hits += h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
                }
                hits
            })
        };
        self.counters.hits += hits as u64;
        self.counters.misses += (n - hits) as u64;
        (status, segs, ents)
    }

    fn lookup_into(
        &self,
        keys: &[u8],
        now_ms: Option<i64>,
        status: &mut [u8],
        segs: &mut [u8],
        ents: &mut [u8],
    ) -> usize {
        let mut hits = 0;
        let hashes = self.prefetched_hashes(keys);
        let rows = keys
            .chunks_exact(KEY_LEN)
            .zip(status.iter_mut())
            .zip(segs.chunks_exact_mut(8).zip(ents.chunks_exact_mut(8)));
        for (i, ((k, st), (sg, en))) in rows.enumerate() {
            let key = <Key>::try_from(k).unwrap_or_default();
            self.prefetch_ahead(&hashes, i);
            let h = hashes.get(i).copied().unwrap_or_default();
            let (code, seg, ent) = match self.peek_hashed(&key, h, now_ms) {
                Lookup::Absent => (ABSENT, -1i64, -1i64),
                Lookup::Pending(r) => (PENDING, i64::from(r.segment_id), i64::from(r.entry_id)),
                Lookup::Committed(r) => (COMMITTED, i64::from(r.segment_id), i64::from(r.entry_id)),
            };
            hits += usize::from(code != ABSENT);
            *st = code;
            sg.copy_from_slice(&seg.to_le_bytes());
            en.copy_from_slice(&ent.to_le_bytes());
        }
        hits
    }

    /// The intake of a batch of writes, row by row in order, each row as of its own timestamp.
    /// A key committed within its window ([`COMMITTED`]) or in flight ([`PENDING`], including a
    /// repeat of an earlier row) reports the ids it holds; any other key becomes pending at the
    /// next entry id of `segment_id`, counting up from `first_entry_id` ([`ABSENT`]: new here).
    /// Returns the status and ids like [`Window::get_many`].
    /// The caller keeps `first_entry_id + rows` within `u32`.
    pub fn reserve_many(
        &mut self,
        keys: &[u8],
        timestamps_ms: &[i64],
        segment_id: u32,
        first_entry_id: u32,
    ) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let n = keys.len() / KEY_LEN;
        let mut status = vec![0u8; n];
        let mut segs = vec![0u8; n * 8];
        let mut ents = vec![0u8; n * 8];
        let mut next = first_entry_id;
        // The segment's order queue, looked up once for the batch (not once per key).
        let mut order = self.pending_order.remove(&segment_id).unwrap_or_default();
        let seed = self.seed;
        let hashes = self.prefetched_hashes(keys);
        let rows = keys
            .chunks_exact(KEY_LEN)
            .zip(timestamps_ms)
            .zip(status.iter_mut())
            .zip(segs.chunks_exact_mut(8).zip(ents.chunks_exact_mut(8)));
        for (i, (((k, &ts), st), (sg, en))) in rows.enumerate() {
            let key = <Key>::try_from(k).unwrap_or_default();
            self.prefetch_ahead(&hashes, i);
            // `get` then `add_pending`, with one probe of each table instead of two.
            let h = hashes.get(i).copied().unwrap_or_default();
            let mut expired = false;
            let committed = match self.find_committed(&key, h) {
                Some(r) if age(ts, r.timestamp_ms) < i128::from(self.window_ms) => Some(*r),
                found => {
                    expired = found.is_some();
                    None
                }
            };
            let (code, rec) = if let Some(r) = committed {
                self.counters.hits += 1;
                (COMMITTED, r)
            } else {
                let rec = Record {
                    key,
                    segment_id,
                    entry_id: next,
                    timestamp_ms: ts,
                };
                // pending already, or pending now: one walk of the pending index
                match self.pending.find_or_insert(rec, h, |k| key_hash(seed, k)) {
                    Reserved::Held(held) => {
                        self.counters.hits += 1;
                        (PENDING, held)
                    }
                    Reserved::Added(at) => {
                        self.counters.misses += 1;
                        if expired {
                            self.kill(&key, h); // the new write replaces its expired record
                        }
                        push_ordered(&mut order, rec.entry_id, at);
                        next = next.wrapping_add(1);
                        (ABSENT, rec)
                    }
                }
            };
            *st = code;
            sg.copy_from_slice(&i64::from(rec.segment_id).to_le_bytes());
            en.copy_from_slice(&i64::from(rec.entry_id).to_le_bytes());
        }
        if !order.is_empty() {
            self.pending_order.insert(segment_id, order);
        }
        (status, segs, ents)
    }

    /// Recovery insert of many records in order; returns how many were inserted.
    pub fn add_committed_many(&mut self, recs: impl IntoIterator<Item = Record>) -> usize {
        let mut recs = recs.into_iter();
        self.reserve_committed(recs.size_hint().0);
        let seed = self.seed;
        let mut n = 0;
        let mut batch: Vec<(Record, u64)> = Vec::with_capacity(BULK_CHUNK);
        loop {
            // hashed a chunk at a time, so the index cells of the keys ahead can be asked for
            batch.clear();
            batch.extend(
                recs.by_ref()
                    .take(BULK_CHUNK)
                    .map(|r| (r, key_hash(seed, &r.key))),
            );
            if batch.is_empty() {
                return n;
            }
            for &(_, h) in batch.iter().take(PREFETCH_AHEAD) {
                self.index.prefetch(h);
            }
            for (i, &(rec, h)) in batch.iter().enumerate() {
                if let Some(&(_, ahead)) = batch.get(i + PREFETCH_AHEAD) {
                    self.index.prefetch(ahead);
                }
                n += usize::from(self.add_committed_hashed(rec, h));
            }
        }
    }

    /// Load `recs` (commit order) into this new window as committed, in bulk: the records are
    /// copied into the ring as they are, and the index is built in hash order
    /// ([`SlotIndex::fill`]), which at ten million keys costs 0.6-0.7x the CPU of an insert a key
    /// (each a cache miss in the index and one in the ring). The same window results as from
    /// [`Window::add_committed_many`]. None, with nothing changed, where that is not so or not
    /// worth it: a window already used, records beyond `max_keys`, too few to gain, or a key
    /// given twice (the one-at-a-time path keeps the newer occurrence).
    pub fn load_committed(&mut self, recs: &[Record]) -> Option<usize> {
        let hashed = self.bulk_order(recs, BULK_LOAD_MIN)?;
        self.ring.extend_from_slice(recs);
        Some(self.bulk_index(&hashed))
    }

    /// [`Window::load_committed`] of records handed over: they become the ring (grown in place
    /// to `max_keys`), so they are neither copied nor is the ring's memory touched a second
    /// time (at ten million keys a third of the load was the copy and the page faults of the
    /// ring it filled); from [`BULK_ADOPT_MIN`] records on. `Err(recs)`, with nothing changed,
    /// where it does not apply (as `load_committed`).
    pub fn adopt_committed(&mut self, mut recs: Vec<Record>) -> Result<usize, Vec<Record>> {
        let Some(hashed) = self.bulk_order(&recs, BULK_ADOPT_MIN) else {
            return Err(recs);
        };
        let room = self.max_keys.saturating_sub(recs.len());
        if recs.try_reserve_exact(room).is_err() {
            return Err(recs);
        }
        self.ring = recs; // the new window's ring held nothing: its reservation is released
        Ok(self.bulk_index(&hashed))
    }

    /// The bulk load's (hash, ring slot) of each of `recs`, sorted by home; None where a bulk
    /// load does not apply (see [`Window::load_committed`]; fewer than `min` records).
    fn bulk_order(&self, recs: &[Record], min: usize) -> Option<Vec<(u64, u32)>> {
        let n = recs.len();
        let fresh = self.ring.is_empty() && self.len == 0 && self.pending.is_empty();
        if !fresh || n > self.max_keys || n < min {
            return None;
        }
        let seed = self.seed;
        // max_keys <= u32::MAX, so every slot number fits.
        let mut hashed: Vec<(u64, u32)> = recs
            .iter()
            .enumerate()
            .map(|(slot, r)| (key_hash(seed, &r.key), slot as u32))
            .collect();
        sort_by_home(&mut hashed);
        let key = |slot: u32| recs.get(slot as usize).map(|r| r.key);
        if hashed
            .windows(2)
            .any(|w| matches!(w, [a, b] if a.0 == b.0 && key(a.1) == key(b.1)))
        {
            return None;
        }
        Some(hashed)
    }

    /// Index the ring's records, now in place, from their `bulk_order`.
    fn bulk_index(&mut self, hashed: &[(u64, u32)]) -> usize {
        self.len = hashed.len();
        let ring = &self.ring;
        let seed = self.seed;
        let hash_of = |s: u32| ring.get(s as usize).map_or(0, |r| key_hash(seed, &r.key));
        self.index.fill(hashed, &hash_of);
        self.len
    }

    /// Room in the index for `additional` more committed keys (`max_keys` in all at most), so a
    /// bulk load (recovery) rehashes once, not at every doubling of a growing index.
    pub fn reserve_committed(&mut self, additional: usize) {
        let want = self.max_keys.min(self.len.saturating_add(additional));
        let ring = &self.ring;
        let seed = self.seed;
        // Only a speed-up: if the memory is not there, inserts grow the index as they go.
        let _ = self
            .index
            .try_reserve(want.saturating_sub(self.index.len()), &|s: u32| {
                ring.get(s as usize).map_or(0, |r| key_hash(seed, &r.key))
            });
    }
}

/// How many keys ahead of the one it works on a batch pass asks for index cells
/// ([`SlotIndex::prefetch`]): enough for their cache misses to overlap (a miss costs about as
/// much as the work on several keys), few enough that the cells are still cached when reached.
const PREFETCH_AHEAD: usize = 8;

/// Records hashed ahead at a time by [`Window::add_committed_many`] (32 KiB of them).
const BULK_CHUNK: usize = 1024;

/// Fewer records than this are copied in one at a time ([`Window::load_committed`]): until the
/// index and the ring outgrow the caches an insert a key (with prefetching) costs no more than the
/// bulk path's sort and copy. CPU time of a snapshot's load, one at a time / in bulk: 1M keys
/// 0.065 / 0.075 s, 4M 0.33-0.40 / 0.35-0.39 s, 7M 0.71-0.74 / 0.63-0.73 s, 10M 1.18-1.58 /
/// 0.82-0.99 s. Unit tests use a smaller one.
const BULK_LOAD_MIN: usize = if cfg!(test) { 50_000 } else { 8 << 20 };

/// [`BULK_LOAD_MIN`] for records handed over ([`Window::adopt_committed`]), which saves the bulk
/// path its copy: one at a time / handed over in bulk, CPU time, 300k keys 0.007 / 0.015 s, 1M
/// 0.050-0.053 / 0.046-0.048 s, 3M 0.177-0.188 / 0.146-0.161 s.
const BULK_ADOPT_MIN: usize = if cfg!(test) { 50_000 } else { 1_000_000 };

/// Batches at least this long are looked up on several threads.
pub const GET_MANY_PARALLEL_MIN: usize = 65_536;

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u64) -> Key {
        let mut key = [0u8; 16];
        key[8..].copy_from_slice(&i.to_be_bytes());
        key
    }

    fn rec(i: u64, ts: i64) -> Record {
        Record {
            key: k(i),
            segment_id: (i / 10) as u32,
            entry_id: i as u32,
            timestamp_ms: ts,
        }
    }

    fn order(w: &Window) -> Vec<u32> {
        w.committed_iter().map(|r| r.entry_id).collect()
    }

    /// Keys far apart in the hash space, and many sharing their top bits (a mix like a real one).
    fn spread(n: u64) -> Vec<Record> {
        (0..n)
            .map(|i| Record {
                key: k(i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i << 7)),
                segment_id: (i / 1000) as u32,
                entry_id: (i % 1000) as u32,
                timestamp_ms: 1_000 + i as i64,
            })
            .collect()
    }

    #[test]
    fn a_bulk_load_makes_the_window_one_at_a_time_would() {
        let recs = spread(120_000);
        let mut bulk = Window::new(200_000, 10_000_000).unwrap();
        let mut one = Window::new(200_000, 10_000_000).unwrap();
        assert_eq!(bulk.load_committed(&recs), Some(recs.len()));
        assert_eq!(one.add_committed_many(recs.iter().copied()), recs.len());
        let listed = |w: &Window| w.committed_iter().copied().collect::<Vec<_>>();
        assert_eq!(listed(&bulk), listed(&one));
        assert_eq!(bulk.committed_count(), one.committed_count());
        for r in &recs {
            assert_eq!(bulk.get(&r.key, None), Lookup::Committed(*r));
        }
        assert_eq!(bulk.get(&k(u64::MAX), None), Lookup::Absent);
        // and it goes on as a window: a newer occurrence replaces, eviction by capacity works
        let newer = Record {
            segment_id: 999,
            ..recs[7]
        };
        assert!(bulk.add_committed(newer));
        assert_eq!(bulk.get(&recs[7].key, None), Lookup::Committed(newer));
        for (i, r) in spread(200_000).iter().enumerate().skip(120_000) {
            let r = Record {
                segment_id: 5_000 + i as u32,
                ..*r
            };
            assert!(bulk.add_committed(r));
        }
        assert_eq!(bulk.get(&recs[0].key, None), Lookup::Absent); // evicted, oldest first
    }

    #[test]
    fn a_bulk_load_leaves_what_it_cannot_do_to_the_caller() {
        let mut recs = spread(60_000);
        let mut w = Window::new(100_000, 10_000_000).unwrap();
        recs[50_000].key = recs[10].key; // a key given twice
        assert_eq!(w.load_committed(&recs), None);
        assert_eq!(w.committed_count(), 0);
        recs[50_000].key = k(u64::MAX - 1);
        assert_eq!(w.load_committed(&recs[..100]), None); // too few to gain
        assert_eq!(Window::new(50_000, 1).unwrap().load_committed(&recs), None); // > max_keys
        assert_eq!(w.load_committed(&recs), Some(recs.len()));
        assert_eq!(w.load_committed(&recs), None); // not a new window any more
    }

    #[test]
    fn records_handed_over_make_the_window_a_copy_would_and_become_its_ring() {
        let recs = spread(120_000);
        let mut adopted = Window::new(200_000, 10_000_000).unwrap();
        let mut copied = Window::new(200_000, 10_000_000).unwrap();
        assert_eq!(adopted.adopt_committed(recs.clone()), Ok(recs.len()));
        assert_eq!(copied.load_committed(&recs), Some(recs.len()));
        assert!(adopted.ring.capacity() >= 200_000); // the records, with room for max_keys
        let listed = |w: &Window| w.committed_iter().copied().collect::<Vec<_>>();
        assert_eq!(listed(&adopted), listed(&copied));
        assert_eq!(adopted.committed_count(), recs.len());
        for r in &recs {
            assert_eq!(adopted.peek(&r.key, None), Lookup::Committed(*r));
        }
        // both go on as windows alike: past max_keys, eviction in commit order
        for (i, r) in spread(230_000).iter().enumerate().skip(120_000) {
            let r = Record {
                segment_id: 5_000 + i as u32,
                ..*r
            };
            assert_eq!(adopted.add_committed(r), copied.add_committed(r));
        }
        assert_eq!(listed(&adopted), listed(&copied));
        assert_eq!(adopted.counters(), copied.counters());
        assert_eq!(adopted.get(&recs[0].key, None), Lookup::Absent);
    }

    #[test]
    fn records_a_bulk_load_cannot_take_are_given_back_untouched() {
        let mut recs = spread(60_000);
        recs[50_000].key = recs[10].key; // a key given twice
        let mut w = Window::new(100_000, 10_000_000).unwrap();
        assert_eq!(w.adopt_committed(recs.clone()), Err(recs.clone()));
        assert_eq!((w.committed_count(), w.ring.len()), (0, 0));
        recs[50_000].key = k(u64::MAX - 1);
        let small = Window::new(50_000, 1)
            .unwrap()
            .adopt_committed(recs.clone());
        assert_eq!(small, Err(recs.clone())); // > max_keys
        assert_eq!(w.adopt_committed(recs.clone()), Ok(recs.len()));
        assert_eq!(w.adopt_committed(recs.clone()), Err(recs)); // not a new window any more
    }

    #[test]
    fn sort_by_home_orders_hashes_and_puts_equal_ones_together() {
        let mut v: Vec<(u64, u32)> = (0..50_000u64)
            .map(|i| (fmix64(i % 20_000) & !0xff | (i & 0x7), i as u32))
            .collect();
        let mut want = v.clone();
        sort_by_home(&mut v);
        want.sort_unstable();
        assert_eq!(v, want);
    }

    #[test]
    fn pending_then_commit() {
        let mut w = Window::new(4, 1000).unwrap();
        w.add_pending(rec(1, 5)).unwrap();
        assert_eq!(w.add_pending(rec(1, 6)), Err(WindowError::KeyPresent));
        assert_eq!(w.get(&k(1), None), Lookup::Pending(rec(1, 5)));
        assert!(w.commit(&k(1)));
        assert!(!w.commit(&k(1)));
        assert_eq!(w.get(&k(1), None), Lookup::Committed(rec(1, 5)));
        assert_eq!(w.add_pending(rec(1, 6)), Err(WindowError::KeyPresent));
        assert_eq!(w.get(&k(2), None), Lookup::Absent);
        assert_eq!(w.counters().hits, 2);
        assert_eq!(w.counters().misses, 1);
        w.add_pending(rec(3, 5)).unwrap();
        assert!(w.drop_pending(&k(3)));
        assert!(!w.drop_pending(&k(3)));
        assert_eq!(w.peek(&k(3), None), Lookup::Absent);
    }

    #[test]
    fn pending_is_never_evicted_and_not_counted() {
        let mut w = Window::new(2, 10).unwrap();
        for i in 100..110 {
            w.add_pending(rec(i, 0)).unwrap();
        }
        for i in 0..50 {
            assert!(w.add_committed(rec(i, 1_000 + i as i64)));
        }
        assert_eq!(w.committed_count(), 2);
        assert_eq!(w.pending_count(), 10);
        w.evict(i64::MAX);
        assert_eq!(w.committed_count(), 0);
        for i in 100..110 {
            assert_eq!(w.peek(&k(i), Some(i64::MAX)), Lookup::Pending(rec(i, 0)));
        }
    }

    #[test]
    fn capacity_eviction_follows_commit_order() {
        let mut w = Window::new(3, 1_000).unwrap();
        for i in [5, 1, 9, 2] {
            w.add_pending(rec(i, 0)).unwrap();
        }
        // Commit in a different order than the pending adds.
        for i in [9, 1, 5] {
            assert!(w.commit(&k(i)));
        }
        assert_eq!(order(&w), vec![9, 1, 5]);
        assert!(w.commit(&k(2)));
        assert_eq!(order(&w), vec![1, 5, 2]);
        assert_eq!(w.peek(&k(9), None), Lookup::Absent);
        assert_eq!(w.counters().evictions, 1);
        assert_eq!(w.counters().early_evictions, 1);
    }

    #[test]
    fn early_eviction_only_within_the_window() {
        let mut w = Window::new(1, 100).unwrap();
        w.add_committed(rec(1, 0));
        w.add_committed(rec(2, 100)); // evicts an entry exactly window_ms old: not early
        w.add_committed(rec(3, 199)); // 99 ms old: early
        let c = w.counters();
        assert_eq!((c.evictions, c.early_evictions), (2, 1));
    }

    #[test]
    fn time_eviction() {
        let mut w = Window::new(10, 100).unwrap();
        for (i, ts) in [(1, 0), (2, 50), (3, 20), (4, 150)] {
            w.add_committed(rec(i, ts));
        }
        assert_eq!(w.peek(&k(1), Some(99)), Lookup::Committed(rec(1, 0)));
        assert_eq!(w.peek(&k(1), Some(100)), Lookup::Absent);
        // Stops at the first entry (in commit order) that is still young.
        assert_eq!(w.evict(149), 1);
        assert_eq!(order(&w), vec![2, 3, 4]);
        assert_eq!(w.evict(i64::MAX), 3);
        assert_eq!(w.evict(i64::MIN), 0);
        assert_eq!(w.counters().evictions, 4);
        assert_eq!(w.counters().early_evictions, 0);
        // Extreme timestamps must not overflow.
        w.add_committed(rec(7, i64::MIN));
        assert_eq!(w.peek(&k(7), Some(i64::MAX)), Lookup::Absent);
        assert_eq!(w.evict(i64::MAX), 1);
    }

    #[test]
    fn add_committed_semantics() {
        let mut w = Window::new(10, 100).unwrap();
        assert!(w.add_committed(rec(1, 0)));
        let mut older = rec(1, 5);
        older.entry_id = 0; // rec(1, 0) sits at (1, 1): an earlier position never replaces it
        assert!(!w.add_committed(older));
        assert_eq!(w.peek(&k(1), None), Lookup::Committed(rec(1, 0)));
        w.add_pending(rec(2, 0)).unwrap();
        let mut upgrade = rec(2, 3);
        upgrade.segment_id = 42;
        assert!(w.add_committed(upgrade));
        assert_eq!(w.pending_count(), 0);
        assert_eq!(w.peek(&k(2), None), Lookup::Committed(upgrade));
        assert_eq!(w.add_committed_many([rec(1, 0), rec(3, 0), rec(3, 0)]), 1);
    }

    #[test]
    fn rewritten_keys_replace_their_old_record() {
        let mut w = Window::new(3, 100).unwrap();
        assert!(w.add_committed(rec(1, 0)));
        assert!(w.add_committed(rec(2, 10)));
        // a later log position of key 1 (recovery meets the rewrite) replaces the old record
        let mut newer = rec(1, 120);
        newer.entry_id = 9;
        assert!(w.add_committed(newer));
        assert_eq!(w.peek(&k(1), None), Lookup::Committed(newer));
        assert_eq!(w.committed_count(), 2);
        assert_eq!(
            w.committed_iter().map(|r| r.key).collect::<Vec<_>>(),
            vec![k(2), k(1)]
        );
        // the dead slot leaves at the oldest end without counting as an eviction
        assert_eq!(w.evict(105), 0);
        assert_eq!(w.evict(115), 1); // key 2
        assert_eq!(w.counters().evictions, 1);
        assert_eq!(w.committed_count(), 1);
        // a write of a key whose committed record expired replaces it as pending
        let mut again = rec(1, 220);
        again.entry_id = 10;
        assert!(w.add_pending(rec(1, 200)).is_err()); // 200 - 120 < 100: still in the window
        w.add_pending(again).unwrap();
        assert_eq!(w.peek(&k(1), None), Lookup::Pending(again));
        assert!(w.commit(&k(1)));
        assert_eq!(w.committed_count(), 1);
        // capacity: dead slots free space first, without early evictions
        for i in 10..13u64 {
            w.add_committed(rec(i, 230));
        }
        assert_eq!(w.committed_count(), 3);
        assert_eq!(w.counters().early_evictions, 1); // key 1 was live and young
    }

    #[test]
    fn ring_wraps_many_times_and_index_stays_consistent() {
        let mut w = Window::new(7, 1_000_000).unwrap();
        for i in 0..1_000u64 {
            w.add_committed(rec(i, i as i64));
            if i % 13 == 0 {
                w.evict(i as i64 - 3 + 1_000_000);
            }
            let live: Vec<u32> = order(&w);
            assert!(live.len() <= 7);
            for e in &live {
                assert!(matches!(
                    w.peek(&k(u64::from(*e)), None),
                    Lookup::Committed(_)
                ));
            }
            if i >= 7 {
                assert_eq!(w.peek(&k(i - 7), None), Lookup::Absent);
            }
        }
        assert!(w.memory_bytes() >= 7 * 32);
    }

    #[test]
    fn clone_committed_copies_order_only() {
        let mut w = Window::new(4, 100).unwrap();
        for i in 0..6 {
            w.add_committed(rec(i, 0));
        }
        w.add_pending(rec(50, 0)).unwrap();
        w.get(&k(1), None);
        let mut c = w.clone_committed().unwrap();
        assert_eq!(order(&c), order(&w));
        assert_eq!(c.pending_count(), 0);
        assert_eq!(c.counters(), Counters::default());
        assert_eq!(c.peek(&k(5), None), Lookup::Committed(rec(5, 0)));
        c.add_committed(rec(9, 0));
        assert_eq!(order(&c), vec![3, 4, 5, 9]);
        assert_eq!(order(&w), vec![2, 3, 4, 5]);
    }

    #[test]
    fn a_bulk_load_sizes_the_index_once_within_max_keys() {
        let mut w = Window::new(1_000, 100).unwrap();
        assert_eq!(w.index.capacity(), 0, "nothing reserved before keys come");
        w.reserve_committed(600);
        let cap = w.index.capacity();
        assert!((600..2_000).contains(&cap), "{cap}");
        for i in 0..600 {
            w.add_committed(rec(i, 0));
        }
        assert_eq!(w.index.capacity(), cap, "no growth within the reservation");
        w.reserve_committed(1_000_000_000); // capped at max_keys
        assert!(w.index.capacity() < 2_000, "{}", w.index.capacity());
        let mut grown = Window::new(1_000, 100).unwrap();
        assert_eq!(grown.add_committed_many((0..600).map(|i| rec(i, 0))), 600);
        assert_eq!(order(&grown), order(&w));
    }

    #[test]
    fn a_replay_in_small_calls_after_a_bulk_load_rehashes_the_index_rarely() {
        // Recovery: a snapshot's keys in one call, then the gap 2,000 keys a call. Each call's
        // reserve grew the index to exactly what it needed, rehashing every key at every call.
        let mut w = Window::new(1_000_000, 100).unwrap();
        assert_eq!(
            w.add_committed_many((0..100_000).map(|i| rec(i, 0))),
            100_000
        );
        let mut sizes = vec![w.index.allocation_size()];
        for call in 0..50u64 {
            let first = 100_000 + call * 2_000;
            assert_eq!(
                w.add_committed_many((first..first + 2_000).map(|i| rec(i, 0))),
                2_000
            );
            if sizes.last() != Some(&w.index.allocation_size()) {
                sizes.push(w.index.allocation_size());
            }
        }
        assert_eq!(sizes.len(), 2, "one growth for the whole gap: {sizes:?}");
        assert_eq!(w.committed_count(), 200_000);
        for i in (0..200_000).step_by(997) {
            assert_eq!(w.peek(&k(i), None), Lookup::Committed(rec(i, 0)));
        }
    }

    #[test]
    fn a_copy_of_a_part_full_window_grows_then_wraps_like_one() {
        let mut w = Window::new(8, 100).unwrap();
        for i in 0..3 {
            w.add_committed(rec(i, 0));
        }
        let mut c = w.clone_committed().unwrap();
        for i in 3..13 {
            c.add_committed(rec(i, 0));
        }
        assert_eq!(order(&c), (5..13).map(|i| i as u32).collect::<Vec<_>>());
        assert_eq!(c.peek(&k(4), None), Lookup::Absent);
        assert_eq!(c.peek(&k(12), None), Lookup::Committed(rec(12, 0)));
        assert_eq!(order(&w), vec![0, 1, 2]);
    }

    fn pending_rec(i: u64, segment_id: u32, entry_id: u32) -> Record {
        Record {
            key: k(i),
            segment_id,
            entry_id,
            timestamp_ms: 5,
        }
    }

    #[test]
    fn commit_through_commits_a_prefix_of_one_segment() {
        let mut w = Window::new(100, 1000).unwrap();
        for e in 0..5 {
            w.add_pending(pending_rec(u64::from(e), 1, e)).unwrap();
            w.add_pending(pending_rec(100 + u64::from(e), 2, e))
                .unwrap();
        }
        assert_eq!(w.commit_through(1, 2), 3);
        let committed: Vec<u32> = w.committed_iter().map(|r| r.entry_id).collect();
        assert_eq!(committed, vec![0, 1, 2]);
        assert!(matches!(w.peek(&k(3), None), Lookup::Pending(_)));
        assert!(matches!(w.peek(&k(100), None), Lookup::Pending(_)));
        assert_eq!(w.commit_through(1, 2), 0); // nothing left at or below 2
        assert_eq!(w.commit_through(9, 100), 0); // unknown segment
        assert!(w.commit(&k(3))); // one by one: leaves the queue
        assert_eq!(w.pending_order[&1].len(), 1);
        assert_eq!(w.commit_through(1, 10), 1);
        assert_eq!(w.committed_count(), 5);
        assert_eq!(w.drop_segment(2), 5);
        assert_eq!(w.pending_count(), 0);
        assert!(w.pending_order.is_empty());
    }

    #[test]
    fn commit_through_keeps_entry_order_and_follows_replaced_keys() {
        let mut w = Window::new(100, 1000).unwrap();
        // out of order (an API caller, not the writer): committed in entry order anyway
        for e in [3, 1, 2, 0] {
            w.add_pending(pending_rec(e, 7, e as u32)).unwrap();
        }
        // dropped, then pending again at a later entry: only the new position counts
        assert!(w.drop_pending(&k(1)));
        w.add_pending(pending_rec(1, 7, 9)).unwrap();
        assert_eq!(w.commit_through(7, 3), 3);
        let order: Vec<u32> = w.committed_iter().map(|r| r.entry_id).collect();
        assert_eq!(order, vec![0, 2, 3]);
        assert!(matches!(w.peek(&k(1), None), Lookup::Pending(r) if r.entry_id == 9));
        assert_eq!(w.commit_through(7, 9), 1);
        assert!(w.pending_order.is_empty());
        assert_eq!(w.pending_count(), 0);
    }

    #[test]
    fn keys_taken_one_by_one_leave_the_order_queue() {
        let mut w = Window::new(100, 1000).unwrap();
        for e in 0..50u32 {
            w.add_pending(pending_rec(u64::from(e), 3, e / 2)).unwrap(); // ties too
        }
        for e in (0..50u64).rev().step_by(3) {
            assert!(w.drop_pending(&k(e)));
        }
        let left: Vec<u64> = (0..50u64).filter(|e| (49 - e) % 3 != 0).collect();
        assert_eq!(w.pending_order[&3].len(), left.len());
        for e in left {
            assert!(w.commit(&k(e)));
        }
        assert!(w.pending_order.is_empty());
    }

    #[test]
    fn reserve_many_matches_get_then_add_pending() {
        // Rows: committed keys (some expired as of their row's time), a pending key, new keys and
        // repeats of new keys within the batch; the batch must equal the one-by-one sequence.
        let mut one = Window::with_seed(1_000, 100, 7).unwrap();
        for i in 0..50u64 {
            one.add_committed(rec(i, i as i64 * 2));
        }
        one.add_pending(rec(500, 90)).unwrap();
        let mut many = Window::with_seed(1_000, 100, 7).unwrap();
        for i in 0..50u64 {
            many.add_committed(rec(i, i as i64 * 2));
        }
        many.add_pending(rec(500, 90)).unwrap();
        let rows: Vec<(u64, i64)> = [0u64, 10, 49, 500, 600, 601, 600, 5, 601, 700, 0]
            .iter()
            .enumerate()
            .map(|(n, &i)| (i, 95 + n as i64 * 3))
            .collect();
        let keys: Vec<u8> = rows.iter().flat_map(|&(i, _)| k(i)).collect();
        let ts: Vec<i64> = rows.iter().map(|&(_, t)| t).collect();
        let (st, sg, en) = many.reserve_many(&keys, &ts, 9, 40);
        let mut next = 40u32;
        for (row, &(i, t)) in rows.iter().enumerate() {
            let seg = i64::from_le_bytes(sg[row * 8..row * 8 + 8].try_into().unwrap());
            let ent = i64::from_le_bytes(en[row * 8..row * 8 + 8].try_into().unwrap());
            let want = match one.get(&k(i), Some(t)) {
                Lookup::Pending(r) => (PENDING, r.segment_id.into(), r.entry_id.into()),
                Lookup::Committed(r) => (COMMITTED, r.segment_id.into(), r.entry_id.into()),
                Lookup::Absent => {
                    let r = Record {
                        key: k(i),
                        segment_id: 9,
                        entry_id: next,
                        timestamp_ms: t,
                    };
                    one.add_pending(r).unwrap();
                    next += 1;
                    (ABSENT, 9, i64::from(next - 1))
                }
            };
            assert_eq!((st[row], seg, ent), want, "row {row} key {i}");
        }
        assert_eq!(next - 40, 5); // new: 600, 601, 5 (expired at its row), 700, 0 (expired)
        assert_eq!(st.iter().filter(|&&c| c == ABSENT).count(), 5);
        assert_eq!(many.pending_count(), one.pending_count());
        assert_eq!(many.counters(), one.counters());
        for (i, _) in rows {
            assert_eq!(many.peek(&k(i), None), one.peek(&k(i), None));
        }
    }

    #[test]
    fn get_many_matches_get() {
        let mut w = Window::new(100_000, 1_000).unwrap();
        for i in 0..100_000u64 {
            w.add_committed(rec(i, (i % 2000) as i64));
        }
        w.add_pending(rec(200_000, 0)).unwrap();
        let probe: Vec<u64> = (0..70_000u64).map(|i| i * 3).chain([200_000]).collect();
        let keys: Vec<u8> = probe.iter().flat_map(|&i| k(i)).collect();
        let (st, sg, en) = w.get_many(&keys, Some(1_500));
        for (row, &i) in probe.iter().enumerate() {
            let want = w.peek(&k(i), Some(1_500));
            let seg = i64::from_le_bytes(sg[row * 8..row * 8 + 8].try_into().unwrap());
            let ent = i64::from_le_bytes(en[row * 8..row * 8 + 8].try_into().unwrap());
            match want {
                Lookup::Absent => assert_eq!((st[row], seg, ent), (ABSENT, -1, -1)),
                Lookup::Pending(r) => {
                    assert_eq!(
                        (st[row], seg, ent),
                        (PENDING, r.segment_id.into(), r.entry_id.into())
                    )
                }
                Lookup::Committed(r) => assert_eq!(
                    (st[row], seg, ent),
                    (COMMITTED, r.segment_id.into(), r.entry_id.into())
                ),
            }
        }
        let c = w.counters();
        assert_eq!(c.hits + c.misses, probe.len() as u64);
        assert!(c.hits > 0 && c.misses > 0);
    }

    #[test]
    fn memory_target() {
        for n in [100_000usize, 1_000_000] {
            let mut w = Window::new(n, 1_000).unwrap();
            for i in 0..n as u64 {
                w.add_committed(rec(i, 0));
            }
            let per_key = w.memory_bytes() as f64 / n as f64;
            assert!(per_key <= 37.5, "{n}: {per_key} bytes per key");
        }
    }

    #[test]
    fn structured_keys_hash_apart() {
        let seed = 1;
        let a = key_hash(seed, &k(1));
        let b = key_hash(seed, &k(2));
        assert_ne!(a, b);
    }

    /// Read `[from, end)` in chunks of `per`, as a snapshot does, running `between` after each
    /// chunk (writes and evictions between two holds of the lock).
    fn chunked(
        w: &mut Window,
        from: u64,
        end: u64,
        per: usize,
        mut between: impl FnMut(&mut Window, usize),
    ) -> Vec<Record> {
        let mut out = Vec::new();
        let mut cursor = from;
        let mut round = 0;
        loop {
            let chunk: Vec<(u64, Record)> = w
                .committed_between(cursor, end)
                .take(per)
                .map(|(p, r)| (p, *r))
                .collect();
            let Some(&(last, _)) = chunk.last() else {
                break;
            };
            cursor = last + 1;
            out.extend(chunk.into_iter().map(|(_, r)| r));
            between(w, round);
            round += 1;
        }
        out
    }

    #[test]
    fn chunks_of_a_still_window_are_committed_iter() {
        let mut w = Window::new(10, 1_000).unwrap();
        for i in 0..25 {
            w.add_committed(rec(i, 0)); // wraps the ring twice
        }
        let (from, end) = w.positions();
        assert_eq!((from, end), (15, 25));
        let all: Vec<Record> = w.committed_iter().copied().collect();
        for per in [1, 3, 10, 100] {
            assert_eq!(chunked(&mut w, from, end, per, |_, _| {}), all);
        }
        assert_eq!(w.committed_between(0, u64::MAX).count(), 10);
        assert_eq!(w.committed_between(20, 22).count(), 2);
        assert_eq!(w.committed_between(30, 40).count(), 0);
        assert_eq!(w.committed_between(22, 20).count(), 0);
    }

    #[test]
    fn chunks_skip_what_is_evicted_and_stop_at_the_end() {
        let mut w = Window::new(8, 1_000).unwrap();
        for i in 0..8 {
            w.add_committed(rec(i, i as i64));
        }
        let (from, end) = w.positions();
        // after every chunk of 2: one new commit (pushes the oldest out of the full ring)
        let mut next = 100;
        let got = chunked(&mut w, from, end, 2, |w, _| {
            w.add_committed(rec(next, 500));
            next += 1;
        });
        let ids: Vec<u32> = got.iter().map(|r| r.entry_id).collect();
        // each commit pushes out a record read already; the commits after the start (at
        // positions from `end` on) are not read
        assert_eq!(ids, (0..8).collect::<Vec<u32>>());
        let mut w = Window::new(8, 100).unwrap();
        for i in 0..8 {
            w.add_committed(rec(i, i as i64 * 10));
        }
        let (from, end) = w.positions();
        // time eviction of the first six between the first and the second chunk
        let got = chunked(&mut w, from, end, 2, |w, round| {
            if round == 0 {
                assert_eq!(w.evict(155), 6);
            }
        });
        let ids: Vec<u32> = got.iter().map(|r| r.entry_id).collect();
        assert_eq!(ids, vec![0, 1, 6, 7]);
    }

    #[test]
    fn chunks_skip_dead_records_and_wrap() {
        let mut w = Window::new(6, 1_000).unwrap();
        for i in 0..9 {
            w.add_committed(rec(i, 0)); // 3..9 held, the ring wrapped
        }
        let mut newer = rec(4, 10);
        newer.entry_id = 40; // key 4 again at a later position: its old slot is dead
        assert!(w.add_committed(newer)); // evicts 3
        let (from, end) = w.positions();
        let ids: Vec<u32> = chunked(&mut w, from, end, 2, |_, _| {})
            .iter()
            .map(|r| r.entry_id)
            .collect();
        assert_eq!(ids, vec![5, 6, 7, 8, 40]);
        assert_eq!(
            ids,
            w.committed_iter().map(|r| r.entry_id).collect::<Vec<_>>()
        );
        // a key killed between chunks (rewritten after its window) is not read
        let mut w = Window::new(6, 100).unwrap();
        for i in 0..6 {
            w.add_committed(rec(i, 0));
        }
        let (from, end) = w.positions();
        let ids: Vec<u32> = chunked(&mut w, from, end, 2, |w, round| {
            if round == 0 {
                let mut again = rec(4, 200);
                again.entry_id = 44;
                w.add_pending(again).unwrap(); // expired: replaced, its old slot dead
            }
        })
        .iter()
        .map(|r| r.entry_id)
        .collect();
        assert_eq!(ids, vec![0, 1, 2, 3, 5]);
    }
}
