//! A parallel loop whose items are claimed one at a time from both ends of
//! per-thread regions: each thread runs its own contiguous run of items
//! front to back (a matrix's chunks in address order, so its prefetches
//! and the hardware's run ahead of it), and a thread whose run is done
//! takes the items left in the others' runs from their back ends, so that
//! the threads end together without splitting the runs into small pieces
//! up front (rayon's `with_max_len`), whose every piece is a job to queue
//! and a break in the stream of addresses.

use std::sync::atomic::{AtomicU64, Ordering};

/// The items `front..back` not yet claimed, packed in one word (`front` in
/// the low half) so that a claim from either end is one compare-exchange.
#[repr(align(64))]
struct Region(AtomicU64);

impl Region {
    fn new(front: usize, back: usize) -> Self {
        Self(AtomicU64::new(pack(front, back)))
    }

    /// The first unclaimed item, claimed.
    fn front(&self) -> Option<usize> {
        self.claim(|f, b| (f, (f + 1, b)))
    }

    /// The last unclaimed item, claimed.
    fn back(&self) -> Option<usize> {
        self.claim(|f, b| (b - 1, (f, b - 1)))
    }

    /// `take(front, back)` is the claimed item and what is left, for a
    /// region that is not empty.
    fn claim(&self, take: impl Fn(usize, usize) -> (usize, (usize, usize))) -> Option<usize> {
        let mut v = self.0.load(Ordering::Relaxed);
        loop {
            let (f, b) = unpack(v);
            if f >= b {
                return None;
            }
            let (item, (f2, b2)) = take(f, b);
            match self
                .0
                .compare_exchange_weak(v, pack(f2, b2), Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Some(item),
                Err(now) => v = now,
            }
        }
    }
}

fn pack(front: usize, back: usize) -> u64 {
    front as u64 | (back as u64) << 32
}

fn unpack(v: u64) -> (usize, usize) {
    ((v & u32::MAX as u64) as usize, (v >> 32) as usize)
}

/// `item(i)` once for every `i` in `0..n`, on up to `threads` of the
/// current rayon pool: thread `t` starts on the `t`-th of `threads` equal
/// runs of items (the first run starts with item 0), then takes what is
/// left of the others' runs from their ends. Returns when every item has
/// run.
///
/// # Panics
/// If `n` does not fit in 32 bits.
pub(crate) fn for_each_claimed(n: usize, threads: usize, item: &(dyn Fn(usize) + Sync)) {
    assert!(u32::try_from(n).is_ok(), "too many items");
    let t = threads.clamp(1, n.max(1));
    let regions: Vec<Region> = (0..t)
        .map(|r| Region::new(r * n / t, (r + 1) * n / t))
        .collect();
    let worker = |w: usize| {
        while let Some(i) = regions[w].front() {
            item(i);
        }
        for o in 1..t {
            let region = &regions[(w + o) % t];
            while let Some(i) = region.back() {
                item(i);
            }
        }
    };
    run_workers(0..t, &worker);
}

/// `worker(w)` for every `w` of `workers`, as `rayon::join`s (jobs on the
/// stack, where a scope's spawns are on the heap); the calling thread runs
/// the first.
fn run_workers(workers: std::ops::Range<usize>, worker: &(impl Fn(usize) + Sync)) {
    if workers.len() <= 1 {
        workers.for_each(worker);
        return;
    }
    let mid = workers.start + workers.len() / 2;
    rayon::join(
        || run_workers(workers.start..mid, worker),
        || run_workers(mid..workers.end, worker),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_item_runs_once() {
        for threads in [1, 2, 3, 8] {
            for n in [0, 1, 2, 5, 64, 1000] {
                let runs: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                for_each_claimed(n, threads, &|i| {
                    runs[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    runs.iter().all(|r| r.load(Ordering::Relaxed) == 1),
                    "n {n} threads {threads}"
                );
            }
        }
    }

    #[test]
    fn regions_are_claimed_from_both_ends() {
        let r = Region::new(3, 7);
        assert_eq!(r.front(), Some(3));
        assert_eq!(r.back(), Some(6));
        assert_eq!(r.back(), Some(5));
        assert_eq!(r.front(), Some(4));
        assert_eq!(r.front(), None);
        assert_eq!(r.back(), None);
    }
}
