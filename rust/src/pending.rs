//! The dedup window's pending keys (`window.rs`): the writes in flight, as records in a slab
//! indexed by a [`SlotIndex`] of slab positions.
//!
//! Why not `hashbrown::HashTable<Record>`: a writer's pending keys churn (reserved, then committed
//! a few milliseconds later), and hashbrown's removals leave tombstones that make the table
//! double at the next growth: 11,000 writes in flight took 32,768 buckets of 33 bytes (1.1 MB).
//! Here a removal frees its slab position for the next insert and shifts index cells back (no
//! tombstones): ~32 + 5.3 bytes per write in flight. Once nothing is in flight the memory is
//! released ([`Pending::release_if_drained`]), so a writer at rest keeps nothing for its peak.

use crate::keys::Key;
use crate::slot_index::SlotIndex;
use crate::window::Record;

/// Slab positions the index is first sized to address; it is widened (re-encoded) beyond them.
const FIRST_SLOT_LIMIT: usize = 1 << 16;

/// A drained table at most this big is kept (a writer of one write, or of bursts of up to ~1,500
/// writes, at a time would otherwise allocate it for each); under glibc's smallest mmap
/// threshold, so releasing it never raises that threshold (see slot_index.rs).
const KEEP_BYTES: usize = 64 << 10;

/// What [`Pending::find_or_insert`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reserved {
    /// The key was pending already, with this record.
    Held(Record),
    /// The record was added at this slab position.
    Added(u32),
}

#[derive(Debug)]
pub struct Pending {
    slab: Vec<Record>,
    /// Slab positions not in use (their records are stale).
    free: Vec<u32>,
    index: SlotIndex,
    slot_limit: usize,
    /// Most writes in flight at once before the last release: the next burst is sized for them
    /// at its first insert (one allocation, no growth steps).
    peak: usize,
}

impl Default for Pending {
    fn default() -> Self {
        Self {
            slab: Vec::new(),
            free: Vec::new(),
            index: SlotIndex::new(FIRST_SLOT_LIMIT),
            slot_limit: FIRST_SLOT_LIMIT,
            peak: 0,
        }
    }
}

impl Pending {
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.len() == 0
    }

    /// Heap bytes owned.
    pub fn allocation_size(&self) -> usize {
        self.slab.capacity() * std::mem::size_of::<Record>()
            + self.free.capacity() * std::mem::size_of::<u32>()
            + self.index.allocation_size()
    }

    /// The record at slab position `at` (a position `insert` returned and no removal since).
    #[inline]
    pub fn record_at(&self, at: u32) -> Option<&Record> {
        self.slab.get(at as usize)
    }

    /// Start loading the index cell of hash `h` into the cache ([`SlotIndex::prefetch`]).
    #[inline]
    pub fn prefetch(&self, h: u64) {
        self.index.prefetch(h);
    }

    /// The pending record of `key` (hash `h`).
    #[inline]
    pub fn find(&self, key: &Key, h: u64, hash: impl Fn(&Key) -> u64) -> Option<&Record> {
        let slab = &self.slab;
        let hash_of = |s: u32| slab.get(s as usize).map_or(0, |r| hash(&r.key));
        let pos = self.index.find(
            h,
            |s| slab.get(s as usize).is_some_and(|r| r.key == *key),
            &hash_of,
        )?;
        slab.get(self.index.slot_at(pos) as usize)
    }

    /// Add `rec` (hash `h`), known not to be pending; returns its slab position.
    pub fn insert(&mut self, rec: Record, h: u64, hash: impl Fn(&Key) -> u64) -> u32 {
        if self.slab.capacity() == 0 && self.peak > 0 {
            self.presize(&hash);
        }
        let at = match self.free.pop() {
            Some(at) => {
                if let Some(r) = self.slab.get_mut(at as usize) {
                    *r = rec;
                }
                at
            }
            None => {
                if self.slab.len() >= self.slot_limit {
                    self.widen(&hash);
                }
                self.slab.push(rec);
                // slot_limit <= u32::MAX + 1, so a position below it fits
                (self.slab.len() - 1) as u32
            }
        };
        let slab = &self.slab;
        self.index.insert(h, at, &|s: u32| {
            slab.get(s as usize).map_or(0, |r| hash(&r.key))
        });
        at
    }

    /// The pending record of `rec.key` (hash `h`) if there is one; otherwise `rec` is added, in
    /// the same walk of the index.
    pub fn find_or_insert(&mut self, rec: Record, h: u64, hash: impl Fn(&Key) -> u64) -> Reserved {
        if self.slab.capacity() == 0 && self.peak > 0 {
            self.presize(&hash);
        }
        if self.free.is_empty() && self.slab.len() >= self.slot_limit {
            self.widen(&hash);
        }
        // the position `rec` takes if it is added (not in the slab yet: nothing reads it before)
        let at = match self.free.last() {
            Some(&f) => f,
            None => self.slab.len() as u32,
        };
        let slab = &self.slab;
        let hash_of = |s: u32| slab.get(s as usize).map_or(0, |r| hash(&r.key));
        let key = rec.key;
        let found = self.index.find_or_insert(
            h,
            |s| slab.get(s as usize).is_some_and(|r| r.key == key),
            at,
            &hash_of,
        );
        if let Some(pos) = found {
            let held = self.slab.get(self.index.slot_at(pos) as usize).copied();
            return Reserved::Held(held.unwrap_or(rec));
        }
        if self.free.last() == Some(&at) {
            self.free.pop();
            if let Some(r) = self.slab.get_mut(at as usize) {
                *r = rec;
            }
        } else {
            self.slab.push(rec);
        }
        Reserved::Added(at)
    }

    /// Take the pending record of `key` (hash `h`) out: `(its slab position, the record)`.
    pub fn remove(
        &mut self,
        key: &Key,
        h: u64,
        hash: impl Fn(&Key) -> u64,
    ) -> Option<(u32, Record)> {
        let slab = &self.slab;
        let hash_of = |s: u32| slab.get(s as usize).map_or(0, |r| hash(&r.key));
        let pos = self.index.find(
            h,
            |s| slab.get(s as usize).is_some_and(|r| r.key == *key),
            &hash_of,
        )?;
        let at = self.index.slot_at(pos);
        let rec = slab.get(at as usize).copied()?;
        self.index.remove_at(pos, &hash_of);
        self.free.push(at);
        Some((at, rec))
    }

    /// Take the pending record at slab position `at` out (a position `insert` returned and no
    /// removal since): the record and its hash. No key comparison: the slot identifies it.
    pub fn take_at(&mut self, at: u32, hash: impl Fn(&Key) -> u64) -> Option<(Record, u64)> {
        let slab = &self.slab;
        let rec = slab.get(at as usize).copied()?;
        let h = hash(&rec.key);
        let hash_of = |s: u32| slab.get(s as usize).map_or(0, |r| hash(&r.key));
        let pos = self.index.find(h, |s| s == at, &hash_of)?;
        self.index.remove_at(pos, &hash_of);
        self.free.push(at);
        Some((rec, h))
    }

    /// Release the memory once nothing is pending (beyond a small table).
    pub fn release_if_drained(&mut self) {
        if !self.is_empty() {
            return;
        }
        if self.allocation_size() > KEEP_BYTES {
            let peak = self.slab.len();
            *self = Self::default();
            self.peak = peak;
        } else {
            self.slab.clear();
            self.free.clear();
        }
    }

    /// Room for as many writes as the last burst had in flight, so a writer that drains between
    /// bursts allocates once per burst; only a speed-up (inserts grow as they go otherwise).
    fn presize(&mut self, hash: &impl Fn(&Key) -> u64) {
        let peak = std::mem::take(&mut self.peak).min(self.slot_limit);
        if self.slab.try_reserve_exact(peak).is_err() {
            return;
        }
        let slab = &self.slab;
        let hash_of = |s: u32| slab.get(s as usize).map_or(0, |r| hash(&r.key));
        let _ = self.index.try_reserve(peak, &hash_of);
    }

    /// Address 4x as many slab positions (at most u32's range): the index's cells re-encoded.
    fn widen(&mut self, hash: &impl Fn(&Key) -> u64) {
        self.slot_limit = self.slot_limit.saturating_mul(4).min(1 << 32);
        let mut index = SlotIndex::new(self.slot_limit.min(u32::MAX as usize));
        let slab = &self.slab;
        let hash_of = |s: u32| slab.get(s as usize).map_or(0, |r| hash(&r.key));
        let mut live = vec![true; slab.len()];
        for &f in &self.free {
            if let Some(l) = live.get_mut(f as usize) {
                *l = false;
            }
        }
        for (at, r) in slab.iter().enumerate() {
            if live.get(at).copied().unwrap_or(false) {
                index.insert(hash(&r.key), at as u32, &hash_of);
            }
        }
        self.index = index;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u64) -> Record {
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&i.to_le_bytes());
        Record {
            key,
            segment_id: 1,
            entry_id: i as u32,
            timestamp_ms: i as i64,
        }
    }

    fn hash(k: &Key) -> u64 {
        let mut h = u64::from_le_bytes(k[..8].try_into().unwrap());
        h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 29)
    }

    #[test]
    fn churn_reuses_positions_widens_and_releases() {
        let mut p = Pending::default();
        let n = 3 * FIRST_SLOT_LIMIT as u64; // widened twice
        for i in 0..n {
            let r = rec(i);
            p.insert(r, hash(&r.key), hash);
        }
        assert_eq!(p.len(), n as usize);
        for i in (0..n).step_by(2) {
            let r = rec(i);
            assert_eq!(p.remove(&r.key, hash(&r.key), hash).map(|x| x.1), Some(r));
            assert_eq!(p.remove(&r.key, hash(&r.key), hash), None);
        }
        let slab = p.slab.len();
        for i in n..n + n / 2 {
            let r = rec(i);
            if i % 2 == 0 {
                p.insert(r, hash(&r.key), hash);
            } else {
                let Reserved::Added(at) = p.find_or_insert(r, hash(&r.key), hash) else {
                    panic!("{i} was not pending");
                };
                let mut other = r;
                other.entry_id += 1;
                assert_eq!(
                    p.find_or_insert(other, hash(&r.key), hash),
                    Reserved::Held(r)
                );
                assert_eq!(p.take_at(at, hash), Some((r, hash(&r.key))));
                assert_eq!(p.find(&r.key, hash(&r.key), hash), None);
                p.insert(r, hash(&r.key), hash);
            }
        }
        assert_eq!(p.slab.len(), slab, "freed positions are reused");
        for i in 0..n + n / 2 {
            let r = rec(i);
            let want = (i >= n || i % 2 == 1).then_some(r);
            assert_eq!(p.find(&r.key, hash(&r.key), hash).copied(), want, "{i}");
        }
        for i in 0..n + n / 2 {
            let r = rec(i);
            p.remove(&r.key, hash(&r.key), hash);
        }
        assert!(p.is_empty());
        let peak = p.slab.len();
        p.release_if_drained();
        assert_eq!(p.allocation_size(), 0);
        // the next burst is sized for the last one at its first insert
        let r = rec(1);
        p.insert(r, hash(&r.key), hash);
        assert!(p.slab.capacity() >= peak.min(p.slot_limit));
        assert!(p.index.capacity() >= peak.min(p.slot_limit));
        assert_eq!(p.find(&r.key, hash(&r.key), hash), Some(&r));
    }
}
