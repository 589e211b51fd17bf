//! The dedup window's index of committed keys (`window.rs`): ring slot numbers in an
//! open-addressing table with linear probing in Robin Hood order, of any size (not a power of
//! two).
//!
//! Why not `hashbrown::HashTable<u32>`: its bucket count is a power of two at most 7/8 full, plus
//! a control byte per bucket, so the index cost 5 * 8/7 .. 5 * 16/7 bytes per key (10.5 at 1M
//! keys, where 2^20 buckets are just too few). Here a cell is one `u32` and the table doubles,
//! but at most to what `max_len` keys need at 3/4 load: a full window's index is 4 * 4/3 = 5.3
//! bytes per key. (At 7/8 an insert walked ~30 cells to the next empty one, and a writer's
//! reserve-then-commit path ran 1.7x slower than with hashbrown.)
//!
//! A cell holds the slot number + 1 in its low `slot_bits` bits (0: empty), then its distance
//! from its home cell in up to [`DIST_BITS`] bits (saturated: at the saturation value the
//! distance is recomputed from the key in the ring), then, in the bits left over, a tag of the
//! key's hash (9 bits at 100k keys, 6 at 1M, none beyond 2^26). A lookup walks from the key's
//! home cell and stops at an empty cell or one nearer its own home than the walk is from the
//! key's (Robin Hood order); it compares the key (a ring read, the cost of a lookup) only in
//! cells with the key's own home and tag. Removal shifts the cells after it back by one (no
//! tombstones, so the table never fills up with them).
//!
//! The table never frees a large block while it grows: the window reserves its address space for
//! `max_len` keys up front ([`SlotIndex::reserve_address_space`]; pages are touched only as the
//! table grows into them) and every growth rehashes in place, from the window's ring in memory
//! order ([`SlotIndex::rebuild`]) or through scratch buffers small enough to come from malloc's
//! heap. Freeing a block above glibc's mmap threshold (128 KiB at first) raises that threshold,
//! and the trim threshold with it, to the block's size: later tables then came from the heap,
//! and the old ones freed at each growth stayed resident as holes.

use std::collections::TryReserveError;

/// The smallest table allocated.
const MIN_CELLS: usize = 16;

/// Bits of a cell's distance from its home (when the slot number leaves them): Robin Hood keeps
/// distances short (a few cells at 3/4 load), so 63 is rarely reached, and the rest is tag.
const DIST_BITS: u32 = 6;

/// Cells per scratch buffer of a rehash: 64 KiB, under glibc's smallest mmap threshold.
const SCRATCH_CELLS: usize = 16 << 10;

/// Most entries a table of `cells` cells holds: 3/4 of them.
#[inline]
fn max_load(cells: usize) -> usize {
    cells - cells / 4
}

/// Cells for `n` entries at most 3/4 full.
fn cells_for(n: usize) -> usize {
    let mut cells = n + n / 3 + 1;
    while max_load(cells) < n {
        cells += 1;
    }
    cells.max(MIN_CELLS)
}

/// A hint to the CPU to load the cache line of `p` (x86-64's PREFETCHT0; nothing elsewhere).
#[inline(always)]
#[allow(unsafe_code)]
fn prefetch_read(p: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint, not a load: it never faults and returns nothing to the
    // program, for any address (out of bounds, unmapped or null alike), so no memory safety
    // property rests on `p`. The SSE feature it needs is part of the x86-64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// As a Vec or a hashbrown table does when the allocator fails.
fn grow_failed(cells: usize, e: &TryReserveError) -> ! {
    panic!("dedup window index: cannot grow to {cells} cells: {e}");
}

/// Ring slot numbers (`u32`, below `max_len`), found by the hash of the key in the slot.
/// Every method that may look at a stored slot's key takes `hash_of(slot)`.
#[derive(Clone, Debug)]
pub struct SlotIndex {
    cells: Vec<u32>,
    len: usize,
    slot_bits: u32,
    slot_mask: u32,
    /// The distance bits, in place.
    dist_mask: u32,
    /// The largest distance a cell stores (0 when no bits are left for it: always recomputed).
    sat: usize,
    /// Where the tag starts, and the tag bits of a hash (in place).
    tag_shift: u32,
    tag_mask: u32,
    /// Most entries ever held (the window's `max_keys`): the table never grows past their need.
    max_len: usize,
}

impl SlotIndex {
    /// An empty index (nothing allocated) for slot numbers below `max_len`.
    pub fn new(max_len: usize) -> Self {
        let max_len = max_len.clamp(1, u32::MAX as usize);
        // slot + 1 <= max_len < 2^slot_bits: a cell is never all ones in the slot bits
        let slot_bits = usize::BITS - max_len.leading_zeros();
        let dist_bits = (32 - slot_bits).min(DIST_BITS);
        let tag_shift = slot_bits + dist_bits;
        let field = |bits: u32, shift: u32| (((1u64 << bits) - 1) << shift) as u32;
        Self {
            cells: Vec::new(),
            len: 0,
            slot_bits,
            slot_mask: field(slot_bits, 0),
            dist_mask: field(dist_bits, slot_bits),
            sat: ((1u64 << dist_bits) - 1) as usize,
            tag_shift,
            tag_mask: field(32 - tag_shift, tag_shift),
            max_len,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Entries it holds without growing.
    pub fn capacity(&self) -> usize {
        if self.cells.is_empty() {
            0
        } else {
            max_load(self.cells.len())
        }
    }

    /// Bytes of the table in use (its reserved address space beyond them is not touched).
    pub fn allocation_size(&self) -> usize {
        self.cells.len() * std::mem::size_of::<u32>()
    }

    /// Reserve the address space of the table `max_len` entries need (no page is touched), so
    /// that growing never moves it.
    pub fn reserve_address_space(&mut self) -> Result<(), TryReserveError> {
        let want = cells_for(self.max_len);
        self.cells
            .try_reserve_exact(want.saturating_sub(self.cells.len()))
    }

    #[inline]
    fn home(&self, h: u64) -> usize {
        // the high bits of the hash scaled to the table (no power-of-two size needed)
        ((u128::from(h) * self.cells.len() as u128) >> 64) as usize
    }

    #[inline]
    fn next(&self, pos: usize) -> usize {
        let p = pos + 1;
        if p == self.cells.len() {
            0
        } else {
            p
        }
    }

    #[inline]
    fn cell_at(&self, pos: usize) -> u32 {
        self.cells.get(pos).copied().unwrap_or(0)
    }

    #[inline]
    fn slot(&self, cell: u32) -> u32 {
        (cell & self.slot_mask).wrapping_sub(1)
    }

    /// The tag bits of hash `h`, in place (the low bits: the home is taken from the high ones).
    #[inline]
    fn tag(&self, h: u64) -> u32 {
        ((h as u32) << self.tag_shift.min(31)) & self.tag_mask
    }

    /// A cell of `slot` with tag `tag` (in place), distance 0.
    #[inline]
    fn make(&self, tag: u32, slot: u32) -> u32 {
        tag | (slot + 1)
    }

    /// `cell` with its distance set to `dist` (saturated).
    #[inline]
    fn with_dist(&self, cell: u32, dist: usize) -> u32 {
        let d = (dist.min(self.sat) as u64) << self.slot_bits;
        (cell & !self.dist_mask) | d as u32
    }

    /// How far the cell at `pos` is from its home cell.
    #[inline]
    fn dist(&self, cell: u32, pos: usize, hash_of: &impl Fn(u32) -> u64) -> usize {
        let d = ((cell & self.dist_mask) >> self.slot_bits.min(31)) as usize;
        if d < self.sat {
            return d;
        }
        let home = self.home(hash_of(self.slot(cell)));
        if pos >= home {
            pos - home
        } else {
            pos + self.cells.len() - home
        }
    }

    /// Start loading the home cell of hash `h` into the cache, so that a lookup or insert of it a
    /// few keys later finds it there: a batch pass (the window's `get_many`, `reserve_many`, and a
    /// quorum ack's `commit_through`) asks for the cells of the keys ahead of the one it works on,
    /// and their cache misses overlap instead of coming one after another. A hint only: nothing
    /// depends on it, and a table that grows meanwhile just makes it useless.
    #[inline]
    pub fn prefetch(&self, h: u64) {
        if !self.cells.is_empty() {
            prefetch_read(self.cells.as_ptr().wrapping_add(self.home(h)).cast());
        }
    }

    /// The position of the entry with hash `h` whose slot satisfies `eq`, if any.
    #[inline]
    pub fn find(
        &self,
        h: u64,
        mut eq: impl FnMut(u32) -> bool,
        hash_of: &impl Fn(u32) -> u64,
    ) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mut pos = self.home(h);
        let tag = self.tag(h);
        let mut d = 0;
        loop {
            let cell = self.cell_at(pos);
            if cell == 0 {
                return None;
            }
            let cd = self.dist(cell, pos, hash_of);
            if cd < d {
                return None;
            }
            if cd == d && cell & self.tag_mask == tag && eq(self.slot(cell)) {
                return Some(pos);
            }
            pos = self.next(pos);
            d += 1;
        }
    }

    /// The slot stored at `pos` (a position `find` returned).
    #[inline]
    pub fn slot_at(&self, pos: usize) -> u32 {
        self.slot(self.cell_at(pos))
    }

    /// Remove the entry at `pos` (a position `find` returned).
    pub fn remove_at(&mut self, mut pos: usize, hash_of: &impl Fn(u32) -> u64) {
        loop {
            let next = self.next(pos);
            let cell = self.cell_at(next);
            let d = if cell == 0 {
                0
            } else {
                self.dist(cell, next, hash_of)
            };
            if d == 0 {
                break;
            }
            let moved = self.with_dist(cell, d - 1);
            if let Some(c) = self.cells.get_mut(pos) {
                *c = moved;
            }
            pos = next;
        }
        if let Some(c) = self.cells.get_mut(pos) {
            *c = 0;
        }
        self.len -= 1;
    }

    /// Add `slot` under hash `h` (the caller knows its key is not in the index), growing the
    /// table if it is full.
    pub fn insert(&mut self, h: u64, slot: u32, hash_of: &impl Fn(u32) -> u64) {
        if let Some(want) = self.growth() {
            if let Err(e) = self.resize(want, hash_of) {
                grow_failed(want, &e);
            }
        }
        self.place(h, self.make(self.tag(h), slot), hash_of);
        self.len += 1;
    }

    /// The position of the entry with hash `h` whose slot satisfies `eq`; if there is none,
    /// `slot` is added under `h` where the search stopped (one walk instead of a lookup and an
    /// insert) and None is returned. The table grows first if it is full.
    pub fn find_or_insert(
        &mut self,
        h: u64,
        mut eq: impl FnMut(u32) -> bool,
        slot: u32,
        hash_of: &impl Fn(u32) -> u64,
    ) -> Option<usize> {
        if let Some(want) = self.growth() {
            if let Err(e) = self.resize(want, hash_of) {
                grow_failed(want, &e);
            }
        }
        let mut pos = self.home(h);
        let tag = self.tag(h);
        let mut d = 0;
        loop {
            let cell = self.cell_at(pos);
            if cell == 0 {
                break;
            }
            let cd = self.dist(cell, pos, hash_of);
            if cd < d {
                break;
            }
            if cd == d && cell & self.tag_mask == tag && eq(self.slot(cell)) {
                return Some(pos);
            }
            pos = self.next(pos);
            d += 1;
        }
        self.place_from(pos, d, self.make(tag, slot), hash_of);
        self.len += 1;
        None
    }

    /// The cells to grow to before one more insert, if it needs more.
    pub fn growth(&self) -> Option<usize> {
        if self.len < self.capacity() {
            return None;
        }
        Some(self.doubled().max(cells_for(self.len + 1)))
    }

    /// Twice the table, but no more than what `max_len` entries need: each growth at least
    /// doubles, so n inserts or reserves move O(n) cells in all, not O(n) at every growth.
    fn doubled(&self) -> usize {
        (2 * self.cells.len()).min(cells_for(self.max_len))
    }

    /// The cells to grow to for room for `additional` more entries (at most `max_len` in all),
    /// if the table lacks it: exactly what they need when that is more than double (a bulk load
    /// into an empty or small table is sized once, with nothing to spare), else double. Growing
    /// to exactly `len + additional` made a series of small reserves (recovery's replay, 2,000
    /// keys a call) rehash the whole table at every call: 50 moves of 1M cells for a 100k gap.
    pub fn reserve_cells(&self, additional: usize) -> Option<usize> {
        let want = self.len.saturating_add(additional).min(self.max_len);
        if want <= self.capacity() {
            return None;
        }
        Some(cells_for(want).max(self.doubled()))
    }

    /// Grow to `cells` cells (in place, as `insert` does) from `entries`, `(slot, hash)` of every
    /// entry held, in any order: a caller that can list them in memory order (the window's ring)
    /// spares the rehash a random read of each key.
    pub fn rebuild(
        &mut self,
        cells: usize,
        entries: impl IntoIterator<Item = (u32, u64)>,
        hash_of: &impl Fn(u32) -> u64,
    ) {
        if let Err(e) = self
            .cells
            .try_reserve_exact(cells.saturating_sub(self.cells.len()))
        {
            grow_failed(cells, &e);
        }
        self.cells.fill(0);
        self.cells.resize(cells, 0);
        let mut n = 0;
        for (slot, h) in entries {
            self.place(h, self.make(self.tag(h), slot), hash_of);
            n += 1;
        }
        debug_assert_eq!(n, self.len);
    }

    /// Index `entries` (hash, slot) into this empty index, grown to hold them. Given in hash
    /// order (homes ascending: [`sort_by_home`]), each insert walks cells the ones before it have
    /// just written, so the table fills front to back instead of at a cache miss per key. Any
    /// order is correct; only the speed depends on it.
    pub fn fill(&mut self, entries: &[(u64, u32)], hash_of: &impl Fn(u32) -> u64) {
        debug_assert_eq!(self.len, 0, "fill is for an empty index");
        let cells = self
            .reserve_cells(entries.len())
            .unwrap_or(self.cells.len());
        self.len = entries.len();
        self.rebuild(cells, entries.iter().map(|&(h, s)| (s, h)), hash_of);
    }

    /// Room for `additional` more entries (at most `max_len` in all) in one resize (of the size
    /// [`SlotIndex::reserve_cells`] says).
    pub fn try_reserve(
        &mut self,
        additional: usize,
        hash_of: &impl Fn(u32) -> u64,
    ) -> Result<(), TryReserveError> {
        match self.reserve_cells(additional) {
            Some(cells) => self.resize(cells, hash_of),
            None => Ok(()),
        }
    }

    /// Grow to `cells` cells in place: within the reserved address space, or by `realloc`
    /// (which moves a large block with mremap, freeing nothing); the entries go out to scratch
    /// buffers of at most [`SCRATCH_CELLS`] and back in.
    fn resize(
        &mut self,
        cells: usize,
        hash_of: &impl Fn(u32) -> u64,
    ) -> Result<(), TryReserveError> {
        self.cells
            .try_reserve_exact(cells.saturating_sub(self.cells.len()))?;
        let mut scratch: Vec<Vec<u32>> = Vec::new();
        for part in self.cells.chunks(SCRATCH_CELLS) {
            let mut kept = Vec::new();
            kept.try_reserve_exact(part.iter().filter(|&&c| c != 0).count())?;
            kept.extend(part.iter().copied().filter(|&c| c != 0));
            scratch.push(kept);
        }
        self.cells.fill(0);
        self.cells.resize(cells, 0);
        for cell in scratch.into_iter().flatten() {
            self.place(hash_of(self.slot(cell)), cell, hash_of);
        }
        Ok(())
    }

    /// Robin Hood insertion of `cell` (its slot and tag; hash `h`): walk from the home cell; take
    /// the place of a cell nearer its own home than the walk is, and carry that one on.
    fn place(&mut self, h: u64, cell: u32, hash_of: &impl Fn(u32) -> u64) {
        self.place_from(self.home(h), 0, cell, hash_of);
    }

    /// [`SlotIndex::place`] from `pos`, `d` cells from the home of `cell`, where a walk from
    /// the home found every cell before `pos` at least as far from its own home.
    fn place_from(&mut self, pos: usize, d: usize, cell: u32, hash_of: &impl Fn(u32) -> u64) {
        let (mut pos, mut d) = (pos, d);
        let mut carried = cell;
        loop {
            let cell = self.cell_at(pos);
            if cell == 0 {
                let new = self.with_dist(carried, d);
                if let Some(c) = self.cells.get_mut(pos) {
                    *c = new;
                }
                return;
            }
            let cd = self.dist(cell, pos, hash_of);
            if cd < d {
                let new = self.with_dist(carried, d);
                if let Some(c) = self.cells.get_mut(pos) {
                    *c = new;
                }
                carried = cell;
                d = cd;
            }
            pos = self.next(pos);
            d += 1;
        }
    }
}

/// Sort (hash, slot) pairs by hash, as [`SlotIndex::fill`] wants them: a stable LSD radix sort
/// on the top [`SORT_BITS`] bits (homes are the high bits of the hash: that alone puts each key
/// within a few cells of the one before it at millions of keys), then each run that shares those
/// bits by the whole hash, so equal hashes end up next to each other. Two sequential passes
/// instead of a comparison sort's n log n.
pub fn sort_by_home(v: &mut Vec<(u64, u32)>) {
    const DIGIT: u32 = 11;
    const BUCKETS: usize = 1 << DIGIT;
    let mut buf = vec![(0u64, 0u32); v.len()];
    for pass in 0..SORT_BITS / DIGIT {
        let shift = 64 - SORT_BITS + pass * DIGIT;
        let digit = |h: u64| ((h >> shift) as usize) & (BUCKETS - 1);
        let mut next = vec![0usize; BUCKETS];
        for &(h, _) in v.iter() {
            if let Some(c) = next.get_mut(digit(h)) {
                *c += 1;
            }
        }
        let mut sum = 0;
        for c in next.iter_mut() {
            (*c, sum) = (sum, sum + *c);
        }
        for &e in v.iter() {
            if let Some(c) = next.get_mut(digit(e.0)) {
                if let Some(dst) = buf.get_mut(*c) {
                    *dst = e;
                }
                *c += 1;
            }
        }
        std::mem::swap(v, &mut buf);
    }
    for run in v.chunk_by_mut(|a, b| a.0 >> (64 - SORT_BITS) == b.0 >> (64 - SORT_BITS)) {
        if run.len() > 1 {
            run.sort_unstable();
        }
    }
}

/// The high hash bits [`sort_by_home`] sorts on by radix (a multiple of its 11-bit digit).
const SORT_BITS: u32 = 22;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Slot s holds the key whose hash is `hashes[s]`.
    struct Keys {
        hashes: Vec<u64>,
    }

    impl Keys {
        fn hash_of(&self) -> impl Fn(u32) -> u64 + '_ {
            move |s| self.hashes[s as usize]
        }
    }

    fn mix(i: u64) -> u64 {
        let mut h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 31;
        h.wrapping_mul(0xbf58_476d_1ce4_e5b9)
    }

    fn check(index: &SlotIndex, keys: &Keys, live: &HashSet<u32>) {
        let hash_of = keys.hash_of();
        assert_eq!(index.len(), live.len());
        for (s, &h) in keys.hashes.iter().enumerate() {
            let s = s as u32;
            let found = index.find(h, |x| x == s, &hash_of);
            assert_eq!(found.is_some(), live.contains(&s), "slot {s}");
            if let Some(pos) = found {
                assert_eq!(index.slot_at(pos), s);
            }
        }
    }

    fn churn(max_len: usize, hashes: Vec<u64>) {
        let keys = Keys { hashes };
        let n = keys.hashes.len() as u32;
        let hash_of = keys.hash_of();
        let mut index = SlotIndex::new(max_len);
        let mut live = HashSet::new();
        for s in 0..n {
            if s % 2 == 0 {
                index.insert(keys.hashes[s as usize], s, &hash_of);
            } else {
                let h = keys.hashes[s as usize];
                assert_eq!(index.find_or_insert(h, |x| x == s, s, &hash_of), None);
                let again = index.find_or_insert(h, |x| x == s, s, &hash_of);
                assert_eq!(again.map(|pos| index.slot_at(pos)), Some(s));
            }
            live.insert(s);
        }
        check(&index, &keys, &live);
        for s in (0..n).step_by(3) {
            let h = keys.hashes[s as usize];
            let pos = index.find(h, |x| x == s, &hash_of).unwrap();
            index.remove_at(pos, &hash_of);
            live.remove(&s);
        }
        check(&index, &keys, &live);
        for s in (0..n).step_by(3) {
            index.insert(keys.hashes[s as usize], s, &hash_of);
            live.insert(s);
        }
        check(&index, &keys, &live);
        let copy = index.clone();
        check(&copy, &keys, &live);
    }

    #[test]
    fn insert_find_remove_with_random_hashes() {
        churn(5_000, (0..5_000).map(mix).collect());
    }

    #[test]
    fn colliding_homes_and_saturated_distances() {
        // 2000 slots need 11 bits, leaving 21 for the distance; a max_len of 2^31 leaves 0, so
        // every distance is recomputed from the key; clustered hashes make long runs either way
        for max_len in [2_000, 1 << 31] {
            churn(
                max_len,
                (0..2_000u64).map(|i| (i % 7) << 60 | mix(i) >> 8).collect(),
            );
            churn(max_len, (0..2_000u64).map(|i| u64::MAX - (i % 3)).collect());
        }
        // 6 distance bits: runs longer than 63 cells saturate
        let max_len = (1 << 26) - 1;
        churn(max_len, (0..3_000u64).map(|i| (i % 2) << 63).collect());
    }

    #[test]
    fn doubles_up_to_what_max_len_needs() {
        let keys = Keys {
            hashes: (0..1_000).map(mix).collect(),
        };
        let hash_of = keys.hash_of();
        let mut index = SlotIndex::new(1_000);
        assert_eq!((index.capacity(), index.allocation_size()), (0, 0));
        let mut sizes = vec![];
        for s in 0..1_000u32 {
            index.insert(keys.hashes[s as usize], s, &hash_of);
            if sizes.last() != Some(&index.cells.len()) {
                sizes.push(index.cells.len());
            }
        }
        for w in sizes.windows(2) {
            assert!(w[1] <= 2 * w[0], "{sizes:?}");
        }
        assert_eq!(index.cells.len(), cells_for(1_000), "{sizes:?}");
        assert!(index.allocation_size() <= 4 * 1_000 * 4 / 3 + 8);
        let mut reserved = SlotIndex::new(1_000);
        reserved.reserve_address_space().unwrap();
        let block = reserved.cells.as_ptr();
        for s in 0..1_000u32 {
            reserved.insert(keys.hashes[s as usize], s, &hash_of);
        }
        assert_eq!(
            reserved.cells.as_ptr(),
            block,
            "grown in place, never moved"
        );
        assert_eq!(reserved.cells.len(), cells_for(1_000));
        let mut reserved = SlotIndex::new(1_000);
        reserved.try_reserve(600, &hash_of).unwrap();
        assert_eq!(reserved.cells.len(), cells_for(600));
        reserved.try_reserve(1 << 40, &hash_of).unwrap();
        assert_eq!(reserved.cells.len(), cells_for(1_000));
    }

    #[test]
    fn many_small_reserves_grow_the_table_geometrically() {
        // Recovery's replay: a bulk load sized exactly, then one small reserve per 2,000-key call.
        // Growing to exactly len + additional rehashed the whole table at each of the 50 calls.
        let n = 120_000u32;
        let keys = Keys {
            hashes: (0..u64::from(n)).map(mix).collect(),
        };
        let hash_of = keys.hash_of();
        let mut index = SlotIndex::new(1_000_000);
        index.try_reserve(20_000, &hash_of).unwrap();
        assert_eq!(
            index.cells.len(),
            cells_for(20_000),
            "a bulk load is sized once"
        );
        let mut sizes = vec![index.cells.len()];
        for s in 0..n {
            if s >= 20_000 && s % 2_000 == 0 {
                index.try_reserve(2_000, &hash_of).unwrap();
                if sizes.last() != Some(&index.cells.len()) {
                    sizes.push(index.cells.len());
                }
            }
            index.insert(keys.hashes[s as usize], s, &hash_of);
        }
        assert_eq!(
            sizes.len(),
            4,
            "20k -> 120k keys in three doublings: {sizes:?}"
        );
        for w in sizes.windows(2) {
            assert_eq!(w[1], 2 * w[0], "{sizes:?}");
        }
        check(&index, &keys, &(0..n).collect());
        // never past what max_len needs: a full table costs what it did
        let mut capped = SlotIndex::new(100_000);
        capped.try_reserve(60_000, &hash_of).unwrap();
        for s in 0..60_000u32 {
            capped.insert(keys.hashes[s as usize], s, &hash_of);
        }
        capped.try_reserve(2_000, &hash_of).unwrap();
        assert_eq!(capped.cells.len(), cells_for(100_000));
        assert_eq!(capped.reserve_cells(40_000), None);
        assert_eq!(capped.reserve_cells(1 << 40), None);
    }
}
