//! Ownership of the KV pool's blocks: allocation, reference counts, prefix
//! caching.
//!
//! The pool holds a fixed number of 16-token blocks. A sequence owns a
//! [`BlockTable`]: its block ids in position order. Dropping the table
//! returns its blocks, so a sequence that finishes, fails or whose client
//! leaves frees its memory simply by being dropped.
//!
//! Prefix caching: once a block is completely filled with computed tokens,
//! it is registered under a hash of its 16 tokens chained with the hash of
//! the block before it (so a hash names the whole prefix up to the block's
//! end, not just its own tokens). A new sequence looks up the hashes of its
//! prompt's full blocks and takes every leading match by reference
//! (refcount + 1) instead of recomputing it. A block nobody references any
//! more keeps its contents and its hash in an LRU list and is reused for a
//! cache hit until an allocation needs it, oldest first.
//!
//! The manager is shared behind `Arc<Mutex<_>>` so tables can free
//! themselves in `Drop`; the engine loop is its only user, so the lock is
//! never contended.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use hearth_models::BLOCK_SIZE;

/// Hash chain over the full blocks of `tokens`, salted with `salt` (the
/// model, later the adapter): entry `i` names `tokens[..(i + 1) * 16]`.
pub fn block_hashes(salt: u64, tokens: &[u32]) -> Vec<u64> {
    let mut prev = salt;
    tokens
        .chunks_exact(BLOCK_SIZE)
        .map(|chunk| {
            let mut h = DefaultHasher::new();
            prev.hash(&mut h);
            chunk.hash(&mut h);
            prev = h.finish();
            prev
        })
        .collect()
}

#[derive(Debug)]
struct Inner {
    refcount: Vec<u32>,
    /// Hash a block is registered under, if any.
    hash_of: Vec<Option<u64>>,
    by_hash: HashMap<u64, u32>,
    /// Unreferenced blocks without a hash.
    free: Vec<u32>,
    /// Unreferenced blocks that keep a cached prefix, oldest first. Entries
    /// go stale when a block is revived by a hit; they are skipped then.
    evictable: VecDeque<u32>,
    evictable_count: usize,
    hits: u64,
}

impl Inner {
    fn is_evictable(&self, b: u32) -> bool {
        self.refcount[b as usize] == 0 && self.hash_of[b as usize].is_some()
    }

    fn release(&mut self, b: u32) {
        let rc = &mut self.refcount[b as usize];
        debug_assert!(*rc > 0, "block {b} released twice");
        *rc -= 1;
        if *rc == 0 {
            if self.hash_of[b as usize].is_some() {
                self.evictable.push_back(b);
                self.evictable_count += 1;
            } else {
                self.free.push(b);
            }
        }
    }

    fn allocate(&mut self) -> Option<u32> {
        let b = if let Some(b) = self.free.pop() {
            b
        } else {
            loop {
                let b = self.evictable.pop_front()?;
                if self.is_evictable(b) {
                    self.evictable_count -= 1;
                    if let Some(h) = self.hash_of[b as usize].take() {
                        self.by_hash.remove(&h);
                    }
                    break b;
                }
            }
        };
        self.refcount[b as usize] = 1;
        Some(b)
    }
}

/// Shared handle to the block bookkeeping of one pool.
#[derive(Debug, Clone)]
pub struct BlockManager {
    inner: Arc<Mutex<Inner>>,
    num_blocks: usize,
}

impl BlockManager {
    pub fn new(num_blocks: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                refcount: vec![0; num_blocks],
                hash_of: vec![None; num_blocks],
                by_hash: HashMap::new(),
                free: (0..num_blocks as u32).rev().collect(),
                evictable: VecDeque::new(),
                evictable_count: 0,
                hits: 0,
            })),
            num_blocks,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the counts half
        // updated in a way later calls would trip over; keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Blocks an allocation can take now (free plus cached-but-unused).
    pub fn available(&self) -> usize {
        let inner = self.lock();
        inner.free.len() + inner.evictable_count
    }

    /// Blocks referenced by at least one sequence.
    pub fn in_use(&self) -> usize {
        self.num_blocks - self.available()
    }

    /// Full prompt blocks served from the prefix cache so far.
    pub fn prefix_hits(&self) -> u64 {
        self.lock().hits
    }

    /// An empty table for a new sequence.
    pub fn table(&self) -> BlockTable {
        BlockTable {
            manager: self.clone(),
            blocks: Vec::new(),
            registered: 0,
        }
    }
}

/// The blocks of one sequence, in position order; returned to the manager
/// on drop.
#[derive(Debug)]
pub struct BlockTable {
    manager: BlockManager,
    blocks: Vec<u32>,
    /// Leading blocks already registered in (or taken from) the prefix cache.
    registered: usize,
}

impl BlockTable {
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// Token positions the table covers.
    pub fn capacity(&self) -> usize {
        self.blocks.len() * BLOCK_SIZE
    }

    /// Takes the cached blocks matching the leading `hashes` (at most
    /// `max_blocks` of them) into an empty table; returns how many.
    pub fn take_cached_prefix(&mut self, hashes: &[u64], max_blocks: usize) -> usize {
        debug_assert!(self.blocks.is_empty());
        let mut inner = self.manager.lock();
        for h in hashes.iter().take(max_blocks) {
            let Some(&b) = inner.by_hash.get(h) else {
                break;
            };
            if inner.is_evictable(b) {
                inner.evictable_count -= 1;
            }
            inner.refcount[b as usize] += 1;
            inner.hits += 1;
            self.blocks.push(b);
        }
        self.registered = self.blocks.len();
        self.blocks.len()
    }

    /// Grows the table to cover `tokens` positions. All or nothing: returns
    /// false, holding no more blocks than before, when the pool is short.
    pub fn ensure(&mut self, tokens: usize) -> bool {
        let need = tokens
            .div_ceil(BLOCK_SIZE)
            .saturating_sub(self.blocks.len());
        if need == 0 {
            return true;
        }
        let mut inner = self.manager.lock();
        if inner.free.len() + inner.evictable_count < need {
            return false;
        }
        for _ in 0..need {
            let b = inner.allocate().expect("counted above");
            self.blocks.push(b);
        }
        true
    }

    /// Registers the blocks that `computed` tokens fill completely, given
    /// the hash chain of the sequence's tokens (`hashes[i]` for block `i`).
    pub fn register_full(&mut self, computed: usize, hashes: &[u64]) {
        let full = (computed / BLOCK_SIZE)
            .min(hashes.len())
            .min(self.blocks.len());
        if full <= self.registered {
            return;
        }
        let mut inner = self.manager.lock();
        let new = self.blocks[self.registered..full]
            .iter()
            .zip(&hashes[self.registered..full]);
        for (&b, &h) in new {
            if inner.hash_of[b as usize].is_none() && !inner.by_hash.contains_key(&h) {
                inner.hash_of[b as usize] = Some(h);
                inner.by_hash.insert(h, b);
            }
        }
        self.registered = full;
    }

    /// Returns every block (the sequence will be recomputed from scratch).
    pub fn clear(&mut self) {
        let mut inner = self.manager.lock();
        for b in self.blocks.drain(..) {
            inner.release(b);
        }
        self.registered = 0;
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: usize, seed: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 31 + seed).collect()
    }

    #[test]
    fn tables_allocate_all_or_nothing_and_free_on_drop() {
        let m = BlockManager::new(4);
        let mut a = m.table();
        assert!(a.ensure(33)); // 3 blocks
        assert_eq!(a.blocks().len(), 3);
        assert_eq!(m.in_use(), 3);
        let mut b = m.table();
        assert!(!b.ensure(17), "2 blocks wanted, 1 left");
        assert!(b.blocks().is_empty());
        assert!(b.ensure(16));
        assert_eq!(m.available(), 0);
        drop(a);
        assert_eq!(m.in_use(), 1);
        drop(b);
        assert_eq!(m.in_use(), 0);
        assert_eq!(m.available(), 4);
    }

    #[test]
    fn hashes_chain_over_the_whole_prefix() {
        let a = tokens(40, 1);
        let mut b = a.clone();
        b[3] += 1; // differs in block 0 only
        let (ha, hb) = (block_hashes(7, &a), block_hashes(7, &b));
        assert_eq!(ha.len(), 2);
        assert_ne!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1], "block 1 hashes the prefix too");
        assert_ne!(block_hashes(8, &a), ha, "salted");
        assert_eq!(block_hashes(7, &a), ha);
    }

    #[test]
    fn full_blocks_are_shared_and_survive_until_evicted() {
        let m = BlockManager::new(4);
        let prompt = tokens(40, 5);
        let hashes = block_hashes(0, &prompt);
        let mut a = m.table();
        assert!(a.ensure(40));
        a.register_full(40, &hashes);
        let a_blocks = a.blocks().to_vec();

        // A second sequence with the same prompt shares both full blocks.
        let mut b = m.table();
        assert_eq!(b.take_cached_prefix(&hashes, 2), 2);
        assert_eq!(b.blocks(), &a_blocks[..2]);
        assert!(b.ensure(41));
        assert_eq!(m.in_use(), 4, "3 of a + 1 of b's own");
        drop(a);
        drop(b);
        assert_eq!(m.in_use(), 0);
        assert_eq!(m.prefix_hits(), 2);

        // Unused cached blocks are still found...
        let mut c = m.table();
        assert_eq!(c.take_cached_prefix(&hashes, 1), 1);
        assert_eq!(c.blocks()[0], a_blocks[0]);
        drop(c);
        // ...until allocations need them: the pool is reused whole.
        let mut d = m.table();
        assert!(d.ensure(64));
        assert_eq!(m.available(), 0);
        let mut e = m.table();
        assert_eq!(e.take_cached_prefix(&hashes, 2), 0, "evicted");
        drop(d);
        assert!(e.ensure(64));
    }

    #[test]
    fn clear_releases_everything_for_recompute() {
        let m = BlockManager::new(3);
        let mut a = m.table();
        assert!(a.ensure(48));
        a.clear();
        assert!(a.blocks().is_empty());
        assert_eq!(m.available(), 3);
        assert!(a.ensure(20));
        assert_eq!(m.in_use(), 2);
    }
}
