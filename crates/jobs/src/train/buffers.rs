//! The large `f32` buffers a training step reuses from one step to the
//! next ([`Buffers`]).

/// Buffers kept from step to step: a step takes every large buffer from
/// here and gives it back, so after the first step no large allocation
/// (and no fresh page) is made. Where large blocks are mapped on their own
/// (the server holds glibc's mmap threshold at 1 MiB), allocating them per
/// step cost a quarter of the step in page faults.
#[derive(Debug, Default)]
pub(crate) struct Buffers {
    /// Free buffers, each marked when it was given back during this step.
    free: Vec<(Vec<f32>, bool)>,
}

impl Buffers {
    /// `len` zeros in the smallest free buffer that holds them without
    /// wasting more than half of it (a block's buffers come in a few sizes;
    /// a small one must not take a large one that a later request needs);
    /// else the largest free one of at least half that size, grown (a
    /// batch a little longer than the earlier ones grows their buffers
    /// instead of allocating a second set beside them); else a new one
    /// with an eighth more room.
    pub(crate) fn zeros(&mut self, len: usize) -> Vec<f32> {
        let cap = |i: &usize| self.free[*i].0.capacity();
        let fits = (0..self.free.len())
            .filter(|i| cap(i) >= len && cap(i) <= 2 * len)
            .min_by_key(cap);
        let grows = || {
            (0..self.free.len())
                .filter(|i| cap(i) < len && 2 * cap(i) >= len)
                .max_by_key(cap)
        };
        let mut v = match fits.or_else(grows) {
            Some(i) => self.free.swap_remove(i).0,
            None => Vec::new(),
        };
        v.clear();
        if v.capacity() < len {
            v.reserve_exact(len + len / 8);
        }
        v.resize(len, 0.0);
        v
    }

    pub(crate) fn give(&mut self, v: Vec<f32>) {
        if v.capacity() > 0 {
            self.free.push((v, true));
        }
    }

    /// At the end of a step: drops the buffers it did not use (too small
    /// for it), so what is held is one step's worth whatever the lengths
    /// of earlier batches.
    pub(crate) fn end_step(&mut self) {
        self.free.retain(|(_, used)| *used);
        for (_, used) in &mut self.free {
            *used = false;
        }
    }

    /// Bytes held for reuse.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.free.iter().map(|(v, _)| v.capacity() * 4).sum()
    }
}
